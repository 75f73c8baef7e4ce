"""The per-packet cost of authenticated feedback, side by side with the
datapath from before it (docs/performance/auth-cost.md).

    python scripts/auth_cost_side_by_side.py --base DIR [--also NAME=DIR] \
        [--rounds 3] [--batches 20] [--per 200] [-j]

DIR is a checkout of the tree before authentication (e.g. `git archive
8f2446e | tar -x -C DIR`).  The timings are `mrc_ebpf.bench.cost`'s
BPF_PROG_TEST_RUN part (rr policy, 1/16/256 paths, single runs).

The key / no key ratio, the target, is measured in pairs, as `mrcctl
bench cost` does (mrc_ebpf.bench.cost.measure_key_cost: the method, the
"own" ratios, the feedback rows); here one process per tree and round,
the rounds pooled.  --also trees must have measure_key_cost; trees
without keys (the base) run whole in turn, so ratios against them are
of medians of rounds, noisier.
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
sys.path.insert(0, str(HERE))
from mrc_ebpf.bench import cost  # noqa: E402

# a tree without keys (before authentication): each path count in turn
PLAIN = r"""
import json, sys
from mrc_ebpf.bench import cost
for r in cost.measure(int(sys.argv[1]) * int(sys.argv[2]), ("rr",), 1)[0]:
    print(json.dumps({"what": "data", "paths": r["paths"], "key": False, "batch": 0,
                      "tx": r["tx_ns"]["median"], "rx": r["rx_ns"]["median"]}))
"""

# a tree with keys: no key and key alternate batch by batch
# (mrc_ebpf.bench.cost.measure_key_cost, this tree and later ones)
PAIRED = r"""
import json, sys
from mrc_ebpf.bench import cost
for r in cost.measure_key_cost(int(sys.argv[1]), int(sys.argv[2])):
    print(json.dumps(r))
"""


def one(tree: Path, script: str, batches: int, per: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", script, str(batches), str(per)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def has_keys(tree: Path) -> bool:
    return "def measure_key_cost" in (tree / "mrc_ebpf/bench/cost.py").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="checkout of the pre-auth tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--per", type=int, default=200, help="packets per batch")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                        help="another tree to run alongside (e.g. the datapath before a change)")
    parser.add_argument("-j", "--json", action="store_true")
    args = parser.parse_args()
    trees = [("pre-auth", args.base)] + [(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in args.also]
    trees.append(("now", HERE))
    batches: dict[tuple, list] = {}     # (tree, what, paths, key) -> batch rows
    for i in range(args.rounds):
        for name, tree in trees:
            keyed = has_keys(tree)
            for r in one(tree, PAIRED if keyed else PLAIN, args.batches, args.per):
                r["round"] = i
                batches.setdefault((name, r["what"], r["paths"], r["key"]), []).append(r)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)

    def med(rows, side):
        return statistics.median(r[side] for r in rows)

    rows = []
    for (name, what, paths, key), rs in sorted(batches.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0], kv[0][3])):
        row = {"tree": name, "what": what, "paths": paths, "key": key, "batches": len(rs),
               "tx_ns": med(rs, "tx"), "rx_ns": med(rs, "rx")}
        base = batches.get(("pre-auth", "data", paths, False))
        if base and what == "data":
            row["tx_over_pre_auth"] = row["tx_ns"] / med(base, "tx")
            row["rx_over_pre_auth"] = row["rx_ns"] / med(base, "rx")
        if key:     # the pairs, as the bench sums them up
            point = cost.key_cost_ratios(batches[(name, what, paths, False)] + rs)
            row.update({k: v for r in point if (r["what"], r["paths"]) == (what, paths)
                        for k, v in r.items() if "key_over" in k or "plus_ns" in k})
        if "floor_tx" in rs[0]:
            row["floor_tx_ns"], row["floor_rx_ns"] = med(rs, "floor_tx"), med(rs, "floor_rx")
        rows.append(row)
    if args.json:
        print(json.dumps({"rounds": args.rounds, "batches": args.batches, "per": args.per, "rows": rows,
                          "load": os.getloadavg(),
                          "raw": {"|".join(map(str, k)): v for k, v in batches.items()}}, indent=1))
        return
    from tabulate import tabulate

    def f(row, k, fmt="{:.2f}"):
        return fmt.format(row[k]) if k in row else ""
    print(tabulate([(r["tree"] + (", " + r["what"] if r["what"] != "data" else "") + (", key" if r["key"] else ""),
                     r["paths"], r["tx_ns"], r["rx_ns"], f(r, "tx_over_pre_auth"), f(r, "rx_over_pre_auth"),
                     f(r, "tx_key_over_no_key"), f(r, "rx_key_over_no_key"), f(r, "tx_plus_ns", "{:+.0f}"),
                     f(r, "rx_plus_ns", "{:+.0f}"), f(r, "tx_own_key_over_no_key"), f(r, "rx_own_key_over_no_key"))
                    for r in rows],
                   headers=["datapath", "paths", "TX ns", "RX ns", "TX / pre-auth", "RX / pre-auth",
                            "TX key / no key", "RX key / no key", "TX +ns", "RX +ns",
                            "TX own", "RX own"]))


if __name__ == "__main__":
    main()
