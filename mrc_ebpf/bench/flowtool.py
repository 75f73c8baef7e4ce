"""Small traffic tools the benchmarks run inside namespaces, logging every
arrival with its CLOCK_MONOTONIC time (one clock for every namespace of
the machine, so a sender's timestamp and a receiver's arrival compare).

    python -m mrc_ebpf.bench.flowtool udp-recv ADDR PORT SECONDS OUT
    python -m mrc_ebpf.bench.flowtool udp-send ADDR PORT SECONDS FLOWS BPS SIZE
    python -m mrc_ebpf.bench.flowtool tcp-recv ADDR PORT SECONDS CONNS OUT
    python -m mrc_ebpf.bench.flowtool tcp-send ADDR PORT SECONDS CONNS
    python -m mrc_ebpf.bench.flowtool udp-flood SRC ADDR PORT SECONDS BPS SIZE

udp-recv writes (arrival_ns, flow, seq, sent_ns) per datagram as int64s;
tcp-recv writes (arrival_ns, bytes) per read.  Senders print JSON
(per-flow counts) on stdout when done.
"""
from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time
from array import array

HDR = struct.Struct("!IQQ")       # flow, seq, sent_ns
now = time.monotonic_ns


def udp_recv(addr, port, seconds, out):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((addr, int(port)))
    s.settimeout(0.2)
    log = array("q")
    end = now() + int(float(seconds) * 1e9)
    print("ready", flush=True)
    while now() < end:
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        t = now()
        if len(data) >= HDR.size:
            f, q, ts = HDR.unpack_from(data)
            log.extend((t, f, q, ts))
    with open(out, "wb") as fh:
        log.tofile(fh)


def paced(t0, seconds, pps, idle):
    """Packet numbers 0, 1, ... each at its due time from t0 at `pps`
    (bursting to catch up after a late wake-up), for `seconds`."""
    end = t0 + int(float(seconds) * 1e9)
    sent = 0
    while True:
        t = now()
        if t >= end:
            return
        due = int((t - t0) / 1e9 * pps)
        if sent >= due:
            time.sleep(idle)
            continue
        while sent < due:
            yield sent
            sent += 1


def udp_send(addr, port, seconds, flows, bps, size):
    flows, bps, size = int(flows), float(bps), int(size)
    socks = [socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) for _ in range(flows)]
    for s in socks:
        s.connect((addr, int(port)))
    buf = bytearray(size)
    seqs = [0] * flows
    errors = 0
    t0 = now()
    for i in paced(t0, seconds, bps / (size * 8), 0.0001):
        f = i % flows
        HDR.pack_into(buf, 0, f, seqs[f], now())
        try:
            socks[f].send(buf)
            seqs[f] += 1
        except OSError:
            errors += 1
    print(json.dumps({"sent": seqs, "errors": errors, "t0": t0, "end": now()}), flush=True)


def tcp_recv(addr, port, seconds, conns, out):
    ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, int(port)))
    ls.listen(64)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    for _ in range(int(conns)):
        c, _ = ls.accept()
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ)
    log = array("q")
    end = now() + int(float(seconds) * 1e9)
    open_ = int(conns)
    while now() < end and open_:
        for key, _ in sel.select(0.1):
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            log.extend((now(), len(data)))
    with open(out, "wb") as fh:
        log.tofile(fh)


def tcp_send(addr, port, seconds, conns):
    socks = []
    for _ in range(int(conns)):
        s = socket.create_connection((addr, int(port)), timeout=10)
        s.setblocking(False)
        socks.append(s)
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    buf = bytes(128 << 10)
    t0 = now()
    end = t0 + int(float(seconds) * 1e9)
    sent = [0] * len(socks)
    while now() < end:
        for key, _ in sel.select(0.05):
            try:
                sent[socks.index(key.fileobj)] += key.fileobj.send(buf)
            except BlockingIOError:
                pass
    for s in socks:
        s.close()
    print(json.dumps({"sent": sent, "t0": t0, "end": now()}), flush=True)


def udp_flood(src, addr, port, seconds, bps, size):
    """Paced UDP from SRC (any address) to ADDR: background load."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind((src, 0))
    buf = bytes(int(size))
    sent = 0
    for _ in paced(now(), seconds, float(bps) / (int(size) * 8), 0.0002):
        try:
            s.sendto(buf, (addr, int(port)))
        except OSError:
            pass
        sent += 1
    print(json.dumps({"sent": sent}), flush=True)


def read_log(path, width):
    a = array("q")
    with open(path, "rb") as fh:
        a.frombytes(fh.read())
    return [tuple(a[i:i + width]) for i in range(0, len(a), width)]


def main(argv=None):
    argv = argv or sys.argv[1:]
    cmd, args = argv[0], argv[1:]
    {"udp-recv": udp_recv, "udp-send": udp_send, "tcp-recv": tcp_recv, "tcp-send": tcp_send,
     "udp-flood": udp_flood}[cmd](*args)


if __name__ == "__main__":
    main()
