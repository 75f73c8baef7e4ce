"""The congested-spine scenario's analysis (bench/congested_spine.py
measures): from each run's counters and events (the measurement types
below) to the goodput against the capacity left, the paths taken down
and skipped, then the spread over the repetitions, the table and the
plot.  A pure function of the measurements: no fabric, no process.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.bench.runner import fmt_spread, spread

UDP_WIRE = 8 + 40 + 14          # a cross datagram's headers on the link (UDP, IPv6, Ethernet)
DOWN_TYPES = ("down", "shared-down", "fail-open")
TARGET = 0.9                    # issue #29: >= 0.9 of the capacity left


@dataclasses.dataclass
class CrossFlow:
    """The UDP cross flow over one run's TCP flow (iperf3 in the spine)."""
    spine: str
    payload_bps: float              # the rate asked of the sender (payload)
    size: int                       # datagram payload bytes
    received: int                   # h2's UDP datagrams (Udp6InDatagrams) over the TCP flow's time
    link_tx_bytes: int              # the spine's link towards l2, everything it carried meanwhile
    link_tx_dropped: int


@dataclasses.dataclass
class MrcView:
    """h1's events (all so far) and its paths towards h2 (`path list`)."""
    events: list[dict]
    paths: dict[int, dict]
    rx_ce: dict[int, int]           # h2: packets from h1 that arrived CE-marked, per path
    counters: dict[str, int]        # h1's tx_skip (turns skipped), rx_fb_ce (CE reports filed)


@dataclasses.dataclass
class Run:
    mode: str
    t0: int                         # CLOCK_MONOTONIC ns around the TCP flow
    t1: int
    goodput_bps: float              # mrc-perf's receiver count
    sent_bps: float
    retransmits: int | None
    spines: dict                    # contenders.spines_used over the TCP flow (l1's uplinks)
    cross: CrossFlow
    marks: dict[str, dict]          # per queue (l1>s1 ...) over the TCP flow: packets, ect, marked
    mrc_before: MrcView | None = None
    mrc_after: MrcView | None = None


@dataclasses.dataclass
class Measured:
    runs: dict[str, list[Run]]      # mode -> runs
    mode_setup: dict[str, dict]     # contenders.mode's record per mode
    proof: dict[str, dict]          # the contenders' own evidence
    ceiling: dict[str, float]       # "ecmp" / "rr": payload per byte on the link (spray_vs_ecmp.ceilings)


def _mrc_counts(before: MrcView, after: MrcView, t0: int, t1: int) -> dict:
    seen = max((e["seq"] for e in before.events), default=0)
    new = [e for e in after.events if e["seq"] > seen]
    by_type: dict[str, int] = {}
    for e in new:
        by_type[e["type"]] = by_type.get(e["type"], 0) + 1
    ce = {pid: row["ce_reports"] - before.paths.get(pid, {}).get("ce_reports", 0)
          for pid, row in after.paths.items()}
    tx = {pid: row["tx_packets"] - before.paths.get(pid, {}).get("tx_packets", 0)
          for pid, row in after.paths.items()}
    rx_ce = {pid: n - before.rx_ce.get(pid, 0) for pid, n in after.rx_ce.items()}
    downs = {pid: row["downs"] - before.paths.get(pid, {}).get("downs", 0) for pid, row in after.paths.items()}
    # the paths' own down counters and h1's skip counter: the event log is
    # a ring of 1,024 entries, which a run's skip events overrun
    return {"events": by_type, "rx_ce": rx_ce, "downs": downs,
            "paths_down": sum(downs.values()), "paths_down_events": sum(by_type.get(t, 0) for t in DOWN_TYPES),
            "skips": after.counters["tx_skip"] - before.counters["tx_skip"], "skip_events": by_type.get("skip", 0),
            "ce_reports": ce, "tx_packets": tx,
            "down_paths": sorted(pid for pid, n in downs.items() if n)}


def analyse_run(p: dict, r: Run, ceiling: float | None) -> dict:
    rate, K = p["rate_bps"], p["spines"]
    left = (K - p["cross_load"]) * rate
    secs = max((r.t1 - r.t0) / 1e9, 1e-9)
    cross_bps = r.cross.received * (r.cross.size + UDP_WIRE) * 8 / secs     # on the wire
    pk = r.spines["packets"]
    total = sum(pk.values())
    # goodput over mrc-perf's own seconds; the window [t0, t1] also holds its start-up
    out = {"goodput_bps": r.goodput_bps, "of_left": r.goodput_bps / left, "window_s": secs,
           "of_ceiling": r.goodput_bps / left / ceiling if ceiling else None,
           "retransmits": r.retransmits, "spines": r.spines, "marks": r.marks,
           "cross_spine_share": pk.get(r.cross.spine, 0) / total if total else None,
           "cross": {**dataclasses.asdict(r.cross), "load_measured": cross_bps / rate}}
    if r.mrc_before is not None and r.mrc_after is not None:
        out["mrc"] = _mrc_counts(r.mrc_before, r.mrc_after, r.t0, r.t1)
    return out


