"""One sprayed TCP flow across a fabric one of whose spines also carries
a UDP cross flow (issue #29's first target: congestion is not failure).

Fabric: K spines (4), h1 under l1 sends to h2 under l2, the leaf-spine
links rate-limited and marking ECN above `ecn_threshold` of queue (the
hosts ask for ECN).  The cross flow is one-way UDP from inside spine
`cross_spine` (s1) to h2 at `cross_load` (0.7) of the link's rate on the
wire (iperf3 -u, paced by iperf3, until the TCP flow is done), so it loads
s1's queue towards l2 alone: what is left for h1's flow is
(K - cross_load) x rate, 3.3 of 4 spines.  Its delivered rate is
measured (h2's count of UDP datagrams over the TCP flow's time), not
assumed: on a loaded machine a sender falls short.

Modes (one fabric, one run each per repetition):
  ecmp     no MRC: the leaves hash the flow onto one spine (5-tuple);
  prr      kernel PRR (bench/contenders.py): flow-label hashing leaves,
           a new label on every RTO;
  mptcp    K subflows per connection (bench/contenders.py);
  rr       MRC attached, rr spraying, no congestion skip (today's
           default: `--skip-rotations 0`);
  rr-skip  the same datapath with `skip_rotations` (8) set in place
           (`mrcctl show-config | apply`): a path the receiver reports
           CE-marked skips that many of its turns.
Measured per run: h1's TCP goodput (mrc-perf's receiver byte count over
`seconds`), as a fraction of the capacity left (`of_left`), and of the
header ceiling (the payload a full segment carries per byte on the link:
bench/spray_vs_ecmp.ceilings); the cross flow's own delivered rate; the
spines the flow's packets crossed (l1's uplink counters); and for the
MRC modes h1's path events in the run (`down`: paths taken down, want 0;
`skip`: skips) and its paths' CE reports (`path list`).

This module measures (typed measurements: bench/congested_spine_analysis.py);
the analysis turns them into the results, table and plot.
"""
from __future__ import annotations

import json
import subprocess
import time

from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.congested_spine_analysis import (UDP_WIRE, CrossFlow, Measured, MrcView, Run,  # noqa: F401
                                                     plot, summarize, table)
from mrc_ebpf.bench.runner import log, set_attach
from mrc_ebpf.perf.iperf_json import read_result

TITLE = "one sprayed TCP flow beside a 70% UDP cross flow on 1 of 4 spines: rr vs rr + skip, ECMP, PRR, MPTCP"
MRC_MODES = ("rr", "rr-skip")
MODES_ALLOWED = ("ecmp", "prr", "mptcp", *MRC_MODES)


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "seconds": 2.0 if short else 6.0,
            "repeat": 1 if short else 2, "modes": list(MODES_ALLOWED), "cross_spine": "s1",
            "cross_load": 0.7, "cross_size": 1200, "skip_rotations": 8, "mrc_policy": "rr",
            "ecn_threshold": "1ms", "mtu": 1500,
            "capacity_left": "(spines - cross_load) x rate",
            "tool": "mrc-perf -t SECONDS -i 0 (one TCP flow, 128 KiB writes)"}


def steps(p: dict) -> int:
    return len(p["modes"]) * p["repeat"]


def check(p: dict) -> None:
    from mrc_ebpf.errors import MrcError
    if not 0 < p["cross_load"] < 1:
        raise MrcError(f"congested-spine: cross_load {p['cross_load']}: between 0 and 1")
    import shutil
    if not shutil.which("iperf3"):
        raise MrcError("congested-spine needs iperf3 for its cross flow: apt-get install iperf3 (scripts/setup.sh)")
    if p["cross_spine"] not in [f"s{k}" for k in range(1, p["spines"] + 1)]:
        raise MrcError(f"congested-spine: cross_spine {p['cross_spine']!r} is not one of s1..s{p['spines']}")


def _mrc_view(env, fab) -> MrcView:
    """h1's events so far and its paths' counters towards h2; h2's CE
    count per path from h1 (what the receiver saw marked)."""
    evs = json.loads(env.mrcctl(fab.ns("h1"), "stats", "--events", "-j").stdout)["events"]
    rows = [r for r in json.loads(env.mrcctl(fab.ns("h1"), "path", "list", "-j").stdout)
            if r["prefix"] == fab.prefix6(2)]
    rx = json.loads(env.mrcctl(fab.ns("h2"), "stats", "--paths", "-j").stdout)["received"]
    counters = json.loads(env.mrcctl(fab.ns("h1"), "stats", "-j").stdout)["counters"]
    return MrcView(evs, {r["path_id"]: {"ce_reports": r.get("ce_reports", 0), "downs": r.get("downs", 0),
                                        "tx_packets": r.get("tx_packets", 0), "state": r.get("state")}
                         for r in rows},
                   {r["path_id"]: r.get("ce", 0) for r in rx if r["from"] == fab.host_sid(1)},
                   {k: counters.get(k, 0) for k in ("tx_skip", "rx_fb_ce")})


def ecn_marks(env, fab) -> dict[str, dict]:
    """The switches' own counts per queue (l1>s1 ...): packets, ECN-capable
    ones, CE marks given: the witness of where the fabric marked, from
    `fabric show`."""
    from mrc_ebpf.lab import procs
    shown = json.loads(env.run(None, [*procs.MRCCTL, "fabric", "show", fab.name, "-j"]).stdout)
    return {e["ecn"]["direction"]: {k: e["ecn"][k] for k in ("packets", "ect", "marked")}
            for lk in shown["links"] for e in lk["ends"]
            if e.get("ecn")}


