"""Shared fate on and off, side by side: what a spine black hole costs 8
hosts talking all-to-all.

Fabric: 4 spines x 2 leaves x 4 hosts (8 hosts, one plane, SRH paths:
each host has 4 paths to each of its 7 peers, one per spine), mrc-ebpf
on every host, rr.  Load: every host sends `pps` 200-byte UDP packets a
second to its peers (bench/alltoall_udp.py, one process per host, all
started together) in one of two patterns:
  * phased: in step k (phase_ms long) host i sends to peer (i + k) mod 7,
    as all-to-all collectives schedule it, so a host talks to one peer at
    a time and meets the others in turn;
  * uniform: every host sends to all 7 peers all the time (packet k to
    peer k mod 7).
  * uniform-nofail: uniform, and nothing fails (the control: shared
    fate must lose nothing where nothing fails).
After warmup_s both of spine s1's downlinks are black-holed (the fault
program on l1's and l2's ingress from s1, `fabric fail s1>l1 s1>l2`
switched from an armed 1e-9 loss to blackhole with one map write) for
fail_s, then healed the same way; the load goes on for after_s.

Each (pattern, shared fate) run is measured on the same fabric and
attachments, shared fate switched with `mrcctl shared-fate on|off` on
every host; the order of on/off alternates between repetitions, and the
fabric is given settle_s between runs for the paths taken out to be
probed back.  Measured per run:
  * lost: data packets sent and never received, summed over all 56
    (sender, receiver) pairs (each receiver counts per sender: the
    witness independent of the datapath);
  * fault_drops: what the fault programs dropped (data, probe copies and
    feedback-only packets);
  * hop counters of every host's datapath (`mrcctl shared-fate -j`):
    times s1's hop became suspect, paths taken out by an unanswered
    probe; and `path list` downs summed, and those of paths whose first
    segment is not s1 (`false_downs`: nothing else failed);
  * the datapath's counters summed over the hosts (`mrcctl stats`):
    fail_open (a packet sent on a path that was out: every try was),
    reroute (the pick was out or skipped: another path taken), probe
    (a down or suspect path tested) and probe_copy (of which header-only
    copies of data packets).

A run's measurement (SharedFateRun: the generators' counts, the fault
programs' drops, the hosts' counters before and after) is kept apart from
its analysis (run_result, summarize), a pure function of it.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import statistics
import subprocess
import time

from mrc_ebpf.bench.runner import PY, fmt_spread, log, spread
from mrc_ebpf.errors import MrcError

TITLE = "Shared fate on/off: data lost by 8 hosts all-to-all when a spine's downlinks black-hole"
USES_TCP = False
TARGETS = ("s1>l1", "s1>l2")
SPINE = "s1"


def params(short: bool) -> dict:
    # short: 4 hosts, half the traffic and a quarter of the pairs (the
    # queries of every host's state, two a run, are most of its time)
    return {"spines": 4, "leaves": 2, "hosts_per_leaf": 2 if short else 4, "rate": None, "mtu": 1500,
            "pps": 2000, "size": 200, "phase_ms": 20.0,
            "patterns": ["phased", "uniform", "uniform-nofail"], "shared_fate": ["on", "off"],
            "warmup_s": 1.0, "fail_s": 0.6 if short else 1.0, "after_s": 0.5, "settle_s": 1.0,
            "repeat": 1 if short else 3, "policy": "rr", "port": 6100}


def _fault_drops(fab) -> int:
    from mrc_ebpf.lab import faults
    total = 0
    for t in TARGETS:
        leaf = t.split(">")[1]
        st = faults.status(fab.ns(leaf), SPINE)
        total += st["dropped"] if st else 0
    return total


def _set_faults(fab, mode: str, loss: float = 1.0):
    from mrc_ebpf.lab import faults
    for t in TARGETS:
        faults.rearm(fab.ns(t.split(">")[1]), SPINE, mode, loss)


COUNTERS = {"fail_open": "tx_fail_open", "reroute": "tx_reroute", "probe": "tx_probe",
            "probe_copy": "tx_probe_copy"}


HOP_KEYS = ("suspects", "watch_suspects", "shared_downs", "false_suspects", "downs", "false_downs",
            *COUNTERS)


@dataclasses.dataclass
class Generator:
    """One host's all-to-all generator report (bench/alltoall_udp.py)."""
    sent: dict[str, int]            # peer address -> packets sent to it
    received: dict[str, int]        # sender index -> packets received from it
    send_errors: int


