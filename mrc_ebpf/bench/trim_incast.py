"""8-to-1 incast rounds (short: 5-to-1) on a trimming fabric (issue #29's trimming
target): false path-downs, the receiver's loss count against the trims,
and round completion against the ideal, with trimming and without.

Fabric: K spines (4) x 3 leaves x 3 hosts, `fabric up --trim-threshold`
(the leaf-spine queues cut an MRC packet to its headers above the
threshold: bpf/lab/trim.c); host links unlimited.  h1 (under l1) is the
receiver, the other 8 hosts the senders: each round every sender sends
one `size`-byte message to h1 over a TCP connection set up beforehand,
all at once, and the round ends with the last byte of the slowest
(bench/collisions.run_round).  The 6 senders under l2 and l3 cross the
spines and meet in the spines' queues towards l1: ideal = their bytes /
(K x rate) (the 2 under l1 do not cross a spine).  Modes:
  ecmp       no MRC: the leaves hash each connection onto one spine;
  mrc-drop   MRC (rr, `--granularity packet`, `--skip-rotations`) with
             trimming off (every queue's threshold set out of reach:
             trims.tune): a full queue drops, as a plain fabric;
  mrc-trim   the same with the fabric's threshold: a full queue trims, the
             receiver reports the trim at once, the sender skips the path.
Measured per mode: the rounds' completion times (p50, p99, p99/ideal),
the senders' TCP retransmissions and RTOs (nstat), for the MRC modes the
path-downs on the senders (`down` events: nothing fails here, so every
one is false; want 0), the switches' own count of trims (the witness),
the receiver's count of trimmed packets and of lost ones per path
(`stats --paths`: a trim is not a loss).

This module measures (typed: bench/trim_incast_analysis.py analyses).
"""
from __future__ import annotations

import contextlib
import json
import time

from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.collisions import close_all, connect_all, run_round
from mrc_ebpf.bench.runner import log
from mrc_ebpf.bench.trim_incast_analysis import Measured, ModeRun, plot, summarize, table  # noqa: F401

TITLE = ("8-to-1 incast rounds on a trimming fabric: false path-downs, loss vs trims, completion p99/ideal, "
         "trim vs drop vs ECMP")
MODES_ALLOWED = ("ecmp", "mrc-drop", "mrc-trim")
RECEIVER = 1
OFF_NS = 10 ** 12            # a threshold no queue reaches: trimming off
TCP_KEYS = ("TcpRetransSegs", "TcpExtTCPTimeouts")


def params(short: bool) -> dict:
    # short: 5-to-1 on 2 leaves x 3 hosts (6 attaches, not 9: an attach
    # takes most of a minute on a busy machine)
    return {"spines": 4, "leaves": 2 if short else 3, "hosts_per_leaf": 3, "rate": "50mbit" if short else "100mbit",
            "size": (256 << 10) if short else (1 << 20), "rounds": 3 if short else 20, "repeat": 1,
            "modes": list(MODES_ALLOWED), "trim_threshold": "1ms", "skip_rotations": 8, "mrc_policy": "rr",
            "mtu": 1500, "ideal": "bytes the senders under other leaves send / (spines x rate)"}


def steps(p: dict) -> int:
    return len(p["modes"]) * p["rounds"]


def _trim_queues(env, fab) -> dict[str, dict]:
    """direction -> the trimming queue's counters (packets, mrc, trimmed), from `fabric show`."""
    from mrc_ebpf.lab import procs
    shown = json.loads(env.run(None, [*procs.MRCCTL, "fabric", "show", fab.name, "-j"]).stdout)
    return {e["trim"]["direction"]: {k: e["trim"][k] for k in ("packets", "mrc", "trimmed")}
            for lk in shown["links"] for e in lk["ends"] if e.get("trim")}


def _set_trimming(fab, threshold_ns: int) -> None:
    from mrc_ebpf.lab import trims
    for mac in (trims.read(fab.name) or {}):
        trims.tune(fab.name, mac, threshold_ns=threshold_ns)


