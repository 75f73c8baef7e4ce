"""TCP goodput and reordering as the paths' delays diverge.

There is no netem on this kernel, so the delay is made the honest way: a
standing queue on one spine link.  On spine s1's link towards leaf l2 (the
data direction h1 -> h2) the tbf gets a queue limit of `delay_ms` ms
(`latency`) and a constant background UDP stream, sent by s1 itself to
l2's link address at `background` x the link rate, keeps that queue full:
every packet of ours crossing s1 -> l2 waits ~delay_ms behind it (and some
are dropped at the full queue: this path also loses and has less room;
the other 3 paths are untouched).  delay_ms 0 = no background, the normal
20 ms limit.  The delay each path really had is the receiver's MRC
measurement (queueing delay above the path's minimum, p50/p99 per path).

One TCP flow h1 -> h2 (mrc-perf, -t seconds), sprayed `rr` per packet over
the 4 spines by MRC on both hosts.  Reordering is counted twice: the
receiver's MRC reorder counter and histogram (distance in packets, log2
buckets; deltas over the run), and TCP's own counters in the sender's
namespace (nstat deltas: TcpExtTCPSACKReorder, TcpExtTCPTSReorder,
TcpExtTCPRenoReorder, TcpRetransSegs, TcpExtTCPSpuriousRtxHostQueues,
TcpExtTCPDSACKRecv: DSACKs report spurious retransmissions).
"""
from __future__ import annotations

import json
import time

from .runner import PY, fmt3, log, mmm

TITLE = "TCP goodput and reordering over 4 sprayed paths as one path's queueing delay grows"
NSTAT_KEYS = ("TcpExtTCPSACKReorder", "TcpExtTCPTSReorder", "TcpExtTCPRenoReorder", "TcpRetransSegs",
              "TcpExtTCPDSACKRecv", "TcpExtTCPLostRetransmit", "TcpExtTCPTimeouts")


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit",
            "delays_ms": [0, 4] if short else [0, 1, 2, 4, 8, 16], "seconds": 2.0 if short else 6.0,
            "background": 1.05, "background_size": 1200, "policy": "rr", "repeat": 1 if short else 3,
            "slow_link": "s1 -> l2 (tbf latency = delay_ms, background UDP from s1 to l2)"}


def _rx_view(env, fab):
    r = env.mrcctl(fab.ns("h2"), "stats", "--paths", "-j", check=False)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"received": [], "reorder": []}


def _diff(a, b):
    from ..stats import percentile
    sender = fab_sid = None  # noqa: F841
    out = {"paths": [], "reordered": 0, "packets": 0, "reorder_hist": None}
    before = {(x["from"], x["path_id"]): x for x in a["received"]}
    for x in b["received"]:
        y = before.get((x["from"], x["path_id"]))
        hist = [u - (y["qdelay_hist"][i] if y else 0) for i, u in enumerate(x["qdelay_hist"])]
        pk = x["rx_packets"] - (y["rx_packets"] if y else 0)
        if pk <= 0:
            continue
        out["paths"].append({"path_id": x["path_id"], "packets": pk,
                             "lost": x["lost"] - (y["lost"] if y else 0),
                             "qdelay_p50_us": percentile(hist, 0.5), "qdelay_p99_us": percentile(hist, 0.99)})
    rb = {x["from"]: x for x in a["reorder"]}
    for x in b["reorder"]:
        y = rb.get(x["from"])
        out["packets"] += x["packets"] - (y["packets"] if y else 0)
        out["reordered"] += x["reordered"] - (y["reordered"] if y else 0)
        h = [u - (y["reorder_hist"][i] if y else 0) for i, u in enumerate(x["reorder_hist"])]
        out["reorder_hist"] = h if out["reorder_hist"] is None else [p + q for p, q in zip(out["reorder_hist"], h)]
    return out


