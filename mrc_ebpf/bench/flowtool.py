"""Small traffic tools the benchmarks run inside namespaces, logging every
arrival with its CLOCK_MONOTONIC time (one clock for every namespace of
the machine, so a sender's timestamp and a receiver's arrival compare).

    python -m mrc_ebpf.bench.flowtool udp-recv ADDR PORT SECONDS OUT
    python -m mrc_ebpf.bench.flowtool udp-send ADDR PORT SECONDS FLOWS BPS SIZE [SPORTS [LOG [SRC]]]
    python -m mrc_ebpf.bench.flowtool tcp-recv ADDR PORT SECONDS CONNS OUT [mptcp]
    python -m mrc_ebpf.bench.flowtool tcp-send ADDR PORT SECONDS CONNS [SPORTS [SRC [CC [mptcp]]]]
    python -m mrc_ebpf.bench.flowtool tcp-sink ADDR PORT SECONDS CLAMP

udp-recv writes (arrival_ns, flow, seq, sent_ns) per datagram as int64s;
the arrival is the kernel's receive timestamp (SO_TIMESTAMPNS, converted
from CLOCK_REALTIME to CLOCK_MONOTONIC), so a receiver that is late to
run on a loaded machine does not move arrivals; when the kernel gives
none the time after recvmsg is used.  It stops SECONDS after its start
or once nothing has come for a second after the first datagram.

udp-send paces FLOWS flows round robin at BPS of payload; with LOG it
writes (flow, seq, sent_ns) for every datagram it sent, so losses have
exact send times; a stall longer than 2 ms is skipped, not made up in a
burst (see paced).  SPORTS ("-" for none, else comma-separated) binds
each flow or connection to a chosen source port (from SRC, default the
unspecified address), so a benchmark can pick flows whose ECMP hash it
knows.

With `mptcp` the TCP tools open MPTCP sockets (IPPROTO_MPTCP): each
connection gets the subflows the kernel's path manager opens.

tcp-recv writes (arrival_ns, connection, bytes) per read of at most
64 KiB, the arrival being the kernel's receive time of the last segment
read (TCP gives that with SO_TIMESTAMPNS).

tcp-sink is a background receiver whose advertised window is clamped to
CLAMP bytes (TCP_WINDOW_CLAMP, set again after every read: the kernel's
receive autotuning raises the clamp as data is read): a bulk sender into
it keeps at most CLAMP bytes in flight, i.e. a standing queue of CLAMP
bytes at its bottleneck that never overflows, provided the sender's
congestion control fills the window (CC cubic: the namespaces' default
here is bbr, which keeps its in-flight near 2 x bandwidth x min RTT
whatever the window).

Senders print "started T0" once connected and about to send, and JSON
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

from mrc_ebpf.perf.control import mptcp_subflows, set_congestion, stream_socket


HDR = struct.Struct("!IQQ")       # flow, seq, sent_ns
now = time.monotonic_ns
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)     # SO_TIMESTAMPNS_OLD: struct timespec
TS = struct.Struct("@qq")


def realtime_offset() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC in ns (the tightest of a few samples)."""
    best = None
    for _ in range(20):
        a = now()
        r = time.time_ns()
        b = now()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


def _ports(text):
    return None if text in (None, "", "-") else [int(x) for x in text.split(",")]


def _kernel_time(anc, off, t):
    """The kernel's receive time (SCM_TIMESTAMPNS, realtime) on the monotonic
    clock, if the ancillary data has a plausible one; else t."""
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= TS.size:
            sec, nsec = TS.unpack_from(cdata)
            k = sec * 1_000_000_000 + nsec - off
            if 0 <= t - k < 2_000_000_000:
                return k
    return t


