"""TCP goodput and reordering as the paths' delays diverge.

There is no netem on this kernel (and no fq/etf to hold packets by
time), so the extra delay is a standing queue on one spine link, made so
that it delays without dropping: spine s1's link towards leaf l2 (the
data direction h1 -> h2, path 0) carries, besides our traffic, one
background TCP connection whose window is clamped to delay_ms x rate
bytes.  Its sender is a side namespace NAME-bg hanging off s1 by an
unlimited veth (fd01:ff:1::/64), its receiver is l2 itself (the s1-l2
link address), and it runs cubic: with a base RTT of microseconds its
whole window sits in s1's tbf towards l2, a queue of delay_ms that it
keeps topped up as the link drains it, whatever rate is left over.  The
tbf there gets delay_ms + 20 ms of room (the fabric's usual 20 ms on top),
so neither the background nor our packets are dropped at it; our
packets on path 0 wait behind the standing queue (and somewhat more: the
queue they share drains at the link rate, so with our share r of it the
wait is about delay_ms x rate / (rate - r)).  The other 3 paths are
untouched.  delay_ms 0 = no background.

Why the first method (tbf latency = delay_ms, kept full by open-loop
background UDP *from s1 itself*) did not give the intended delay: the
queue limit was the delay, so the queue was always full and tail-dropped
a share of our packets as large as the background's excess (12% of
everything at 1.05 x rate, more with our traffic added): path 0 became
a lossy path with almost no room, MRC's relative ack timeout (1 ms) took
it down and it carried little more than probes, and the queueing delay
of what did cross it was mixed with the queues TCP builds on every path
(the others' p50 came out as high as path 0's in log2 buckets).  A TCP
background sent by s1 itself does not work either: TCP small queues keep
a local socket's backlog in its own qdisc to about a millisecond, and the
namespaces' default congestion control, bbr, keeps its in-flight near 2 x
bandwidth x min RTT whatever the window (hence cubic, and the side
namespace, whose packets s1 forwards and does not own).  And the clamp
has to be set again after every read: receive autotuning raises it.

The delay actually produced is measured two ways (and the slow link's
tbf drop count over the transfer says whether it also lost packets):
  * ping over each spine's link to l2 (from the spine to l2's address on
    that link, every ping_interval_ms), before our transfer (background
    only: the delay as made) and during it (what the link's queue is
    while we use it); extra delay = s1's median RTT - the median of the
    other spines' medians;
  * the receiver's (h2) MRC measurement per path: queueing delay above the
    path's minimum one-way delay (log2 histogram deltas over the run:
    p50 as a bucket, and a mean from the bucket midpoints).  The minimum
    is the lowest seen since attach, so the first level run should be 0.

The contenders (ecmp, prr, plb, mptcp; bench/contenders.py) run the same
levels first, without MRC: one flow that ECMP (and PRR, absent an RTO)
keeps on one spine, the slow one or not as its hash falls, or MPTCP's K
subflows; their "path 0 share" is s1's share of l1's uplink packets.

One TCP flow h1 -> h2 (mrc-perf, -t seconds), sprayed per packet over
the 4 spines by MRC on both hosts, once per policy: `rr` (blind: path 0
keeps its quarter of the packets whatever its delay) and `adaptive`
(path 0 loses its turns while the receiver reports its queue well above
the others').  Reordering is counted twice: the
receiver's MRC reorder counter and histogram (distance in packets, log2
buckets; deltas over the run), and TCP's own counters in the sender's
namespace (nstat deltas: TcpExtTCPSACKReorder, TcpExtTCPTSReorder,
TcpExtTCPRenoReorder, TcpRetransSegs, TcpExtTCPDSACKRecv: DSACKs report
spurious retransmissions).  Per path the share of packets and how often
h1's datapath took it down (`path list` downs): with the default
ack-timeout of 1 ms a path a few ms slower than the others is overdue by
construction, so MRC keeps taking it down and probing it.

Each transfer's measurement (Level: pings' output, the hosts' counters
and views before and after, the goodput) is kept apart from its analysis
(level_result, summarize), a pure function of it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import time

from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.runner import PY, fmt_spread, log, spread
from mrc_ebpf.perf.iperf_json import read_result

TITLE = "TCP goodput and reordering over 4 sprayed paths as one path's queueing delay grows"
MRC_POLICIES = ("rr", "adaptive")
MODES_ALLOWED = ("ecmp", "prr", "plb", "mptcp", *MRC_POLICIES)
NSTAT_KEYS = ("TcpExtTCPSACKReorder", "TcpExtTCPTSReorder", "TcpExtTCPRenoReorder", "TcpRetransSegs",
              "TcpExtTCPDSACKRecv", "TcpExtTCPLostRetransmit", "TcpExtTCPTimeouts")
BG_NET = "fd01:ff:1::"
MSS = 1428


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit",
            "delays_ms": [0, 5] if short else [0, 2, 5, 10], "seconds": 2.0 if short else 6.0,
            "warmup_s": 0.8, "ping_interval_ms": 20, "idle_pings": 25, "policies": list(MRC_POLICIES),
            # the contenders run the same levels before MRC is attached (one
            # flow: ecmp and prr put it on one spine, mptcp on K subflows)
            "modes": list(MODES_ALLOWED),
            "repeat": 1 if short else 3, "mtu": 1500,
            "slow_link": "s1 -> l2: tbf room delay_ms + 20 ms, kept delay_ms full by a window-clamped "
                         "(delay_ms x rate) cubic TCP from NAME-bg via s1 to l2"}


# --------------------------------------------------------------------------- MRC views

def _rx_view(env, fab):
    r = env.mrcctl(fab.ns("h2"), "stats", "--paths", "-j", check=False)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = {}
    # a contender's hosts have no datapath: `stats -j` says {"error": ...}
    return doc if "received" in doc else {"received": [], "reorder": []}


def _tx_view(env, fab):
    r = env.mrcctl(fab.ns("h1"), "stats", "--paths", "-j", check=False)
    try:
        return {x["path_id"]: x for x in json.loads(r.stdout)["sent"] if x["prefix"] == fab.prefix6(2)}
    except (ValueError, KeyError):
        return {}


def _hist_mean(hist):
    """Mean of a log2 histogram (bucket 0: 0; bucket i: [2^(i-1), 2^i)) from midpoints."""
    n = sum(hist)
    if not n:
        return None
    return round(sum(c * (0 if i == 0 else 1.5 * 2 ** (i - 1)) for i, c in enumerate(hist)) / n)


def _diff(a, b, sender_sid):
    from mrc_ebpf.control.stats import percentile
    out = {"paths": [], "reordered": 0, "packets": 0, "reorder_hist": None}
    before = {(x["from"], x["path_id"]): x for x in a["received"]}
    for x in b["received"]:
        if x["from"] != sender_sid:
            continue
        y = before.get((x["from"], x["path_id"]))
        hist = [u - (y["qdelay_hist"][i] if y else 0) for i, u in enumerate(x["qdelay_hist"])]
        pk = x["rx_packets"] - (y["rx_packets"] if y else 0)
        if pk <= 0:
            continue
        out["paths"].append({"path_id": x["path_id"], "packets": pk,
                             "lost": x["lost"] - (y["lost"] if y else 0),
                             "qdelay_p50_us": percentile(hist, 0.5), "qdelay_p99_us": percentile(hist, 0.99),
                             "qdelay_mean_us": _hist_mean(hist)})
    rb = {x["from"]: x for x in a["reorder"]}
    for x in b["reorder"]:
        if x["from"] != sender_sid:
            continue
        y = rb.get(x["from"])
        out["packets"] += x["packets"] - (y["packets"] if y else 0)
        out["reordered"] += x["reordered"] - (y["reordered"] if y else 0)
        h = [u - (y["reorder_hist"][i] if y else 0) for i, u in enumerate(x["reorder_hist"])]
        out["reorder_hist"] = h if out["reorder_hist"] is None else [p + q for p, q in zip(out["reorder_hist"], h)]
    return out


# --------------------------------------------------------------------------- ping

def _ping(env, ns, dst, count, interval_s):
    return env.popen(ns, ["ping", "-6", "-n", "-D", "-c", str(count), "-i", f"{interval_s:g}", "-W", "1", dst])


def _parse(out, since=None, until=None):
    """RTTs (ms) of `ping -D` replies, optionally only those stamped in [since, until] (epoch s)."""
    v = []
    for ts, rtt in re.findall(r"^\[([\d.]+)\].*time=([\d.]+)", out or "", re.M):
        if (since is None or float(ts) >= since) and (until is None or float(ts) <= until):
            v.append(float(rtt))
    return v


def _stop(env, proc):
    """End a ping with SIGINT (it prints what it has) and return its output."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        out = ""
    env.end(proc)
    return out


