"""Spraying over 4 paths, each through its own kernel End router: split
counted by our maps and by the routers' own interface counters; per-path
loss and reordering at the receiver against ground truth."""
from __future__ import annotations

import subprocess
import time

import pytest

from conftest import mrcctl
from mrc_ebpf.lab import faults

pytestmark = pytest.mark.root


def test_rr_splits_exactly_and_routers_agree(spray_any):
    spray = spray_any
    # the split, not failover: one lost acknowledgement before the pause
    # below would retire a path for a probe interval (as MRC does)
    spray.attach("rr", "--ack-timeout-us", "5000000")
    spray.udp(10, pps=1000)                       # neighbours resolved before counting
    before_maps, before_routers = spray.sent(), spray.router_tx()
    spray.udp(4000)
    maps = {k: v - before_maps[k] for k, v in spray.sent().items()}
    routers = [a - b for a, b in zip(spray.router_tx(), before_routers)]
    assert sorted(maps.values()) == [1000] * 4, (maps, mrcctl("stats", "--events", netns=spray.A).stdout)
    for n in routers:   # the routers' counters also carry the odd ND packet
        assert 1000 <= n <= 1003, routers
    # the receiver saw every packet of every path, none lost
    rx = spray.stats(spray.B)["received"]
    assert sum(r["rx_packets"] for r in rx) == 4010 and sum(r["lost"] for r in rx) == 0


def test_bytes_balances_bytes_where_rr_balances_packets(spray):
    """Datagrams of 1000, 100, 100, 100 bytes in turn: rr hands every big
    one to the same path; `bytes` gives each path a quarter of the bytes.
    The routers' own byte counters are the witness."""
    spray.attach("rr", "--ack-timeout-us", "5000000")
    spray.udp(10, pps=1000)
    shares = {}
    for policy in ("rr", "bytes"):
        spray.policy(policy)
        before_maps, before_routers = spray.sent(what="tx_bytes"), spray.router_tx("bytes")
        spray.udp(4000, sizes="1000,100,100,100")
        maps = [v - before_maps[k] for k, v in sorted(spray.sent(what="tx_bytes").items())]
        routers = [a - b for a, b in zip(spray.router_tx("bytes"), before_routers)]
        for m, r in zip(maps, routers):     # the routers see the same split (give or take ND)
            assert abs(m - r) <= 0.01 * m + 500, (policy, maps, routers)
        shares[policy] = [r / sum(routers) for r in routers]
    assert max(shares["rr"]) > 0.5, shares             # one path carries every 1000-byte datagram
    assert all(abs(s - 0.25) < 0.01 for s in shares["bytes"]), shares


def test_hash_keeps_a_flow_on_one_path(spray):
    spray.attach("hash")
    spray.udp(400, flows=1)
    used = [k for k, v in spray.sent().items() if v]
    assert len(used) == 1
    spray.udp(2000, flows=64)
    assert len([k for k, v in spray.sent().items() if v]) > 1


def test_weighted_3_to_1(spray):
    mrcctl("attach", "a0", "--sid", spray.A_SID, netns=spray.A)
    mrcctl("path", "add", "fd00:b::/64", "--via", spray.path_via(1, spray.B_SID), "--weight", "3",
           netns=spray.A)
    mrcctl("path", "add", "fd00:b::/64", "--via", spray.path_via(2, spray.B_SID), "--weight", "1",
           netns=spray.A)
    spray.policy("weighted")
    spray.udp(100000, pps=200000)
    sent = spray.sent()
    share = sent[0] / (sent[0] + sent[1])
    assert abs(share - 0.75) < 0.02 and sent[0] + sent[1] == 100000


def test_random_uses_every_path(spray):
    spray.attach("random")
    spray.udp(4000)
    sent = spray.sent()
    assert all(600 < v < 1400 for v in sent.values()), sent


