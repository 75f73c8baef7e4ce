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

This module measures (run's logs, counters, events: typed measurements);
bench/failover_analysis.py turns them into the results, table and plot.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from mrc_ebpf.control.config.schema import DEFAULT_POLICY
from mrc_ebpf.datapath import layout
from mrc_ebpf.lab import netns
from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.failover_analysis import (Calibration, Measured, MrcWitness, PathCounters, Run,  # noqa: F401
                                              TcpMeasurement, UdpMeasurement, exclusion, plot, summarize,
                                              table)
from mrc_ebpf.bench.flowtool import read_log
from mrc_ebpf.bench.runner import PY, log

TITLE = "goodput across a far-side black hole of 1 of 4 paths: MRC failover vs kernel ECMP, PRR, PLB, MPTCP"
MODES_ALLOWED = ("ecmp", "prr", "plb", "mptcp", "mrc")


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "seconds": 1.5 if short else 4.0,
            "fail_at": 0.5 if short else 1.0, "udp_flows": 16, "load": 0.3, "udp_size": 1200,
            "conns": 4, "repeat": 1 if short else 3, "modes": list(MODES_ALLOWED), "protocols": ["udp", "tcp"],
            # the contenders are TCP's own repathing: they run the TCP part only
            "contender_protocols": ["tcp"], "conn_bucket_ms": 10,
            "bucket_ms": 1.0, "window_ms": 10, "tcp_window_ms": 100, "threshold": 0.9, "stable_ms": 50, "pre_ms": 300,
            "late_ms": 100, "tail_ms": 30, "judged": 0.5,
            "mtu": 1500, "fault": "s1>l2 blackhole (l2 ingress from s1)",
            "mrc_policy": DEFAULT_POLICY, "mrc": f"ack-timeout {layout.TIMER_DEFAULTS['ack_timeout_us']} us, "
                                       f"probe {layout.TIMER_DEFAULTS['probe_us']} us (mrcctl attach defaults)",
            # no ECN marking: at 1 ms, classic ECN holds cubic under the 90%
            # line the outage is measured against (README, collisions)
            "ecn_threshold": None}


def _arm(fab_mod, fab, spines=("s1",)):
    fab_mod.fail(fab.name, [f"{s}>l2" for s in spines], "loss=1e-9")


def disarm(fab, spines=("s1",)):
    """Back to the armed state (practically no drops) between runs: one map
    write again, not a heal and a new inject (a program load each)."""
    from mrc_ebpf.lab import faults
    for s in spines:
        faults.rearm(fab.ns("l2"), s, "loss", 1e-9)


def trigger(fab, spine="s1"):
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
    def busiest():
        now = contenders.uplinks(env, fab)
        spine = max(now, key=lambda k: now[k] - since.get(k, 0))
        chosen.append(spine)
        return trigger(fab, spine)
    return busiest


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


def _calibrate(env, fab, K, proto, dport, per_spine, first_port) -> Calibration:
    """Source ports such that exactly per_spine flows of `proto` to dport
    hash onto each spine at l1, in the order s1, s2, .., s1, s2, ..
    Returns them, the spine index of each, and how many candidates were tried."""
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
    return Calibration(ports, spines, tried)


# --------------------------------------------------------------------------- one run

def fail_when_due(snd, p, trigger) -> tuple[int, float]:
    """Wait for the sender's "started T0" line, then fail the path at
    T0 + fail_at: returns what trigger() returns (fail time, its cost)."""
    line = snd.stdout.readline()
    if not line.startswith("started"):
        snd.wait(timeout=30)
        raise RuntimeError(f"the sender did not start: {snd.stderr.read().strip()[-300:]}")
    t_start = int(line.split()[1])
    time.sleep(max(0.0, (t_start + p["fail_at"] * 1e9 - time.monotonic_ns()) / 1e9))
    return trigger()


def _udp(env, fab, p, port, mode, sports, flow_spines, trigger) -> UdpMeasurement:
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
        t_fail, trigger_us = fail_when_due(snd, p, trigger)
        out, _ = env.wait(snd, timeout=p["seconds"] + 30)
        rout, _ = env.wait(rcv, timeout=p["seconds"] + 30)
        sent = json.loads(out.strip().splitlines()[-1])
        rinfo = json.loads(rout.strip().splitlines()[-1])
        recs = read_log(rpath, 4)
        sends = read_log(spath, 3)
    finally:
        for path in paths:
            os.unlink(path)
    return UdpMeasurement(mode, flow_spines, t_fail, trigger_us, sent["t0"], sent["end"], sent["errors"],
                          sent.get("skipped"), rinfo.get("user_times"), sends, recs)


