"""Congestion apart from failure, and the probe budget, on a fabric of
namespaces (issue #29, items 1 and 5).  The datapath's own view is
checked against independent witnesses: the lab's ECN marker's counters
(bpf/lab/ecn_mark.c), the lab's fault program's drop counter
(bpf/lab/fault.c) and the spines' interface counters.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import UDP_SEND, mrcctl
from test_fabric import SINK, Net, _ecn_marks, _events, _sent, fabric

pytestmark = pytest.mark.root

PREFIX = "fd00:0:2::/64"
SPINES = ["s1", "s2", "s3", "s4"]


@pytest.fixture(scope="module")
def net():
    """One fabric for both tests (4 spines at 100 Mbit/s, ECN marking
    queues), attached with skip and backoff on: the skip test sends ECT
    traffic, the backoff test Not-ECT, which no queue marks."""
    name = f"cg{os.getpid() % 10000}"
    try:
        fabric("up", name, "--spines", "4", "--leaves", "2", "--rate", "100mbit", "--ecn-threshold", "1ms")
        fabric("attach", name, "--policy", "rr", "--", "--skip-rotations", "8",
               "--probe-us", "5000", "--probe-max-us", "80000")
        yield Net(name)
    finally:
        fabric("down", name, check=False)


def _sink(net):
    return net.popen("h2", SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def copies_now(net) -> int:
    return json.loads(mrcctl("stats", "-j", netns=net.ns("h1")).stdout)["counters"]["tx_probe_copy"]


def _udp(net, count, pps, tclass=0):
    net.exec("h1", [*UDP_SEND, "fd00:0:2::1", "9", str(count), f"--pps={pps}",
                    f"--tclass={tclass}"], timeout=120)


def test_a_ce_marked_path_is_skipped_and_never_taken_down(net):
    """l1's queue towards s1 marks every ECN-capable packet (the lab's
    marker, its virtual queue kept backlogged); the other queues mark
    nothing.  One-way ECT(0) UDP sprayed rr over the 4 spines: h2 counts
    the marks on the path via s1 and reports them in its feedback; h1
    skips that path for 8 turns a report.  Witnesses: the marker's
    counters (marks on l1>s1 alone) and the spines' own interface
    counters (s1 carries a fraction of what each other spine carries)."""
    from mrc_ebpf.lab import ecn_marks
    mac = json.loads(net.exec("l1", ["ip", "-j", "link", "show", "s1"]).stdout)[0]["address"]
    ecn_marks.tune(net.name, mac, threshold_ns=1, ns_per_kbyte=10 ** 9)
    sink = _sink(net)
    try:
        marks_before = _ecn_marks(net)
        spines_before = net.spine_tx(SPINES, "l2")
        sent_before = _sent(net, "h1", PREFIX)
        _udp(net, 4000, 4000, tclass=2)              # ECT(0)
        spines = {s: v - spines_before[s] for s, v in net.spine_tx(SPINES, "l2").items()}
        sent = {k: v - sent_before[k] for k, v in _sent(net, "h1", PREFIX).items()}
        marks = {d: q["marked"] - marks_before[d]["marked"] for d, q in _ecn_marks(net).items()}
    finally:
        sink.kill()
        sink.wait()
    print(f"skip: spines' packets towards l2 {spines}; h1's paths {sent}; marks {marks}")
    # the witness of the marks: l1>s1 only
    assert marks["l1>s1"] > 0 and all(v == 0 for d, v in marks.items() if d.startswith("l1>") and d != "l1>s1")
    # the receiver counted them on path 0 (via s1) alone
    got = {r["path_id"]: r for r in json.loads(mrcctl("stats", "--paths", "-j", netns=net.ns("h2")).stdout)["received"]
           if r["path_id"] in sent}
    assert got[0]["ce"] > 0 and all(got[k]["ce"] == 0 for k in (1, 2, 3)), got
    # the spines' own counters: s1 carries far less than each other spine
    others = [spines[s] for s in SPINES[1:]]
    assert spines["s1"] * 3 < min(others), spines
    assert sent[0] * 3 < min(sent[k] for k in (1, 2, 3)), sent
    # skipped, never down: events and states
    evs = _events(net)
    assert not [e for e in evs if e["type"] in ("down", "shared-down", "fail-open")], evs
    assert {e["path_id"] for e in evs if e["type"] == "skip"} == {0}
    rows = {r["path_id"]: r for r in json.loads(mrcctl("path", "list", "-j", netns=net.ns("h1")).stdout)
            if r["prefix"] == PREFIX}
    assert rows[0]["ce_reports"] > 0 and rows[0]["downs"] == 0
    assert all(rows[k]["ce_reports"] == 0 and rows[k]["state"] == "up" for k in (1, 2, 3))
    assert rows[0]["state"] in ("up", "skip")


def test_a_dead_path_is_probed_with_backoff_and_comes_back(net):
    """s1's downlink black-holed for ~1 s under one-way UDP: the path via
    s1 goes down and is probed at 5, 10, 20, 40, 80, 80 ... ms instead of
    every 5 ms.  Witness: the fault program's own drop count on l2 (the
    probe copies, and the few packets sent before the path went out).
    After the heal a probe is answered within the max interval and the
    path carries traffic again."""
    from mrc_ebpf.lab import faults
    sink = _sink(net)
    try:
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "loss=1e-9")      # loaded, drops nothing
        _udp(net, 500, 5000)
        copies_before = copies_now(net)
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
        _udp(net, 1000, 5000)                        # 0.2 s: the path goes out
        dropped_out, copies_out = faults.status(net.ns("l2"), "s1")["dropped"], copies_now(net)
        _udp(net, 4000, 5000)                        # 0.8 s more, only probes into the hole
        status = json.loads(mrcctl("status", "-j", netns=net.ns("h1"), check=False).stdout)[0]
        dropped = faults.status(net.ns("l2"), "s1")["dropped"]
        copies = copies_now(net) - copies_before
        late_drops, late_copies = dropped - dropped_out, copies_now(net) - copies_out
        fabric("heal", "-n", net.name, "s1>l2")
        before = _sent(net, "h1", PREFIX)[0]
        _udp(net, 1000, 5000)                        # 0.2 s: more than the 80 ms max interval
        after = _sent(net, "h1", PREFIX)[0]
    finally:
        sink.kill()
        sink.wait()
    print(f"backoff: {copies} probe copies in ~1 s, {late_drops} dropped by the hole in its last 0.8 s "
          f"({late_copies} copies; every 5 ms: ~160); status {status['probing']}")
    # the fixed schedule would have sent ~200 copies; the backoff ~15
    assert 5 <= copies <= 30, copies
    # once the path is out, what the hole eats is the probe copies, ever fewer
    assert late_drops <= 20 and abs(late_drops - late_copies) <= 1, (late_drops, late_copies)
    assert status["probing"]["down_paths"] == 1
    assert status["probing"]["probes_per_s"] <= 1e6 / 80000 + 0.1
    # back: an "up" after the heal, and its share again
    evs = _events(net)
    assert [e["type"] for e in evs if e["path_id"] == 0][-1] == "up", evs
    assert after - before > 100, (before, after)
