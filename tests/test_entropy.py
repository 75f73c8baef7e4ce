"""Entropy paths (EVs): no segment list, outer IPv6 straight to the peer's
SID with the MRC TLV in a Destination Options header, each path its own
outer flow label.  The routers in the middle are plain IPv6 routers
(SRv6 off) whose kernel ECMP hashes the flow label: their own interface
counters show the spread, tcpdump + scapy show the headers."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt
from scapy.utils import rdpcap

from conftest import UDP_SEND, Spray, mrcctl  # noqa: F401  (UDP_SEND: the fixtures)
from mrc_ebpf.lab import faults
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root


class EntropyNet(Spray):
    """The Diamond with plain routers and ECMP on the flow label."""

    def attach(self, policy="rr", *options, evs=16):
        mrcctl("attach", "a0", "--sid", self.A_SID, *options, netns=self.A)
        mrcctl("attach", "b0", "--sid", self.B_SID, *options, netns=self.B)
        mrcctl("path", "add", "fd00:b::/64", "--entropy", str(evs), "--sid", self.B_SID, netns=self.A)
        mrcctl("path", "add", "fd00:a::/64", "--entropy", str(evs), "--sid", self.A_SID, netns=self.B)
        self.policy(policy)

    def paths(self, ns=None):
        return json.loads(mrcctl("path", "list", "-j", netns=ns or self.A).stdout)


def _sink(topo, net):
    return topo.popen(net.B, [sys.executable, "-c", "import socket\n"
                              "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                              "s.bind(('::', 9))\n"
                              "while True: s.recv(65536)"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def ev_net(topo):
    net = EntropyNet(topo, n_paths=4, entropy=True)
    sink = _sink(topo, net)
    try:
        yield net
    finally:
        sink.kill()
        sink.wait()


@pytest.fixture
def mixed_net(topo):
    """SRv6 routers (End), and ECMP to the hosts' SIDs for entropy paths."""
    net = Spray(topo, n_paths=4)
    hops1 = [a for k in range(1, 5) for a in ("nexthop", "via", f"fd00:10:{k:x}::2")]
    hops2 = [a for k in range(1, 5) for a in ("nexthop", "via", f"fd00:20:{k:x}::2")]
    topo.exec(net.L1, ["ip", "-6", "route", "replace", "fc00:b::/48", *hops1])
    topo.exec(net.L2, ["ip", "-6", "route", "replace", "fc00:a::/48", *hops2])
    sink = _sink(topo, net)
    try:
        yield net
    finally:
        sink.kill()
        sink.wait()


def test_routers_are_plain_ipv6(ev_net):
    """The middle has no SRv6 at all: seg6 off, no seg6local routes."""
    for r in ev_net.R:
        out = ev_net.t.exec(r, ["sysctl", "-n", "net.ipv6.conf.all.seg6_enabled",
                                "net.ipv6.conf.rup.seg6_enabled", "net.ipv6.conf.rdown.seg6_enabled"])
        assert out.stdout.split() == ["0", "0", "0"]
        assert "seg6" not in ev_net.t.exec(r, ["ip", "-6", "route"]).stdout


