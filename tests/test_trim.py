"""Trimming on a fabric of namespaces (issue #29, item 2): the lab's
switches cut MRC packets to their headers past a queue threshold
(bpf/lab/trim.c); the receiver counts the trims per path, never
delivers them, answers each at once, and the sender skips the path,
never taking it down.  Witnesses: the switch's own counters (what it
trimmed, per device), the receiving host's kernel UDP counter (what
was delivered) and the spines' interface counters.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import UDP_SEND, mrcctl
from test_fabric import SINK, Net, _events, _nstat, _sent, fabric

pytestmark = pytest.mark.root

PREFIX = "fd00:0:2::/64"
SPINES = ["s1", "s2", "s3", "s4"]


@pytest.fixture(scope="module")
def net():
    name = f"tr{os.getpid() % 10000}"
    try:
        fabric("up", name, "--spines", "4", "--leaves", "2", "--rate", "100mbit", "--trim-threshold", "1ms")
        fabric("attach", name, "--policy", "rr", "--", "--skip-rotations", "8")
        yield Net(name)
    finally:
        fabric("down", name, check=False)


def _trims(net) -> dict[str, dict]:
    """direction (l1>s1 ...) -> the trimming queue's counters, from `fabric show -j`."""
    shown = json.loads(fabric("show", net.name, "-j").stdout)
    return {e["trim"]["direction"]: e["trim"] for lk in shown["links"] for e in lk["ends"] if e.get("trim")}


def _counters(net, host) -> dict[str, int]:
    return json.loads(mrcctl("stats", "-j", netns=net.ns(host)).stdout)["counters"]


def test_trimmed_packets_are_counted_answered_never_delivered_and_skip_the_path(net):
    """l1's queue towards s1 trims every MRC packet (its virtual queue
    kept backlogged, threshold 1 ns); the other queues trim nothing.
    One-way UDP sprayed rr over the 4 spines from h1 to h2."""
    from mrc_ebpf.lab import trims
    mac = json.loads(net.exec("l1", ["ip", "-j", "link", "show", "s1"]).stdout)[0]["address"]
    trims.tune(net.name, mac, threshold_ns=1, ns_per_kbyte=10 ** 9)
    sink = net.popen("h2", SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        trims_before, rx_before, tx_before = _trims(net), _counters(net, "h2"), _counters(net, "h1")
        udp_before = _nstat(net, "h2", "Udp6InDatagrams")
        spines_before = net.spine_tx(SPINES, "l2")
        sent_before = _sent(net, "h1", PREFIX)
        net.exec("h1", [*UDP_SEND, "fd00:0:2::1", "9", "4000", "--pps=4000"], timeout=120)
        spines = {s: v - spines_before[s] for s, v in net.spine_tx(SPINES, "l2").items()}
        sent = {k: v - sent_before[k] for k, v in _sent(net, "h1", PREFIX).items()}
        cut = {d: q["trimmed"] - trims_before[d]["trimmed"] for d, q in _trims(net).items()}
        rx = {k: v - rx_before.get(k, 0) for k, v in _counters(net, "h2").items()}
        tx = {k: v - tx_before.get(k, 0) for k, v in _counters(net, "h1").items()}
        delivered = _nstat(net, "h2", "Udp6InDatagrams") - udp_before
    finally:
        sink.kill()
        sink.wait()
    print(f"trim: cut by the switches {cut}; h1's paths {sent}; spines towards l2 {spines}; "
          f"h2 delivered {delivered}, rx_trimmed {rx.get('rx_trimmed')}, answered {rx.get('fb_trim_clone')}; "
          f"h1 heard CE/trim reports {tx.get('rx_fb_ce')}, skipped turns {tx.get('tx_skip')}")
    # the switch's own witness: l1>s1 trims, no other queue does
    assert cut["l1>s1"] > 0 and all(v == 0 for d, v in cut.items() if d != "l1>s1"), cut
    # the receiver counted each trim once, on path 0 (via s1), and answered each
    assert rx["rx_trimmed"] == cut["l1>s1"], (rx, cut)
    assert 0 < rx.get("fb_trim_clone", 0) <= rx["rx_trimmed"]
    got = {r["path_id"]: r for r in json.loads(mrcctl("stats", "--paths", "-j", netns=net.ns("h2")).stdout)["received"]
           if r["path_id"] in sent}
    assert got[0]["trimmed"] > 0 and all(got[k]["trimmed"] == 0 for k in (1, 2, 3)), got
    # a trim is not a loss: no path reports one
    assert all(r["lost"] == 0 for r in got.values()), got
    # never delivered: the kernel's UDP counter has what was sent, less the trims
    assert delivered == sum(sent.values()) - rx["rx_trimmed"], (delivered, sent, rx["rx_trimmed"])
    # the sender heard and skipped: s1 carries far less than each other spine
    assert tx["rx_fb_ce"] > 0 and tx["tx_skip"] > 0
    assert sent[0] * 3 < min(sent[k] for k in (1, 2, 3)), sent
    assert spines["s1"] * 3 < min(spines[s] for s in SPINES[1:]), spines
    # skipped, never down
    evs = _events(net)
    assert not [e for e in evs if e["type"] in ("down", "shared-down", "fail-open")], evs
    assert {e["path_id"] for e in evs if e["type"] == "skip"} == {0}
    rows = {r["path_id"]: r for r in json.loads(mrcctl("path", "list", "-j", netns=net.ns("h1")).stdout)
            if r["prefix"] == PREFIX}
    assert rows[0]["downs"] == 0 and rows[0]["ce_reports"] > 0
    assert all((rows[k]["feedback"] or {}).get("lost", 0) == 0 for k in rows), rows
