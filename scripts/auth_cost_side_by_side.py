"""The per-packet cost of authenticated feedback, side by side with the
datapath from before it (docs/performance/auth-cost.md).

    python scripts/auth_cost_side_by_side.py --base DIR [--rounds 5] [--runs 2000]

DIR is a checkout of the tree before authentication (e.g. `git archive
8f2446e | tar -x -C DIR`).  Each round runs `mrc_ebpf.bench.cost`'s
BPF_PROG_TEST_RUN part (rr policy, 1/16/256 paths) in a fresh process for
the base tree, then for this tree without and with a key, so the three
share the machine's load; the medians of the rounds' medians and their
ratios are printed (ratios, not wall-clock, are what compare).
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


def one(tree: Path, runs: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", ONE, str(runs)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="checkout of the pre-auth tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("-j", "--json", action="store_true")
    args = parser.parse_args()
    samples: dict[tuple, list] = {}
    for i in range(args.rounds):
        for name, tree in (("pre-auth", args.base), ("now", HERE)):
            for r in one(tree, args.runs):
                what = f"{name}{', key' if r['key'] else ''}"
                samples.setdefault((what, r["paths"]), []).append((r["tx"], r["rx"]))
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v))
           for k, v in samples.items()}
    rows = []
    for (what, paths), (tx, rx) in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = med[("pre-auth", paths)]
        nokey = med.get(("now", paths), base)
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
