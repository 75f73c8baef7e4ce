"""Spare EVs on an `--encoding ev` fabric (issue #29, item 4): 64 EVs +
16 spares from h1 to h2, traced over the 4 spines (`path trace
--order`), s1 black-holed, then losing a quarter of its packets, under
one-way UDP.  Witness: the spines' own interface counters towards leaf
2, in one run with the spares and then with them denied (no spares)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import UDP_SEND, mrcctl
from test_fabric import _xfer, fabric, make_fabric  # noqa: F401

pytestmark = pytest.mark.root

PREFIX = "fd00:0:2::/64"
LOSS = 0.25        # s1>l2 gray: a quarter of its packets lost
SINK = ["python3", "-c", "import socket\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        "s.bind(('::', 9))\n"
        "while True: s.recv(65536)"]


def _rows(net):
    return [r for r in json.loads(mrcctl("path", "list", "-j", netns=net.ns("h1")).stdout)
            if r["prefix"] == PREFIX]


def _udp(net, count, pps=20000):
    p = net.popen("h1", [*UDP_SEND, "fd00:0:2::1", "9", str(count), f"--pps={pps}"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err


def _spines_tx(net, what="packets"):
    """What each spine sent to leaf 2 (its own interface counter)."""
    out = []
    for k in range(1, 5):
        link = json.loads(subprocess.run(["ip", "-n", net.ns(f"s{k}"), "-j", "-s", "link", "show", "l2"],
                                         capture_output=True, text=True, check=True).stdout)
        out.append(link[0]["stats64"]["tx"][what])
    return out


def _spine_shares(net, mode):
    """s1>l2 failed (`fabric fail --mode ...`): after a warm-up, the
    packets each spine carried of 20,000 towards leaf 2 (its own
    counter, what it sent before the fault on leaf 2's side dropped
    them)."""
    fabric("fail", "-n", net.name, "s1>l2", "--mode", mode)
    try:
        _udp(net, 4000)
        before = _spines_tx(net)
        _udp(net, 20000)
        return [a - b for a, b in zip(_spines_tx(net), before)]
    finally:
        fabric("heal", "-n", net.name, "s1>l2")


def _dead_spine_shares(net):
    """s1>l2 black-holed: the live spines' (s2..s4) shares."""
    carried = _spine_shares(net, "blackhole")
    live = carried[1:]
    return [c / sum(live) for c in live], carried


def _lossy_spine_shares(net, loss):
    """s1>l2 losing LOSS of its packets: each loss takes the EV out until a
    probe brings it back, so at any time some of s1's EVs are out (a
    plane partly failed): every spine's share."""
    carried = _spine_shares(net, f"loss={loss}")
    return [c / sum(carried) for c in carried], carried


def _evs_back(net):
    """Every EV up again after the heal (a spare out is probed only while
    an EV it stands in for is out: it may stay assumed-bad)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _udp(net, 2000, 10000)
        if not [r for r in _rows(net) if r["state"] == "assumed-bad" and not r["spare"]]:
            return
    raise AssertionError([(r["path_id"], r["state"]) for r in _rows(net) if r["state"] == "assumed-bad"])


def _with_spares(net):
    """h1's 64 EVs to h2 (fabric attach) get 16 spares, all traced."""
    sid = _rows(net)[0]["peer_sid"]
    # the 64 EVs `fabric attach` gave are kept: 16 spares added, then traced
    added = json.loads(mrcctl("path", "add", PREFIX, "--entropy", "64", "--spare", "16", "--sid", sid, "-j",
                              netns=net.ns("h1")).stdout)
    assert sum(1 for r in added if not r["existed"]) == 16 and all(r["spare"] for r in added if not r["existed"])
    mrcctl("path", "trace", PREFIX, "--order", netns=net.ns("h1"))
    rows = _rows(net)
    spares = [r for r in rows if r["spare"]]
    assert len(rows) == 80 and len(spares) == 16
    assert all(r["state"] == "spare" and r["hop"] for r in spares), spares
    s1_hop = {r["hop"] for r in rows if r["hop"]}
    assert len(s1_hop) == 4
    return spares