def udp_recv(addr, port, seconds, out):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((addr, int(port)))
    s.settimeout(0.2)
    off = realtime_offset()
    log = array("q")
    user_times = 0
    end = now() + int(float(seconds) * 1e9)
    last = None
    print("ready", flush=True)
    while now() < end:
        try:
            data, anc, _, _ = s.recvmsg(65536, 64)
        except socket.timeout:
            if last is not None and now() - last > 1_000_000_000:
                break               # the sender has been done for a second
            continue
        last = now()
        t = _kernel_time(anc, off, last)
        user_times += t == last
        if len(data) >= HDR.size:
            f, q, ts = HDR.unpack_from(data)
            log.extend((t, f, q, ts))
    with open(out, "wb") as fh:
        log.tofile(fh)
    print(json.dumps({"received": len(log) // 4, "user_times": user_times}), flush=True)


def paced(t0, seconds, pps, idle, catch_up_s=0.002, skipped=None):
    """Packet numbers 0, 1, ... each at its due time from t0 at `pps`, for
    `seconds`.  After a late wake-up it bursts to catch up by at most
    catch_up_s worth of packets; the slots of a longer stall (a loaded
    machine can starve the sender for 100 ms) are skipped, not sent in one
    burst that no link queue could hold.  skipped[0] counts them."""
    end = t0 + int(float(seconds) * 1e9)
    most = max(1, int(pps * catch_up_s))
    sent = 0
    while True:
        t = now()
        if t >= end:
            return
        due = int((t - t0) / 1e9 * pps)
        if sent >= due:
            time.sleep(idle)
            continue
        if due - sent > most:
            if skipped is not None:
                skipped[0] += due - most - sent
            sent = due - most
        while sent < due:
            yield sent
            sent += 1


def _bound(kind, src, port):
    s = socket.socket(socket.AF_INET6, kind)
    if port is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((src or "::", port))
    return s


def udp_send(addr, port, seconds, flows, bps, size, sports=None, logpath=None, src=None):
    flows, bps, size = int(flows), float(bps), int(size)
    ports = _ports(sports)
    if ports is not None and len(ports) != flows:
        raise SystemExit(f"udp-send: {len(ports)} source ports for {flows} flows")
    src = None if src in (None, "-") else src
    socks = [_bound(socket.SOCK_DGRAM, src, ports[i] if ports else None) for i in range(flows)]
    for s in socks:
        s.connect((addr, int(port)))
    buf = bytearray(size)
    seqs = [0] * flows
    errors = 0
    skipped = [0]
    log = array("q")
    t0 = now()
    print(f"started {t0}", flush=True)
    for i in paced(t0, seconds, bps / (size * 8), 0.0001, skipped=skipped):
        f = i % flows
        ts = now()
        HDR.pack_into(buf, 0, f, seqs[f], ts)
        try:
            socks[f].send(buf)
        except OSError:
            errors += 1
            continue
        if logpath:
            log.extend((f, seqs[f], ts))
        seqs[f] += 1
    end = now()
    if logpath:
        with open(logpath, "wb") as fh:
            log.tofile(fh)
    print(json.dumps({"sent": seqs, "errors": errors, "skipped": skipped[0], "t0": t0, "end": end,
                      "sports": [s.getsockname()[1] for s in socks]}), flush=True)


def _is_mptcp(flag) -> bool:
    if flag not in (None, "-", "mptcp"):
        raise SystemExit(f"flowtool: {flag!r}: mptcp or -")
    return flag == "mptcp"


def tcp_recv(addr, port, seconds, conns, out, mptcp=None):
    off = realtime_offset()
    ls = stream_socket(socket.AF_INET6, _is_mptcp(mptcp))
    ls.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, int(port)))
    ls.listen(64)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    ports = []
    for i in range(int(conns)):
        c, peer = ls.accept()
        c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ, i)
        ports.append(peer[1])
    log = array("q")
    end = now() + int(float(seconds) * 1e9)
    open_ = int(conns)
    while now() < end and open_:
        for key, _ in sel.select(0.1):
            try:
                data, anc, _, _ = key.fileobj.recvmsg(64 << 10, 64)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""        # tcp-send ends with a reset (see there)
            if not data:
                sel.unregister(key.fileobj)
                open_ -= 1
                continue
            log.extend((_kernel_time(anc, off, now()), key.data, len(data)))
    with open(out, "wb") as fh:
        log.tofile(fh)
    print(json.dumps({"peer_ports": ports}), flush=True)


def tcp_send(addr, port, seconds, conns, sports=None, src=None, cc=None, mptcp=None):
    ports = _ports(sports)
    if ports is not None and len(ports) != int(conns):
        raise SystemExit(f"tcp-send: {len(ports)} source ports for {conns} connections")
    mp = _is_mptcp(mptcp)
    socks = []
    for i in range(int(conns)):
        if mp:      # the path manager picks the subflows' addresses and ports
            s = stream_socket(socket.AF_INET6, True)
        else:
            s = _bound(socket.SOCK_STREAM, None if src in (None, "-") else src, ports[i] if ports else None)
        set_congestion(s, None if cc in (None, "-") else cc)
        s.settimeout(10)
        s.connect((addr, int(port)))
        s.setblocking(False)
        socks.append(s)
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        sel.register(s, selectors.EVENT_WRITE, i)
    buf = bytes(128 << 10)
    t0 = now()
    print(f"started {t0}", flush=True)
    end = t0 + int(float(seconds) * 1e9)
    sent = [0] * len(socks)
    while now() < end:
        for key, _ in sel.select(0.05):
            try:
                sent[key.data] += key.fileobj.send(buf)
            except BlockingIOError:
                pass
    sports_used = [s.getsockname()[1] for s in socks]
    subflows = [mptcp_subflows(s) for s in socks] if mp else None
    for s in socks:
        # abortive: a connection through a black hole could not finish
        # its close, and would hold its (calibrated) source port for the
        # next repetition; the measurement is over by now
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    print(json.dumps({"sent": sent, "t0": t0, "end": now(), "sports": sports_used, "mptcp_subflows": subflows}),
          flush=True)


def tcp_sink(addr, port, seconds, clamp):
    """Accept one connection at a time and discard what it sends, with the
    advertised window clamped to CLAMP bytes and a receive buffer far
    larger (so the clamp, not the reader's speed, bounds the window)."""
    clamp = int(clamp)
    ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    ls.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
    ls.bind((addr, int(port)))
    ls.listen(4)
    ls.settimeout(0.2)
    print("ready", flush=True)
    end = now() + int(float(seconds) * 1e9)
    got = 0
    while now() < end:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
        c.settimeout(0.2)
        while now() < end:
            try:
                data = c.recv(1 << 20)
            except socket.timeout:
                continue
            if not data:
                break
            got += len(data)
            # receive autotuning raises window_clamp as the reader copies data
            # (up to what the buffer allows): put it back after every read
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
        c.close()
    print(json.dumps({"received": got}), flush=True)


def read_log(path, width):
    a = array("q")
    with open(path, "rb") as fh:
        a.frombytes(fh.read())
    return [tuple(a[i:i + width]) for i in range(0, len(a), width)]


def main(argv=None):
    argv = argv or sys.argv[1:]
    cmd, args = argv[0], argv[1:]
    {"udp-recv": udp_recv, "udp-send": udp_send, "tcp-recv": tcp_recv, "tcp-send": tcp_send,
     "tcp-sink": tcp_sink}[cmd](*args)


if __name__ == "__main__":
    main()