@dataclasses.dataclass
class SharedFateRun:
    """One (pattern, shared fate) run as measured."""
    pattern: str
    shared_fate: str
    hosts: list[str]
    addrs: list[str]
    generators: list[Generator]
    fault_drops: int                # what the fault programs dropped during the run
    hops_before: dict[str, int]     # _hops() before and after: HOP_KEYS summed over the hosts
    hops_after: dict[str, int]
    t_fail: float
    load: float


def _hops(env, fab, hosts) -> dict[str, int]:
    """Summed over the hosts: suspicions and shared downs of s1's hop,
    every path's downs (path list), those of paths not through s1, and the
    datapath counters of COUNTERS."""
    sid = fab.spine_sid(0, 1)
    out = {k: 0 for k in HOP_KEYS}
    for h in hosts:
        r = env.mrcctl(fab.ns(h), "shared-fate", "-j")
        for hop in json.loads(r.stdout)["hops"]:
            if ipaddress.IPv6Address(hop["sid"]) == ipaddress.IPv6Address(sid):
                out["suspects"] += hop["suspects"]
                out["watch_suspects"] += hop["watch_suspects"]
                out["shared_downs"] += hop["shared_downs"]
            else:       # nothing else failed: a false suspicion
                out["false_suspects"] += hop["suspects"]
        r = env.mrcctl(fab.ns(h), "path", "list", "-j")
        rows = json.loads(r.stdout)
        out["downs"] += sum(x.get("downs", 0) for x in rows)
        out["false_downs"] += sum(x.get("downs", 0) for x in rows
                                  if not x["segments"] or
                                  ipaddress.IPv6Address(x["segments"][0]) != ipaddress.IPv6Address(sid))
        counters = json.loads(env.mrcctl(fab.ns(h), "stats", "-j").stdout)["counters"]
        for k, name in COUNTERS.items():
            out[k] += counters.get(name, 0)
    return out


def _one(env, fab, p, hosts, pattern: str, sf: str, port: int) -> SharedFateRun:
    for h in hosts:
        env.mrcctl(fab.ns(h), "shared-fate", sf)
    addrs = [fab.addr6(int(h[1:])) for h in hosts]
    drops0, hops0 = _fault_drops(fab), _hops(env, fab, hosts)
    seconds = p["warmup_s"] + p["fail_s"] + p["after_s"]
    load, _, nofail = pattern.partition("-")
    procs = []
    for i, h in enumerate(hosts):
        peers = [a for j, a in enumerate(addrs) if j != i]
        procs.append(env.popen(fab.ns(h), [PY, "-m", "mrc_ebpf.bench.alltoall_udp", "--index", str(i),
                                           "--peers", ",".join(peers), "--port", str(port),
                                           "--pps", str(p["pps"]), "--seconds", str(seconds),
                                           "--pattern", load, "--phase-ms", str(p["phase_ms"]),
                                           "--size", str(p["size"])],
                               stdin=subprocess.PIPE))
    start = time.monotonic() + 1.5         # every generator up and waiting
    for pr in procs:
        pr.stdin.write(f"{start}\n")
        pr.stdin.flush()
    time.sleep(max(0.0, start + p["warmup_s"] - time.monotonic()))
    if not nofail:
        _set_faults(fab, "blackhole")
    t_fail = time.monotonic()
    time.sleep(max(0.0, t_fail + p["fail_s"] - time.monotonic()))
    if not nofail:
        _set_faults(fab, "loss", 1e-9)
    docs = []
    for pr in procs:
        out, err = env.wait(pr, timeout=seconds + 30)
        try:
            d = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise MrcError(f"all-to-all generator failed: {err.strip()[-300:]}")
        docs.append(Generator(d["sent"], d["received"], d["send_errors"]))
    hops1 = _hops(env, fab, hosts)
    return SharedFateRun(pattern, sf, hosts, addrs, docs, _fault_drops(fab) - drops0, hops0, hops1, t_fail,
                         _load())