def _summ(v):
    if not v:
        return None
    s = sorted(v)
    return {"median_ms": round(statistics.median(s), 3), "p10_ms": round(s[int(0.1 * (len(s) - 1))], 3),
            "p90_ms": round(s[int(0.9 * (len(s) - 1))], 3), "n": len(s)}


def _extra(per_spine):
    """s1's median RTT minus the median of the other spines' medians."""
    s1 = per_spine.get("s1")
    others = [v["median_ms"] for k, v in per_spine.items() if k != "s1" and v]
    if not s1 or not others:
        return None
    return round(s1["median_ms"] - statistics.median(others), 3)


# --------------------------------------------------------------------------- the side namespace

def _tbf(env, ns, dev):
    r = env.run(None, ["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev], check=False)
    try:
        q = next(x for x in json.loads(r.stdout) if x.get("kind") == "tbf")
        return {"packets": q["packets"], "drops": q["drops"]}
    except (ValueError, StopIteration, KeyError):
        return {"packets": 0, "drops": 0}


def _bg_up(env, fab, bgns):
    s1, l2 = fab.ns("s1"), fab.ns("l2")
    env.run(None, ["ip", "netns", "add", bgns])
    env.run(None, ["ip", "-n", bgns, "link", "set", "lo", "up"])
    env.run(None, ["ip", "link", "add", "bg0", "netns", bgns, "type", "veth", "peer", "name", "bg", "netns", s1])
    env.run(None, ["ip", "-n", bgns, "addr", "add", f"{BG_NET}2/64", "dev", "bg0", "nodad"])
    env.run(None, ["ip", "-n", s1, "addr", "add", f"{BG_NET}1/64", "dev", "bg", "nodad"])
    env.run(None, ["ip", "-n", bgns, "link", "set", "bg0", "up"])
    env.run(None, ["ip", "-n", s1, "link", "set", "bg", "up"])
    env.run(None, ["ip", "-n", bgns, "route", "add", "default", "via", f"{BG_NET}1", "dev", "bg0"])
    env.run(None, ["ip", "-n", l2, "route", "add", f"{BG_NET}/64", "via", f"{fab.link_net(0, 1, 2)}1",
                   "dev", "s1"])


# --------------------------------------------------------------------------- what a run measured

@dataclasses.dataclass
class Level:
    """One transfer at one extra delay on path 0 (MRC or a contender), as measured."""
    delay_ms: int
    window_clamp: int               # the background's window clamp (bytes; 0: no background)
    seconds: float                  # the transfer's length
    goodput_bps: float              # the receiver's (mrc-perf)
    mptcp_subflows: int | None
    ping_idle: dict[str, str]       # spine -> `ping -D` output before the transfer (background only)
    ping_during: dict[str, str]     # spine -> `ping -D` output around the transfer
    t_done: float                   # epoch s the transfer ended: it is the `seconds` before
    sender_sid: str                 # h1's, as h2 files what it receives
    rx_before: dict                 # h2's `stats --paths -j` (received, reorder) around it
    rx_after: dict
    tx_before: dict[int, dict]      # h1's sent rows to h2's prefix, by path id, around it
    tx_after: dict[int, dict]
    nstat_before: dict[str, int]    # h1's TCP counters around it
    nstat_after: dict[str, int]
    tbf_before: dict[str, int]      # the slow link's tbf (packets, drops) around it
    tbf_after: dict[str, int]
    spines: dict                    # contenders.spines_used over the transfer


@dataclasses.dataclass
class Measured:
    """The whole scenario as measured."""
    capacity_bps: int
    cc: str                                         # the transfers' TCP congestion control
    policies: dict[str, dict[str, list[Level]]]     # MRC policy -> delay (ms, str) -> transfers
    contenders: dict[str, dict[str, list[Level]]]   # contender -> delay (ms, str) -> transfers
    mode_setup: dict[str, dict]                     # contenders.mode's record per mode
    counters: dict[str, dict] = dataclasses.field(default_factory=dict)  # contender -> counter deltas


# --------------------------------------------------------------------------- run


def steps(p: dict) -> int:
    """Measurements run(p) makes (the progress line's total): every mode at every delay."""
    return len(p["modes"]) * p["repeat"] * len(p["delays_ms"])


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab.fabric import parse_rate
    from mrc_ebpf.bench.runner import fabric
    rate = parse_rate(p["rate"])
    cap = p["spines"] * rate
    p["policies"] = [m for m in p["modes"] if m in MRC_POLICIES]
    others = [m for m in p["modes"] if m not in MRC_POLICIES]
    measured = Measured(cap, "", {pol: {str(d): [] for d in p["delays_ms"]} for pol in p["policies"]},
                        {m: {str(d): [] for d in p["delays_ms"]} for m in others}, {})
    levels, clevels = measured.policies, measured.contenders
    ctx = {"port": 5700, "bg_port": 9100, "rate": rate, "cap": cap, "burst": max(rate // 8 // 1000, 3200)}
    K = p["spines"]
    plb = "plb" in others
    with fabric("ro", spines=K, leaves=2, hosts_per_leaf=1, rate=p["rate"], mtu=p["mtu"],
                host_sysctls=p["host_sysctls"], ecn_threshold=contenders.PLB_ECN_THRESHOLD if plb else None,
                ask_ecn=False) as fab:
        measured.cc = env.cc or env.run(fab.ns("h1"),
                                        ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).stdout.strip()
        ctx["link_addr"] = {f"s{k}": f"{fab.link_net(0, k, 2)}2" for k in range(1, K + 1)}
        ctx["bgns"] = f"{fab.name}-bg"
        try:
            _bg_up(env, fab, ctx["bgns"])
            for m in others:
                with contenders.mode(env, fab, m, [1, 2]) as rec:
                    measured.mode_setup[m] = rec
                    c0 = contenders.counters(env, fab, [1, 2], contenders.MPTCP_KEYS + contenders.PLB_KEYS)
                    for rep in range(p["repeat"]):
                        for d in p["delays_ms"]:
                            log(f"reorder: {m}, delay {d} ms, run {rep + 1}/{p['repeat']}", step=True)
                            clevels[m][str(d)].append(_level(env, fab, p, ctx, d))
                    if m in contenders.CONTENDERS:
                        c1 = contenders.counters(env, fab, [1, 2], contenders.MPTCP_KEYS + contenders.PLB_KEYS)
                        measured.counters[m] = contenders.delta_of(c0, c1)
            if p["policies"]:
                log("reorder: attaching MRC on h1, h2")
                fab_mod.attach(fab.name, "h1,h2", p["policies"][0], [])
            for rep in range(p["repeat"]):
                for pol, d in ((pol, d) for pol in p["policies"] for d in p["delays_ms"]):
                    log(f"reorder: {pol}, delay {d} ms, run {rep + 1}/{p['repeat']}", step=True)
                    env.mrcctl(fab.ns("h1"), "path", "policy", fab.prefix6(2), pol)
                    env.mrcctl(fab.ns("h2"), "path", "policy", fab.prefix6(1), pol)
                    levels[pol][str(d)].append(_level(env, fab, p, ctx, d))
        finally:
            subprocess.run(["ip", "netns", "del", ctx["bgns"]], capture_output=True)
    return measured


def _level(env, fab, p, ctx, d) -> Level:
    """One transfer at extra delay d on path 0 (MRC or not)."""
    from mrc_ebpf.lab.fabric import QUEUE_LATENCY
    ctx["port"] += 1
    ctx["bg_port"] += 1
    port, bg_port, rate, burst = ctx["port"], ctx["bg_port"], ctx["rate"], ctx["burst"]
    link_addr, bgns = ctx["link_addr"], ctx["bgns"]
    s1, l2 = fab.ns("s1"), fab.ns("l2")
    u0 = contenders.uplinks(env, fab)
    clamp = int(d * 1e-3 * rate / 8) + 2 * MSS   # the window is a whole number of MSS, rounded down
    env.run(None, ["tc", "-n", s1, "qdisc", "replace", "dev", "l2", "root", "tbf", "rate",
                   f"{rate}bit", "burst", str(burst), "latency",
                   f"{d + 20}ms" if d else QUEUE_LATENCY])
    sink = bg = None
    pings = []
    try:
        if d:
            total = p["warmup_s"] + p["seconds"] + 6
            sink = env.popen(l2, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-sink",
                                  link_addr["s1"], str(bg_port), str(total + 2), str(clamp)])
            sink.stdout.readline()
            bg = env.popen(bgns, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-send", link_addr["s1"],
                                  str(bg_port), str(total), "1", "-", "-", "cubic"])
            bg.stdout.readline()
            time.sleep(p["warmup_s"])
        # the delay as made (background only), on s1's link and on s2's
        idle = {k: _ping(env, fab.ns(k), link_addr[k], p["idle_pings"], 0.01) for k in ("s1", "s2")}
        idle = {k: env.wait(pr, timeout=15)[0] for k, pr in idle.items()}
        # during the transfer, on every spine's link to l2
        n_ping = int((p["seconds"] + 60) * 1000 / p["ping_interval_ms"])
        pings = {k: _ping(env, fab.ns(k), addr, n_ping, p["ping_interval_ms"] / 1000)
                 for k, addr in link_addr.items()}
        a, ta, n_a = _rx_view(env, fab), _tx_view(env, fab), env.nstat(fab.ns("h1"))
        q_a = _tbf(env, s1, "l2")
        doc = env.perf(fab.ns("h1"), fab.ns("h2"), fab.addr6(2), port,
                       ["-t", str(p["seconds"])], p["seconds"])
        t_done = time.time()
        # the transfer is the last `seconds` before the client returned
        outs = {k: _stop(env, pr) for k, pr in pings.items()}
        b, tb, n_b = _rx_view(env, fab), _tx_view(env, fab), env.nstat(fab.ns("h1"))
        q_b = _tbf(env, s1, "l2")
    finally:
        for pr in ([bg, sink] + (list(pings.values()) if isinstance(pings, dict) else [])):
            if pr is not None:
                env.end(pr)
        env.run(None, ["tc", "-n", s1, "qdisc", "replace", "dev", "l2", "root", "tbf", "rate",
                       f"{rate}bit", "burst", str(burst), "latency", QUEUE_LATENCY])
    return Level(d, clamp if d else 0, p["seconds"], read_result(doc)["received_bps"],
                 doc["mrc"]["local"].get("mptcp_subflows"), idle, outs, t_done, fab.host_sid(1),
                 a, b, ta, tb, n_a, n_b, q_a, q_b, contenders.spines_used(u0, contenders.uplinks(env, fab)))


# --------------------------------------------------------------------------- analysis

def level_result(m: Level, cap: int) -> dict:
    """One transfer's record: goodput, the delay made (ping), reordering
    (MRC's and TCP's), and per path its share, queueing delay and downs."""
    idle = {k: _summ(_parse(o)) for k, o in m.ping_idle.items()}
    during = {k: _summ(_parse(o, m.t_done - m.seconds, m.t_done - 0.1)) for k, o in m.ping_during.items()}
    view = _diff(m.rx_before, m.rx_after, m.sender_sid)
    total_pk = sum(x["packets"] for x in view["paths"]) or 1
    for x in view["paths"]:
        x["share"] = round(x["packets"] / total_pk, 3)
        t0, t1 = m.tx_before.get(x["path_id"], {}), m.tx_after.get(x["path_id"], {})
        x["downs"] = t1.get("downs", 0) - t0.get("downs", 0)
    rx = m.goodput_bps
    return _with_spines({
        "goodput_bps": rx, "fraction": rx / cap, "bg_window_clamp_bytes": m.window_clamp,
        "ping_idle": idle, "ping_idle_extra_ms": (round(idle["s1"]["median_ms"] -
                                                        idle["s2"]["median_ms"], 3)
                                                  if idle.get("s1") and idle.get("s2") else None),
        "ping_during": during, "ping_during_extra_ms": _extra(during),
        "slow_link_tbf": {k: m.tbf_after[k] - m.tbf_before[k] for k in m.tbf_before},
        "nstat": {k: m.nstat_after.get(k, 0) - m.nstat_before.get(k, 0) for k in NSTAT_KEYS},
        "mrc_reordered": view["reordered"], "mrc_packets": view["packets"],
        "mrc_reorder_fraction": view["reordered"] / max(1, view["packets"]),
        "mrc_reorder_hist": view["reorder_hist"], "paths": view["paths"],
        "mptcp_subflows": m.mptcp_subflows},
        m.spines)


def summarize(p: dict, measured: Measured) -> dict:
    """The results: every transfer's record, per mode and delay their spread, the contenders' proofs."""
    cap, cc = measured.capacity_bps, measured.cc
    levels = {pol: {d: [level_result(x, cap) for x in xs] for d, xs in by_d.items()}
              for pol, by_d in measured.policies.items()}
    clevels = {m: {d: [level_result(x, cap) for x in xs] for d, xs in by_d.items()}
               for m, by_d in measured.contenders.items()}
    proofs = {}
    for m, delta in measured.counters.items():
        first = clevels[m][str(p["delays_ms"][0])][0]
        proofs[m] = contenders.proof(m, measured.mode_setup[m], first["spines"], delta,
                                     first.get("mptcp_subflows"))
    return {"capacity_bps": cap, "tcp_congestion_control": cc,
            "policies": {pol: _summary(by_delay) for pol, by_delay in levels.items()},
            "contenders": {m: _summary(by_delay) for m, by_delay in clevels.items()},
            "mode_setup": measured.mode_setup, "proof": proofs,
            "notes": ["path 0 crosses s1 (the slowed link s1->l2); 'ping extra' = s1's median RTT on its "
                      "link to l2 minus the others' (idle: background only; during: with our transfer)",
                      "MRC qdelay is the receiver's one-way delay above each path's minimum since attach "
                      "(log2 histogram; mean from bucket midpoints)",
                      "contenders (no MRC): path 0's share is s1's share of l1's uplink packets",
                      f"TCP congestion control of the transfer: {cc}"]}


def _with_spines(rec, used):
    """Where MRC's own view has no paths (a contender), path 0's share is s1's uplink share."""
    rec["spines"] = used
    if not rec["paths"]:
        total = sum(used["packets"].values()) or 1
        rec["paths"] = [{"path_id": k - 1, "packets": used["packets"][f"s{k}"],
                         "share": round(used["packets"][f"s{k}"] / total, 3), "downs": None,
                         "qdelay_mean_us": None, "qdelay_p50_us": None}
                        for k in range(1, len(used["packets"]) + 1)]
    return rec


def _summary(levels: dict) -> dict:
    summary = {}
    for d, rs in levels.items():
        def path0(r, key):
            return next((x[key] for x in r["paths"] if x["path_id"] == 0), None)

        def others(r, key):
            v = [x[key] for x in r["paths"] if x["path_id"] != 0 and x[key] is not None]
            return statistics.median(v) if v else None
        summary[d] = {"fraction": spread([r["fraction"] for r in rs]),
                      "ping_idle_extra_ms": spread([r["ping_idle_extra_ms"] for r in rs]),
                      "ping_during_extra_ms": spread([r["ping_during_extra_ms"] for r in rs]),
                      "ping_during_s1_ms": spread([(r["ping_during"].get("s1") or {}).get("median_ms") for r in rs]),
                      "mrc_reorder_fraction": spread([r["mrc_reorder_fraction"] for r in rs]),
                      "sack_reorder": spread([r["nstat"]["TcpExtTCPSACKReorder"] for r in rs]),
                      "retransmits": spread([r["nstat"]["TcpRetransSegs"] for r in rs]),
                      "dsack_recv": spread([r["nstat"]["TcpExtTCPDSACKRecv"] for r in rs]),
                      "slow_path_qdelay_mean_us": spread([path0(r, "qdelay_mean_us") for r in rs]),
                      "other_paths_qdelay_mean_us": spread([others(r, "qdelay_mean_us") for r in rs]),
                      "slow_path_qdelay_p50_us": spread([path0(r, "qdelay_p50_us") for r in rs]),
                      "slow_path_share": spread([path0(r, "share") for r in rs]),
                      "slow_path_downs": spread([path0(r, "downs") for r in rs]),
                      "slow_link_drops": spread([r["slow_link_tbf"]["drops"] for r in rs]),
                      "runs": rs}
    return summary


def table(results: dict):
    headers = ["policy", "extra ms (set)", "ping extra idle", "ping extra during", "MRC qdelay mean us path0 / others",
               "s1->l2 drops", "path0 share", "path0 downs", "goodput frac", "MRC reord frac", "SACKReorder",
               "retrans", "DSACKs"]
    rows = []
    every = {**results.get("contenders", {}), **results["policies"]}
    for pol, d, s in ((pol, d, s) for pol, by_d in every.items() for d, s in by_d.items()):
        rows.append([pol, d, fmt_spread(s["ping_idle_extra_ms"]), fmt_spread(s["ping_during_extra_ms"]),
                     f"{fmt_spread(s['slow_path_qdelay_mean_us'])} / {fmt_spread(s['other_paths_qdelay_mean_us'])}",
                     fmt_spread(s["slow_link_drops"]), fmt_spread(s["slow_path_share"]), fmt_spread(s["slow_path_downs"]),
                     fmt_spread(s["fraction"]), fmt_spread(s["mrc_reorder_fraction"]), fmt_spread(s["sack_reorder"]),
                     fmt_spread(s["retransmits"]), fmt_spread(s["dsack_recv"])])
    return headers, rows


def plot(results: dict, plt):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for pol, by_d in results["policies"].items():
        ds = list(by_d)
        xs = [by_d[d]["ping_idle_extra_ms"]["median"] for d in ds]
        xs = [x if x is not None else float(d) for x, d in zip(xs, ds)]
        line = ax1.plot(xs, [by_d[d]["fraction"]["median"] for d in ds], "o-",
                        label=f"{pol}: goodput / capacity")[0]
        ax1.plot(xs, [by_d[d]["mrc_reorder_fraction"]["median"] for d in ds], "s--", color=line.get_color(),
                 label=f"{pol}: MRC reordered fraction")
        ax1.plot(xs, [by_d[d]["slow_path_share"]["median"] for d in ds], "^:", color=line.get_color(),
                 label=f"{pol}: path 0's share of packets")
    for m, by_d in results.get("contenders", {}).items():
        ds = list(by_d)
        xs = [by_d[d]["ping_idle_extra_ms"]["median"] for d in ds]
        xs = [x if x is not None else float(d) for x, d in zip(xs, ds)]
        ax1.plot(xs, [by_d[d]["fraction"]["median"] for d in ds], "x-", lw=0.8, label=f"{m}: goodput / capacity")
    ax1.set_xlabel("extra delay on path 0, ms (ping, background only)")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=7)
    first = next(iter(results["policies"]))
    for d, s in results["policies"][first].items():
        h = s["runs"][0]["mrc_reorder_hist"] or []
        if h:
            ax2.plot(range(len(h)), h, marker=".", label=f"{first}, {d} ms")
    ax2.set_yscale("symlog")
    ax2.set_xlabel("reorder distance bucket (log2 packets)")
    ax2.set_ylabel("packets")
    ax2.legend(fontsize=7)
    return fig