def _one(env, fab, p, mode, port) -> Run:
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    spine = p["cross_spine"]
    cross_ns = fab.ns(spine)
    size = p["cross_size"]
    payload_bps = p["cross_load"] * p["rate_bps"] * size / (size + UDP_WIRE)
    # iperf3 (C, its own pacing timer): a Python sender on this loaded
    # machine lost a third of its slots and offered 0.2-0.3 of the rate.
    # It runs until the TCP flow is done (starting mrc-perf takes seconds
    # on a loaded machine), then is ended; what it delivered meanwhile is
    # h2's count of UDP datagrams over the TCP flow's time.
    srv = env.popen(h2, ["iperf3", "-s", "-1", "-p", str(port + 1000), "-B", fab.addr6(2)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    cli = env.popen(cross_ns, ["iperf3", "-c", fab.addr6(2), "-p", str(port + 1000), "-u", "-b", str(int(payload_bps)),
                               "-l", str(size), "-t", str(p["seconds"] + 60), "-B", cross_addr(fab, spine)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)             # the cross flow's queue in place before the TCP flow starts
        if cli.poll() is not None:
            raise RuntimeError(f"the cross flow (iperf3 in {spine}) failed: {cli.stderr.read().strip()[-300:]}")
        before = _mrc_view(env, fab) if mode in MRC_MODES else None
        u0 = contenders.uplinks(env, fab)
        marks0 = ecn_marks(env, fab)
        link0 = env.link_stats(cross_ns, "l2")
        udp0 = env.nstat(h2).get("Udp6InDatagrams", 0)
        t0 = time.monotonic_ns()
        doc = env.perf(h1, h2, fab.addr6(2), port, ["-t", str(p["seconds"])], p["seconds"])
        t1 = time.monotonic_ns()
        udp1 = env.nstat(h2).get("Udp6InDatagrams", 0)
        link1 = env.link_stats(cross_ns, "l2")
        used = contenders.spines_used(u0, contenders.uplinks(env, fab))
        marks = {d: {k: n - marks0[d][k] for k, n in v.items()} for d, v in ecn_marks(env, fab).items()}
        after = _mrc_view(env, fab) if mode in MRC_MODES else None
        alive = cli.poll() is None
    finally:
        env.end(cli)
        env.end(srv)
    if not alive:
        raise RuntimeError(f"the cross flow (iperf3 in {spine}) stopped before the TCP flow ended")
    cross = CrossFlow(spine, payload_bps, size, udp1 - udp0, link1["tx_bytes"] - link0["tx_bytes"],
                      link1["tx_dropped"] - link0["tx_dropped"])
    result = read_result(doc)
    return Run(mode, t0, t1, result["received_bps"], result["sent_bps"], result["retransmits"], used, cross,
               {d: v for d, v in marks.items() if v["packets"]}, before, after)


def cross_addr(fab, spine: str) -> str:
    """The spine's address on its link to l2 (h2 routes it back: _route_back)."""
    return fab.link_net(0, int(spine[1:]), 2) + "1"


def _route_back(env, fab, spine: str) -> None:
    """h2 answers the cross flow's iperf3 control connection: a route to
    the spine's link to l2 (the fabric routes only fd00::/16, fc00::/16)."""
    env.run(fab.ns("h2"), ["ip", "-6", "route", "replace", fab.link_net(0, int(spine[1:]), 2) + "/64",
                           "via", "fe80::1", "dev", "eth0"])


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (congested_spine_analysis.summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab.fabric import parse_rate
    from mrc_ebpf.bench.runner import fabric
    from mrc_ebpf.bench.spray_vs_ecmp import ceilings, route_mss
    check(p)
    p["rate_bps"] = parse_rate(p["rate"])
    measured = Measured({m: [] for m in p["modes"]}, {}, {}, {})
    port = 5700
    with fabric("cs", spines=p["spines"], leaves=2, hosts_per_leaf=1, rate=p["rate"], mtu=p["mtu"],
                host_sysctls=p["host_sysctls"], ecn_threshold=p["ecn_threshold"]) as fab:
        _route_back(env, fab, p["cross_spine"])
        attached = None
        for mode in p["modes"]:
            if mode in MRC_MODES:
                if attached is None:
                    log(f"congested-spine: attaching MRC on h1, h2 ({p['mrc_policy']})")
                    fab_mod.attach(fab.name, "h1,h2", p["mrc_policy"], [])
                    attached = 0
                    time.sleep(0.5)
                turns = p["skip_rotations"] if mode == "rr-skip" else 0
                if attached != turns:
                    set_attach(env, fab, ("h1", "h2"), skip_rotations=turns)
                    attached = turns
            with contenders.mode(env, fab, mode, [1, 2]) as rec:
                measured.mode_setup[mode] = rec
                keys = contenders.MPTCP_KEYS
                c0 = contenders.counters(env, fab, [1, 2], keys)
                for rep in range(p["repeat"]):
                    port += 2
                    log(f"congested-spine: {mode}, run {rep + 1}/{p['repeat']}", step=True)
                    measured.runs[mode].append(_one(env, fab, p, mode, port))
                    time.sleep(0.3)
                if mode in contenders.CONTENDERS:
                    best = max(measured.runs[mode], key=lambda r: len(r.spines["carrying"]))
                    measured.proof[mode] = contenders.proof(
                        mode, rec, best.spines, contenders.delta_of(c0, contenders.counters(env, fab, [1, 2], keys)))
        measured.ceiling.update(ceilings(*route_mss(env, fab), ["ecmp", "rr"]))
    return measured