def test_loss_on_one_path_counted_exactly(spray_any):
    spray = spray_any
    # failover would retire the lossy path at its first loss (as MRC does)
    # and reroute its packets; this test counts losses, so keep it off
    spray.attach("rr", "--ack-timeout-us", "5000000")
    spray.udp(10, pps=1000)
    # R2 carries exactly path 1 towards B: the lab's fault program drops
    # a seventh of what arrives there
    faults.inject(spray.R[1], "rup", "loss", 1 / 7)
    try:
        spray.udp(8000)
        # a loss shows when the path's next packet arrives: a few more
        # packets, practically none of them dropped, show the last ones
        faults.rearm(spray.R[1], "rup", "loss", 1e-9)
        spray.udp(40)
    finally:
        dropped = faults.heal(spray.R[1], "rup")["dropped"]
    assert dropped > 200
    rx = {r["path_id"]: r for r in spray.stats(spray.B)["received"] if r["from"] == spray.A_SID}
    assert rx[1]["lost"] == dropped
    assert [rx[k]["lost"] for k in (0, 2, 3)] == [0, 0, 0]
    assert spray.stats(spray.B)["received"] and rx[1]["rx_packets"] + dropped == rx[0]["rx_packets"]


def test_classes_keep_to_their_paths(spray):
    spray.attach("rr")
    mrcctl("class", "set", "gold", "--dscp", "46", netns=spray.A)
    mrcctl("path", "del", "fd00:b::/64", netns=spray.A)
    for k in (1, 2):
        mrcctl("path", "add", "fd00:b::/64", "--via", spray.path_via(k, spray.B_SID), netns=spray.A)
    for k in (3, 4):
        mrcctl("path", "add", "fd00:b::/64", "--via", spray.path_via(k, spray.B_SID),
               "--class", "gold", netns=spray.A)
    before = spray.router_tx()
    spray.udp(2000, tclass=46 << 2)
    gold = spray.sent()
    assert gold[0] == gold[1] == 0 and gold[2] == gold[3] == 1000
    spray.udp(2000, tclass=0)
    both = spray.sent()
    assert both[0] == both[1] == 1000 and both[2] == both[3] == 1000
    routers = [a - b for a, b in zip(spray.router_tx(), before)]
    assert all(1000 <= n <= 1003 for n in routers), routers


def test_256_paths(spray):
    """256 path ids over the 4 routers (64 each), added in one command:
    rr still splits exactly and the receiver tracks all 256."""
    # each path is used once per 12.8 ms here and reported once per four
    # feedbacks (64 ids each): a 1 ms acknowledgement window would flap
    # them; failover with many sparse paths is for the fabric issue
    wide = ("--ack-timeout-us", "5000000")
    mrcctl("attach", "a0", "--sid", spray.A_SID, *wide, netns=spray.A)
    mrcctl("attach", "b0", "--sid", spray.B_SID, *wide, netns=spray.B)
    # 256 distinct paths (a path given twice is refused): each router
    # answers 64 End SIDs, fc00:1:k:: and fc00:1:k::1 .. fc00:1:k::3f
    for k, r in enumerate(spray.R, start=1):
        for n in range(1, 64):
            spray.t.exec(r, ["ip", "-6", "route", "add", f"fc00:1:{k:x}::{n:x}/128", "encap", "seg6local",
                             "action", "End", "dev", "rup"])
    vias = [a for i in range(256)
            for a in ("--via", f"fc00:1:{i % 4 + 1:x}::{i // 4:x},{spray.B_SID}" if i >= 4 else
                      spray.path_via(i % 4 + 1, spray.B_SID))]
    mrcctl("path", "add", "fd00:b::/64", *vias, netns=spray.A)
    back = [a for k in range(1, 5) for a in ("--via", spray.path_via(k, spray.A_SID))]
    mrcctl("path", "add", "fd00:a::/64", *back, netns=spray.B)     # B's feedback to A
    before = spray.router_tx()
    spray.udp(256 * 20)
    sent = spray.sent()
    assert len(sent) == 256 and set(sent.values()) == {20}
    routers = [a - b for a, b in zip(spray.router_tx(), before)]
    assert all(64 * 20 <= n <= 64 * 20 + 3 for n in routers), routers
    rx = spray.stats(spray.B)["received"]
    assert len(rx) == 256 and {r["rx_packets"] for r in rx} == {20}


def _log2_bucket(v: int) -> int:
    """The datapath's bucket (lib/rx_track.h): 0 for 0, else bit length, capped."""
    from mrc_ebpf.datapath.source import C
    return min(v.bit_length(), C["MRC_HIST_BUCKETS"] - 1)