def run(p: dict, env) -> dict:
    from .. import fabric as fab_mod
    from ..fabric import QUEUE_LATENCY, parse_rate
    from .runner import fabric
    rate = parse_rate(p["rate"])
    cap = p["spines"] * rate
    burst = max(rate // 8 // 1000, 3200)
    levels = {str(d): [] for d in p["delays_ms"]}
    port = 5700
    with fabric("ro", spines=p["spines"], leaves=2, hosts_per_leaf=1, rate=p["rate"]) as fab:
        log("reorder: attaching MRC on h1, h2 (rr)")
        fab_mod.attach(fab.name, "h1,h2", p["policy"], [])
        s1 = fab.ns("s1")
        link = fab.link_net(0, 1, 2)
        for rep in range(p["repeat"]):
            for d in p["delays_ms"]:
                port += 1
                log(f"reorder: delay {d} ms, run {rep + 1}/{p['repeat']}")
                bg = None
                env.run(None, ["tc", "-n", s1, "qdisc", "replace", "dev", "l2", "root", "tbf", "rate",
                               f"{rate}bit", "burst", str(burst), "latency", f"{d}ms" if d else QUEUE_LATENCY])
                try:
                    if d:
                        bg = env.popen(s1, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-flood", f"{link}1",
                                            f"{link}2", "9", str(p["seconds"] + 3),
                                            str(p["background"] * rate), str(p["background_size"])])
                        time.sleep(0.5)
                    a, n_a = _rx_view(env, fab), env.nstat(fab.ns("h1"))
                    doc = env.perf(fab.ns("h1"), fab.ns("h2"), fab.addr6(2), port,
                                   ["-t", str(p["seconds"])], p["seconds"])
                    b, n_b = _rx_view(env, fab), env.nstat(fab.ns("h1"))
                finally:
                    if bg is not None:
                        env.end(bg)
                    env.run(None, ["tc", "-n", s1, "qdisc", "replace", "dev", "l2", "root", "tbf", "rate",
                                   f"{rate}bit", "burst", str(burst), "latency", QUEUE_LATENCY])
                rx = doc["end"]["receiver"]["sum"]["bits_per_second"]
                view = _diff(a, b)
                levels[str(d)].append({"goodput_bps": rx, "fraction": rx / cap,
                                       "nstat": {k: n_b.get(k, 0) - n_a.get(k, 0) for k in NSTAT_KEYS},
                                       "mrc_reordered": view["reordered"], "mrc_packets": view["packets"],
                                       "mrc_reorder_fraction": view["reordered"] / max(1, view["packets"]),
                                       "mrc_reorder_hist": view["reorder_hist"], "paths": view["paths"]})
                time.sleep(0.3)
    summary = {}
    for d, rs in levels.items():
        slow = [next((x["qdelay_p50_us"] for x in r["paths"] if x["path_id"] == 0), None) for r in rs]
        fast = [max([x["qdelay_p50_us"] or 0 for x in r["paths"] if x["path_id"] != 0], default=None) for r in rs]
        summary[d] = {"fraction": mmm([r["fraction"] for r in rs]),
                      "mrc_reorder_fraction": mmm([r["mrc_reorder_fraction"] for r in rs]),
                      "sack_reorder": mmm([r["nstat"]["TcpExtTCPSACKReorder"] for r in rs]),
                      "retransmits": mmm([r["nstat"]["TcpRetransSegs"] for r in rs]),
                      "dsack_recv": mmm([r["nstat"]["TcpExtTCPDSACKRecv"] for r in rs]),
                      "slow_path_qdelay_p50_us": mmm(slow), "other_paths_qdelay_p50_us_max": mmm(fast),
                      "runs": rs}
    return {"capacity_bps": cap, "delays": summary,
            "notes": ["path 0 crosses s1 (the slowed link); qdelay is MRC's receiver-side measurement "
                      "(log2 buckets: within a factor of two)"]}


def table(results: dict):
    headers = ["queue ms", "slow path qdelay p50 us", "others' p50 us", "goodput fraction",
               "MRC reordered frac", "TCPSACKReorder", "retrans", "DSACKs"]
    rows = []
    for d, s in results["delays"].items():
        rows.append([d, fmt3(s["slow_path_qdelay_p50_us"]), fmt3(s["other_paths_qdelay_p50_us_max"]),
                     fmt3(s["fraction"]), fmt3(s["mrc_reorder_fraction"]), fmt3(s["sack_reorder"]),
                     fmt3(s["retransmits"]), fmt3(s["dsack_recv"])])
    return headers, rows


def plot(results: dict, plt):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ds = list(results["delays"])
    xs = [float(d) for d in ds]
    g = [results["delays"][d]["fraction"]["median"] for d in ds]
    r = [results["delays"][d]["mrc_reorder_fraction"]["median"] for d in ds]
    ax1.plot(xs, g, "o-", label="goodput / capacity")
    ax1.plot(xs, r, "s--", label="MRC reordered fraction")
    ax1.set_xlabel("standing queue on s1->l2 (ms)")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    for d in ds:
        h = results["delays"][d]["runs"][0]["mrc_reorder_hist"] or []
        if h:
            ax2.plot(range(len(h)), h, marker=".", label=f"{d} ms")
    ax2.set_yscale("symlog")
    ax2.set_xlabel("reorder distance bucket (log2 packets)")
    ax2.set_ylabel("packets")
    ax2.legend(fontsize=7)
    return fig
