"""MRC's path states (up, assumed-bad, denied, unknown), the operator's
deny/allow (by path and by hop), and the floor of usable paths
(--min-active), on the Diamond: 4 paths, each through its own router,
whose own counters are the witness."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import XFER, mrcctl
from mrc_ebpf.lab import faults

pytestmark = pytest.mark.root

PREFIX = "fd00:b::/64"


def states(net, ns=None) -> dict[int, str]:
    rows = json.loads(mrcctl("path", "list", "-j", netns=ns or net.A).stdout)
    return {r["path_id"]: r["state"] for r in rows if r["prefix"] == PREFIX}


def events(net):
    return json.loads(mrcctl("stats", "--events", "-j", netns=net.A).stdout)["events"]


def blackhole(net, router) -> tuple[str, str]:
    """Router k's link from L1 black-holed (the lab's fault program)."""
    hole = (net.R[router], "rup")
    faults.inject(*hole, "blackhole")
    return hole


def counters(net) -> dict:
    return json.loads(mrcctl("stats", "-j", netns=net.A).stdout)["counters"]


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}


def test_unknown_up_denied_allowed(spray):
    net = spray
    net.attach("rr", "--ack-timeout-us", "5000000")
    assert set(states(net).values()) == {"unknown"}          # added, never acknowledged
    net.udp(400, pps=5000)
    time.sleep(0.1)
    assert set(states(net).values()) == {"up"}
    r = json.loads(mrcctl("path", "deny", PREFIX, "--path", "1", "-j", netns=net.A).stdout)
    assert r[0]["changed"] == [1] and r[0]["usable"] == 3
    assert states(net)[1] == "denied"
    status = json.loads(mrcctl("status", "-j", netns=net.A).stdout)[0]
    assert status["path_states"] == {"up": 3, "assumed-bad": 0, "denied": 1, "unknown": 0, "skip": 0, "spare": 0}
    before, routers = net.sent(), net.router_tx()
    net.udp(3000, pps=20000)
    # never used: neither by the maps nor by router R2's own counter
    sent = delta(net.sent(), before)
    assert sent[1] == 0 and sorted(sent[k] for k in (0, 2, 3)) == [1000] * 3, sent
    assert [a - b for a, b in zip(net.router_tx(), routers)][1] <= 2
    # ... nor probed, not even by mrcctl probe
    out = json.loads(mrcctl("probe", net.B6, "--path", "1", "-c", "2", "--timeout", "0.3", "-j",
                            netns=net.A).stdout)
    assert out["paths"][0]["received"] == 0 and out["paths"][0]["state"] == "denied"
    assert delta(net.sent(), before)[1] == 0
    mrcctl("path", "allow", PREFIX, "--path", "1", netns=net.A)
    assert states(net)[1] == "unknown"
    net.udp(400, pps=5000)
    time.sleep(0.1)
    assert states(net)[1] == "up"


def test_assumed_bad_is_the_datapaths_verdict(spray):
    net = spray
    net.attach("rr", "--ack-timeout-us", "1000", "--reorder-max-us", "0")
    net.udp(400, pps=5000)
    hole = blackhole(net, 2)
    try:
        net.udp(2000, pps=10000)
        got = states(net)
    finally:
        faults.heal(*hole)
    assert got == {0: "up", 1: "up", 2: "assumed-bad", 3: "up"}, got
    evs = [e for e in events(net) if e["path_id"] == 2 and e["type"] == "down"]
    assert evs and evs[0]["state"] == "assumed-bad"


def test_min_active_keeps_two_of_four_with_three_blackholed(spray):
    """4 paths, --min-active 2, paths 1, 2, 3 black-holed: two are taken
    out, the third is kept (the floor), so exactly 2 stay in use; the
    refusal is an event."""
    net = spray
    net.attach("rr", "--ack-timeout-us", "1000", "--reorder-max-us", "0", "--probe-us", "2000000",
               "--min-active", "2")
    net.udp(400, pps=5000)
    holes = [blackhole(net, k) for k in (1, 2, 3)]
    try:
        net.udp(2000, pps=10000)             # the failures are found
        before = net.sent()
        net.udp(2000, pps=10000)
        sent = delta(net.sent(), before)
        got = states(net)
        status = json.loads(mrcctl("status", "-j", netns=net.A, check=False).stdout)[0]
    finally:
        for h in holes:
            faults.heal(*h)
    in_use = sorted(k for k, v in sent.items() if v > 10)
    assert len(in_use) == 2 and 0 in in_use, (sent, got)
    assert all(sent[k] >= 600 for k in in_use), sent     # rr skips the out paths' turns
    assert sorted(got.values()) == ["assumed-bad", "assumed-bad", "up", "up"], got
    assert status["min_active"] == 2
    kept = [e for e in events(net) if e["type"] == "kept"]
    assert kept and {e["path_id"] for e in kept} == set(in_use) - {0}, kept
    assert all(e["state"] == "up" for e in kept)
    text = mrcctl("stats", "--events", netns=net.A).stdout
    assert "kept" in text


def test_without_a_floor_all_three_go(spray):
    """The same failure without --min-active: all three are taken out,
    nothing is kept, and with one path of four left every packet whose
    turn falls on an out path finds the live one (a short list is tried
    in order, every entry): none fails open."""
    net = spray
    net.attach("rr", "--ack-timeout-us", "1000", "--reorder-max-us", "0", "--probe-us", "2000000")
    net.udp(400, pps=5000)
    holes = [blackhole(net, k) for k in (1, 2, 3)]
    try:
        net.udp(2000, pps=10000)
        got = states(net)
        # with one path of four up, every packet finds it: none fails open
        c0 = counters(net)
        net.udp(2000, pps=10000)
        c1 = counters(net)
    finally:
        for h in holes:
            faults.heal(*h)
    assert got == {0: "up", 1: "assumed-bad", 2: "assumed-bad", 3: "assumed-bad"}, got
    assert not [e for e in events(net) if e["type"] == "kept"]
    assert c1["tx_fail_open"] == c0["tx_fail_open"], (c0, c1)
    assert c1["tx_reroute"] - c0["tx_reroute"] >= 1000, (c0, c1)


def test_deny_hop_drains_a_router_under_tcp_without_loss(spray):
    """`path deny --hop SID` while TCP runs: the router's counters fall to
    0, the receiver saw no loss on any path (its per-path sequence
    numbers: the witness that nothing was lost), TCP had no timeout;
    `allow --hop` brings the paths back.  (TCP's fast retransmissions
    here come from reordering across the sprayed paths, drain or not.)"""
    net = spray
    net.attach("rr")
    mrcctl("path", "add", "fd00:a::/64", "--via", net.path_via(1, net.A_SID), netns=net.B)
    server = net.t.popen(net.B, [*XFER, "serve", net.B6, "5201"], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    nstat = ["nstat", "-azs", "-j", "TcpRetransSegs", "TcpExtTCPTimeouts"]
    tcp0 = json.loads(net.t.exec(net.A, nstat).stdout)["kernel"]
    client = net.t.popen(net.A, [*XFER, "send", net.B6, "5201", str(64 << 20), "200"],
                         stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.7)
        r = json.loads(mrcctl("path", "deny", "--hop", "fc00:1:2::", "-j", netns=net.A).stdout)
        assert r[0]["changed"] == [1]
        time.sleep(0.2)
        drained = net.router_tx()[1]
        time.sleep(0.7)
        after = net.router_tx()[1]
        assert client.poll() is None, "transfer ended too early"
        sent, _ = client.communicate(timeout=120)
        received, _ = server.communicate(timeout=60)
    finally:
        for p in (client, server):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sent.strip() == received.strip() and received.startswith(str(64 << 20))
    assert after - drained <= 2                       # R2 carries nothing (give or take ND)
    rx = [r for r in net.stats(net.B)["received"] if r["from"] == net.A_SID]
    # a gap a late packet filled is reordering on the path (two CPUs), not loss
    assert sum(max(0, r["lost"] - r["late"]) for r in rx) == 0, rx
    tcp = {k: int(v) - int(tcp0[k]) for k, v in json.loads(net.t.exec(net.A, nstat).stdout)["kernel"].items()}
    print(f"drain under TCP: {tcp}")
    assert tcp["TcpExtTCPTimeouts"] == 0, tcp
    r = json.loads(mrcctl("path", "allow", "--hop", "fc00:1:2::", "-j", netns=net.A).stdout)
    assert r[0]["changed"] == [1]
    bad = mrcctl("path", "deny", "--hop", "fc00:1:9::", netns=net.A, check=False)
    assert bad.returncode == 1 and "no path crosses" in bad.stderr