def test_spares_keep_the_live_spines_even_with_a_spine_black_holed(make_fabric):
    net = make_fabric("--spines", "4", "--leaves", "2", "--encoding", "ev", "--rate", "none")
    fabric("attach", net.name, "--policy", "rr")
    spares = _with_spares(net)
    sink = net.popen("h2", SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _udp(net, 2000)            # first acknowledgements: paths start `unknown`
        lossy_spares, lossy_carried = _lossy_spine_shares(net, LOSS)
        print(f"64+16 EVs, s1>l2 losing {LOSS:.0%}, with spares: spines' shares {[round(x, 3) for x in lossy_spares]}, "
              f"packets {lossy_carried}")
        _evs_back(net)
        with_spares, carried = _dead_spine_shares(net)
        rows = {r["path_id"]: r for r in _rows(net)}
        used = sorted(r["path_id"] for r in rows.values() if r["spare"] and r["tx_packets"])
        # the spares that stood in are of the dead spine's plane (its hop):
        # those went out too; no live spine's spare carried a packet
        dead_hops = {rows[i]["hop"] for i in used}
        print(f"64+16 EVs, s1>l2 black-holed, with spares: live spines' shares "
              f"{[round(s, 3) for s in with_spares]}, packets {carried}; spares used {used} "
              f"(hops {sorted(dead_hops)})")
        assert len(dead_hops) <= 1
        _evs_back(net)
        assert all(r["state"] == "spare" for r in _rows(net) if r["spare"] and r["hop"] not in dead_hops)
        # the same without spares
        mrcctl("path", "deny", PREFIX, *[a for i in sorted(r["path_id"] for r in spares)
                                         for a in ("--path", str(i))], netns=net.ns("h1"))
        without, carried = _dead_spine_shares(net)
        print(f"64 EVs (spares denied), s1>l2 black-holed: live spines' shares "
              f"{[round(s, 3) for s in without]}, packets {carried}")
        _evs_back(net)
        lossy_without, lossy_carried = _lossy_spine_shares(net, LOSS)
        print(f"64 EVs (spares denied), s1>l2 losing {LOSS:.0%}: spines' shares "
              f"{[round(x, 3) for x in lossy_without]}, packets {lossy_carried}")
        # the target: the live spines within +-10% of equal (the
        # spray rotates over the traced spines, so this holds without
        # spares too: a dead spine's spares are dead as well)
        assert all(abs(s * 3 - 1) <= 0.10 for s in with_spares), with_spares
        # a plane partly out (a lossy spine: some of its EVs out at any
        # time): its spares keep more of its share than skipping does
        assert lossy_spares[0] >= lossy_without[0] + 0.01, (lossy_spares, lossy_without)
    finally:
        sink.kill()
        sink.wait()


def test_one_tcp_flow_over_64_plus_16_evs_with_a_spine_black_holed(make_fabric):
    """The issue's user: one TCP flow (bytes), s1>l2 black-holed before it
    starts: the live spines' shares by their own counters, with the
    spares and with them denied; every byte arrives.  Links at 100
    Mbit/s, so that attach's auto granularity sprays per packet (unlimited
    links: 64 KB bursts, each on one turn, and the shares follow how the
    bursts fall, with or without spares)."""
    net = make_fabric("--spines", "4", "--leaves", "2", "--encoding", "ev", "--rate", "100mbit")
    fabric("attach", net.name, "--policy", "bytes")
    spares = _with_spares(net)
    out = {}
    sink = net.popen("h2", SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _udp(net, 2000)            # first acknowledgements
        _tcp_phases(net, spares, out)
    finally:
        sink.kill()
        sink.wait()
    assert all(abs(x * 3 - 1) <= 0.10 for x in out["spares"]), out


def _retrans(net) -> int:
    out = net.exec("h1", ["nstat", "-asz", "--json"]).stdout
    return json.loads(out)["kernel"].get("TcpRetransSegs", 0)


def _tcp_phases(net, spares, out):
    for label in ("spares", "denied"):
        if label == "denied":
            mrcctl("path", "deny", PREFIX, *[a for i in sorted(r["path_id"] for r in spares)
                                             for a in ("--path", str(i))], netns=net.ns("h1"))
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
        try:
            _udp(net, 4000)     # takes s1's EVs out (else the SYN may die in the hole)
            # bytes: a spine's veth counts a GRO'd burst as one packet
            before = _spines_tx(net, "bytes")
            retrans = _retrans(net)
            sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1", nbytes=32 << 20)
            carried = [a - b for a, b in zip(_spines_tx(net, "bytes"), before)]
            retrans = _retrans(net) - retrans
        finally:
            fabric("heal", "-n", net.name, "s1>l2")
        assert sent == received and sent.startswith(str(32 << 20)), (sent, received)
        live = carried[1:]
        out[label] = [c / sum(live) for c in live]
        print(f"one TCP flow, 32 MB, 64 EVs, {label} 16 spares, s1>l2 black-holed: live spines' shares "
              f"of bytes {[round(x, 3) for x in out[label]]}, bytes {carried}, {retrans} TCP retransmissions")
        _evs_back(net)
