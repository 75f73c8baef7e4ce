"""A host's plane device down under 4 flows from 4 peers: how soon every
peer stops sending into that plane, by port status against the
acknowledgement clock (issue #29's port-status target).

Fabric: 2 planes x 2 spines x 2 leaves x 3 hosts, MRC on every host.
h1, h2, h3 and h5 each send one-way UDP (`pps` datagrams a second) to h4;
`down_at_s` into the flows h4's plane-1 link is cut at its leaf's end
(p1l2's device towards h4 set down: h4's eth1 loses its carrier, as a
failed NIC port or cable), and brought back `down_s` later (the leaf's
addresses and routes put back, as `fabric heal` does).  Modes (h4's kernel hooks, bpf/mrc_ports.c, put on or off with `mrcctl
ports hook` before each):
  ack-clock    hooks off, no watcher: nothing tells the peers, each finds
               out by its own clock (`--ack-timeout-us`, events `down`);
  port-status  hooks off, `mrcctl ports watch` on h4 (real-time priority,
               as a port daemon would) finds the change from netlink,
               writes h4's port status, which every TLV then carries, and
               sends one feedback packet to each peer (events `port-down`
               on the peers);
  kernel       hooks on, no watcher: the hook sets h4's port status the
               instant the carrier goes; each peer hears it in the
               feedback its next packet into h4 draws (owed at once);
  kernel+watcher  hooks on, and the watcher, woken by the hook's event
               (not netlink), sends each peer its feedback packet too.
For each peer: the instant it stopped sending into plane 1 = its
`port-down` event, or when each of its plane-1 paths to h4 had gone
`down`, whichever came first, in the kernel's event timestamps
(CLOCK_MONOTONIC, which bpf_ktime_get_ns reads too), from the instant of
the netlink call that set the link down (`out_ms`); the slowest peer is
the run's (`all_out_ms`; the issue's target: within 1 ms).  With the
watcher, also when it read the change (`woke_ms`); with the hooks, when
h4's own hook set its status (`hook_ms`: its event `own-port-down`); and
when h4's datapath told each peer from the first packet in after the
change (`told_ms`: its events `port-told`, bpf/lib/port_tell.h): the
stages call -> hook -> told -> peer out, each a kernel timestamp.

This module measures (typed: bench/port_down_analysis.py analyses).
"""
from __future__ import annotations

import json
import time

from mrc_ebpf.bench.port_down_analysis import Measured, Run, plot, summarize, table  # noqa: F401
from mrc_ebpf.bench.runner import PY, log
from mrc_ebpf.lab import procs

TITLE = "every peer out of a plane whose device went down: port status vs the acknowledgement clock"
MODES_ALLOWED = ("ack-clock", "port-status", "kernel", "kernel+watcher")
TARGET, PEERS, PLANE = 4, (1, 2, 3, 5), 1


def params(short: bool) -> dict:
    return {"planes": 2, "spines": 2, "leaves": 2, "hosts_per_leaf": 3, "pps": 2000,
            "down_at_s": 1.0, "down_s": 1.0, "after_s": 0.5 if short else 1.0, "repeat": 1 if short else 3,
            "modes": list(MODES_ALLOWED), "rate": None, "mtu": 1500,
            # the clock races the news: a long one shows what port status
            # saves when no clock runs (idle paths, long timeouts); the
            # attach default (1 ms) is the other end
            "ack_timeout_us": 100000, "probe_max_us": 50000, "mrc_policy": "rr",
            "target": "h4 (its plane-1 link cut at p1l2)", "senders": "h1, h2, h3, h5 (one UDP flow each)"}


def steps(p: dict) -> int:
    return len(p["modes"]) * p["repeat"]


def _leaf_port(fab, up: bool) -> tuple[int, int]:
    """h4's plane-1 link cut (or back) at its leaf's end: one netlink call,
    CLOCK_MONOTONIC just before and after it.  Back up, the leaf's
    addresses and routes are put back (the kernel drops IPv6 routes
    through a device set down)."""
    from pyroute2 import IPRoute
    from mrc_ebpf.lab.netns import inside
    leaf = fab.leaf(PLANE, fab.leaf_of(TARGET))
    with inside(fab.ns(leaf)), IPRoute() as ipr:
        index = ipr.link_lookup(ifname=f"h{TARGET}")[0]
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        ipr.link("set", index=index, state="up" if up else "down")
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if up:
        procs.batch(["ip", "-n", fab.ns(leaf)], fab.addr_cmds(leaf), f"addresses of {leaf}")
        procs.batch(["ip", "-n", fab.ns(leaf)], fab.route_cmds(leaf), f"routes of {leaf}")
    return before, after


