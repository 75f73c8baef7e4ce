"""The per-packet cost of authenticated feedback, side by side with the
datapath from before it (docs/performance/auth-cost.md).

    python scripts/auth_cost_side_by_side.py --base DIR [--also NAME=DIR] \
        [--rounds 3] [--batches 20] [--per 200] [-j]

DIR is a checkout of the tree before authentication (e.g. `git archive
8f2446e | tar -x -C DIR`).  The timings are `mrc_ebpf.bench.cost`'s
BPF_PROG_TEST_RUN part (rr policy, 1/16/256 paths, single runs).

The key / no key ratio, the target, is measured in pairs: one process
per tree and round compiles the datapath once, then alternates no key
and key in batches of PER packets (the order flips every batch), so both
sides of a ratio ran within milliseconds of each other; the ratio given
is the median over batches of (key batch / no-key batch), each batch
given by the mean of its middle half (the interquartile mean: the test
run's clock ticks in 10 ns on this machine, and a median snaps to it).
On a machine shared with other work, load moves by tens of percent
between seconds, more than the effect measured, and only this pairing
survives it.  Programs that do nothing (XDP_PASS, TC_ACT_OK) run in the
same batches: the floor under every row (the syscall and the timer), so
the "own" ratios, (key - floor) / (no key - floor), compare the programs
alone.  "feedback" rows: 1 path, packets that carry feedback (the bench's
carry none), as most do once two hosts talk both ways; each batch's first
RX packet acknowledges TX's path, as a live peer does (unacknowledged, the
path went down and the rows timed its probes).  --also trees
with keys are measured the same way; trees without (the base) run whole
in turn, so ratios against them are of medians of rounds, noisier.
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

# a tree without keys (before authentication): each path count in turn
PLAIN = r"""
import json, sys
from mrc_ebpf.bench import cost
for r in cost.measure(int(sys.argv[1]) * int(sys.argv[2]), ("rr",), 1)[0]:
    print(json.dumps({"what": "", "paths": r["paths"], "key": False, "batch": 0,
                      "tx": r["tx_ns"]["median"], "rx": r["rx_ns"]["median"]}))
"""

# a tree with keys: no key and key alternate batch by batch
PAIRED = r"""
import ctypes, ipaddress, json, statistics, sys, time
from bcc import BPF
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from mrc_ebpf.bench import cost
from mrc_ebpf.datapath import auth, bpfsys, layout, source
from mrc_ebpf.datapath.loader import compile_datapath
batches, per = int(sys.argv[1]), int(sys.argv[2])
module, tx, rx, _ = compile_datapath()
empty = BPF(text=b"int tx(struct __sk_buff *s) { return 0; } int rx(struct xdp_md *x) { return XDP_PASS; }")
etx, erx = empty.load_func("tx", BPF.SCHED_CLS), empty.load_func("rx", BPF.XDP)
PROBE = ctypes.c_int(source.counter_names().index("tx_probe"))
packet = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IPv6(src="fd00:a::a", dst="fd00:b::b")
               / UDP(dport=9) / bytes(64))