def test_wire_capture_outer_header_doh_tlv_and_distinct_labels(ev_net, tmp_path):
    net = ev_net
    net.attach("rr", "--ack-timeout-us", "5000000", evs=8)
    pcap = tmp_path / "l1a.pcap"
    proc = net.t.popen(net.L1, ["tcpdump", "-i", "l1a", "-U", "--immediate-mode", "-n", "-w", str(pcap),
                                "ip6 and src host " + net.A_SID],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert b"listening on" in proc.stderr.readline()
        net.udp(40, pps=1000)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    packets = [p for p in rdpcap(str(pcap)) if p.haslayer(IPv6ExtHdrDestOpt)]
    assert len(packets) == 40
    rows = {r["path_id"]: r for r in net.paths()}
    assert len(rows) == 8 and all(r["encoding"] == "entropy" for r in rows.values())
    assert len({r["flowlabel"] for r in rows.values()}) == 8          # one EV per path
    labels = {}
    for p in packets:
        ip6 = p[IPv6]
        assert ip6.src == net.A_SID and ip6.dst == net.B_SID           # straight to the peer's SID
        assert ip6.nh == 60                                             # Destination Options
        doh = p[IPv6ExtHdrDestOpt]
        assert (doh.len + 1) * 8 == C["MRC_DOH_LEN"] and doh.nh == 41   # then the inner IPv6
        assert ip6.plen == len(bytes(ip6.payload))
        tlv = wire.mrc_tlv(p)
        assert tlv is not None and tlv.version == C["MRC_VERSION"] and tlv.len == C["MRC_TLV_LEN"]
        inner = doh.payload
        assert inner.dst == net.B6 and inner.src == net.A6
        labels.setdefault(tlv.path_id, set()).add(ip6.fl)
    # rr: 5 packets on each of the 8 paths; each path always its own label, the one the maps hold
    assert sorted(labels) == list(range(8))
    for path_id, seen in labels.items():
        assert seen == {rows[path_id]["flowlabel"]}
    assert len({next(iter(s)) for s in labels.values()}) == 8
    assert rows[0]["overhead"] == layout.encap_len(1, usid=True)


@pytest.mark.parametrize("policy", ["rr", "bytes"])
def test_kernel_ecmp_on_the_flow_label_spreads_evs_over_routers(ev_net, policy):
    """64 EVs over 4 plain routers: every router carries a share (by the
    routers' own counters, which add up to what was sent), and the
    receiver sees every packet of every EV, none lost."""
    net = ev_net
    net.attach(policy, "--ack-timeout-us", "5000000", evs=64)
    net.udp(64, pps=1000)
    before = net.router_tx()
    net.udp(6400, pps=20000)
    carried = [a - b for a, b in zip(net.router_tx(), before)]
    assert 6400 <= sum(carried) <= 6420, carried        # + the odd ND packet
    shares = [c / sum(carried) for c in carried]
    assert all(0.10 <= s <= 0.45 for s in shares), shares
    rx = [r for r in net.stats(net.B)["received"] if r["from"] == net.A_SID]
    assert len(rx) == 64
    assert sum(r["rx_packets"] for r in rx) == 6464 and sum(r["lost"] for r in rx) == 0
    sent = net.sent()
    assert len(sent) == 64 and all(v > 0 for v in sent.values())


def test_a_peer_mixes_srh_and_entropy_paths(mixed_net):
    net = mixed_net
    mrcctl("attach", "a0", "--sid", net.A_SID, "--ack-timeout-us", "5000000", netns=net.A)
    mrcctl("attach", "b0", "--sid", net.B_SID, "--ack-timeout-us", "5000000", netns=net.B)
    mrcctl("path", "add", "fd00:b::/64", "--via", net.path_via(1, net.B_SID),
           "--via", net.path_via(2, net.B_SID), netns=net.A)
    mrcctl("path", "add", "fd00:b::/64", "--entropy", "4", "--sid", net.B_SID, netns=net.A)
    mrcctl("path", "add", "fd00:a::/64", "--entropy", "2", "--sid", net.A_SID, netns=net.B)
    rows = json.loads(mrcctl("path", "list", "-j", netns=net.A).stdout)
    assert [r["encoding"] for r in rows] == ["srh", "srh"] + ["entropy"] * 4
    net.udp(6, pps=1000)
    net.udp(600)
    assert sorted(net.sent().values()) == [101] * 6
    rx = [r for r in net.stats(net.B)["received"] if r["from"] == net.A_SID]
    assert sorted(r["path_id"] for r in rx) == list(range(6))
    assert all(r["rx_packets"] == 101 and r["lost"] == 0 for r in rx)


def test_probe_and_feedback_per_ev(ev_net):
    """`mrcctl probe` pins an echo to each EV and reports its round trip;
    the receiver's feedback reaches the sender per EV."""
    net = ev_net
    net.attach("rr", evs=4)
    out = json.loads(mrcctl("probe", net.B6, "-c", "2", "-j", netns=net.A).stdout)
    assert [p["path_id"] for p in out["paths"]] == [0, 1, 2, 3]
    assert all(p["received"] == 2 and p["rtt_us"]["min"] > 0 for p in out["paths"])
    net.udp(400, pps=5000)
    time.sleep(0.2)
    rows = net.paths()
    assert all(r["feedback"] is not None for r in rows), rows
    assert all(r["state"] == "up" for r in rows)


def test_ev_failover_takes_out_the_evs_through_a_dead_router(ev_net):
    """A router black-holed: the EVs that hash onto it go out (the
    datapath's events), the rest carry every later packet, nothing is
    lost once they are out; after the heal the EVs come back."""
    net = ev_net
    net.attach("rr", "--reorder-max-us", "0", "--probe-us", "20000", evs=16)
    before = net.router_tx()
    net.udp(320, pps=5000)
    time.sleep(0.2)
    # The router that carried the most EVs: which one that is depends on the
    # kernel's multipath hash key (random per boot), not on the datapath.
    carried = [a - b for a, b in zip(net.router_tx(), before)]
    hole = (net.R[carried.index(max(carried))], "rup")
    faults.inject(*hole, "blackhole")
    try:
        net.udp(1600, pps=5000)              # takes the hole's EVs out
        rx_before = {r["path_id"]: r["rx_packets"] for r in net.stats(net.B)["received"]
                     if r["from"] == net.A_SID}
        down = {r["path_id"] for r in net.paths() if r["state"] == "assumed-bad"}
        net.udp(1600, pps=5000)
        rx_after = {r["path_id"]: r["rx_packets"] for r in net.stats(net.B)["received"]
                    if r["from"] == net.A_SID}
    finally:
        dropped = faults.heal(*hole)["dropped"]
    assert dropped > 0
    assert 1 <= len(down) < 16, down
    grew = {k for k in rx_after if rx_after[k] > rx_before.get(k, 0)}
    assert grew == set(range(16)) - down             # the live EVs carry on, the dead ones got nothing
    evs = json.loads(mrcctl("stats", "--events", "-j", netns=net.A).stdout)["events"]
    assert {e["path_id"] for e in evs if e["type"] == "down"} >= down
    # healed: probes bring them back
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        net.udp(200, pps=5000)
        if all(r["state"] == "up" for r in net.paths()):
            break
    assert all(r["state"] == "up" for r in net.paths())


def test_entropy_bad_input(ev_net):
    net = ev_net
    mrcctl("attach", "a0", "--sid", net.A_SID, netns=net.A)
    for args, msg in ((["--entropy", "4"], "needs --sid"),
                      (["--entropy", "0", "--sid", net.B_SID], "bad --entropy"),
                      (["--entropy", "300", "--sid", net.B_SID], "bad --entropy"),
                      (["--entropy", "2", "--sid", "nope"], "bad --sid"),
                      (["--entropy", "2", "--sid", "ff02::1"], "bad --sid"),
                      (["--spare", "2", "--sid", net.B_SID], "--spare M needs --entropy N"),
                      (["--via", net.B_SID, "--spare", "2"], "--spare M needs --entropy N"),
                      (["--entropy", "250", "--spare", "7", "--sid", net.B_SID], "bad --spare"),
                      (["--entropy", "2", "--spare", "-1", "--sid", net.B_SID], "bad --spare")):
        r = mrcctl("path", "add", "fd00:b::/64", *args, netns=net.A, check=False)
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.loads(mrcctl("path", "list", "-j", netns=net.A).stdout) == []
