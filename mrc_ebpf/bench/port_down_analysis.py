"""The port-down scenario's analysis (bench/port_down.py measures): from
the peers' events (kernel timestamps) to when each stopped sending into
the plane whose device went down; the spread over the repetitions, the
table and the plot.  A pure function of the measurements.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.bench.runner import fmt_spread, spread

TARGET_MS = 1.0             # issue #29: every peer within 1 ms
DOWN_TYPES = ("down", "shared-down")


@dataclasses.dataclass
class Run:
    mode: str
    t0: int                     # CLOCK_MONOTONIC ns just before and after the netlink call
    t1: int
    watcher: list[dict]         # `ports watch -j` lines: {"ns", "mask", "told": [...]}
    events: dict[int, list[dict]]   # peer host -> its events (all kept)
    prefix: str                 # the target's prefix
    plane_ids: list[int]        # the path ids (to the target) through the plane that went down
    hook_ns: int | None = None  # the target's own hook set its port status (event own-port-down)
    # peer host -> when the target's datapath told it (event port-told, lib/port_tell.h)
    told_ns: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Measured:
    runs: dict[str, list[Run]]
    notes: list[str] = dataclasses.field(default_factory=list)     # e.g. modes the kernel could not run


def peer_out(r: Run, evs: list[dict]) -> dict:
    """When this peer stopped sending into the plane: its port-down event,
    or each of its plane paths' first down, whichever came first (ms from
    the call that set the link down)."""
    port = [e["ns"] for e in evs if e["type"] == "port-down" and e["ns"] >= r.t0]
    firsts = []
    for pid in r.plane_ids:
        t = [e["ns"] for e in evs if e["type"] in DOWN_TYPES and e["path_id"] == pid
             and e.get("prefix") == r.prefix and e["ns"] >= r.t0]
        firsts.append(min(t) if t else None)
    by_clock = max(firsts) if firsts and None not in firsts else None
    cands = [t for t in (min(port) if port else None, by_clock) if t is not None]
    ms = lambda t: None if t is None else round((t - r.t0) / 1e6, 3)  # noqa: E731
    return {"out_ms": ms(min(cands)) if cands else None, "port_down_ms": ms(min(port) if port else None),
            "clock_ms": ms(by_clock), "by": None if not cands else
            ("port-status" if port and min(port) == min(cands) else "clock")}


def analyse_run(r: Run) -> dict:
    peers = {h: peer_out(r, evs) for h, evs in r.events.items()}
    for h, v in peers.items():
        # the stages: the target told this peer (ms from the call), and
        # from then to the peer out (the feedback's way and its filing)
        told = r.told_ns.get(h)
        v["told_ms"] = None if told is None else round((told - r.t0) / 1e6, 3)
        v["told_to_out_ms"] = None if told is None or v["out_ms"] is None else round(v["out_ms"] - v["told_ms"], 3)
    hook_ms = None if r.hook_ns is None else (r.hook_ns - r.t0) / 1e6
    told_all = [v["told_ms"] for v in peers.values() if v["told_ms"] is not None]
    outs = [v["out_ms"] for v in peers.values()]
    woke = [round((c["ns"] - r.t0) / 1e6, 3) for c in r.watcher]
    return {"peers": peers, "all_out_ms": max(outs) if outs and None not in outs else None,
            "first_out_ms": min((o for o in outs if o is not None), default=None),
            "not_out": [h for h, v in peers.items() if v["out_ms"] is None],
            "by_port_status": sum(v["by"] == "port-status" for v in peers.values()),
            "netlink_call_ms": round((r.t1 - r.t0) / 1e6, 3), "watcher_woke_ms": woke,
            "hook_ms": None if r.hook_ns is None else round((r.hook_ns - r.t0) / 1e6, 3),
            # from the target's own hook (its kernel's instant of the change) to the slowest peer out
            "after_hook_ms": None if r.hook_ns is None or None in outs or not outs
            else round(max(outs) - (r.hook_ns - r.t0) / 1e6, 3),
            "watcher_told": [len(c.get("told", [])) for c in r.watcher],
            # the hook to the first peer told (the wait for a packet in, and the clones)
            "hook_to_told_ms": None if hook_ms is None or not told_all else round(min(told_all) - hook_ms, 3),
            "peers_told": len(told_all)}


def summarize(p: dict, m: Measured) -> dict:
    modes = {}
    for mode, runs in m.runs.items():
        rows = [analyse_run(r) for r in runs]
        modes[mode] = {k: spread([x[k] for x in rows]) for k in ("all_out_ms", "first_out_ms", "by_port_status")}
        hooked = [x["after_hook_ms"] for x in rows if x["after_hook_ms"] is not None]
        modes[mode]["after_hook_ms"] = spread(hooked) if hooked else None
        for k in ("hook_ms", "hook_to_told_ms"):
            got = [x[k] for x in rows if x[k] is not None]
            modes[mode][k] = spread(got) if got else None
        legs = [v["told_to_out_ms"] for x in rows for v in x["peers"].values() if v["told_to_out_ms"] is not None]
        modes[mode]["told_to_out_ms"] = spread(legs) if legs else None
        modes[mode]["within_target"] = sum(x["all_out_ms"] is not None and x["all_out_ms"] <= TARGET_MS
                                           for x in rows)
        modes[mode]["runs"] = rows
    notes = [f"{mode}: every peer out of the plane {r['all_out_ms']['median']} ms (median of the slowest peer; "
             f"target {TARGET_MS} ms) after the netlink call" for mode, r in modes.items()]
    return {"modes": modes, "notes": notes + m.notes}


def table(results: dict):
    headers = ["mode", "slowest peer out ms", "first peer out ms", "peers out by port status",
               f"runs all out within {TARGET_MS} ms", "slowest peer after the hook ms", "call to hook ms",
               "hook to first told ms", "told to peer out ms"]
    rows = [[mode, fmt_spread(r["all_out_ms"]), fmt_spread(r["first_out_ms"]), fmt_spread(r["by_port_status"]),
             f"{r.get('within_target', '-')}/{len(r['runs'])}",
             fmt_spread(r["after_hook_ms"]) if r.get("after_hook_ms") else "-",
             *[fmt_spread(r[k]) if r.get(k) else "-" for k in ("hook_ms", "hook_to_told_ms", "told_to_out_ms")]]
            for mode, r in results["modes"].items()]
    return headers, rows


def plot(results: dict, plt):
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (mode, r) in enumerate(results["modes"].items()):
        vals = [v["out_ms"] for run in r["runs"] for v in run["peers"].values() if v["out_ms"] is not None]
        ax.scatter([i] * len(vals), vals, s=12, label=mode)
    ax.axhline(TARGET_MS, color="grey", ls="--", lw=0.8)
    ax.set_xticks(range(len(results["modes"])))
    ax.set_xticklabels(list(results["modes"]))
    ax.set_yscale("log")
    ax.set_ylabel("peer out of the plane (ms after the link went down)")
    return fig