def _rx(env, fab) -> dict[int, dict]:
    """The receiver's per-sender totals (rx_packets, lost, late, trimmed)
    from `stats --paths`.  A packet overtaken on its path counts as a gap
    (lost) when the one behind it arrives, then as late when it does: what
    was lost is lost - late."""
    rx = json.loads(env.mrcctl(fab.ns(fab.host(RECEIVER)), "stats", "--paths", "-j").stdout)["received"]
    out: dict = {}
    for r in rx:
        t = out.setdefault(r["from"], {"rx_packets": 0, "lost": 0, "late": 0, "trimmed": 0})
        for k in t:
            t[k] += r.get(k, 0) or 0
    return out


def _downs(env, fab, hosts, t_from) -> dict[str, int]:
    n: dict[str, int] = {}
    for h in hosts:
        evs = json.loads(env.mrcctl(fab.ns(fab.host(h)), "stats", "--events", "-j").stdout)["events"]
        for e in evs:
            if e["ns"] >= t_from and e["type"] in ("down", "shared-down", "late", "up", "skip"):
                n[e["type"]] = n.get(e["type"], 0) + 1
            if e["ns"] >= t_from and e["type"] == "down" and e.get("after_us") is not None:
                # how old the send judged overdue was: which rule took the
                # path down (the overtaken one within a window or two of
                # the allowance, the silence one at 16 windows)
                n[_age_bucket(e["after_us"])] = n.get(_age_bucket(e["after_us"]), 0) + 1
    return n


AGE_BUCKETS_MS = (2, 20, 100)


def _age_bucket(after_us: float) -> str:
    """The events-dict key of a down whose overdue send was AFTER_US old."""
    lo = 0
    for hi in AGE_BUCKETS_MS:
        if after_us < hi * 1000:
            return f"down_age_{lo}_{hi}ms"
        lo = hi
    return f"down_age_{lo}ms_up"


def _mode(env, fab, p, mode, senders, port) -> ModeRun:
    mrc = mode != "ecmp"
    with contextlib.ExitStack() as stack:
        listeners: list = []
        stack.callback(lambda: [ls.close() for ls in listeners])
        pairs = [(s, RECEIVER) for s in senders]
        conns = connect_all(fab, pairs, port, env.cc, False, listeners)
        stack.callback(close_all, conns)
        run_round(conns, pairs, 4096)          # connections warm, paths heard
        time.sleep(0.3)
        c0 = contenders.counters(env, fab, senders, TCP_KEYS)
        q0 = _trim_queues(env, fab)
        rx0 = _rx(env, fab) if mrc else None
        t_from = time.monotonic_ns()
        rounds = []
        for r in range(p["rounds"]):
            log(f"trim-incast: {mode} round {r + 1}/{p['rounds']}", step=True)
            rounds.append(run_round(conns, pairs, p["size"]))
        c1 = contenders.counters(env, fab, senders, TCP_KEYS)
        q1 = _trim_queues(env, fab)
        rx1 = _rx(env, fab) if mrc else None
        events = _downs(env, fab, senders, t_from) if mrc else None
    return ModeRun(mode, rounds, contenders.delta_of(c0, c1),
                   {d: {k: v - q0[d][k] for k, v in q.items()} for d, q in q1.items()},
                   rx0, rx1, events)


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (trim_incast_analysis.summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab import trims
    from mrc_ebpf.bench.runner import fabric
    m = Measured({}, [], {})
    with fabric("ti", spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"], rate=p["rate"],
                mtu=p["mtu"], host_sysctls=p["host_sysctls"], trim_threshold=p["trim_threshold"]) as fab:
        senders = [h for h in fab.hosts() if h != RECEIVER]
        m.crossing = [h for h in senders if fab.leaf_of(h) != fab.leaf_of(RECEIVER)]
        threshold = trims.parse_threshold(p["trim_threshold"])
        attached = False
        for i, mode in enumerate(p["modes"]):
            if mode != "ecmp" and not attached:
                log(f"trim-incast: attaching MRC on {len(fab.hosts())} hosts (minutes on a busy machine)")
                fab_mod.attach(fab.name, None, p["mrc_policy"], ["--granularity", "packet", "--skip-rotations",
                                                                 str(p["skip_rotations"])])
                attached = True
                time.sleep(0.5)
            _set_trimming(fab, threshold if mode == "mrc-trim" else OFF_NS)
            m.runs[mode] = _mode(env, fab, p, mode, senders, 6100 + i)
        m.sender_sids = {fab.host_sid(h): h for h in senders}
    return m