def summarize(p: dict, m: Measured) -> dict:
    K = p["spines"]
    left = (K - p["cross_load"]) * p["rate_bps"]
    modes = {}
    for mode, runs in m.runs.items():
        ceiling = m.ceiling.get("ecmp" if mode in ("ecmp", "prr", "mptcp", "plb") else "rr")
        rows = [analyse_run(p, r, ceiling) for r in runs]
        mrc = [x["mrc"] for x in rows if "mrc" in x]
        modes[mode] = {"of_left": spread([x["of_left"] for x in rows]),
                       "of_ceiling": spread([x["of_ceiling"] for x in rows]),
                       "goodput_bps": spread([x["goodput_bps"] for x in rows]),
                       "cross_spine_share": spread([x["cross_spine_share"] for x in rows]),
                       "cross_load_measured": spread([x["cross"]["load_measured"] for x in rows]),
                       "retransmits": spread([x["retransmits"] for x in rows]),
                       "paths_down": spread([x["paths_down"] for x in mrc]) if mrc else None,
                       "skips": spread([x["skips"] for x in mrc]) if mrc else None,
                       "runs": rows}
    notes = [f"capacity left {(K - p['cross_load']):.1f} of {K} spines = {left / 1e6:.0f} Mbit/s; "
             f"header ceiling ecmp {m.ceiling.get('ecmp')}, MRC {m.ceiling.get('rr')}"]
    for mode in ("rr", "rr-skip"):
        if mode in modes and modes[mode]["paths_down"]:
            notes.append(f"{mode}: {modes[mode]['paths_down']['max']} path downs at most in a run "
                         f"(target 0), {modes[mode]['skips']['median']} turns skipped (median)")
    best = max(modes, key=lambda k: modes[k]["of_left"]["median"] or 0) if modes else None
    if best:
        notes.append(f"best: {best} at {modes[best]['of_left']['median']:.2f} of the capacity left "
                     f"(target >= {TARGET})")
    for mode, pr in m.proof.items():
        notes.append(f"{mode} proof: {'ok' if pr.get('ok') else 'NOT shown'}")
    return {"capacity_left_bps": left, "ceiling": m.ceiling, "modes": modes, "mode_setup": m.mode_setup,
            "proof": m.proof, "notes": notes}


def _order(results: dict) -> list[str]:
    known = ("ecmp", "prr", "plb", "mptcp", "rr", "rr-skip")
    return sorted(results["modes"], key=lambda k: known.index(k) if k in known else len(known))


def table(results: dict):
    headers = ["mode", "of capacity left", "of header ceiling", "goodput Mbit/s", "share via cross spine",
               "cross load measured", "path downs", "turns skipped", "retrans"]
    rows = []
    for mode in _order(results):
        r = results["modes"][mode]
        rows.append([mode, fmt_spread(r["of_left"]), fmt_spread(r["of_ceiling"]),
                     fmt_spread(r["goodput_bps"], 1e-6), fmt_spread(r["cross_spine_share"]),
                     fmt_spread(r["cross_load_measured"]),
                     fmt_spread(r["paths_down"]) if r["paths_down"] else "-",
                     fmt_spread(r["skips"]) if r["skips"] else "-", fmt_spread(r["retransmits"])])
    return headers, rows


def plot(results: dict, plt):
    modes = _order(results)
    fig, ax = plt.subplots(figsize=(7, 4))
    med = [results["modes"][k]["of_left"]["median"] or 0 for k in modes]
    lo = [x - (results["modes"][k]["of_left"]["min"] or 0) for x, k in zip(med, modes)]
    hi = [(results["modes"][k]["of_left"]["max"] or 0) - x for x, k in zip(med, modes)]
    ax.bar(range(len(modes)), med, yerr=[lo, hi])
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes)
    ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
    ax.annotate(f"target {TARGET}", (len(modes) - 0.5, TARGET), fontsize=7, va="bottom", ha="right")
    for c in sorted({c for c in results.get("ceiling", {}).values() if c}):
        ax.axhline(c, color="grey", lw=0.5, ls=":")
    ax.set_ylabel("TCP goodput / capacity left")
    ax.set_ylim(0, 1.2)
    return fig
