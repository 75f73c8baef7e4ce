"""The probe-budget scenario's analysis (bench/probe_budget.py measures):
from each run's uplink counters, probe counters and events to the dead
spine's share of a live spine's packets and the way back after the
heal; the spread over the repetitions, the table and the plot.  A pure
function of the measurements.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.bench.runner import fmt_spread, spread

DEAD = "s1"
TARGET_SHARE, TARGET_BACK_MS = 0.01, 1000.0      # issue #29
DOWN_TYPES = ("down", "shared-down")


@dataclasses.dataclass
class Run:
    mode: str
    settings: dict                  # probe_max_us, probe_budget as set
    t_start: int                    # CLOCK_MONOTONIC ns: the sender's start, the hole, the heal
    t_fail: int
    t_heal: int
    heal_ns: int                    # how long the heal's map write took
    uplinks: list[dict]             # l1's tx packets per spine: at the hole, +settle, the heal, the run's end
    probe_copies: list[int]         # h1's tx_probe_copy at the hole, +settle, just before the heal
    dropped: list[int]              # the fault's own drop count, the same instants
    probing: dict | None            # h1's `status` probing block at the hole's end
    events: list[dict]              # h1's events towards h2 (all kept)


@dataclasses.dataclass
class Measured:
    runs: dict[str, list[Run]]
    settings: dict[str, dict]


def _share(a: dict, b: dict) -> float | None:
    d = {k: b[k] - a.get(k, 0) for k in b}
    live = [v for k, v in d.items() if k != DEAD]
    mean = sum(live) / len(live) if live else 0
    return d[DEAD] / mean if mean else None


def _types(evs: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in evs:
        out[e["type"]] = out.get(e["type"], 0) + 1
    return out


def analyse_run(r: Run) -> dict:
    u0, u1, u2, u3 = r.uplinks
    downs = [e for e in r.events if e["type"] in DOWN_TYPES and r.t_fail <= e["ns"] <= r.t_heal]
    went = sorted({e["path_id"] for e in downs})
    # still out at the heal (its last event before it a down): through s1;
    # the others went down and came back in the hole (a live spine's EV
    # whose packets were late: `late`, or a probe answered: `up`)
    last = {}
    for e in sorted(r.events, key=lambda e: e["ns"]):
        if e["ns"] < r.t_heal:
            last[e["path_id"]] = e["type"]
    dead = [pid for pid in went if last.get(pid) in DOWN_TYPES]
    back = {}
    for pid in dead:
        ups = [e["ns"] for e in r.events if e["path_id"] == pid and e["type"] == "up" and e["ns"] >= r.t_heal]
        back[pid] = round((min(ups) - r.t_heal) / 1e6, 3) if ups else None
    out_ms = {pid: round((min(e["ns"] for e in downs if e["path_id"] == pid) - r.t_fail) / 1e6, 3)
              for pid in dead}
    hole_s = (r.t_heal - r.t_fail) / 1e9
    late = [v for v in back.values() if v is not None]
    return {"settings": r.settings,
            "dead_over_live": _share(u1, u2), "dead_over_live_whole_hole": _share(u0, u2),
            "dead_over_live_after_heal": _share(u2, u3),
            "into_dead_after_settle": u2[DEAD] - u1[DEAD],
            "live_mean_after_settle": sum(u2[k] - u1[k] for k in u2 if k != DEAD) / max(1, len(u2) - 1),
            "probe_copies_per_s": (r.probe_copies[2] - r.probe_copies[0]) / hole_s,
            "probe_copies_hole": r.probe_copies[2] - r.probe_copies[0],
            "probe_copies_after_settle": r.probe_copies[2] - r.probe_copies[1],
            "dropped_hole": r.dropped[2] - r.dropped[0], "dropped_after_settle": r.dropped[2] - r.dropped[1],
            "out_ms": out_ms, "all_out_ms": max(out_ms.values()) if out_ms else None,
            "paths_down": len(dead), "down_events": len(downs), "back_in_hole": [p for p in went if p not in dead],
            "back_ms": back, "all_back_ms": max(late) if late and len(late) == len(dead) else None,
            "first_back_ms": min(late) if late else None, "not_back": [p for p, v in back.items() if v is None],
            "probing_status": r.probing, "uplinks": r.uplinks,
            "events_after_heal": _types([e for e in r.events if e["ns"] >= r.t_heal]),
            "events_in_hole": _types([e for e in r.events if r.t_fail <= e["ns"] < r.t_heal]),
            "heal_write_us": r.heal_ns / 1e3}


def summarize(p: dict, m: Measured) -> dict:
    modes = {}
    for mode, runs in m.runs.items():
        rows = [analyse_run(r) for r in runs]
        for x in rows:
            x["back_in_hole_n"] = len(x["back_in_hole"])
        modes[mode] = {k: spread([x[k] for x in rows]) for k in
                       ("dead_over_live", "dead_over_live_whole_hole", "probe_copies_per_s", "paths_down",
                        "back_in_hole_n", "all_out_ms",
                        "all_back_ms", "first_back_ms")}
        modes[mode]["runs"] = rows
    notes = []
    for mode, r in modes.items():
        s, b = r["dead_over_live"]["median"], r["all_back_ms"]["max"]
        notes.append(f"{mode}: s1 got {s if s is None else round(s, 4)} of a live spine's packets once its EVs "
                     f"were out (target <= {TARGET_SHARE}); every EV back {b} ms after the heal "
                     f"(target <= {TARGET_BACK_MS:.0f})")
    return {"modes": modes, "settings": m.settings, "notes": notes}


def table(results: dict):
    headers = ["mode", "s1 / live spine (after settle)", "s1 / live (whole hole)", "probe copies/s",
               "all s1's EVs out ms", "EVs out at the heal", "EVs down and back in the hole", "all back ms",
               "first back ms"]
    rows = []
    for mode, r in results["modes"].items():
        rows.append([mode, fmt_spread(r["dead_over_live"]), fmt_spread(r["dead_over_live_whole_hole"]),
                     fmt_spread(r["probe_copies_per_s"]), fmt_spread(r["all_out_ms"]),
                     fmt_spread(r["paths_down"]), fmt_spread(r["back_in_hole_n"]), fmt_spread(r["all_back_ms"]),
                     fmt_spread(r["first_back_ms"])])
    return headers, rows


def plot(results: dict, plt):
    modes = list(results["modes"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.5))
    a1.bar(modes, [results["modes"][k]["dead_over_live"]["median"] or 0 for k in modes])
    a1.axhline(TARGET_SHARE, color="grey", ls="--", lw=0.8)
    a1.set_ylabel("packets into s1 / a live spine's")
    a1.set_yscale("log")
    a2.bar(modes, [results["modes"][k]["all_back_ms"]["max"] or 0 for k in modes])
    a2.axhline(TARGET_BACK_MS, color="grey", ls="--", lw=0.8)
    a2.set_ylabel("every EV back after the heal (ms)")
    return fig
