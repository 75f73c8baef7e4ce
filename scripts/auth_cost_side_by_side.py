"""The per-packet cost of authenticated feedback, side by side with the
datapath from before it (docs/performance/auth-cost.md).

    python scripts/auth_cost_side_by_side.py --base DIR [--rounds 5] [--runs 2000]

DIR is a checkout of the tree before authentication (e.g. `git archive
8f2446e | tar -x -C DIR`).  Each round runs `mrc_ebpf.bench.cost`'s
BPF_PROG_TEST_RUN part (rr policy, 1/16/256 paths) in a fresh process for
the base tree, then for this tree without and with a key, so the three
share the machine's load; the medians of the rounds' medians and their
ratios are printed (ratios, not wall-clock, are what compare).  "now,
feedback" rows: this tree, 1 path, packets that carry feedback (the
bench's carry none), each side timed over RUNS packets; their "no key"
ratio is against the same rows without a key.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

ONE = r"""
import inspect, json, sys
from mrc_ebpf.bench import cost
kw = {"keys": (False, True)} if "keys" in inspect.signature(cost.measure).parameters else {}
for r in cost.measure(int(sys.argv[1]), ("rr",), 1, **kw)[0]:
    print(json.dumps({"paths": r["paths"], "key": r.get("key", False),
                      "tx": r["tx_ns"]["median"], "rx": r["rx_ns"]["median"]}))
"""

# This tree only (it needs the keyed bench): packets that carry feedback,
# as most do once two hosts talk both ways; the bench's carry none.
FEEDBACK = r"""
import ctypes, ipaddress, json, statistics, sys
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from mrc_ebpf.bench import cost
from mrc_ebpf.datapath import auth, bpfsys, layout
from mrc_ebpf.datapath.loader import compile_datapath
runs = int(sys.argv[1])
module, tx, rx, _ = compile_datapath()
packet = bytes(Ether() / IPv6(src="fd00:a::a", dst="fd00:b::b") / UDP(dport=9) / bytes(64))
for keyed in (False, True):
    cost._configure(module, 1, "rr")
    path = layout.Path.from_buffer_copy(bytes(module["mrc_paths"][ctypes.c_int(0)]))
    ctypes.memmove(path.peer_sid.addr, ipaddress.IPv6Address(cost.PEER_SID).packed, 16)
    module["mrc_paths"][ctypes.c_int(0)] = module["mrc_paths"].Leaf.from_buffer_copy(bytes(path))
    cost._set_key(module, keyed)
    _, _, out = bpfsys.prog_test_run(tx.fd, packet, 1)
    frames = []
    for frame in cost._inbound(out, runs + 1, False):
        f = bytearray(frame)
        at = 14 + 40 + 8 + 16 * (f[14 + 40 + 4] + 1)
        f[at + layout.MrcTlv.flags.offset] |= layout.C["MRC_F_FEEDBACK"]
        if keyed:
            tlv = bytes(f[at:at + layout.C["MRC_TLV_SIZE"]])
            mac_at = at + layout.C["MRC_TLV_MAC_OFF"]
            f[mac_at:mac_at + 8] = auth.tlv_mac(cost.BENCH_KEY, cost.PEER_SID, cost.SID, tlv)
        frames.append(bytes(f))
    rx_ns = [bpfsys.prog_test_run(rx.fd, f, 1)[1] for f in frames]   # the first makes the peer known
    tx_ns = []
    for _ in range(runs):
        ret, ns, out = bpfsys.prog_test_run(tx.fd, packet, 1)
        assert out[14 + 40 + 8 + 32 + 3] & layout.C["MRC_F_FEEDBACK"]
        tx_ns.append(ns)
    print(json.dumps({"paths": 1, "key": keyed, "tx": statistics.median(tx_ns),
                      "rx": statistics.median(rx_ns[1:])}))
module.cleanup()
"""


def one(tree: Path, runs: int, script: str = ONE) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", script, str(runs)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="checkout of the pre-auth tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                        help="another tree to run alongside (e.g. the datapath before a change)")
    parser.add_argument("-j", "--json", action="store_true")
    args = parser.parse_args()
    trees = [("pre-auth", args.base)] + [(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in args.also]
    samples: dict[tuple, list] = {}
    for i in range(args.rounds):
        for name, tree in trees + [("now", HERE)]:
            for r in one(tree, args.runs):
                what = f"{name}{', key' if r['key'] else ''}"
                samples.setdefault((what, r["paths"]), []).append((r["tx"], r["rx"]))
        for r in one(HERE, args.runs, FEEDBACK):
            what = f"now, feedback{', key' if r['key'] else ''}"
            samples.setdefault((what, r["paths"]), []).append((r["tx"], r["rx"]))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v))
           for k, v in samples.items()}
    rows = []
    for (what, paths), (tx, rx) in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = med[("pre-auth", paths)]
        nokey = med.get((what.split(",")[0] + (", feedback" if "feedback" in what else ""), paths), base)
        rows.append({"what": what, "paths": paths, "tx_ns": tx, "rx_ns": rx,
                     "tx_over_pre_auth": tx / base[0], "rx_over_pre_auth": rx / base[1],
                     "tx_over_no_key": tx / nokey[0], "rx_over_no_key": rx / nokey[1]})
    if args.json:
        print(json.dumps({"rounds": args.rounds, "runs": args.runs, "rows": rows,
                          "samples": {f"{w}|{p}": v for (w, p), v in samples.items()}}, indent=1))
        return
    from tabulate import tabulate
    print(tabulate([(r["what"], r["paths"], r["tx_ns"], r["rx_ns"], f"{r['tx_over_pre_auth']:.2f}",
                     f"{r['rx_over_pre_auth']:.2f}", f"{r['tx_over_no_key']:.2f}", f"{r['rx_over_no_key']:.2f}")
                    for r in rows],
                   headers=["datapath", "paths", "TX ns", "RX ns", "TX / pre-auth", "RX / pre-auth",
                            "TX / no key", "RX / no key"]))


if __name__ == "__main__":
    main()
