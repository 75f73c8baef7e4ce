"""Gray failures (mrc_ebpf.faults): a TC ingress dropper on a router's
receiving device, proven by its counters and by what the far end gets."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time

import pytest

from mrc_ebpf.lab import faults
from mrc_ebpf.datapath import pins
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.topology import timeout_scale

from conftest import ROOT, UDP_SEND

pytestmark = pytest.mark.root

FAULTS_CLI = [sys.executable, "-m", "mrc_ebpf.lab.faults"]
# UDP GSO (UDP_SEGMENT): one send is one skb of SEGMENTS datagrams, which
# veths and R's forwarding carry whole, as they do a TCP sender's TSO bursts
GSO_SEND = """import socket, sys, time
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, 1000)
for _ in range(int(sys.argv[2])):
    s.sendto(bytes(1000 * int(sys.argv[3])), (sys.argv[1], 9))
    time.sleep(0.01)
"""


class Line:
    """A --- R --- B, IPv4 and IPv6, plus B's fd00:3::b reached from A only
    through the kernel's SRv6 encapsulation (End.DT6 at fc00:b::6).
    Faults go on R's r0: traffic from A towards B, while A's own link
    stays healthy."""

    A4, B4, A6, B6, B_SRV6 = "198.18.1.1", "198.18.2.2", "fd00:1::a", "fd00:2::b", "fd00:3::b"

    def __init__(self, t):
        self.t = t
        self.A, self.R, self.B = t.ns("A"), t.ns("R", forwarding=True), t.ns("B")
        t.link(self.A, "a0", self.R, "r0")
        t.link(self.R, "r1", self.B, "b0")
        for ns, dev, addrs in ((self.A, "a0", ["fd00:1::a/64", "198.18.1.1/24"]),
                               (self.R, "r0", ["fd00:1::1/64", "198.18.1.254/24"]),
                               (self.R, "r1", ["fd00:2::1/64", "198.18.2.254/24"]),
                               (self.B, "b0", ["fd00:2::b/64", "198.18.2.2/24"]),
                               (self.B, "lo", ["fd00:3::b/128"])):
            for a in addrs:
                t.addr(ns, dev, a)
        t.route(self.A, "fd00:2::/64", "via", "fd00:1::1")
        t.route(self.A, "198.18.2.0/24", "via", "198.18.1.254")
        t.route(self.B, "fd00:1::/64", "via", "fd00:2::1")
        t.route(self.B, "198.18.1.0/24", "via", "198.18.2.254")
        t.route(self.A, "fc00::/16", "via", "fd00:1::1")    # the outer header's route
        t.route(self.R, "fc00:b::/48", "via", "fd00:2::b")
        t.exec(self.A, ["ip", "-6", "route", "add", "fd00:3::/64", "encap", "seg6", "mode", "encap",
                        "segs", "fc00:b::6", "via", "fd00:1::1", "dev", "a0"])
        t.exec(self.B, ["ip", "-6", "route", "add", "fc00:b::6/128", "encap", "seg6local",
                        "action", "End.DT6", "table", "local", "dev", "b0"])

    def ping(self, dst, count=3):
        return self.t.exec(self.A, ["ping", "-c", str(count), "-i", "0.2", "-W", "1", dst],
                           check=False).returncode == 0

    def link_stats(self, ns, dev):
        return json.loads(self.t.exec(ns, ["ip", "-j", "-s", "link", "show", dev]).stdout)[0]

    def rx_bytes(self, ns, dev):
        return self.link_stats(ns, dev)["stats64"]["rx"]["bytes"]


@pytest.fixture
def line(topo):
    net = Line(topo)
    try:
        yield net
    finally:
        # pins outlive namespaces: clear ours even when a test failed half-way
        for ns in list(dict.fromkeys(topo.namespaces)):
            faults.forget(ns)


def cli(*args, check=True):
    r = subprocess.run([*FAULTS_CLI, *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=120 * timeout_scale())
    if check:
        assert r.returncode == 0, r.stderr
    return r


def pinned(netns):
    return sorted(str(p.relative_to(pins.BASE)) for p in (pins.BASE / "faults" / netns).rglob("*")) \
        if (pins.BASE / "faults" / netns).exists() else []


def ingress_filters(net, ns, dev):
    out = net.t.exec(ns, ["tc", "-j", "filter", "show", "dev", dev, "ingress"], check=False).stdout
    return [f for f in json.loads(out or "[]") if f.get("options")]


def has_clsact(net, ns, dev):
    return "clsact" in net.t.exec(ns, ["tc", "qdisc", "show", "dev", dev]).stdout


def wait_for(predicate, seconds):
    deadline = time.monotonic() + seconds * timeout_scale()
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_blackhole_stops_a_running_tcp_flow_and_heal_restores_it(line, family):
    dst = line.B4 if family == "ipv4" else line.B6
    server = line.t.popen(line.B, ["iperf3", "-s", "-B", dst], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    client = None
    try:
        time.sleep(0.5)
        client = line.t.popen(line.A, ["iperf3", "-c", dst, "-t", "60", "-i", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = line.rx_bytes(line.B, "b0")
        assert wait_for(lambda: line.rx_bytes(line.B, "b0") - start > 50 << 20, 5), "no flow"

        # injected mid-flow
        faults.inject(line.R, "r0", "blackhole")
        time.sleep(0.3)    # what was past r0 drains
        before, rx0 = faults.status(line.R, "r0"), line.rx_bytes(line.B, "b0")
        time.sleep(1.5)
        after, rx1 = faults.status(line.R, "r0"), line.rx_bytes(line.B, "b0")
        assert rx1 - rx0 < 10_000, "data reached B through the black hole"
        assert after["dropped"] > before["dropped"] > 0, "retransmissions not dropped"
        assert after["passed"] == 0
        assert line.link_stats(line.A, "a0")["operstate"] == "UP"

        healed = faults.heal(line.R, "r0")
        assert healed["filter_removed"] and not healed["stale"]
        assert healed["dropped"] >= after["dropped"]
        rx2 = line.rx_bytes(line.B, "b0")
        # the next retransmission (or window probe) is up to a backed-off RTO away
        assert wait_for(lambda: line.rx_bytes(line.B, "b0") - rx2 > 20 << 20, 15), "no recovery"
        assert client.poll() is None, "the flow broke instead of stalling"
    finally:
        for p in (client, server):
            if p is not None:
                p.kill()
                p.wait()
    assert pinned(line.R) == [] and not has_clsact(line, line.R, "r0")


def test_blackhole_drops_srv6_keeps_neighbour_discovery_and_outlives_its_process(line):
    assert line.ping(line.B_SRV6) and line.ping(line.B4)
    cli("inject", line.R, "r0")        # a process that exits: the fault stays
    line.t.exec(line.A, ["ip", "neigh", "flush", "dev", "a0"])
    assert not line.ping(line.B_SRV6, count=5)
    assert not line.ping(line.B4, count=2)
    st = json.loads(cli("status", line.R, "r0").stdout)
    assert st["mode"] == "blackhole" and st["loss"] == 1.0
    assert st["dropped"] >= 7 and st["passed"] == 0
    # NS and ARP from A crossed r0: R answered, so A's link looks healthy
    neigh = line.t.exec(line.A, ["ip", "neigh", "show", "dev", "a0"]).stdout
    assert "fd00:1::1" in neigh and "198.18.1.254" in neigh
    assert "FAILED" not in neigh and "INCOMPLETE" not in neigh

    cli("heal", line.R, "r0")
    assert line.ping(line.B_SRV6) and line.ping(line.B4)
    assert pinned(line.R) == [] and ingress_filters(line, line.R, "r0") == []


def test_loss_drops_about_half_and_counts_every_packet(line):
    n = 4000
    sink = line.t.popen(line.B, [sys.executable, str(ROOT / "tests" / "tools" / "udp_sink.py"), "9"],
                        stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        faults.inject(line.R, "r0", "loss", loss=0.5)
        before = faults.status(line.R, "r0")
        line.t.exec(line.A, [*UDP_SEND, line.B6, "9", str(n)], timeout=120)
        received = int(sink.communicate(timeout=30)[0].strip())
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    after = faults.status(line.R, "r0")
    dropped, passed = after["dropped"] - before["dropped"], after["passed"] - before["passed"]
    assert (after["mode"], after["loss"]) == ("loss", 0.5)
    # every packet judged; a few more may be the hosts' own MLD reports,
    # sent at random moments after link-up (ND is let through uncounted)
    assert n <= dropped + passed <= n + 3
    assert received <= passed <= received + 3
    assert abs(dropped - n / 2) < 5 * math.sqrt(n / 4), f"{dropped} of {n} dropped"
    assert faults.list_faults(line.R) == [after]

    # a super-packet is one decision: lost or kept whole, counted as what it carries
    sends, segments = 40, 60
    sink = line.t.popen(line.B, [sys.executable, str(ROOT / "tests" / "tools" / "udp_sink.py"), "9"],
                        stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        line.t.exec(line.A, [sys.executable, "-c", GSO_SEND, line.B6, str(sends), str(segments)])
        received = int(sink.communicate(timeout=30)[0].strip())
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()
    gso = faults.status(line.R, "r0")
    dropped, passed = gso["dropped"] - after["dropped"], gso["passed"] - after["passed"]
    assert dropped + passed == sends * segments and received == passed
    assert dropped == segments * (gso["dropped_skbs"] - after["dropped_skbs"])
    assert 0 < dropped < sends * segments
    faults.heal(line.R, "r0")
    assert faults.status(line.R, "r0") is None and faults.list_faults(line.R) == []


def test_bad_requests_change_nothing(line, monkeypatch):
    line.t.exec(line.R, ["tc", "qdisc", "add", "dev", "r1", "clsact"])   # not ours: must stay
    bad = [(line.R, "r0", "netem", 1.0), (line.R, "r0", "loss", 0.0), (line.R, "r0", "loss", 1.5),
           (line.R, "r0", "loss", float("nan")), (line.R, "r0", "loss", "half"),
           (line.R, "nope0", "blackhole", 1.0), (line.R + "-gone", "r0", "blackhole", 1.0),
           ("../etc", "r0", "blackhole", 1.0), (line.R, "r0/x", "blackhole", 1.0)]
    for args in bad:
        with pytest.raises(MrcError):
            faults.inject(*args)
    assert pinned(line.R) == [] and not has_clsact(line, line.R, "r0")
    with pytest.raises(MrcError, match="no fault"):
        faults.heal(line.R, "r0")
    assert faults.status(line.R, "r0") is None

    def fail(fd):   # the last step before the filter: pins and clsact are made
        raise OSError("injected failure")
    with monkeypatch.context() as m:
        m.setattr(faults.bpfsys, "prog_info", fail)
        with pytest.raises(MrcError, match="injected failure"):
            faults.inject(line.R, "r0", "blackhole")
    assert pinned(line.R) == [] and not has_clsact(line, line.R, "r0")

    faults.inject(line.R, "r1", "loss", loss=0.25)
    with pytest.raises(MrcError, match="already has a fault"):
        faults.inject(line.R, "r1", "blackhole")
    assert faults.status(line.R, "r1")["loss"] == 0.25
    # switched in place, as a fabric arms a fault and triggers it later
    faults.rearm(line.R, "r1", "blackhole")
    assert (faults.status(line.R, "r1")["mode"], faults.status(line.R, "r1")["loss"]) == ("blackhole", 1.0)
    for args in (("r0", "blackhole", 1.0), ("r1", "loss", 0.0), ("r1", "flaky", 1.0)):
        with pytest.raises(MrcError):
            faults.rearm(line.R, *args)
    assert faults.status(line.R, "r1")["mode"] == "blackhole"
    assert len(ingress_filters(line, line.R, "r1")) == 1
    assert pinned(line.R) == ["faults/" + line.R + "/r1" + s for s in ("", "/config", "/counters", "/prog")]

    result = faults.heal(line.R, "r1")
    assert result["filter_removed"] and not result["clsact_removed"]
    assert has_clsact(line, line.R, "r1") and ingress_filters(line, line.R, "r1") == []
    assert pinned(line.R) == []
    with pytest.raises(MrcError, match="no fault"):
        faults.heal(line.R, "r1")
    assert cli("heal", line.R, "r1", check=False).returncode == 1


def test_deleted_namespace_leaves_no_stale_fault(line):
    faults.inject(line.R, "r0", "blackhole")
    faults.inject(line.R, "r1", "loss", loss=0.1)
    assert [f["dev"] for f in faults.list_faults(line.R)] == ["r0", "r1"]
    subprocess.run(["ip", "netns", "del", line.R], check=True)

    assert faults.status(line.R, "r0") is None and faults.list_faults(line.R) == []
    assert faults.heal(line.R, "r0")["stale"]
    assert faults.forget(line.R) == ["r1"]
    assert pinned(line.R) == [] and faults.forget(line.R) == []

    # a namespace of the same name made again starts clean, even when
    # nobody called forget for the old one
    line.t.ns("R")
    line.t.exec(line.R, ["ip", "link", "add", "r0", "type", "veth", "peer", "name", "r0p"])
    faults.inject(line.R, "r0", "blackhole")
    subprocess.run(["ip", "netns", "del", line.R], check=True)
    line.t.ns("R")
    line.t.exec(line.R, ["ip", "link", "add", "r0", "type", "veth", "peer", "name", "r0p"])
    assert faults.status(line.R, "r0") is None
    faults.inject(line.R, "r0", "blackhole")
    assert faults.status(line.R, "r0")["mode"] == "blackhole"
    faults.heal(line.R, "r0")
    assert pinned(line.R) == []


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
def test_blackhole_on_one_ecmp_path_holds_the_flows_hashed_onto_it(topo):
    """A --- L1 =(R1, R2)= L2 --- B with kernel ECMP hashed on the headers'
    5-tuple (policy 3, as a switch would): the streams on R1 stall for as
    long as R1 black-holes them, the others carry on, and heal revives them.
    (With policy 1 a veth hands the router the sender's socket hash, which
    TCP re-rolls after a timeout: the stalled streams would move to R2.)"""
    t = topo
    A, B, L1, L2 = t.ns("A"), t.ns("B"), t.ns("L1", forwarding=True), t.ns("L2", forwarding=True)
    R = [t.ns(f"R{k}", forwarding=True) for k in (1, 2)]
    t.link(A, "a0", L1, "l1a")
    t.link(L2, "l2b", B, "b0")
    for ns, dev, a in ((A, "a0", "fd00:a::a"), (L1, "l1a", "fd00:a::1"),
                       (B, "b0", "fd00:b::b"), (L2, "l2b", "fd00:b::1")):
        t.addr(ns, dev, f"{a}/64")
    t.route(A, "fd00:b::/64", "via", "fd00:a::1")
    t.route(B, "fd00:a::/64", "via", "fd00:b::1")
    for k, r in enumerate(R, start=1):
        t.link(L1, f"l1r{k}", r, "rup")
        t.link(r, "rdown", L2, f"l2r{k}")
        for ns, dev, a in ((L1, f"l1r{k}", f"fd00:10:{k}::1"), (r, "rup", f"fd00:10:{k}::2"),
                           (r, "rdown", f"fd00:20:{k}::2"), (L2, f"l2r{k}", f"fd00:20:{k}::1")):
            t.addr(ns, dev, f"{a}/64")
        t.route(r, "fd00:b::/64", "via", f"fd00:20:{k}::1")
        t.route(r, "fd00:a::/64", "via", f"fd00:10:{k}::1")
    for ns, prefix, side, dev in ((L1, "fd00:b::/64", "10", "l1r"), (L2, "fd00:a::/64", "20", "l2r")):
        t.sysctl(ns, "net.ipv6.fib_multipath_hash_policy", 3)
        t.sysctl(ns, "net.ipv6.fib_multipath_hash_fields", "0x37")
        t.exec(ns, ["ip", "-6", "route", "add", prefix,
                    *[w for k in (1, 2) for w in ("nexthop", "via", f"fd00:{side}:{k}::2", "dev", f"{dev}{k}")]])

    def tx(k):
        link = json.loads(t.exec(R[k - 1], ["ip", "-j", "-s", "link", "show", "rdown"]).stdout)[0]
        return link["stats64"]["tx"]["bytes"]

    server = t.popen(B, ["iperf3", "-s", "-B", "fd00:b::b"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    client = None
    try:
        time.sleep(0.5)
        # 16 streams: all on one path has odds 2 in 65536
        client = t.popen(A, ["iperf3", "-c", "fd00:b::b", "-t", "60", "-P", "16", "-b", "150M",
                             "-i", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        start = [tx(1), tx(2)]
        assert wait_for(lambda: tx(1) - start[0] > 10 << 20 and tx(2) - start[1] > 10 << 20, 8)

        faults.inject(R[0], "rup", "blackhole")
        time.sleep(0.3)
        before, (r1, r2) = faults.status(R[0], "rup"), (tx(1), tx(2))
        time.sleep(2)
        after = faults.status(R[0], "rup")
        assert tx(1) - r1 < 10_000, "streams escaped R1's black hole or passed through it"
        assert tx(2) - r2 > 10 << 20, "the streams on R2 stopped too"
        assert after["dropped"] > before["dropped"] and after["passed"] == 0

        faults.heal(R[0], "rup")
        r1 = tx(1)
        assert wait_for(lambda: tx(1) - r1 > 5 << 20, 8), "R1's streams did not come back (rehashed onto R2?)"
        assert client.poll() is None
    finally:
        for p in (client, server):
            if p is not None:
                p.kill()
                p.wait()
        faults.forget(R[0])
