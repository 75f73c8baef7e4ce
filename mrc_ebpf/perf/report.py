"""Text output in iperf3's layout, plus the MRC per-path lines."""
from __future__ import annotations

from mrc_ebpf.perf.units import fmt_bytes, fmt_rate

RULE = "- " * 25


def _head(kind: str, role: str, summary: bool = False) -> str:
    base = "[ ID] Interval           Transfer     Bitrate"
    if kind == "tcp":
        return base + ("         Retr" if summary else
                       "         Retr  Cwnd" if role == "sender" else "")
    if role == "sender":
        return base + "         Total Datagrams"
    return base + "         Jitter    Lost/Total Datagrams  Latency p50/p99/p99.9"


def header(kind: str, role: str, unit: str | None = None) -> str:
    return _head(kind, role)


def _latency(lat) -> str:
    if not lat:
        return "-"
    return f"{lat['p50']:.0f}/{lat['p99']:.0f}/{lat['p99.9']:.0f} us"


def _line(label: str, r: dict, t0: float, t1: float, kind: str, role: str, summary: bool,
          unit: str | None = None) -> str:
    text = f"[{label:>3}] {t0:6.2f}-{t1:<6.2f} sec  {fmt_bytes(r['bytes']):>11}  " \
           f"{fmt_rate(r['bits_per_second'], unit):>15}"
    if kind == "tcp" and role == "sender":
        text += f" {r['retransmits']:>4}"
        if not summary and "snd_cwnd" in r:
            text += f"  {fmt_bytes(r['snd_cwnd']):>10}"
    elif kind == "tcp" and summary:
        text += " " * 5
    elif kind == "udp" and role == "sender":
        text += f"  {r['packets']}"
    elif kind == "udp":
        total = r["packets"] + r["lost"]
        text += f"  {r['jitter_ms']:.3f} ms  {r['lost']}/{total} ({r['lost_percent']:.2g}%)" \
                f"  {_latency(r['latency_us'])}"
    return text


def interval_lines(rec: dict, kind: str, role: str, multi: bool, unit: str | None = None) -> list[str]:
    t0, t1 = rec["start"], rec["end"]
    out = [_line(str(s["id"]), s, t0, t1, kind, role, False, unit) for s in rec["streams"]]
    if multi:
        out.append(_line("SUM", rec["sum"], t0, t1, kind, role, False, unit))
    if rec.get("mrc"):
        out.extend(mrc_lines(rec["mrc"]))
    return out


def mrc_lines(view: dict, indent: str = "") -> list[str]:
    """Paths that carried packets in the period (JSON has every row)."""
    out = []
    for r in view["tx"]:
        if r["packets"]:
            out.append(f"{indent}[MRC] tx path {r['path_id']:<3} {r['prefix']:<18} "
                       f"{fmt_bytes(r['bytes']):>11}  {fmt_rate(r['bits_per_second']):>15}  "
                       f"{r['packets']:>8} pkts {100 * r['share']:5.1f}%  {r['state']}")
    for r in view["rx"]:
        if r["packets"]:
            q50 = "-" if r["qdelay_p50_us"] is None else r["qdelay_p50_us"]
            q99 = "-" if r["qdelay_p99_us"] is None else r["qdelay_p99_us"]
            out.append(f"{indent}[MRC] rx path {r['path_id']:<3} from {r['from']:<13} "
                       f"{fmt_bytes(r['bytes']):>11}  {fmt_rate(r['bits_per_second']):>15}  "
                       f"{r['packets']:>8} pkts {100 * r['share']:5.1f}%  lost {r['lost']} "
                       f"late {r['late']} qdelay p50/p99 <={q50}/<={q99} us")
    for r in view["reorder"]:
        if r["packets"]:
            out.append(f"{indent}[MRC] reordered {r['reordered']} of {r['packets']} from {r['from']}")
    return out


def summary_lines(end: dict, kind: str, multi: bool, unit: str | None = None) -> list[str]:
    out = [RULE]
    for role in ("sender", "receiver"):
        s = end[role]
        if s is None:
            continue
        if role == "sender" or kind == "udp":     # UDP's receiver has columns of its own
            out.append(_head(kind, role, summary=True))
        rows = [(str(r["id"]), r) for r in s["streams"]]
        if multi:
            rows.append(("SUM", s["sum"]))
        for label, r in rows:
            out.append(_line(label, r, s["start"], s["end"], kind, role, True, unit) + f"  {role}")
    return out


def mrc_summary_lines(end: dict, local: dict, remote: dict) -> list[str]:
    out = []
    for who, side in (("local", local), ("remote", remote)):
        summary = end[side["role"]]
        dev = side.get("mrc")
        if dev is None or summary is None or summary.get("mrc") is None:
            out.append(f"MRC ({who}, {side['role']}): no datapath attached")
            continue
        out.append(f"MRC ({who} {dev['device']} {dev['sid']}, {side['role']}), whole test:")
        out.extend(mrc_lines(summary["mrc"], indent="  "))
    return out