def test_reordering_matches_capture(spray, tmp_path):
    """Path 0 is slowed by a tbf queue on its router, so its packets
    arrive late; what B counted equals what scapy computes from a capture
    of what B received, packet for packet."""
    from scapy.utils import rdpcap
    from mrc_ebpf.datapath import wire
    # a queue far deeper than the acknowledgement timeout: keep failover
    # from taking the slow path down, this test is about reordering
    spray.attach("rr", "--ack-timeout-us", "5000000")
    spray.udp(8, pps=1000)
    spray.t.exec(spray.R[0], ["tc", "qdisc", "add", "dev", "rdown", "root", "tbf", "rate", "400kbit",
                              "burst", "2kb", "limit", "200kb"])
    pcap = tmp_path / "b.pcap"
    cap = spray.t.popen(spray.L2, ["tcpdump", "-i", "l2b", "-U", "--immediate-mode", "-n", "-w",
                                   str(pcap), f"ip6 and src host {spray.A_SID}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert b"listening on" in cap.stderr.readline()
        before = spray.stats(spray.B)
        spray.udp(800, size=200, pps=2000)
        time.sleep(2.5)                       # let path 0's queue drain
        after = spray.stats(spray.B)
    finally:
        cap.terminate()
        cap.wait(timeout=10)
    seqs = [wire.mrc_tlv(p).peer_seq for p in rdpcap(str(pcap))]
    assert len(seqs) == 800
    highest, reordered, hist = seqs[0] - 1, 0, {}
    for s in seqs:
        if s > highest:
            highest = s
        elif s != highest:
            reordered += 1
            b = _log2_bucket(highest - s)
            hist[b] = hist.get(b, 0) + 1
    peer_a = lambda d: next(r for r in d["reorder"] if r["from"] == spray.A_SID)  # noqa: E731
    got = peer_a(after)["reordered"] - peer_a(before)["reordered"]
    got_hist = [x - y for x, y in zip(peer_a(after)["reorder_hist"], peer_a(before)["reorder_hist"])]
    assert reordered > 100 and got == reordered
    assert {i: n for i, n in enumerate(got_hist) if n} == hist
    # the slowed path shows queueing delay; per path nothing was late or lost
    rx = {r["path_id"]: r for r in after["received"] if r["from"] == spray.A_SID}
    assert rx[0]["qdelay_p50_us"] > 10 * max(rx[k]["qdelay_p99_us"] or 1 for k in (1, 2, 3))
    assert all(r["lost"] == 0 and r["late"] == 0 for r in rx.values())


def _iperf(spray, seconds=3):
    server = spray.t.popen(spray.B, ["iperf3", "-s", "-1", "-B", spray.B6],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        spray.t.exec(spray.A, ["iperf3", "-c", spray.B6, "-t", str(seconds)], timeout=60)
    finally:
        server.wait(timeout=30)


def _shares(spray, seconds=3):
    before = spray.sent()
    _iperf(spray, seconds)
    delta = {k: v - before[k] for k, v in spray.sent().items()}
    total = sum(delta.values())
    return {k: v / total for k, v in delta.items()}


def test_adaptive_moves_traffic_off_a_slow_path_and_back(spray):
    """All paths shaped to 40 Mbit/s, then path 0 to a quarter of that:
    its share of a TCP transfer falls; unshaped again, it rises.  (tbf
    queues of 20 ms: the acknowledgement timeout must be longer, or
    failover rather than the policy would move the traffic.)"""
    spray.attach("adaptive", "--ack-timeout-us", "100000")
    for k, r in enumerate(spray.R):
        spray.t.exec(r, ["tc", "qdisc", "add", "dev", "rdown", "root", "tbf", "rate", "40mbit",
                         "burst", "16kb", "latency", "20ms"])
    even = _shares(spray)
    spray.t.exec(spray.R[0], ["tc", "qdisc", "change", "dev", "rdown", "root", "tbf", "rate", "10mbit",
                              "burst", "16kb", "latency", "20ms"])
    slowed = _shares(spray)
    spray.t.exec(spray.R[0], ["tc", "qdisc", "change", "dev", "rdown", "root", "tbf", "rate", "40mbit",
                              "burst", "16kb", "latency", "20ms"])
    again = _shares(spray)
    print("shares of path 0:", even[0], slowed[0], again[0])
    assert even[0] > 0.18
    assert slowed[0] < 0.6 * even[0] and slowed[0] < 0.13
    assert again[0] > 1.5 * slowed[0]
