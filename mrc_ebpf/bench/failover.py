"""Goodput over time across a far-side black hole of one of K paths, for
MRC (rr spraying with datapath failover) and kernel ECMP.

Fabric: K spines, h1 (under l1) sends to h2 (under l2).  At t_fail the
link s1 -> l2 is black-holed on its receiving end (faults.inject on l2's
TC ingress from s1; s1 and h1 see nothing wrong).  Loading the fault
program takes a second even from the build cache (a compile, uncached),
so it is installed before the run
(`fabric fail s1>l2 --mode loss=1e-9`: drops practically nothing) and at
t_fail its pinned config is switched to blackhole with one map write
(faults.rearm); t_fail is the time that call returned (`trigger_us` is how
long the whole call took; the write is its last step).  The failure
instant is timed from the sender's own start ("started" line), so the
pre-failure period is `fail_at` of real traffic.  Between runs the fault
is switched back to loss=1e-9 the same way (one compile per scenario);
healed at the end.

UDP load: `load` x K x rate of payload (0.3: 60 Mbit/s on 4 x 50), 16
flows; why 0.3: docs/design/failover.md.  ECMP keeps 3/4 of the load
whatever it is: 75% < 90%.

ECMP flows are not left to chance: before the runs, source ports are
picked by probing (a few packets or SYNs per candidate port from h1,
counted on l1's uplinks) so that exactly udp_flows/K UDP flows and
conns/K TCP connections hash onto each spine, s1 included, as an even
hash would.  MRC sprays per packet, so its ports do not matter (the same
ones are used).

The contenders (prr, plb, mptcp: bench/contenders.py) run the TCP part
only, on flow-label hashing leaves: their connections (subflows) sit where
their random flow labels hash them, so ports cannot be calibrated; the
fault is armed on every spine's link to l2 and the spine black-holed is
the one that carried most of h1's packets before the failure
(`failed_spine`): the failure always hits the contender's traffic.  prr
also gets a witness of its own (one connection steered onto s1 by
reconnecting, then the hole: after its RTO its packets show up on another
spine's counters), plb its TcpExtTCPPLBRehash count, mptcp its MP_JOINs
and the spines its subflows crossed.

Measures, per run (UDP and TCP):
  * goodput over time in `bucket_ms` buckets.  UDP: the payload of the
    datagrams *sent* in the bucket that arrived (within `late_ms`), from
    the sender's log of every datagram and the receiver's log of every
    arrival; on this axis a sender the loaded machine starves for a
    millisecond, or bursts after, offers and is owed exactly that, and a
    datagram held in a queue counts for when it left, so what is left is
    loss - what a black hole does.  The arrival-time goodput is kept too
    (`arrival_goodput_bps_1ms`, `arrival_axis`: the same outage measure
    on it, informational: on a loaded 2-core machine the sender's
    catch-up bursts and MRC's short exclusions of healthy paths, which
    push their turns onto one neighbour, move arrivals by milliseconds
    and dip 10 ms windows without any loss).  TCP: bytes per bucket at
    the kernel's receive time (SO_TIMESTAMPNS of reads of <= 64 KiB);
  * reference = what the surviving paths can carry of the offered load:
    min(offered, (K-1) x rate x payload/wire) after the failure.  UDP's
    offered load is counted per bucket from the sender's own log; TCP's
    is its goodput over the `pre_ms` before the failure;
  * outage = from t_fail to the end of the last `window_ms` window
    (sliding by one bucket; TCP: `tcp_window_ms`) whose goodput is below
    `threshold` x the reference, looking at the run but its last
    `tail_ms` (the senders winding down).  TCP gets 100 ms windows
    because a bulk TCP flow's own goodput dips below 90% of its mean in
    many 10 ms windows with nothing failed (docs/design/failover.md):
    the `pre_failure_windows_below` fields are that noise floor, the
    same test run on the `pre_ms` before the failure.  A UDP window whose
    reference is under `judged` (0.5) of the nominal one is not judged
    either way (`unjudged_ms`): the loaded machine can starve the sender
    for 100 ms and more, and a window it offered one datagram in is 0%
    or 100% on that datagram alone (one of MRC's probes into the hole).
    "Recovered" needs at least `stable_ms` of good (or unjudged)
    windows after it; otherwise the outage lasts "until the end"
    (outage_ms None, outage_until_end_ms the time from t_fail to the
    end).  A 10 ms average hides a dip of a few ms (MRC's exclusion: 25%
    short for 1 ms is 2.5% of a window), so MRC's outage is often 0; the
    loss counts (lost_first_10ms) and the events show that dip instead;
  * recovery_ms: from t_fail to the end of the last window below before
    the first good window that starts after t_fail (0: that first one is
    good), and dips_after_recovery: the share of later windows below.
    The outage above ends at the last dip wherever it is, and a bulk TCP
    flow's sawtooth dips 100 ms windows below 90% of the line with nothing
    failed: `pre_failure_windows_below_capacity` is how often, before the
    failure, against the four paths' capacity, to set the later dips by;
  * UDP packets lost = sent (sender's log) - received, split by send time
    before/after t_fail and per flow; for ECMP also the datagrams sent
    after t_fail on the flows calibrated onto s1 (what the hole must eat,
    exactly); for MRC the per-path tx (h1) - rx (h2) counter deltas;
  * TCP: retransmissions and RTOs (sender namespace nstat deltas), and
    per connection the bytes after the failure: a connection that
    delivers nothing in the second half of the post-failure period is
    stalled, and a run with a stalled connection has not recovered
    (the other connections may fill the remaining capacity, so the sum
    alone would hide a transfer that never completes); each connection's
    longest receive gap from the failure on (`longest_gap_ms`; the run's
    worst in the summary) and its goodput in `conn_bucket_ms` buckets (the
    plot draws every connection);
  * MRC: the sender's path-state events (`mrcctl stats --events -j`):
    when s1's path went down after t_fail (from t_fail and from the first
    datagram the hole ate), or that it was already down at t_fail, and
    how often the healthy paths went down meanwhile.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from mrc_ebpf.datapath import layout
from mrc_ebpf.lab import netns
from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.flowtool import read_log
from mrc_ebpf.bench.runner import PY, fmt_spread, log, spread

TITLE = "goodput across a far-side black hole of 1 of 4 paths: MRC failover vs kernel ECMP, PRR, PLB, MPTCP"
MODES_ALLOWED = ("ecmp", "prr", "plb", "mptcp", "mrc")
NSTAT_KEYS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPSpuriousRTOs",
              "TcpExtTCPSACKReorder")
MRC_OVERHEAD = layout.encap_len(2)        # a path through a spine: 2 segments (128 bytes)
ETH, IP6, UDP, TCP_HDR = 14, 40, 8, 32    # TCP with timestamps


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "seconds": 1.5 if short else 4.0,
            "fail_at": 0.5 if short else 1.0, "udp_flows": 16, "load": 0.3, "udp_size": 1200,
            "conns": 4, "repeat": 1 if short else 3, "modes": list(MODES_ALLOWED), "protocols": ["udp", "tcp"],
            # the contenders are TCP's own repathing: they run the TCP part only
            "contender_protocols": ["tcp"], "conn_bucket_ms": 10,
            "bucket_ms": 1.0, "window_ms": 10, "tcp_window_ms": 100, "threshold": 0.9, "stable_ms": 50, "pre_ms": 300,
            "late_ms": 100, "tail_ms": 30, "judged": 0.5,
            "mtu": 1500, "fault": "s1>l2 blackhole (l2 ingress from s1)",
            "mrc_policy": "rr", "mrc": f"ack-timeout {layout.TIMER_DEFAULTS['ack_timeout_us']} us, "
                                       f"probe {layout.TIMER_DEFAULTS['probe_us']} us (mrcctl attach defaults)",
            # no ECN marking: at 1 ms, classic ECN holds cubic under the 90%
            # line the outage is measured against (README, collisions)
            "ecn_threshold": None}


def _arm(fab_mod, fab, spines=("s1",)):
    fab_mod.fail(fab.name, [f"{s}>l2" for s in spines], "loss=1e-9")


def _disarm(fab, spines=("s1",)):
    """Back to the armed state (practically no drops) between runs: one map
    write again, not a heal and a new inject (a program load each)."""
    from mrc_ebpf.lab import faults
    for s in spines:
        faults.rearm(fab.ns("l2"), s, "loss", 1e-9)


def _trigger(fab, spine="s1"):
    """Switch the armed fault to blackhole: one write to its pinned config."""
    from mrc_ebpf.lab import faults
    a = time.monotonic_ns()
    faults.rearm(fab.ns("l2"), spine, "blackhole")
    b = time.monotonic_ns()
    return b, round((b - a) / 1e3, 1)


def _busiest_trigger(env, fab, since: dict, chosen: list):
    """A trigger for the contenders, whose connections (or subflows) sit
    where their random flow labels hashed them, not on calibrated ports:
    black-hole the spine that carried the most of h1's packets since
    `since` (l1's uplink counters), so the failure always hits traffic.
    The spine goes into `chosen`."""
    def trigger():
        now = contenders.uplinks(env, fab)
        spine = max(now, key=lambda k: now[k] - since.get(k, 0))
        chosen.append(spine)
        return _trigger(fab, spine)
    return trigger


# --------------------------------------------------------------------------- ECMP calibration

def _uplink_tx(env, fab, K):
    r = env.run(None, ["ip", "-n", fab.ns("l1"), "-s", "-j", "link", "show"])
    tx = {d["ifname"]: d["stats64"]["tx"]["packets"] for d in json.loads(r.stdout)}
    return [tx.get(f"s{k}", 0) for k in range(1, K + 1)]


def _probe(fab, proto, sport, dport, n):
    """Send n packets (UDP) or n SYNs (TCP, refused: no listener yet) of the
    flow (h1:sport -> h2:dport) from h1."""
    src, dst = fab.addr6(1), fab.addr6(2)
    with netns.inside(fab.ns("h1")):
        for _ in range(n if proto == "tcp" else 1):
            kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
            s = socket.socket(socket.AF_INET6, kind)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((src, sport))
                if proto == "tcp":
                    s.settimeout(1.0)
                    try:
                        s.connect((dst, dport))
                    except OSError:
                        pass
                else:
                    for _ in range(n):
                        s.sendto(b"x" * 64, (dst, dport))
            finally:
                s.close()


def _calibrate(env, fab, K, proto, dport, per_spine, first_port):
    """Source ports such that exactly per_spine flows of `proto` to dport
    hash onto each spine at l1, in the order s1, s2, .., s1, s2, ..
    Returns (ports, spine index of each, candidates tried)."""
    n = 3
    chosen = [[] for _ in range(K)]
    port, tried = first_port, 0
    while any(len(c) < per_spine for c in chosen) and tried < 400:
        port += 1
        tried += 1
        before = _uplink_tx(env, fab, K)
        _probe(fab, proto, port, dport, n)
        time.sleep(0.01)
        d = [b - a for a, b in zip(before, _uplink_tx(env, fab, K))]
        hit = [k for k in range(K) if d[k] >= n]
        if len(hit) != 1 or sum(d) - d[hit[0]] >= n:
            continue                         # ambiguous (other traffic): skip the port
        if len(chosen[hit[0]]) < per_spine:
            chosen[hit[0]].append(port)
    ports, spines = [], []
    for i in range(per_spine):
        for k in range(K):
            if i < len(chosen[k]):
                ports.append(chosen[k][i])
                spines.append(k)
    return ports, spines, tried


# --------------------------------------------------------------------------- analysis

def _buckets(times_ns, weights, t0, n, width_ns):
    out = [0.0] * n
    for t, w in zip(times_ns, weights):
        i = int((t - t0) // width_ns)
        if 0 <= i < n:
            out[i] += w
    return out


def _below(p, good, ref, i_from, i_to, k, judged=None):
    """Windows of k buckets ending at i_from..i_to-1 whose goodput is below
    threshold x ref(first bucket, last bucket + 1).  With `judged`, only
    windows whose reference is at least `judged` count either way (a
    window the starved sender offered a datagram or two in says nothing:
    one lost probe would make it 100% loss); the others are listed in
    judged_out if it is a list."""
    bad = []
    for i in range(max(i_from, k - 1), i_to):
        want = ref(i - k + 1, i + 1)
        if judged is not None and want < judged[0]:
            judged[1].append(i)
        elif sum(good[i - k + 1:i + 1]) < p["threshold"] * want:
            bad.append(i)
    return bad


def _noise_floor(p, good, ref, t0, t_fail, window_ms, judged=None):
    """The same test on the `pre_ms` before the failure (against the
    pre-failure reference): how often the measure dips with nothing wrong."""
    W = int(p["bucket_ms"] * 1e6)
    k = max(1, int(round(window_ms / p["bucket_ms"])))
    fail_i = int((t_fail - t0) // W)
    start = max(0, fail_i - int(p["pre_ms"] / p["bucket_ms"])) + k - 1
    if fail_i <= start:
        return None
    j = None if judged is None else (judged * k, [])
    bad = _below(p, good, ref, start, fail_i, k, j)
    n = fail_i - start - (len(j[1]) if j else 0)
    return round(len(bad) / n, 3) if n > 0 else None


def _outage(p, good, ref, t0, t_fail, n, window_ms, judged=None):
    """good: payload bits per bucket; ref(i0, i1) -> the reference bits for
    buckets i0..i1-1.  Windows of window_ms sliding by one bucket, those
    ending after t_fail; see the module's doc."""
    W = int(p["bucket_ms"] * 1e6)
    k = max(1, int(round(window_ms / p["bucket_ms"])))
    fail_i = int((t_fail - t0) // W)
    n -= int(p["tail_ms"] / p["bucket_ms"])     # the senders' last moments are not the network's
    j = None if judged is None else (judged * k, [])
    bad = _below(p, good, ref, fail_i, n, k, j)
    last_bad = bad[-1] if bad else None
    end_ns = t0 + n * W
    recovered = last_bad is None or (n - 1 - last_bad) * p["bucket_ms"] >= p["stable_ms"]
    out = {"recovered": recovered, "below_threshold_ms": len(bad) * p["bucket_ms"], "window_ms": window_ms,
           "unjudged_ms": len(j[1]) * p["bucket_ms"] if j else 0,
           "outage_until_end_ms": None if recovered else round((end_ns - t_fail) / 1e6, 1)}
    # The first recovery, and how often goodput dips afterwards: a bulk TCP
    # flow's own sawtooth dips 100 ms windows below 90% of the line with
    # nothing failed (pre_failure_windows_below_capacity), and the strict
    # outage above counts the last such dip after the failure, wherever it is.
    # A window left unjudged (the sender offered next to nothing) is no
    # evidence of recovery either way, so the first good one must be judged.
    not_good = set(bad) | set(j[1] if j else ())
    first_good = next((i for i in range(fail_i + k, n) if i not in not_good), None)
    early = [i for i in bad if first_good is None or i < first_good]
    out["recovery_ms"] = (None if first_good is None else
                          round(max(0.0, (t0 + (early[-1] + 1) * W - t_fail) / 1e6), 1) if early else 0.0)
    later = n - first_good if first_good is not None else 0
    out["dips_after_recovery"] = round(sum(1 for i in bad if first_good is not None and i > first_good)
                                       / later, 3) if later > 0 else None
    if last_bad is None:
        out["outage_ms"] = 0.0
    elif recovered:
        out["outage_ms"] = round(max(0.0, (t0 + (last_bad + 1) * W - t_fail) / 1e6), 1)
    else:
        out["outage_ms"] = None
    return out


def _longest_gap(rows, t_fail, t_end):
    """The longest time a connection received nothing, from the black hole
    (or its last arrival before it) to t_end, in ms; t_end itself closes a
    gap still open there (a stalled connection's gap runs to the end)."""
    times = sorted(r[0] for r in rows)
    before = [t for t in times if t < t_fail]
    after = [t for t in times if t_fail <= t <= t_end]
    if not before and not after:
        return None
    marks = ([before[-1]] if before else [t_fail]) + after + [t_end]
    return round(max(b - a for a, b in zip(marks, marks[1:])) / 1e6, 1)


def _pct(v, q):
    return round(v[min(len(v) - 1, int(q * len(v)))] / 1e3, 1) if v else None


def _capacity(p, mode, payload, wire, spines):
    return spines * p["rate_bps"] * payload / wire


def _fail_when_due(snd, p, trigger) -> tuple[int, float]:
    """Wait for the sender's "started T0" line, then fail the path at
    T0 + fail_at: returns what trigger() returns (fail time, its cost)."""
    line = snd.stdout.readline()
    if not line.startswith("started"):
        snd.wait(timeout=30)
        raise RuntimeError(f"the sender did not start: {snd.stderr.read().strip()[-300:]}")
    t_start = int(line.split()[1])
    time.sleep(max(0.0, (t_start + p["fail_at"] * 1e9 - time.monotonic_ns()) / 1e9))
    return trigger()


def _udp(env, fab, p, port, mode, sports, flow_spines, trigger):
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    paths = []
    for tag in ("recv", "send"):
        fd, path = tempfile.mkstemp(prefix=f"mrcbench-{tag}-", suffix=".log")
        os.close(fd)
        paths.append(path)
    rpath, spath = paths
    cap_all = p["spines"] * p["rate_bps"]
    try:
        rcv = env.popen(h2, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-recv", fab.addr6(2), str(port),
                             str(p["seconds"] + 3), rpath])
        rcv.stdout.readline()
        snd = env.popen(h1, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-send", fab.addr6(2), str(port),
                             str(p["seconds"]), str(p["udp_flows"]), str(p["load"] * cap_all),
                             str(p["udp_size"]), ",".join(map(str, sports)), spath, fab.addr6(1)])
        t_fail, trigger_us = _fail_when_due(snd, p, trigger)
        out, _ = env.wait(snd, timeout=p["seconds"] + 30)
        rout, _ = env.wait(rcv, timeout=p["seconds"] + 30)
        sent = json.loads(out.strip().splitlines()[-1])
        rinfo = json.loads(rout.strip().splitlines()[-1])
        recs = read_log(rpath, 4)
        sends = read_log(spath, 3)
    finally:
        for path in paths:
            os.unlink(path)
    size = p["udp_size"]
    wire = size + UDP + IP6 + ETH + (MRC_OVERHEAD if mode == "mrc" else 0)
    got = {(f, q): t for t, f, q, ts in recs}
    t0, t1 = sent["t0"], sent["end"]
    W = int(p["bucket_ms"] * 1e6)
    n = int((t1 - t0) // W)
    bits = size * 8
    late_ns = int(p["late_ms"] * 1e6)
    owd = [(ts, got[(f, q)] - ts) for f, q, ts in sends if (f, q) in got]
    in_time = [ts for ts, d in owd if d <= late_ns]
    good = _buckets(in_time, [bits] * len(in_time), t0, n, W)              # by send time
    good_arr = _buckets([t for t in got.values()], [bits] * len(got), t0, n, W)   # by arrival
    offered = _buckets([ts for _, _, ts in sends], [bits] * len(sends), t0, n, W)
    fail_i = int((t_fail - t0) // W)
    cap_pre = _capacity(p, mode, size, wire, p["spines"]) * p["bucket_ms"] / 1e3
    cap_post = _capacity(p, mode, size, wire, p["spines"] - 1) * p["bucket_ms"] / 1e3

    def ref(i0, i1):
        return sum(min(offered[i], cap_post if i >= fail_i else cap_pre) for i in range(i0, i1))

    # a window is judged if the reference is at least half the nominal one
    judged = p["judged"] * min(p["load"] * cap_all * p["bucket_ms"] / 1e3, cap_post)
    res = _outage(p, good, ref, t0, t_fail, n, p["window_ms"], judged)
    res["pre_failure_windows_below"] = _noise_floor(p, good, ref, t0, t_fail, p["window_ms"], judged)
    res["arrival_axis"] = _outage(p, good_arr, ref, t0, t_fail, n, p["window_ms"], judged)
    res["arrival_axis"]["pre_failure_windows_below"] = _noise_floor(p, good_arr, ref, t0, t_fail,
                                                                    p["window_ms"], judged)
    pre_d = sorted(d for ts, d in owd if ts < t_fail)
    post_d = sorted(d for ts, d in owd if ts >= t_fail)
    res["one_way_delay_us"] = {
        "before_p50": _pct(pre_d, 0.5), "before_p99": _pct(pre_d, 0.99),
        "after_p50": _pct(post_d, 0.5), "after_p99": _pct(post_d, 0.99)}
    res["late"] = len(owd) - len(in_time)
    lost = [(f, q, ts) for f, q, ts in sends if (f, q) not in got]
    after = [x for x in lost if x[2] >= t_fail]
    per_flow_sent, per_flow_lost = [0] * p["udp_flows"], [0] * p["udp_flows"]
    for f, q, ts in sends:
        if ts >= t_fail:
            per_flow_sent[f] += 1
    for f, q, ts in after:
        per_flow_lost[f] += 1
    dead = [f for f in range(p["udp_flows"]) if per_flow_sent[f] and per_flow_lost[f] >= 0.95 * per_flow_sent[f]]
    first_loss = min((x[2] for x in after), default=None)
    res.update({
        "sent": len(sends), "received": len(got), "lost": len(sends) - len(got),
        "lost_before_fail": len(lost) - len(after), "lost_after_fail": len(after),
        "lost_first_10ms": sum(1 for x in after if x[2] < t_fail + 10_000_000),
        "flows_blackholed": dead, "flow_spines": [f"s{k + 1}" for k in flow_spines],
        "offered_bps": p["load"] * cap_all, "offered_bps_actual": len(sends) * bits / ((t1 - t0) / 1e9),
        "reference_bps_after": min(p["load"] * cap_all, cap_post / p["bucket_ms"] * 1e3),
        "capacity_after_bps": cap_post / p["bucket_ms"] * 1e3, "wire_bytes": wire,
        "capacity_before_bps": cap_pre / p["bucket_ms"] * 1e3,
        "goodput_after_bps": sum(good[fail_i + 1:]) / max(1e-9, (n - fail_i - 1) * p["bucket_ms"] / 1e3),
        "t_fail_ns": t_fail, "t0_ns": t0, "end_ns": t1, "trigger_us": trigger_us,
        "first_loss_sent_ns": first_loss,
        "first_loss_after_fail_us": round((first_loss - t_fail) / 1e3, 1) if first_loss else None,
        "receiver_user_timestamps": rinfo.get("user_times"), "send_errors": sent["errors"],
        "sender_skipped": sent.get("skipped"),
        "goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good],
        "arrival_goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good_arr],
        "offered_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in offered]})
    if mode == "ecmp":
        on_s1 = {f for f, k in enumerate(flow_spines) if k == 0}
        res["flows_on_s1"] = sorted(on_s1)
        res["sent_after_fail_on_s1"] = sum(1 for f, q, ts in sends if f in on_s1 and ts >= t_fail)
    return res


def _tcp(env, fab, p, port, mode, sports, conn_spines, trigger):
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    fd, path = tempfile.mkstemp(prefix="mrcbench-", suffix=".log")
    os.close(fd)
    try:
        mp = "mptcp" if env.mptcp else "-"
        rcv = env.popen(h2, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-recv", fab.addr6(2), str(port),
                             str(p["seconds"] + 5), str(p["conns"]), path, mp])
        rcv.stdout.readline()
        before = env.nstat(h1)
        before_rx = env.nstat(h2)
        u0 = contenders.uplinks(env, fab)
        chosen = []
        if trigger is None:
            trigger = _busiest_trigger(env, fab, u0, chosen)
        snd = env.popen(h1, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-send", fab.addr6(2), str(port),
                             str(p["seconds"]), str(p["conns"]), ",".join(map(str, sports)) if sports else "-",
                             fab.addr6(1), env.cc or "-", mp])
        t_fail, trigger_us = _fail_when_due(snd, p, trigger)
        out, _ = env.wait(snd, timeout=p["seconds"] + 30)
        after = env.nstat(h1)
        after_rx = env.nstat(h2)
        used = contenders.spines_used(u0, contenders.uplinks(env, fab))
        rout, _ = env.wait(rcv, timeout=p["seconds"] + 30)
        sent = json.loads(out.strip().splitlines()[-1])
        peer_ports = json.loads(rout.strip().splitlines()[-1])["peer_ports"]
        recs = read_log(path, 3)
    finally:
        os.unlink(path)
    mss = p["mtu"] - IP6 - TCP_HDR - (MRC_OVERHEAD if mode == "mrc" else 0)
    wire = p["mtu"] + ETH
    t0, t1 = sent["t0"], sent["end"]
    W = int(p["bucket_ms"] * 1e6)
    n = int((t1 - t0) // W)
    good = _buckets([r[0] for r in recs], [r[2] * 8 for r in recs], t0, n, W)
    fail_i = int((t_fail - t0) // W)
    pre_n = max(1, int(p["pre_ms"] / p["bucket_ms"]))
    pre = good[max(0, fail_i - pre_n):fail_i]
    pre_bps = sum(pre) / max(1e-9, len(pre) * p["bucket_ms"] / 1e3)
    cap_post_bps = _capacity(p, mode, mss, wire, p["spines"] - 1)
    ref_bps = min(pre_bps, cap_post_bps)
    ref_bucket = ref_bps * p["bucket_ms"] / 1e3
    res = _outage(p, good, lambda i0, i1: ref_bucket * (i1 - i0), t0, t_fail, n, p["tcp_window_ms"])
    pre_bucket = pre_bps * p["bucket_ms"] / 1e3
    res["pre_failure_windows_below"] = {
        str(w): _noise_floor(p, good, lambda i0, i1: pre_bucket * (i1 - i0), t0, t_fail, w)
        for w in sorted({p["window_ms"], p["tcp_window_ms"]})}
    # against the line, as the outage is after the failure: TCP's own dips
    cap_pre_bucket = _capacity(p, mode, mss, wire, p["spines"]) * p["bucket_ms"] / 1e3
    res["pre_failure_windows_below_capacity"] = _noise_floor(
        p, good, lambda i0, i1: cap_pre_bucket * (i1 - i0), t0, t_fail, p["tcp_window_ms"])
    # per connection: which spine (ECMP), bytes after the failure, stalled?
    spine_of_port = dict(zip(sports or [], conn_spines or []))
    half = t_fail + (t1 - t_fail) // 2
    end_judged = t0 + (n - int(p["tail_ms"] / p["bucket_ms"])) * W
    CW = int(p["conn_bucket_ms"] * 1e6)
    conns = []
    for c in range(p["conns"]):
        rows = [r for r in recs if r[1] == c]
        conns.append({"sport": peer_ports[c] if c < len(peer_ports) else None,
                      "longest_gap_ms": _longest_gap(rows, t_fail, end_judged),
                      "goodput_bps": [round(x * 8 / p["conn_bucket_ms"] * 1e3) for x in
                                      _buckets([r[0] for r in rows], [r[2] for r in rows], t0,
                                               int((t1 - t0) // CW), CW)],
                      "spine": (f"s{spine_of_port[peer_ports[c]] + 1}"
                                if c < len(peer_ports) and peer_ports[c] in spine_of_port else None),
                      "bytes_before": sum(r[2] for r in rows if r[0] < t_fail),
                      "bytes_after": sum(r[2] for r in rows if r[0] >= t_fail),
                      "bytes_second_half": sum(r[2] for r in rows if r[0] >= half)})
    stalled = [c for c, x in enumerate(conns) if x["bytes_second_half"] == 0]
    res["aggregate"] = dict(res)
    if stalled and res["recovered"]:
        res.update({"recovered": False, "outage_ms": None,
                    "outage_until_end_ms": round((t0 + n * W - t_fail) / 1e6, 1)})
    post = good[fail_i + 1:]
    nst = {k2: after.get(k2, 0) - before.get(k2, 0) for k2 in NSTAT_KEYS + contenders.PLB_KEYS}
    for k2 in contenders.MPTCP_KEYS:
        nst[k2] = after.get(k2, 0) - before.get(k2, 0) + after_rx.get(k2, 0) - before_rx.get(k2, 0)
    gaps = [x["longest_gap_ms"] for x in conns if x["longest_gap_ms"] is not None]
    res["longest_gap_ms"] = max(gaps) if gaps else None
    res["spines"] = used
    res["failed_spine"] = chosen[0] if chosen else "s1"
    res["mptcp_subflows"] = sent.get("mptcp_subflows")
    res.update({"bytes": sum(r[2] for r in recs), "pre_failure_bps": pre_bps,
                "post_failure_bps": sum(post) / max(1e-9, len(post) * p["bucket_ms"] / 1e3),
                "reference_bps": ref_bps, "capacity_after_bps": cap_post_bps, "mss": mss,
                "conns": conns, "stalled_conns": stalled,
                "nstat": nst, "retransmits": nst["TcpRetransSegs"], "rtos": nst["TcpExtTCPTimeouts"],
                "t_fail_ns": t_fail, "t0_ns": t0, "end_ns": t1, "trigger_us": trigger_us,
                "goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good]})
    return res


# --------------------------------------------------------------------------- MRC witnesses

def _mrc_paths(env, fab):
    """(h1's per-path tx/downs, h2's per-path rx from h1), keyed by path id."""
    def js(node):
        r = env.mrcctl(fab.ns(node), "stats", "--paths", "-j", check=False)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {}
    a, b = js("h1"), js("h2")
    tx = {x["path_id"]: {"tx": x["tx_packets"], "downs": x["downs"], "segments": x["segments"]}
          for x in a.get("sent", []) if x["prefix"] == fab.prefix6(2)}
    rx = {x["path_id"]: {"rx": x["rx_packets"], "lost": x["lost"]} for x in b.get("received", [])
          if x["from"] == fab.host_sid(1)}
    return tx, rx


def _path_delta(a, b):
    (tx0, rx0), (tx1, rx1) = a, b
    out = {}
    for pid, x in tx1.items():
        y = tx0.get(pid, {"tx": 0, "downs": 0})
        r1, r0 = rx1.get(pid, {"rx": 0, "lost": 0}), rx0.get(pid, {"rx": 0, "lost": 0})
        out[pid] = {"first_segment": x["segments"][0] if x["segments"] else None,
                    "tx": x["tx"] - y["tx"], "rx": r1["rx"] - r0["rx"], "downs": x["downs"] - y["downs"],
                    "rx_seq_gaps": r1["lost"] - r0["lost"]}
        out[pid]["tx_minus_rx"] = out[pid]["tx"] - out[pid]["rx"]
    return out


def _events(env, fab):
    r = env.mrcctl(fab.ns("h1"), "stats", "--events", "-j", check=False)
    try:
        evs = json.loads(r.stdout)["events"]
    except (ValueError, KeyError):
        return None
    return [e for e in evs if e.get("prefix") == fab.prefix6(2)]


def _exclusion(evs, dead_path, t_fail, first_loss, end_ns):
    if evs is None:
        return {"events": "unreadable"}
    mine = [e for e in evs if e["path_id"] == dead_path]
    if evs and evs[0]["seq"] > 1 and evs[0]["ns"] > t_fail - 50_000_000:
        return {"events": "ring wrapped: events around t_fail were overwritten"}
    before = [e for e in mine if e["ns"] < t_fail]
    down_at_fail = bool(before) and before[-1]["type"] == "down"
    down = next((e for e in mine if e["ns"] >= t_fail and e["type"] == "down"), None)
    others = [e for e in evs if e["path_id"] != dead_path and t_fail <= e["ns"] <= end_ns and e["type"] == "down"]
    out = {"dead_path_id": dead_path, "dead_path_down_at_fail": down_at_fail,
           "dead_path_ups_after_fail": sum(1 for e in mine if e["ns"] >= t_fail and e["type"] == "up"),
           "healthy_path_downs_after_fail": len(others),
           "healthy_path_downs_per_s": round(len(others) / max(1e-9, (end_ns - t_fail) / 1e9), 1),
           "dead_path_events": [{k: e[k] for k in ("seq", "ns", "type", "after_us")}
                                for e in mine if e["ns"] >= t_fail - 10_000_000][:20]}
    if down_at_fail:
        out["exclusion_from_fail_us"] = 0.0
    elif down:
        out["exclusion_from_fail_us"] = round((down["ns"] - t_fail) / 1e3, 1)
        out["exclusion_after_unacked_us"] = down["after_us"]
        if first_loss:
            out["exclusion_from_first_loss_us"] = round((down["ns"] - first_loss) / 1e3, 1)
    return out


# --------------------------------------------------------------------------- run

def steps(p: dict) -> int:
    """Measurements run(p) makes (the progress line's total)."""
    return sum(p["repeat"] * len([x for x in p["protocols"] if m not in contenders.CONTENDERS
                                  or x in p["contender_protocols"]]) for m in p["modes"])


def run(p: dict, env) -> dict:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab.fabric import parse_rate
    from mrc_ebpf.bench.runner import fabric
    p["rate_bps"] = parse_rate(p["rate"])
    K = p["spines"]
    runs = {m: {proto: [] for proto in p["protocols"]} for m in p["modes"]}
    port = 5500
    calib = {}
    plb = "plb" in p["modes"] and not p["ecn_threshold"]
    with fabric("fo", spines=K, leaves=2, hosts_per_leaf=1, rate=p["rate"],
                mtu=p["mtu"], host_sysctls=p["host_sysctls"],
                ecn_threshold=contenders.PLB_ECN_THRESHOLD if plb else p["ecn_threshold"],
                ask_ecn=not plb) as fab:
        trigger = lambda: _trigger(fab)  # noqa: E731
        # every TCP run reuses the calibrated 4-tuples: let a new connection
        # take one still in TIME_WAIT from the run before (> 1 s ago)
        env.run(fab.ns("h1"), ["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])
        # one destination port per protocol for the whole scenario: the calibrated hash includes it
        dports = {"udp": 5501, "tcp": 5502}
        for proto, n in (("udp", p["udp_flows"]), ("tcp", p["conns"])):
            if proto not in p["protocols"]:
                continue
            if n % K:
                log(f"failover: {n} {proto} flows do not split evenly over {K} spines")
            ports, spines, tried = _calibrate(env, fab, K, proto, dports[proto], max(1, n // K),
                                              40000 if proto == "udp" else 45000)
            if len(ports) < n:      # not found (unlikely): fill with ports of unknown spine
                extra = [50000 + i for i in range(n - len(ports))]
                ports, spines = ports + extra, spines + [-1] * len(extra)
            calib[proto] = {"sports": ports[:n], "spines": spines[:n], "candidates_tried": tried}
            log(f"failover: {proto} source ports {ports[:n]} -> spines "
                f"{[f's{k + 1}' for k in spines[:n]]} ({tried} candidates)")
        armed = ["s1"] + ([f"s{k}" for k in range(2, K + 1)]
                          if any(m in contenders.CONTENDERS for m in p["modes"]) else [])
        _arm(fab_mod, fab, armed)
        extra = {"armed": armed}
        try:
            _runs(env, fab, fab_mod, p, runs, calib, dports, trigger, extra, armed)
        finally:
            fab_mod.heal(fab.name, None)
    return _summary(p, runs, calib, extra)


def _runs(env, fab, fab_mod, p, runs, calib, dports, trigger, extra, armed):
    attached = False
    for mode in p["modes"]:
        if mode == "mrc" and not attached:
            log(f"failover: attaching MRC on h1, h2 ({p['mrc_policy']})")
            fab_mod.attach(fab.name, "h1,h2", p["mrc_policy"], [])
            attached = True
            time.sleep(0.5)
        contender = mode in contenders.CONTENDERS
        protos = [x for x in p["protocols"] if not contender or x in p["contender_protocols"]]
        with contenders.mode(env, fab, mode, [1, 2]) as rec:
            extra.setdefault("mode_setup", {})[mode] = rec
            _mode_runs(env, fab, p, runs, calib, dports, None if contender else trigger, mode, protos,
                       contender, armed)
            if mode == "prr":
                log("failover: prr witness (one connection onto s1, black hole, after its RTO)")
                extra.setdefault("prr_witness", contenders.prr_witness(env, fab, trigger, lambda: _disarm(fab)))
            if contender:
                rs = runs[mode]["tcp"]
                nst = {k: sum(r["nstat"].get(k, 0) for r in rs) for k in contenders.MPTCP_KEYS + contenders.PLB_KEYS}
                best = max(rs, key=lambda r: len(r["spines"]["carrying"]))
                pr = contenders.proof(mode, rec, best["spines"], nst, best.get("mptcp_subflows"))
                if mode == "prr":
                    w = extra["prr_witness"]
                    pr["witness"] = w
                    pr["ok"] = pr["hash_ok"] and bool(w.get("ok"))
                extra.setdefault("proof", {})[mode] = pr


def _mode_runs(env, fab, p, runs, calib, dports, trigger, mode, protos, contender, armed):
    for rep in range(p["repeat"]):
        for proto in protos:
            log(f"failover: {mode} {proto}, run {rep + 1}/{p['repeat']}", step=True)
            c = calib[proto]
            a = _mrc_paths(env, fab) if mode == "mrc" else None
            # the contenders' hash ignores ports (flow label): no calibration
            sports, spines = (None, None) if contender else (c["sports"], c["spines"])
            try:
                if proto == "udp":
                    r = _udp(env, fab, p, dports[proto], mode, c["sports"], c["spines"], trigger)
                else:
                    r = _tcp(env, fab, p, dports[proto], mode, sports, spines, trigger)
            finally:
                _disarm(fab, armed)
            if mode == "mrc":
                paths = _path_delta(a, _mrc_paths(env, fab))
                dead = next((pid for pid, x in paths.items()
                             if x["first_segment"] == fab.spine_sid(0, 1)), 0)
                r["paths"] = paths
                r.update(_exclusion(_events(env, fab), dead, r["t_fail_ns"],
                                    r.get("first_loss_sent_ns"), r["end_ns"]))
            runs[mode][proto].append(r)
            time.sleep(0.3)


def _summary(p, runs, calib, extra):
    summary = {}
    for mode, by in runs.items():
        by = {proto: rs for proto, rs in by.items() if rs}
        summary[mode] = {}
        for proto, rs in by.items():
            s = {"outage_ms": spread([r["outage_ms"] for r in rs]),
                 "recovery_ms": spread([r["recovery_ms"] for r in rs]),
                 "dips_after_recovery": spread([r["dips_after_recovery"] for r in rs]),
                 "recovered": [r["recovered"] for r in rs],
                 "outage_until_end_ms": [r["outage_until_end_ms"] for r in rs], "runs": rs}
            if proto == "udp":
                for k in ("lost", "sent", "lost_after_fail", "lost_first_10ms"):
                    s[k] = spread([r[k] for r in rs])
            else:
                for k in ("retransmits", "rtos", "pre_failure_bps", "post_failure_bps",
                          "pre_failure_windows_below_capacity", "longest_gap_ms"):
                    s[k] = spread([r[k] for r in rs])
                s["stalled_conns"] = spread([len(r["stalled_conns"]) for r in rs])
            if mode == "mrc":
                for k in ("exclusion_from_fail_us", "exclusion_from_first_loss_us",
                          "healthy_path_downs_per_s"):
                    s[k] = spread([r.get(k) for r in rs])
            summary[mode][proto] = s
    notes = []
    for mode in summary:
        for proto, s in summary[mode].items():
            r = s["runs"][0]
            what = (f"outage {_outage_text(s)}; lost {fmt_spread(s['lost'])} of {fmt_spread(s['sent'])}"
                    if proto == "udp" else
                    f"outage {_outage_text(s)}; stalled connections {fmt_spread(s['stalled_conns'])}; "
                    f"retransmits {fmt_spread(s['retransmits'])}, RTOs {fmt_spread(s['rtos'])}")
            notes.append(f"{mode} {proto}: {what}")
            if proto == "udp" and mode == "ecmp":
                notes.append(f"  ecmp udp check: flows on s1 {r['flows_on_s1']}, black-holed "
                             f"{r['flows_blackholed']}; sent after t_fail on s1's flows "
                             f"{r['sent_after_fail_on_s1']} = lost after t_fail {r['lost_after_fail']}")
            if mode == "mrc":
                dp = r.get("dead_path_id")
                pd = (r.get("paths") or {}).get(dp, {})
                notes.append(f"  mrc {proto} check: s1's path {dp} "
                             + ("already down at t_fail" if r.get("dead_path_down_at_fail") else
                                f"down {r.get('exclusion_from_fail_us')} us after t_fail")
                             + f"; its tx-rx {pd.get('tx_minus_rx')}; healthy paths went down "
                             f"{r.get('healthy_path_downs_after_fail')} times after t_fail")
    for mode, pr in extra.get("proof", {}).items():
        notes.append(f"{mode} proof: {'ok' if pr.get('ok') else 'NOT SHOWN'} (hash {pr['hash']}"
                     + (f"; witness moved after {pr['witness'].get('moved_after_ms')} ms to "
                        f"{pr['witness'].get('moved_to')}, RTOs {pr['witness'].get('rtos')}" if "witness" in pr else "")
                     + (f"; joins {pr['mp_join_ack_rx']}, spines {pr['spines']['carrying']}" if mode == "mptcp" else "")
                     + (f"; PLB rehashes {pr['plb_rehash']}" if mode == "plb" else "") + ")")
    return {"modes": summary, "calibration": calib, "notes": notes, "conn_bucket_ms": p["conn_bucket_ms"],
            **extra}


def _outage_text(s) -> str:
    n_bad = sum(1 for x in s["recovered"] if not x)
    if n_bad:
        ends = [x for x in s["outage_until_end_ms"] if x is not None]
        return f"until the end (>= {min(ends):.0f} ms) in {n_bad}/{len(s['recovered'])} runs"
    return f"{fmt_spread(s['outage_ms'])} ms"


def table(results: dict):
    headers = ["mode", "proto", "outage ms (to last dip)", "recovered", "to first recovery ms",
               "dips after (TCP: before)", "UDP lost (after fail)", "TCP retrans",
               "TCP RTOs", "stalled conns", "TCP longest gap ms", "MRC exclusion us (from fail)"]
    rows = []
    for mode, by in results["modes"].items():
        for proto, s in by.items():
            dips = fmt_spread(s.get("dips_after_recovery"))
            if "pre_failure_windows_below_capacity" in s:
                dips += f" ({fmt_spread(s['pre_failure_windows_below_capacity'])})"
            rows.append([mode, proto, _outage_text(s), f"{sum(s['recovered'])}/{len(s['recovered'])}",
                         fmt_spread(s.get("recovery_ms")), dips,
                         f"{fmt_spread(s['lost'])} ({fmt_spread(s['lost_after_fail'])})" if "lost" in s else "",
                         fmt_spread(s.get("retransmits")) if "retransmits" in s else "",
                         fmt_spread(s.get("rtos")) if "rtos" in s else "",
                         fmt_spread(s.get("stalled_conns")) if "stalled_conns" in s else "",
                         fmt_spread(s.get("longest_gap_ms")) if "longest_gap_ms" in s else "",
                         fmt_spread(s.get("exclusion_from_fail_us")) if "exclusion_from_fail_us" in s else ""])
    return headers, rows


def plot(results: dict, plt):
    """Goodput of every mode per protocol (the sum), UDP's delivered ratio,
    and one panel per mode with each TCP connection on its own line, so a
    connection that stalls shows even when the others fill its share."""
    modes = results["modes"]
    protos = list(dict.fromkeys(proto for by in modes.values() for proto in by))
    panels = [(proto, "goodput", None) for proto in protos]
    if "udp" in protos:
        panels.insert(protos.index("udp") + 1, ("udp", "ratio", None))
    panels += [("tcp", "conns", mode) for mode, by in modes.items() if "tcp" in by]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)

    def avg(g, k):
        return [sum(g[max(0, i - k + 1):i + 1]) / min(k, i + 1) / 1e6 for i in range(len(g))]

    for ax, (proto, what, only) in zip(axes[:, 0], panels):
        for mode, by in modes.items():
            if proto not in by or (only and mode != only):
                continue
            r = by[proto]["runs"][0]
            k = int(r.get("window_ms") or 10)
            t_fail_ms = (r["t_fail_ns"] - r["t0_ns"]) / 1e6
            g = r["goodput_bps_1ms"]
            xs = [i + 1 - t_fail_ms for i in range(len(g))]
            out = ("until the end" if not r["recovered"] else f"{r['outage_ms']:.1f} ms")
            if what == "conns":
                cb = results.get("conn_bucket_ms", 10)
                kk = max(1, int(50 / cb))
                for c, conn in enumerate(r["conns"]):
                    cg = conn.get("goodput_bps") or []
                    cx = [(i + 1) * cb - t_fail_ms for i in range(len(cg))]
                    ax.plot(cx, avg(cg, kk), lw=0.9,
                            label=f"conn {c + 1}{' on ' + conn['spine'] if conn.get('spine') and mode == 'ecmp' else ''}: "
                                  f"longest gap {conn.get('longest_gap_ms')} ms")
                ax.set_title(f"{mode}: every TCP connection (run 1, 50 ms avg); RTOs {r['rtos']}, "
                             f"longest gap {r.get('longest_gap_ms')} ms", fontsize=8)
                continue
            if what == "ratio":
                cap = r["capacity_after_bps"]
                fail_i = int(t_fail_ms)
                ref = [min(o, cap if i >= fail_i else r["capacity_before_bps"])
                       for i, o in enumerate(r["offered_bps_1ms"])]
                ratio = []
                for i in range(len(g)):
                    want = sum(ref[max(0, i - k + 1):i + 1])
                    ratio.append(sum(g[max(0, i - k + 1):i + 1]) / want if want > 0 else float("nan"))
                ax.plot(xs, ratio, lw=1.0, label=f"{mode}: lost {r['lost_after_fail']} after t_fail; outage {out}")
                continue
            axis = "by send time" if proto == "udp" else "by arrival"
            line, = ax.plot(xs, avg(g, k), lw=1.0, label=f"{mode} {axis} ({k} ms avg; outage {out})")
            if r.get("arrival_goodput_bps_1ms"):
                ax.plot(xs, avg(r["arrival_goodput_bps_1ms"], k), lw=0.5, alpha=0.5, color=line.get_color(),
                        label=f"{mode} by arrival ({k} ms avg)")
            ref = r.get("reference_bps_after") or r.get("reference_bps")
            if ref:
                ax.axhline(0.9 * ref / 1e6, color=line.get_color(), lw=0.6, ls="--")
        ax.axvline(0, color="red", lw=0.8)
        if what == "ratio":
            ax.axhline(0.9, color="grey", lw=0.6, ls="--")
            ax.set_ylabel("udp: delivered / reference\n(sliding windows)")
            ax.set_ylim(0, 1.3)
        else:
            ax.set_ylabel(f"{proto} goodput Mbit/s" if what != "conns" else "per connection Mbit/s")
            ax.set_ylim(bottom=0)
        ax.set_xlabel("ms since the black hole" + (" (dashed: 90% of the reference)" if what == "goodput" else ""))
        ax.legend(fontsize=6)
    return fig