def _tcp(env, fab, p, port, mode, sports, conn_spines, trigger) -> TcpMeasurement:
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
        t_fail, trigger_us = fail_when_due(snd, p, trigger)
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
    return TcpMeasurement(mode, sports, conn_spines, t_fail, trigger_us, sent["t0"], sent["end"], recs,
                          peer_ports, (before, after), (before_rx, after_rx), used,
                          chosen[0] if chosen else "s1", sent.get("mptcp_subflows"))


# --------------------------------------------------------------------------- MRC witnesses

def _mrc_paths(env, fab) -> PathCounters:
    """h1's per-path tx/downs, h2's per-path rx from h1, keyed by path id."""
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
    return PathCounters(tx, rx)


def events(env, fab) -> list[dict] | None:
    """h1's path-state events towards h2 (None: unreadable)."""
    r = env.mrcctl(fab.ns("h1"), "stats", "--events", "-j", check=False)
    try:
        evs = json.loads(r.stdout)["events"]
    except (ValueError, KeyError):
        return None
    return [e for e in evs if e.get("prefix") == fab.prefix6(2)]


# --------------------------------------------------------------------------- run

def steps(p: dict) -> int:
    """Measurements run(p) makes (the progress line's total)."""
    return sum(p["repeat"] * len([x for x in p["protocols"] if m not in contenders.CONTENDERS
                                  or x in p["contender_protocols"]]) for m in p["modes"])


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (failover_analysis.summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab.fabric import parse_rate
    from mrc_ebpf.bench.runner import fabric
    p["rate_bps"] = parse_rate(p["rate"])
    K = p["spines"]
    measured = Measured({m: {proto: [] for proto in p["protocols"]} for m in p["modes"]}, {}, [], {})
    port = 5500
    calib = measured.calibration
    plb = "plb" in p["modes"] and not p["ecn_threshold"]
    with fabric("fo", spines=K, leaves=2, hosts_per_leaf=1, rate=p["rate"],
                mtu=p["mtu"], host_sysctls=p["host_sysctls"],
                ecn_threshold=contenders.PLB_ECN_THRESHOLD if plb else p["ecn_threshold"],
                ask_ecn=not plb) as fab:
        fail = lambda: trigger(fab)  # noqa: E731
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
            c = _calibrate(env, fab, K, proto, dports[proto], max(1, n // K), 40000 if proto == "udp" else 45000)
            ports, spines = c.sports, c.spines
            if len(ports) < n:      # not found (unlikely): fill with ports of unknown spine
                extra = [50000 + i for i in range(n - len(ports))]
                ports, spines = ports + extra, spines + [-1] * len(extra)
            calib[proto] = Calibration(ports[:n], spines[:n], c.candidates_tried)
            log(f"failover: {proto} source ports {ports[:n]} -> spines "
                f"{[f's{k + 1}' for k in spines[:n]]} ({c.candidates_tried} candidates)")
        armed = ["s1"] + ([f"s{k}" for k in range(2, K + 1)]
                          if any(m in contenders.CONTENDERS for m in p["modes"]) else [])
        _arm(fab_mod, fab, armed)
        measured.armed = armed
        try:
            _runs(env, fab, fab_mod, p, measured, dports, fail)
        finally:
            fab_mod.heal(fab.name, None)
    return measured


def _runs(env, fab, fab_mod, p, measured: Measured, dports, fail):
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
            measured.mode_setup[mode] = rec
            _mode_runs(env, fab, p, measured, dports, None if contender else fail, mode, protos, contender)
            if mode == "prr":
                log("failover: prr witness (one connection onto s1, black hole, after its RTO)")
                measured.prr_witness = contenders.prr_witness(env, fab, fail, lambda: disarm(fab))


def _mode_runs(env, fab, p, measured: Measured, dports, fail, mode, protos, contender):
    for rep in range(p["repeat"]):
        for proto in protos:
            log(f"failover: {mode} {proto}, run {rep + 1}/{p['repeat']}", step=True)
            c = measured.calibration[proto]
            a = _mrc_paths(env, fab) if mode == "mrc" else None
            # the contenders' hash ignores ports (flow label): no calibration
            sports, spines = (None, None) if contender else (c.sports, c.spines)
            try:
                if proto == "udp":
                    m = _udp(env, fab, p, dports[proto], mode, c.sports, c.spines, fail)
                else:
                    m = _tcp(env, fab, p, dports[proto], mode, sports, spines, fail)
            finally:
                disarm(fab, measured.armed)
            witness = None
            if mode == "mrc":
                witness = MrcWitness(a, _mrc_paths(env, fab), events(env, fab), fab.spine_sid(0, 1))
            measured.runs[mode][proto].append(Run(proto, m, witness))
            time.sleep(0.3)
