"""Thousands of active peers (issue 28): does every peer still spray?

The real mrc_tx, run by BPF_PROG_TEST_RUN, sends to K peers of one
template of N paths in turn (rr: what an all-to-all or a ring over a pod
does), K x N packets in all, for K from 1 to more than the learnt state
holds.  The witness is each frame out, read at the wire's offsets: the
TLV's path id.  Per K: the fraction of its paths each peer used (want
>= 0.9), each path's share of all packets (want within 10% of equal), the
packets that failed open, the learnt states made, remade after an
eviction, or not made (the datapath's own counters), and TX's cost per
packet (the run's duration, median) against K = 1 in the same run.

Run (measure) and analyse are apart: `measure` returns the raw path ids
per peer and counters, `analyse` the typed result.
"""
from __future__ import annotations

import collections
import ctypes
import dataclasses
import statistics

from mrc_ebpf.bench import cost
from mrc_ebpf.datapath import bpfsys, layout
from mrc_ebpf.datapath.loader import compile_datapath

TITLE = "active peers: K peers of one 256-path template sent to in turn, every peer's paths and the cost"
USES_TCP = False
COUNTED = ("tx_encap", "tx_fail_open", "tx_drop_no_path", "state_new", "state_remade", "state_fail")


def params(short: bool) -> dict:
    return {"ks": [1, 256, 1024] if short else [1, 256, 1024, 4096, 16384],
            "paths": 16 if short else 256, "repeat": 1}


def steps(p: dict) -> int:
    return len(p["ks"])


@dataclasses.dataclass
class Raw:
    """One K's run: each peer's path ids in order, ns per packet, counters."""
    k: int
    paths: int
    taken: dict[int, list[int]]
    tx_ns: list[int]
    counted: dict[str, int]


@dataclasses.dataclass
class Point:
    k: int
    paths: int
    packets: int
    min_used: float          # the least fraction of its paths a peer used
    median_used: float
    share_min: float         # a path's share of all packets over the equal share
    share_max: float
    fail_open: int
    state_new: int
    state_remade: int
    state_fail: int
    tx_ns_median: float
    tx_over_k1: float | None


def _send_in_turn(tx, frames: list[bytes], rounds: int) -> tuple[dict[int, list[int]], list[int]]:
    taken: dict[int, list[int]] = collections.defaultdict(list)
    ns = []
    for _ in range(rounds):
        for h, frame in enumerate(frames):
            ret, t, out = bpfsys.prog_test_run(tx.fd, frame, 1)
            if ret != 0 or len(out) <= len(frame):
                raise RuntimeError(f"TX did not encapsulate the packet to peer {h} (ret {ret})")
            at = cost.tlv_offset(out) + layout.MrcTlv.path_id.offset
            taken[h].append(int.from_bytes(out[at:at + 2], "big"))
            ns.append(t)
    return taken, ns


def measure(ks, n_paths: int) -> list[Raw]:
    """One compile; for each K, K peers of one template freshly written
    (no learnt state), K x n_paths packets sent in turn."""
    from mrc_ebpf.datapath import source
    module, tx, _, _ = compile_datapath()
    names = source.counter_names()

    def counters() -> dict[str, int]:
        return {n: sum(module["mrc_counters"][ctypes.c_int(names.index(n))]) for n in COUNTED}
    try:
        cost.set_key(module, False)
        out = []
        for k in ks:
            # no learnt state, and no peer ever had any (peer_starts)
            cost.clear_maps(module, ("peer_state",))
            starts = module["mrc_peer_starts"]
            for i in range(len(starts)):
                starts[ctypes.c_int(i)] = ctypes.c_ulonglong(0)
            cost.fill_peers(module, k, n_paths, "rr", active=0, inside=True)
            frames = [cost.packet_to(str(_address(i))) for i in range(cost.INSIDE, cost.INSIDE + k)]
            before = counters()
            taken, ns = _send_in_turn(tx, frames, n_paths)
            after = counters()
            out.append(Raw(k, n_paths, dict(taken), ns, {n: after[n] - before[n] for n in COUNTED}))
        return out
    finally:
        module.cleanup()


def _address(i: int):
    import ipaddress
    return ipaddress.ip_network(cost.plan_peer(i)[0]).network_address + 9


def analyse(raws: list[Raw]) -> list[Point]:
    points = []
    k1 = next((statistics.median(r.tx_ns) for r in raws if r.k == 1), None)
    for r in raws:
        used = [len(set(ids)) / r.paths for ids in r.taken.values()]
        per_path = collections.Counter(i for ids in r.taken.values() for i in ids)
        packets = sum(per_path.values())
        equal = packets / r.paths
        shares = [per_path.get(i, 0) / equal for i in range(r.paths)]
        med = statistics.median(r.tx_ns)
        points.append(Point(r.k, r.paths, packets, min(used), statistics.median(used), min(shares), max(shares),
                            r.counted["tx_fail_open"], r.counted["state_new"], r.counted["state_remade"],
                            r.counted["state_fail"], med, med / k1 if k1 else None))
    return points


def run(p: dict, env) -> dict:
    from mrc_ebpf.bench.runner import log
    reps = []
    for _ in range(p["repeat"]):
        log(f"active-peers: K in {p['ks']}, {p['paths']} paths, K x {p['paths']} packets each")
        reps.append([dataclasses.asdict(pt) for pt in analyse(measure(p["ks"], p["paths"]))])
    return {"points": reps[0], "repeats": reps,
            "max_active_peers": layout.C["MRC_MAX_ACTIVE_PEERS"]}


def table(results: dict):
    headers = ["K peers", "paths", "packets", "least/median paths used", "path share min-max",
               "fail open", "states new/remade/failed", "TX ns (vs K=1)"]
    rows = []
    for r in results["points"]:
        rows.append((r["k"], r["paths"], r["packets"], f"{r['min_used']:.2f} / {r['median_used']:.2f}",
                     f"{r['share_min']:.2f}-{r['share_max']:.2f}", r["fail_open"],
                     f"{r['state_new']}/{r['state_remade']}/{r['state_fail']}",
                     f"{r['tx_ns_median']:.0f} ({r['tx_over_k1']:.2f})" if r["tx_over_k1"] else
                     f"{r['tx_ns_median']:.0f}"))
    return headers, rows


def plot(results: dict, plt):
    fig, ax = plt.subplots(figsize=(6, 4))
    pts = results["points"]
    ax.plot([r["k"] for r in pts], [r["min_used"] for r in pts], "o-", label="least fraction of paths a peer used")
    ax.plot([r["k"] for r in pts], [r["share_max"] for r in pts], "s--", label="busiest path / equal share")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("active peers K")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=7)
    return fig
