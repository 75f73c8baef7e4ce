"""One host's part of an all-to-all UDP load: sends `pps` packets a second
to its peers and counts what arrives from them (run in a host's
namespace by bench/shared_fate.py; prints one JSON line at the end).

Patterns: `uniform`, packet k to peer k mod n (every peer all the time);
`phased`, peer (offset + step) mod n during step = elapsed // phase_ms,
as all-to-all collectives schedule it (each host sends to one peer per
step, the hosts to different peers, so no receiver takes two senders).
Each packet carries the sender's index and a sequence number per peer.
"""
from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import time

HEADER = struct.Struct("!HI")       # sender index, sequence number to this peer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", type=int, required=True)
    ap.add_argument("--peers", required=True, help="ADDR,ADDR,... (index order, ours left out)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pps", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--linger", type=float, default=0.5, help="receive this long after the last send")
    ap.add_argument("--pattern", choices=("uniform", "phased"), default="uniform")
    ap.add_argument("--phase-ms", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=200)
    a = ap.parse_args()
    peers = a.peers.split(",")
    n = len(peers)
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind(("::", a.port))
    rx.setblocking(False)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    tx.setblocking(False)
    pad = b"\0" * max(0, a.size - HEADER.size)
    sent = [0] * n
    send_errors = 0
    received: dict[int, int] = {}
    # start together: the parent gives every host the same start time
    # (CLOCK_MONOTONIC is one clock for all namespaces)
    start = float(input())
    while time.monotonic() < start:
        time.sleep(0.001)
    t0 = time.monotonic()
    end = t0 + a.seconds
    k = 0
    offset = a.index % n

    def drain():
        while True:
            try:
                data = rx.recv(2048)
            except BlockingIOError:
                return
            if len(data) >= HEADER.size:
                who, _ = HEADER.unpack_from(data)
                received[who] = received.get(who, 0) + 1

    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - t0) * a.pps)
        while k < due:
            t_k = t0 + k / a.pps
            if a.pattern == "uniform":
                p = k % n
            else:
                p = (offset + int((t_k - t0) * 1000 / a.phase_ms)) % n
            try:
                tx.sendto(HEADER.pack(a.index, sent[p]) + pad, (peers[p], a.port))
                sent[p] += 1
            except (BlockingIOError, OSError):
                send_errors += 1
            k += 1
        drain()
        select.select([rx], [], [], 0.0005)
    stop = time.monotonic() + a.linger
    while time.monotonic() < stop:
        select.select([rx], [], [], 0.01)
        drain()
    print(json.dumps({"index": a.index, "sent": dict(zip(peers, sent)), "send_errors": send_errors,
                      "received": {str(k): v for k, v in received.items()},
                      "seconds": round(time.monotonic() - t0, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