def _load() -> float:
    """The machine's 1-minute load average (other sessions share it)."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run(p: dict, env) -> dict:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.bench.runner import fabric
    runs = []
    with fabric("sf", spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                rate=p["rate"], mtu=p["mtu"]) as fab:
        hosts = [fab.host(h) for h in fab.hosts()]
        log(f"shared-fate: attaching mrc-ebpf on {len(hosts)} hosts ({p['policy']})")
        fab_mod.attach(fab.name, None, p["policy"], [])
        fab_mod.fail(fab.name, list(TARGETS), "loss=1e-9")     # armed: a map write switches it
        try:
            port = p["port"]
            for rep in range(p["repeat"]):
                for pattern in p["patterns"]:
                    order = p["shared_fate"] if rep % 2 == 0 else list(reversed(p["shared_fate"]))
                    for sf in order:
                        time.sleep(p["settle_s"])
                        m = _one(env, fab, p, hosts, pattern, sf, port)
                        r = run_result(m)
                        port += 1
                        log(f"shared-fate: {pattern} {sf}: lost {r['lost']} of {r['sent']}, fault drops "
                            f"{r['fault_drops']}, s1 suspect {r['suspects']}x ({r['watch_suspects']} by watch), "
                            f"false suspects {r['false_suspects']}, shared downs "
                            f"{r['shared_downs']}, downs {r['downs']} (not s1: {r['false_downs']}), "
                            f"fail-open {r['fail_open']}, reroute {r['reroute']}, probes {r['probe']} "
                            f"({r['probe_copy']} copies), load {r['load']}")
                        runs.append(m)
        finally:
            fab_mod.heal(fab.name, None)
    return summarize(p, runs)


# --------------------------------------------------------------------------- analysis

def run_result(m: SharedFateRun) -> dict:
    """One run's losses (per sender-receiver pair) and counter deltas."""
    docs, hosts, addrs = m.generators, m.hosts, m.addrs
    sent = received = 0
    pairs = {}          # "h1>h2": packets lost
    for i, d in enumerate(docs):
        sent += sum(d.sent.values())
        for j, dj in enumerate(docs):
            if i != j:
                got = dj.received.get(str(i), 0)
                received += got
                pairs[f"{hosts[i]}>{hosts[j]}"] = d.sent.get(addrs[j], 0) - got
    return {"pattern": m.pattern, "shared_fate": m.shared_fate, "sent": sent, "received": received,
            "lost": sent - received, "fault_drops": m.fault_drops,
            "send_errors": sum(d.send_errors for d in docs),
            "pairs_with_loss": sum(1 for v in pairs.values() if v), "lost_by_pair": pairs,
            "t_fail": m.t_fail, "load": m.load,
            **{k: m.hops_after[k] - m.hops_before[k] for k in m.hops_before}}


def summarize(p: dict, measured: list[SharedFateRun]) -> dict:
    """The results: every run's, and per pattern and setting their spread."""
    runs = [run_result(m) for m in measured]
    out = {"runs": runs, "patterns": {}}
    for pattern in p["patterns"]:
        by = {}
        for sf in p["shared_fate"]:
            rs = [r for r in runs if r["pattern"] == pattern and r["shared_fate"] == sf]
            by[sf] = {k: spread([r[k] for r in rs]) for k in
                      ("lost", "fault_drops", "suspects", "watch_suspects", "false_suspects",
                       "shared_downs", "downs", "false_downs",
                       *COUNTERS, "load", "sent")}
        on = [r["lost"] for r in runs if r["pattern"] == pattern and r["shared_fate"] == "on"]
        off = [r["lost"] for r in runs if r["pattern"] == pattern and r["shared_fate"] == "off"]
        if on and off and statistics.median(off):
            by["lost_ratio_on_off"] = round(statistics.median(on) / statistics.median(off), 3)
        out["patterns"][pattern] = by
    return out


def table(results: dict):
    headers = ["pattern", "shared fate", "data lost", "fault drops", "s1 suspect (hosts x)",
               "paths out by probe", "path downs", "not s1", "fail-open", "reroute", "load", "lost on/off"]
    rows = []
    for pattern, by in results["patterns"].items():
        for sf, s in by.items():
            if sf == "lost_ratio_on_off":
                continue
            rows.append([pattern, sf, fmt_spread(s["lost"]), fmt_spread(s["fault_drops"]),
                         fmt_spread(s["suspects"]), fmt_spread(s["shared_downs"]), fmt_spread(s["downs"]),
                         fmt_spread(s["false_downs"]), fmt_spread(s["fail_open"]), fmt_spread(s["reroute"]),
                         fmt_spread(s["load"]),
                         by.get("lost_ratio_on_off", "") if sf == "on" else ""])
    return headers, rows


def plot(results: dict, plt):
    fig, ax = plt.subplots(1, 1, figsize=(7, 3.5))
    labels, values = [], []
    for pattern, by in results["patterns"].items():
        for sf, s in by.items():
            if sf == "lost_ratio_on_off":
                continue
            labels.append(f"{pattern}\n{sf}")
            values.append(s["lost"]["median"] if s["lost"] else 0)
    ax.bar(labels, values, color=["tab:green" if "\non" in x else "tab:red" for x in labels])
    ax.set_ylabel("data packets lost (median)")
    return fig
