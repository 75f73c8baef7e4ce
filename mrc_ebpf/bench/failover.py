"""Goodput over time across a far-side black hole of one of K paths, for
MRC (rr spraying with datapath failover) and kernel ECMP.

Fabric: K spines, h1 (under l1) sends to h2 (under l2).  At t_fail the
link s1 -> l2 is black-holed on its receiving end (faults.inject on l2's
TC ingress from s1; s1 and h1 see nothing wrong).  Loading the fault
program is a bcc compile (seconds), so it is installed before the run
(`fabric fail s1>l2 --mode loss=1e-9`: drops practically nothing) and at
t_fail its pinned config is switched to blackhole with one map write:
t_fail is exact to microseconds.  Healed between runs.

UDP: a paced sender (mrc_ebpf/bench/flowtool.py, 16 flows = 16 source
ports, offered load `load` x K x rate, which the remaining K-1 spines can
carry) stamps every datagram with its send time; the receiver logs every
arrival (CLOCK_MONOTONIC, shared by all namespaces).  From that log:
goodput in 1 ms arrival buckets (the plot); packets lost = sent - received;
the outage = from t_fail to the end of the last 1 ms send-time bucket
whose delivered fraction is below 90% (the offered load fits the remaining
capacity, so after recovery every bucket is delivered whole; MRC's one
probe per 5 ms into the hole costs ~1/25 of a bucket, under the 10%).
ECMP never recovers from a gray failure: the flows hashed onto s1 stay in
the hole, so its outage lasts to the end of the run (recovered=false).
The sender's MRC events (`mrcctl stats --events -j`) give the time the
datapath took the path down, measured from the send time of the first
datagram the hole ate.

TCP: `conns` bulk TCP connections (flowtool tcp-send/tcp-recv); the
receiver logs (arrival, bytes) per read; goodput in 1 ms buckets; outage =
time from t_fail until the 10 ms moving average is back at 90% of
min(goodput before the failure, remaining capacity) for good (ECMP: the
connections in the hole stall; others may grow into the capacity).
Retransmissions and RTOs are the sender namespace's nstat deltas
(TcpRetransSegs, TcpExtTCPTimeouts, TcpExtTCPLossProbes,
TcpExtTCPSpuriousRTOs).
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from .flowtool import read_log
from .runner import PY, fmt3, log, mmm

TITLE = "goodput across a far-side black hole of 1 of 4 paths: MRC failover vs kernel ECMP"
NSTAT_KEYS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPSpuriousRTOs",
              "TcpExtTCPSACKReorder")


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "seconds": 1.5 if short else 4.0,
            "fail_at": 0.5 if short else 1.0, "udp_flows": 16, "load": 0.6, "udp_size": 1200,
            "conns": 4, "repeat": 1 if short else 3, "modes": ["ecmp", "mrc"], "protocols": ["udp", "tcp"],
            "bucket_ms": 1.0, "threshold": 0.9, "fault": "s1>l2 blackhole (l2 ingress from s1)",
            "mrc": "rr, ack-timeout 1000 us, probe 5000 us (mrcctl attach defaults)"}


def _arm(fab_mod, fab):
    fab_mod.fail(fab.name, ["s1>l2"], "loss=1e-9")


def _trigger(fab):
    """Switch the armed fault to blackhole: one write to its pinned config."""
    from .. import faults
    t = time.monotonic_ns()
    faults.rearm(fab.ns("l2"), "s1", "blackhole")
    return t


def _buckets(times_ns, weights, t0, t1, width_ns):
    n = max(1, int((t1 - t0) // width_ns))
    out = [0.0] * n
    for t, w in zip(times_ns, weights):
        i = int((t - t0) // width_ns)
        if 0 <= i < n:
            out[i] += w
    return out


def _udp(env, fab, p, port, fail):
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    fd, path = tempfile.mkstemp(prefix="mrcbench-", suffix=".log")
    os.close(fd)
    try:
        rcv = env.popen(h2, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-recv", fab.addr6(2), str(port),
                             str(p["seconds"] + 1.5), path])
        rcv.stdout.readline()
        cap = p["spines"] * p["rate_bps"]
        snd = env.popen(h1, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-send", fab.addr6(2), str(port),
                             str(p["seconds"]), str(p["udp_flows"]), str(p["load"] * cap), str(p["udp_size"])])
        time.sleep(p["fail_at"])
        t_fail = fail()
        out, _ = env.wait(snd, timeout=p["seconds"] + 30)
        env.wait(rcv, timeout=p["seconds"] + 30)
        sent = json.loads(out.strip().splitlines()[-1])
        recs = read_log(path, 4)
    finally:
        os.unlink(path)
    got = {}
    for t, f, q, ts in recs:
        got[(f, q)] = (t, ts)
    lost_sent = []              # we cannot know a lost packet's send time exactly: interpolate per flow
    n_sent = sum(sent["sent"])
    # send times of received packets, per flow, to place the lost ones
    per_flow = {}
    for (f, q), (t, ts) in got.items():
        per_flow.setdefault(f, {})[q] = ts
    for f, n in enumerate(sent["sent"]):
        have = per_flow.get(f, {})
        prev = sent["t0"]
        for q in range(n):
            if q in have:
                prev = have[q]
            else:
                lost_sent.append(prev)          # at or just after the previous received one
    t0, t1 = sent["t0"], sent["end"]
    W = int(p["bucket_ms"] * 1e6)
    arr = _buckets([r[0] for r in recs], [p["udp_size"] * 8 / (p["bucket_ms"] / 1e3) for _ in recs], t0, t1, W)
    sent_b = _buckets([v[1] for v in got.values()], [1] * len(got), t0, t1, W)
    lost_b = _buckets(lost_sent, [1] * len(lost_sent), t0, t1, W)
    fail_i = int((t_fail - t0) // W)
    bad = [i for i in range(fail_i, len(sent_b))
           if sent_b[i] + lost_b[i] > 0 and sent_b[i] / (sent_b[i] + lost_b[i]) < p["threshold"]]
    last_bad = bad[-1] if bad else None
    end_i = len(sent_b) - 1
    recovered = last_bad is None or last_bad < end_i - int(50 / p["bucket_ms"])
    outage_ms = ((last_bad + 1) * p["bucket_ms"] - (t_fail - t0) / 1e6) if last_bad is not None else 0.0
    first_loss = min([x for x in lost_sent if x >= t_fail - 5_000_000], default=None)
    return {"sent": n_sent, "received": len(got), "lost": n_sent - len(got), "outage_ms": max(0.0, outage_ms),
            "recovered": recovered, "below_threshold_ms": len(bad) * p["bucket_ms"],
            "t_fail_ns": t_fail, "t0_ns": t0, "first_loss_sent_ns": first_loss,
            "goodput_bps_1ms": [round(x) for x in arr], "offered_bps": p["load"] * cap}


def _tcp(env, fab, p, port, fail):
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    fd, path = tempfile.mkstemp(prefix="mrcbench-", suffix=".log")
    os.close(fd)
    try:
        rcv = env.popen(h2, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-recv", fab.addr6(2), str(port),
                             str(p["seconds"] + 3), str(p["conns"]), path])
        rcv.stdout.readline()
        before = env.nstat(h1)
        snd = env.popen(h1, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-send", fab.addr6(2), str(port),
                             str(p["seconds"]), str(p["conns"])])
        time.sleep(p["fail_at"])
        t_fail = fail()
        out, _ = env.wait(snd, timeout=p["seconds"] + 30)
        after = env.nstat(h1)
        env.wait(rcv, timeout=p["seconds"] + 30)
        sent = json.loads(out.strip().splitlines()[-1])
        recs = read_log(path, 2)
    finally:
        os.unlink(path)
    t0, t1 = sent["t0"], sent["end"]
    W = int(p["bucket_ms"] * 1e6)
    arr = _buckets([r[0] for r in recs], [r[1] * 8 / (p["bucket_ms"] / 1e3) for r in recs], t0, t1, W)
    fail_i = int((t_fail - t0) // W)
    k = max(1, int(10 / p["bucket_ms"]))
    avg = [sum(arr[max(0, i - k + 1):i + 1]) / min(k, i + 1) for i in range(len(arr))]
    pre = arr[max(0, fail_i - int(300 / p["bucket_ms"])):fail_i]
    pre_bps = sum(pre) / len(pre) if pre else 0.0
    remaining = (p["spines"] - 1) * p["rate_bps"]
    ref = min(pre_bps, remaining)
    bad = [i for i in range(fail_i, len(avg)) if avg[i] < p["threshold"] * ref]
    last_bad = bad[-1] if bad else None
    recovered = last_bad is None or last_bad < len(avg) - 1 - int(100 / p["bucket_ms"])
    outage_ms = ((last_bad + 1) * p["bucket_ms"] - (t_fail - t0) / 1e6) if last_bad is not None else 0.0
    post = arr[fail_i:]
    nst = {k2: after.get(k2, 0) - before.get(k2, 0) for k2 in NSTAT_KEYS}
    return {"bytes": sum(r[1] for r in recs), "pre_failure_bps": pre_bps,
            "post_failure_bps": sum(post) / len(post) if post else 0.0, "reference_bps": ref,
            "outage_ms": max(0.0, outage_ms), "recovered": recovered, "nstat": nst,
            "retransmits": nst["TcpRetransSegs"], "rtos": nst["TcpExtTCPTimeouts"],
            "t_fail_ns": t_fail, "t0_ns": t0, "goodput_bps_1ms": [round(x) for x in arr]}


def _events(env, fab, since_ns):
    r = env.mrcctl(fab.ns("h1"), "stats", "--events", "-j", check=False)
    try:
        evs = json.loads(r.stdout)["events"]
    except (ValueError, KeyError):
        return []
    return [e for e in evs if e["ns"] >= since_ns and e.get("prefix") == fab.prefix6(2)]


def run(p: dict, env) -> dict:
    from .. import fabric as fab_mod
    from ..fabric import parse_rate
    from .runner import fabric
    p["rate_bps"] = parse_rate(p["rate"])
    runs = {m: {proto: [] for proto in p["protocols"]} for m in p["modes"]}
    port = 5500
    with fabric("fo", spines=p["spines"], leaves=2, hosts_per_leaf=1, rate=p["rate"]) as fab:
        fail = lambda: _trigger(fab)  # noqa: E731
        attached = False
        for mode in p["modes"]:
            if mode == "mrc" and not attached:
                log("failover: attaching MRC on h1, h2 (rr)")
                fab_mod.attach(fab.name, "h1,h2", "rr", [])
                attached = True
                time.sleep(0.5)
            for rep in range(p["repeat"]):
                for proto in p["protocols"]:
                    port += 1
                    log(f"failover: {mode} {proto}, run {rep + 1}/{p['repeat']}")
                    _arm(fab_mod, fab)
                    try:
                        r = (_udp if proto == "udp" else _tcp)(env, fab, p, port, fail)
                    finally:
                        fab_mod.heal(fab.name, None)
                    if mode == "mrc":
                        evs = _events(env, fab, r["t_fail_ns"] - 1_000_000)
                        down = [e for e in evs if e["type"] == "down" and e["path_id"] == 0]
                        r["events"] = evs[:50]
                        if down:
                            r["exclusion_after_us"] = down[0]["after_us"]
                            fl = r.get("first_loss_sent_ns")
                            r["exclusion_from_first_loss_us"] = (round((down[0]["ns"] - fl) / 1e3, 1)
                                                                 if fl else None)
                            r["exclusion_from_fail_us"] = round((down[0]["ns"] - r["t_fail_ns"]) / 1e3, 1)
                    runs[mode][proto].append(r)
                    time.sleep(0.3)
    summary = {}
    for mode, by in runs.items():
        summary[mode] = {}
        for proto, rs in by.items():
            s = {"outage_ms": mmm([r["outage_ms"] for r in rs]),
                 "recovered": [r["recovered"] for r in rs], "runs": rs}
            if proto == "udp":
                s["lost"] = mmm([r["lost"] for r in rs])
                s["sent"] = mmm([r["sent"] for r in rs])
            else:
                s["retransmits"] = mmm([r["retransmits"] for r in rs])
                s["rtos"] = mmm([r["rtos"] for r in rs])
                s["pre_failure_bps"] = mmm([r["pre_failure_bps"] for r in rs])
                s["post_failure_bps"] = mmm([r["post_failure_bps"] for r in rs])
            if mode == "mrc":
                s["exclusion_from_first_loss_us"] = mmm([r.get("exclusion_from_first_loss_us") for r in rs])
                s["exclusion_from_fail_us"] = mmm([r.get("exclusion_from_fail_us") for r in rs])
            summary[mode][proto] = s
    notes = []
    for mode in summary:
        for proto, s in summary[mode].items():
            rec = "recovered" if all(s["recovered"]) else "NOT recovered (to end of run) in some runs"
            notes.append(f"{mode} {proto}: outage {fmt3(s['outage_ms'])} ms, {rec}")
    return {"modes": summary, "notes": notes}


def table(results: dict):
    headers = ["mode", "proto", "outage ms", "recovered", "UDP lost", "TCP retrans", "TCP RTOs",
               "MRC exclusion us (from 1st loss)"]
    rows = []
    for mode, by in results["modes"].items():
        for proto, s in by.items():
            rows.append([mode, proto, fmt3(s["outage_ms"]), f"{sum(s['recovered'])}/{len(s['recovered'])}",
                         fmt3(s.get("lost")) if "lost" in s else "",
                         fmt3(s.get("retransmits")) if "retransmits" in s else "",
                         fmt3(s.get("rtos")) if "rtos" in s else "",
                         fmt3(s.get("exclusion_from_first_loss_us")) if "exclusion_from_first_loss_us" in s
                         else ""])
    return headers, rows


def plot(results: dict, plt):
    protos = list(next(iter(results["modes"].values())))
    fig, axes = plt.subplots(len(protos), 1, figsize=(9, 3.2 * len(protos)), squeeze=False)
    for ax, proto in zip(axes[:, 0], protos):
        for mode, by in results["modes"].items():
            r = by[proto]["runs"][0]
            t_fail_ms = (r["t_fail_ns"] - r["t0_ns"]) / 1e6
            g = r["goodput_bps_1ms"]
            xs = [i - t_fail_ms for i in range(len(g))]
            ax.plot(xs, [v / 1e6 for v in g], lw=0.4, alpha=0.5)
            k = 10
            avg = [sum(g[max(0, i - k + 1):i + 1]) / min(k, i + 1) / 1e6 for i in range(len(g))]
            ax.plot(xs, avg, lw=1.2, label=f"{mode} (10 ms avg; outage {r['outage_ms']:.1f} ms)")
        ax.axvline(0, color="red", lw=0.8)
        ax.set_xlim(-200, 800)
        ax.set_xlabel("ms since the black hole")
        ax.set_ylabel(f"{proto} goodput Mbit/s (1 ms)")
        ax.legend(fontsize=7)
    return fig