def _events(env, fab, h: int) -> list[dict]:
    return json.loads(env.mrcctl(fab.ns(fab.host(h)), "stats", "--events", "-j").stdout)["events"]


def _one(env, fab, p, mode, port) -> Run:
    target_ns = fab.ns(fab.host(TARGET))
    seconds = p["down_at_s"] + p["down_s"] + p["after_s"]
    sink = env.popen(target_ns, [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-recv", fab.addr6(TARGET), str(port),
                                 str(seconds + 10), "/dev/null"])
    watcher = None
    env.mrcctl(target_ns, "ports", "hook", "on" if mode.startswith("kernel") else "off")
    try:
        sink.stdout.readline()
        if mode in ("port-status", "kernel+watcher"):
            watcher = env.popen(target_ns, ["chrt", "-f", "50", *procs.MRCCTL, "ports", "-j", "watch"])
            first = watcher.stdout.readline()
            if "watching" not in first:
                raise RuntimeError(f"mrcctl ports watch did not start: {first} {watcher.stderr.read()[-300:]}")
        flows = [env.popen(fab.ns(fab.host(h)), [PY, "-m", "mrc_ebpf.bench.flowtool", "udp-send",
                                                 fab.addr6(TARGET), str(port), str(seconds), "1",
                                                 str(p["pps"] * 1200 * 8), "1200"]) for h in PEERS]
        for f in flows:
            if not f.stdout.readline().startswith("started"):
                raise RuntimeError(f"a sender did not start: {f.stderr.read().strip()[-300:]}")
        time.sleep(p["down_at_s"])
        t0, t1 = _leaf_port(fab, up=False)
        time.sleep(p["down_s"])
        _leaf_port(fab, up=True)
        for f in flows:
            env.wait(f, timeout=seconds + 30)
        out = ""
        if watcher is not None:
            watcher.terminate()         # SIGTERM: what it printed stays readable
            out, _ = env.wait(watcher, timeout=10)
    finally:
        env.end(sink)
        if watcher is not None:
            env.end(watcher)
    changes = [json.loads(line) for line in (out or "").splitlines() if line.startswith("{\"ns\"")]
    events = {h: _events(env, fab, h) for h in PEERS}
    target_events = _events(env, fab, TARGET)
    own = [e["ns"] for e in target_events if e["type"] == "own-port-down" and e["ns"] >= t0]
    # the target's datapath telling each peer (lib/port_tell.h): the first after the call
    told = {}
    for h in PEERS:
        ns = [e["ns"] for e in target_events if e["type"] == "port-told" and e["ns"] >= t0
              and e.get("prefix") == fab.prefix6(h)]
        if ns:
            told[h] = min(ns)
    plane_ids = [i for i, path in enumerate(fab.paths(PEERS[0], TARGET)) if path["plane"] == PLANE]
    return Run(mode, t0, t1, changes, events, fab.prefix6(TARGET), plane_ids, min(own) if own else None, told)


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (port_down_analysis.summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.bench.runner import fabric
    measured = Measured({m: [] for m in p["modes"]})
    port = 5900
    with fabric("pd", spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"], rate=p["rate"],
                mtu=p["mtu"], host_sysctls=p["host_sysctls"], planes=p["planes"]) as fab:
        log(f"port-down: attaching MRC on {len(PEERS) + 1} hosts (minutes on a busy machine)")
        # the hosts the flows use (h6 idles: one attach less, most of a minute on a busy machine)
        used = ",".join(fab.host(h) for h in sorted((*PEERS, TARGET)))
        fab_mod.attach(fab.name, used, p["mrc_policy"], ["--ack-timeout-us", str(p["ack_timeout_us"]),
                                                        "--probe-max-us", str(p["probe_max_us"])])
        # a kernel that refuses BPF tracing (fentry) has no kernel modes
        hook = env.mrcctl(fab.ns(fab.host(TARGET)), "ports", "-j", "hook", "on", check=False)
        if hook.returncode != 0:
            why = (json.loads(hook.stdout).get("errors") if hook.stdout.strip().startswith("{") else None) \
                or hook.stderr.strip()[-300:]
            dropped = [m for m in p["modes"] if m.startswith("kernel")]
            measured.notes.append(f"modes {', '.join(dropped)} not run: the kernel hooks do not attach here ({why})")
            log(f"port-down: {measured.notes[-1]}")
            for m in dropped:
                measured.runs.pop(m, None)
        for mode in [m for m in p["modes"] if m in measured.runs]:
            for rep in range(p["repeat"]):
                port += 1
                log(f"port-down: {mode}, run {rep + 1}/{p['repeat']}", step=True)
                measured.runs[mode].append(_one(env, fab, p, mode, port))
                time.sleep(1.0)         # plane-1 paths back (probes every <= probe_max_us)
    return measured
