"""Per-packet cost of the TX and RX programs, by BPF_PROG_TEST_RUN.

    python -m mrc_ebpf.bench_cost [--runs N] [-j]

Loads the datapath without attaching it, gives one peer 1, 16 and 256
paths, and times mrc_tx on an IPv6/UDP packet for that peer and mrc_rx on
what mrc_tx produced.  Each test run is a single run (repeat=1): both
programs change the packet, so repeating on the kernel's copy would time
the pass-through path from the second run on.  The kernel times each run;
the table shows percentiles over N runs.  Numbers are for comparing with
each other on one machine, not absolute.
"""
from __future__ import annotations

import argparse
import ctypes
import ipaddress
import json
import statistics

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from . import bpfsys, layout
from .datapath import compile_datapath
from .paths import MAX_CLASSES, POLICIES, flowlabel, peer_key

SID, PEER_SID = "fc00:a::1", "fc00:b::1"


def _configure(module, n_paths: int, policy: str) -> None:
    cfg = layout.Config(mtu=1500, loss_hold_us=20000)
    ctypes.memmove(cfg.sid, ipaddress.IPv6Address(SID).packed, 16)
    module["config"][ctypes.c_int(0)] = module["config"].Leaf.from_buffer_copy(bytes(cfg))
    prefix = ipaddress.ip_network("fd00:b::/64")
    for i in range(n_paths):
        path = layout.Path(n_segments=2, state=layout.C["MRC_PATH_UP"], weight=1,
                           flowlabel=flowlabel(prefix, i, []))
        for j, seg in enumerate((PEER_SID, f"fc00:1:{i % 4 + 1:x}::")):   # wire order
            ctypes.memmove(path.segments[j].addr, ipaddress.IPv6Address(seg).packed, 16)
        module["paths"][ctypes.c_int(i)] = module["paths"].Leaf.from_buffer_copy(bytes(path))
    spray = layout.Spray(n=n_paths)
    spray.ids[:n_paths] = list(range(n_paths))
    for tclass in range(MAX_CLASSES):
        module["spray"][ctypes.c_int(tclass)] = module["spray"].Leaf.from_buffer_copy(bytes(spray))
    key = module["peers"].Key.from_buffer_copy(bytes(peer_key(prefix)))
    module["peers"][key] = module["peers"].Leaf.from_buffer_copy(
        bytes(layout.Peer(peer_id=0, n_paths=n_paths, policy=POLICIES[policy])))


def _percentiles(samples: list[int]) -> dict:
    samples = sorted(samples)
    at = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))]  # noqa: E731
    return {"p10": at(0.10), "median": at(0.5), "p90": at(0.90)}


def measure(runs: int = 20000, policies=("rr", "adaptive")) -> list[dict]:
    module, tx, rx, _ = compile_datapath()
    packet = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IPv6(src="fd00:a::a", dst="fd00:b::b") / UDP(dport=9) / bytes(64))
    rows = []
    for policy in policies:
        for n_paths in (1, 16, 256):
            _configure(module, n_paths, policy)
            tx_ns, rx_ns = [], []
            for _ in range(runs):
                ret, ns, out = bpfsys.prog_test_run(tx.fd, packet, 1)
                assert ret == 0 and len(out) > len(packet), "TX did not encapsulate"
                tx_ns.append(ns)
            # the receiver's view of the last one: our SID as its destination
            inbound = bytearray(out)
            inbound[14 + 8:14 + 24] = ipaddress.IPv6Address(PEER_SID).packed
            inbound[14 + 24:14 + 40] = ipaddress.IPv6Address(SID).packed
            inbound[14 + 40 + 3] = 0                  # segments left: we are the last
            inbound[14 + 48:14 + 64] = ipaddress.IPv6Address(SID).packed
            for _ in range(runs):
                ret, ns, _ = bpfsys.prog_test_run(rx.fd, bytes(inbound), 1)
                assert ret == 2, "RX did not pass the packet up (XDP_PASS)"
                rx_ns.append(ns)
            rows.append({"policy": policy, "paths": n_paths,
                         "tx_ns": _percentiles(tx_ns), "rx_ns": _percentiles(rx_ns)})
    module.cleanup()
    return rows


def main() -> None:
    from tabulate import tabulate
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("-j", "--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args.runs)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    keys = ("p10", "median", "p90")
    print(tabulate([(r["policy"], r["paths"], *(r["tx_ns"][k] for k in keys),
                     *(r["rx_ns"][k] for k in keys)) for r in rows],
                   headers=["policy", "paths", "TX ns p10", "median", "p90", "RX ns p10", "median", "p90"]))


if __name__ == "__main__":
    main()
