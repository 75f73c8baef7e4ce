"""The trim-incast scenario's analysis (bench/trim_incast.py measures):
round completion against the ideal, false path-downs, the receiver's
loss count against the switches' trims; the table and the plot.  A pure
function of the measurements.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.bench.runner import percentile, spread


@dataclasses.dataclass
class ModeRun:
    mode: str
    rounds: list[list[float]]           # per round: each message's completion (ms from the round's start)
    tcp: dict[str, int]                 # the senders' nstat deltas (TcpRetransSegs, TcpExtTCPTimeouts)
    trim_queues: dict[str, dict]        # the switches' trimming queues over the rounds (packets, mrc, trimmed)
    rx_before: dict | None              # the receiver's per-sender totals (stats --paths), MRC modes
    rx_after: dict | None
    events: dict[str, int] | None       # the senders' path events over the rounds, by type


@dataclasses.dataclass
class Measured:
    runs: dict[str, ModeRun]
    crossing: list[int]                 # the senders whose messages cross the spines
    sender_sids: dict[str, int]         # SID -> sender host


def _rx_delta(r: ModeRun, sids: dict[str, int]) -> dict | None:
    if r.rx_after is None:
        return None
    tot = {"rx_packets": 0, "lost": 0, "late": 0, "trimmed": 0}
    for sid, row in r.rx_after.items():
        if sid not in sids:
            continue
        for k in tot:
            tot[k] += row[k] - (r.rx_before or {}).get(sid, {}).get(k, 0)
    tot["net_lost"] = tot["lost"] - tot["late"]     # gaps never filled
    return tot


def summarize(p: dict, m: Measured) -> dict:
    from mrc_ebpf.lab.fabric import parse_rate
    cap = p["spines"] * parse_rate(p["rate"])
    ideal = len(m.crossing) * p["size"] * 8 / cap * 1e3
    modes = {}
    for mode, r in m.runs.items():
        rounds = [max(x) for x in r.rounds]
        trimmed = sum(q["trimmed"] for q in r.trim_queues.values())
        rx = _rx_delta(r, m.sender_sids)
        modes[mode] = {"round_ms": spread(rounds), "round_p99_ms": percentile(rounds, 0.99),
                       "round_p99_over_ideal": percentile(rounds, 0.99) / ideal,
                       "round_p50_over_ideal": percentile(rounds, 0.5) / ideal,
                       "retransmits": r.tcp.get("TcpRetransSegs"), "rtos": r.tcp.get("TcpExtTCPTimeouts"),
                       "switch_trimmed": trimmed, "receiver": rx,
                       "path_downs": None if r.events is None else r.events.get("down", 0)
                       + r.events.get("shared-down", 0),
                       "events": r.events, "round_times_ms": [[round(t, 3) for t in x] for x in r.rounds],
                       "trim_queues": {d: q for d, q in r.trim_queues.items() if q["trimmed"]}}
    notes = [f"ideal {ideal:.1f} ms: {len(m.crossing)} senders' {p['size']} bytes over {p['spines']} spines"]
    for mode, r in modes.items():
        rx = r["receiver"]
        notes.append(f"{mode}: round p99/ideal {r['round_p99_over_ideal']:.2f}, {r['rtos']} RTOs"
                     + ("" if rx is None else f", {r['path_downs']} false path-downs, switches trimmed "
                        f"{r['switch_trimmed']}, receiver counted {rx['trimmed']} trimmed, {rx['lost']} gaps of which "
                        f"{rx['late']} filled late ({rx['net_lost']} lost)"))
    return {"ideal_ms": ideal, "capacity_bps": cap, "modes": modes, "notes": notes}


def table(results: dict):
    headers = ["mode", "round p50/ideal", "round p99/ideal", "RTOs", "retrans", "false path-downs",
               "switches trimmed", "receiver trimmed", "receiver lost (gaps - late)"]
    rows = []
    for mode, r in results["modes"].items():
        rx = r["receiver"] or {}
        rows.append([mode, f"{r['round_p50_over_ideal']:.2f}", f"{r['round_p99_over_ideal']:.2f}", r["rtos"],
                     r["retransmits"], "-" if r["path_downs"] is None else r["path_downs"], r["switch_trimmed"],
                     rx.get("trimmed", "-"), rx.get("net_lost", "-")])
    return headers, rows


def plot(results: dict, plt):
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for mode, r in results["modes"].items():
        xs = sorted(max(x) / results["ideal_ms"] for x in r["round_times_ms"])
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], marker=".", label=mode)
    ax.set_xlabel("round completion / ideal")
    ax.set_ylabel("CDF of rounds")
    ax.legend(fontsize=8)
    return fig