def iqm(ns):
    # the mean of the middle half: the test run's clock ticks in 10 ns
    # here, so a median snaps to the tick and hides smaller differences
    ns = sorted(ns)
    return statistics.mean(ns[len(ns) // 4:3 * len(ns) // 4])


def configure(paths, feedback):
    cost._configure(module, paths, "rr")
    if feedback:    # the path's peer is the sender of RX's packets, so TX reports to it
        path = layout.Path.from_buffer_copy(bytes(module["mrc_paths"][ctypes.c_int(0)]))
        ctypes.memmove(path.peer_sid.addr, ipaddress.IPv6Address(cost.PEER_SID).packed, 16)
        module["mrc_paths"][ctypes.c_int(0)] = module["mrc_paths"].Leaf.from_buffer_copy(bytes(path))


def frames(keyed, feedback):
    cost._set_key(module, keyed)
    _, _, out = bpfsys.prog_test_run(tx.fd, packet, 1)
    if not feedback:
        return cost._inbound(out, batches * per, keyed)
    fr = []
    for frame in cost._inbound(out, batches * per, False):
        f = bytearray(frame)
        at = 14 + 40 + 8 + 16 * (f[14 + 40 + 4] + 1)
        f[at + layout.MrcTlv.flags.offset] |= layout.C["MRC_F_FEEDBACK"]
        if keyed:
            tlv = bytes(f[at:at + layout.C["MRC_TLV_SIZE"]])
            mac_at = at + layout.C["MRC_TLV_MAC_OFF"]
            f[mac_at:mac_at + 8] = auth.tlv_mac(cost.BENCH_KEY, cost.PEER_SID, cost.SID, tlv)
        fr.append(bytes(f))
    return fr


def acked(frame, keyed):
    # the peer acknowledges TX's path up to now, as a live peer would:
    # unacknowledged, the path goes down (ack_timeout 0 here) and every
    # packet after the first batch is a probe (probe_us 0), which is not
    # the cost of carrying feedback (docs/performance/auth-cost.md)
    f = bytearray(frame)
    at = 14 + 40 + 8 + 16 * (f[14 + 40 + 4] + 1)
    tx32 = at + layout.MrcTlv.fb_path_tx32.offset
    f[tx32:tx32 + 4] = (time.monotonic_ns() & 0xffffffff).to_bytes(4, "big")   # bpf_ktime_get_ns's clock
    if keyed:
        tlv = bytes(f[at:at + layout.C["MRC_TLV_SIZE"]])
        mac_at = at + layout.C["MRC_TLV_MAC_OFF"]
        f[mac_at:mac_at + 8] = auth.tlv_mac(cost.BENCH_KEY, cost.PEER_SID, cost.SID, tlv)
    return bytes(f)


def timed_rx(fd, fr):
    ns = []
    for f in fr:
        ret, t, _ = bpfsys.prog_test_run(fd, f, 1)
        assert ret == 2, "RX did not pass the packet up (XDP_PASS)"
        ns.append(t)
    return ns


def timed_tx(fd, feedback):
    ns = []
    for _ in range(per):
        ret, t, out = bpfsys.prog_test_run(fd, packet, 1)
        assert ret == 0 and len(out) > len(packet), "TX did not encapsulate"
        assert not feedback or out[14 + 40 + 8 + 32 + 3] & layout.C["MRC_F_FEEDBACK"]
        ns.append(t)
    return ns


for what, paths, feedback in (("", 1, False), ("", 16, False), ("", 256, False), ("feedback", 1, True)):
    configure(paths, feedback)
    fr = {k: frames(k, feedback) for k in (False, True)}
    for b in range(batches):
        for keyed in ((False, True) if b % 2 == 0 else (True, False)):
            cost._set_key(module, keyed)
            batch = fr[keyed][b * per:(b + 1) * per]
            if feedback:    # the first packet from the peer gives TX something to report
                probes = sum(module["mrc_counters"][PROBE])
                bpfsys.prog_test_run(rx.fd, acked(batch[0], keyed), 1)
                t = timed_tx(tx.fd, True)
                r = timed_rx(rx.fd, batch[1:])
                assert sum(module["mrc_counters"][PROBE]) == probes, \
                    "TX's path went down: the feedback rows would time a down path's probes"
            else:
                t = timed_tx(tx.fd, False)
                r = timed_rx(rx.fd, batch)
            et = [bpfsys.prog_test_run(etx.fd, packet, 1)[1] for _ in range(per // 4)]
            er = [bpfsys.prog_test_run(erx.fd, batch[0], 1)[1] for _ in range(per // 4)]
            print(json.dumps({"what": what, "paths": paths, "key": keyed, "batch": b,
                              "tx": iqm(t), "rx": iqm(r), "floor_tx": iqm(et), "floor_rx": iqm(er)}))
empty.cleanup()
module.cleanup()
"""


def one(tree: Path, script: str, batches: int, per: int) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", script, str(batches), str(per)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def has_keys(tree: Path) -> bool:
    return "keys=" in (tree / "mrc_ebpf/bench/cost.py").read_text()


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
        base = batches.get(("pre-auth", "", paths, False))
        if base and not what:
            row["tx_over_pre_auth"] = row["tx_ns"] / med(base, "tx")
            row["rx_over_pre_auth"] = row["rx_ns"] / med(base, "rx")
        if key:
            pairs = list(zip(batches[(name, what, paths, False)], rs))
            assert all(a["round"] == b["round"] and a["batch"] == b["batch"] for a, b in pairs)
            for side in ("tx", "rx"):
                row[f"{side}_over_no_key"] = statistics.median(b[side] / a[side] for a, b in pairs)
                row[f"{side}_plus_ns"] = statistics.median(b[side] - a[side] for a, b in pairs)
                row[f"{side}_own_over_no_key"] = statistics.median(
                    (b[side] - b[f"floor_{side}"]) / (a[side] - a[f"floor_{side}"]) for a, b in pairs)
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
    print(tabulate([(r["tree"] + (", " + r["what"] if r["what"] else "") + (", key" if r["key"] else ""),
                     r["paths"], r["tx_ns"], r["rx_ns"], f(r, "tx_over_pre_auth"), f(r, "rx_over_pre_auth"),
                     f(r, "tx_over_no_key"), f(r, "rx_over_no_key"), f(r, "tx_plus_ns", "{:+.0f}"),
                     f(r, "rx_plus_ns", "{:+.0f}"), f(r, "tx_own_over_no_key"), f(r, "rx_own_over_no_key"))
                    for r in rows],
                   headers=["datapath", "paths", "TX ns", "RX ns", "TX / pre-auth", "RX / pre-auth",
                            "TX key / no key", "RX key / no key", "TX +ns", "RX +ns",
                            "TX own", "RX own"]))


if __name__ == "__main__":
    main()
