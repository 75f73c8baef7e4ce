"""All-to-all sprayed traffic on an attached fabric, and its witnesses.

Every host sends COUNT UDP datagrams to every other host's data address
(interleaved over destinations); every host runs a UDP sink counting
datagrams per source address (the sockets' witness, independent of the
datapath), and afterwards each receiver's datapath counters (`mrcctl stats
--paths`: packets received per sender SID and path) say what arrived from
whom and over how many paths.
"""
from __future__ import annotations

import json
import time

from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.procs import PY, Procs, in_netns, run_parallel

from .plan import Fabric

PORT = 9
# A UDP sink: counts datagrams per source address until no datagram has
# come for IDLE seconds (after at least one), or DEADLINE passes; prints them.
SINK = """
import json, socket, sys, time
addr, port, idle, deadline = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind((addr, port))
print("ready", flush=True)
counts, end = {}, time.monotonic() + deadline
s.settimeout(0.2)
last = None
while time.monotonic() < end:
    try:
        _, src = s.recvfrom(2048)
    except socket.timeout:
        if last is not None and time.monotonic() - last > idle:
            break
        continue
    counts[src[0]] = counts.get(src[0], 0) + 1
    last = time.monotonic()
print(json.dumps(counts), flush=True)
"""
# A sender: COUNT rounds, each one datagram to every destination, paced
# by GAP seconds between rounds (the veths' queues are not the subject).
SEND = """
import socket, sys, time
src, port, count, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dsts = sys.argv[5:]
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.bind((src, 0))
payload = b"x" * 200
sent = 0
for i in range(count):
    for d in dsts:
        while True:
            try:
                s.sendto(payload, (d, port))
                break
            except BlockingIOError:
                time.sleep(0.001)
            except OSError as e:
                if e.errno != 105:      # ENOBUFS: the qdisc is full; try again
                    raise
                time.sleep(0.001)
        sent += 1
    time.sleep(gap)
print(sent)
"""


def _datapath_rx(fab: Fabric, hosts: list[int]) -> dict[int, dict[str, dict]]:
    """receiver -> sender SID -> {packets, paths: {path id: packets}} from its datapath."""
    jobs = run_parallel([in_netns(None, [PY, "-m", "mrc_ebpf.cli.mrcctl", "-j", "--netns", fab.ns(fab.host(b)),
                                         "stats", "--paths"]) for b in hosts], limit=4, timeout=300)
    rx = {}
    for b, r in zip(hosts, jobs):
        if r.returncode != 0:
            raise MrcError(f"stats on {fab.host(b)}: {' '.join(r.stderr.split())[-200:]}")
        per: dict[str, dict] = {}
        for row in json.loads(r.stdout)["received"]:
            e = per.setdefault(row["from"], {"packets": 0, "paths": {}})
            e["packets"] += row["rx_packets"]
            e["paths"][row["path_id"]] = row["rx_packets"]
        rx[b] = per
    return rx


def _delta(after: dict, before: dict) -> dict:
    return {"packets": after["packets"] - before.get("packets", 0),
            "paths": {p: n - before.get("paths", {}).get(p, 0) for p, n in after["paths"].items()
                      if n - before.get("paths", {}).get(p, 0) > 0}}


def run(fab: Fabric, hosts: list[int], count: int, gap: float = 0.002, idle: float = 3.0) -> dict:
    """Send COUNT datagrams from every host to every other; return, per
    ordered pair, what the receiver's socket counted and what its datapath
    counted from the sender meanwhile (data and the sender's feedback).
    A first round of one datagram each resolves every neighbour first."""
    _send(fab, hosts, 1, gap)
    before = _datapath_rx(fab, hosts)
    with Procs() as procs:
        sinks = {}
        for b in hosts:
            p = procs.popen(fab.ns(fab.host(b)), [PY, "-c", SINK, fab.addr6(b), str(PORT), str(idle),
                                                  str(120 + count * len(hosts) * 0.01)],
                            stdout=-1, stderr=-1, text=True)
            sinks[b] = p
        for b, p in sinks.items():
            line = p.stdout.readline().strip()
            if line != "ready":
                raise MrcError(f"UDP sink on {fab.host(b)} did not start: {p.stderr.read()[:200]}")
        started = time.monotonic()
        _send(fab, hosts, count, gap)
        send_s = time.monotonic() - started
        sock = {}
        for b, p in sinks.items():
            out, err = procs.wait(p, timeout=60 + count * len(hosts) * 0.01)
            try:
                sock[b] = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise MrcError(f"UDP sink on {fab.host(b)} printed no counts: {err[:200]}")
    rx = _datapath_rx(fab, hosts)
    pairs = []
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            dp = _delta(rx[b].get(fab.host_sid(a), {"packets": 0, "paths": {}}),
                        before[b].get(fab.host_sid(a), {}))
            pairs.append({"src": fab.host(a), "dst": fab.host(b), "sent": count,
                          "socket": sock[b].get(fab.addr6(a), 0),
                          "datapath": dp["packets"], "paths": len(dp["paths"])})
    return {"pairs": pairs, "send_s": round(send_s, 2), "count": count}


def _send(fab: Fabric, hosts: list[int], count: int, gap: float) -> None:
    results = run_parallel([in_netns(fab.ns(fab.host(a)), [PY, "-c", SEND, fab.addr6(a), str(PORT), str(count),
                                                          str(gap), *[fab.addr6(b) for b in hosts if b != a]])
                            for a in hosts], limit=len(hosts), timeout=600)
    for a, r in zip(hosts, results):
        if r.returncode != 0:
            raise MrcError(f"sender on {fab.host(a)}: {' '.join(r.stderr.split())[-200:]}")
