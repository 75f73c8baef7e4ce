"""What goes on the wire: tcpdump captures it, scapy reads it, and each
packet is checked as RFC 8754 says, with the MRC TLV's values matched
against what the maps say was sent."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.utils import rdpcap

from conftest import mrcctl
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root


@pytest.fixture
def capture(interop, tmp_path):
    """tcpdump on R's r0 (the wire between A and R), stopped and read back."""
    pcap = tmp_path / "a0.pcap"
    proc = interop.t.popen(interop.R, ["tcpdump", "-i", "r0", "-U", "--immediate-mode", "-n", "-w", str(pcap),
                                       "ip6 and src host " + interop.A_SID],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # tcpdump says "listening on" once it captures (on stderr)
    assert b"listening on" in proc.stderr.readline(), "tcpdump did not start"

    def stop():
        time.sleep(0.5)
        proc.terminate()
        proc.wait(timeout=10)
        return rdpcap(str(pcap))
    try:
        yield stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def check_rfc8754(pkt, segments):
    ip6 = pkt[IPv6]
    srh = pkt[IPv6ExtHdrSegmentRouting]
    n = len(segments)
    assert ip6.nh == 43 and srh.type == 4
    assert (srh.len + 1) * 8 == layout.srh_len(n)                 # hdr_ext_len
    assert srh.lastentry == n - 1 and srh.segleft == n - 1
    assert list(srh.addresses) == list(reversed(segments))        # list[0] = last segment
    assert ip6.dst == segments[0]                                  # DA = first segment
    assert ip6.plen == len(bytes(ip6.payload))                    # payload length agrees
    assert ip6.fl != 0                                             # flow label: path entropy
    tlv_bytes = sum(len(bytes(t)) for t in srh.tlv_objects)
    assert 8 + 16 * n + tlv_bytes == (srh.len + 1) * 8             # TLVs fill the SRH exactly
    tlv = wire.mrc_tlv(pkt)
    assert tlv is not None and tlv.len == C["MRC_TLV_LEN"] and tlv.version == C["MRC_VERSION"]
    assert srh.nh in (41, 4)
    return tlv


def test_capture_is_valid_rfc8754_and_tlv_matches_maps(interop, capture):
    interop.attach()
    segs = [interop.R_SID, interop.B_DT6]
    mrcctl("path", "add", "fd00:2::/64", "--via", ",".join(segs), netns=interop.A)
    assert interop.ping(interop.A, interop.B6, count=20).returncode == 0
    packets = [p for p in capture() if p.haslayer(IPv6ExtHdrSegmentRouting)]
    assert len(packets) == 20
    tlvs = [check_rfc8754(p, segs) for p in packets]
    assert [t.path_seq for t in tlvs] == list(range(20))
    assert [t.peer_seq for t in tlvs] == list(range(20))
    assert all(t.path_id == 0 for t in tlvs)
    assert all(b.tx_ns > a.tx_ns for a, b in zip(tlvs, tlvs[1:]))
    rows = json.loads(mrcctl("path", "list", "-j", netns=interop.A).stdout)
    assert rows[0]["next_seq"] == 20 and rows[0]["tx_packets"] == 20
    assert packets[0][IPv6].fl == rows[0]["flowlabel"]


def test_ipv4_inner_next_header_4(interop, capture):
    interop.attach()
    mrcctl("path", "add", "198.18.2.0/24", "--via", interop.B_DX4, netns=interop.A)
    assert interop.ping(interop.A, interop.B4, count=3).returncode == 0
    packets = [p for p in capture() if p.haslayer(IPv6ExtHdrSegmentRouting)]
    assert len(packets) == 3
    for p in packets:
        check_rfc8754(p, [interop.B_DX4])
        assert p[IPv6ExtHdrSegmentRouting].nh == 4


@pytest.mark.parametrize("family", ["ipv6", "ipv4"])
def test_outer_traffic_class_copies_the_inner_ecn_and_dscp(interop, capture, family):
    """RFC 6040's normal mode at encap: the outer header carries the inner
    traffic class, ECN field included, so the fabric's queues can mark
    the packets (and ECT(0) from an ECN-capable TCP stays ECT(0))."""
    interop.attach()
    v6 = family == "ipv6"
    mrcctl("path", "add", "fd00:2::/64" if v6 else "198.18.2.0/24",
           "--via", interop.B_DT6 if v6 else interop.B_DX4, netns=interop.A)
    classes = [0xb8 | ecn for ecn in range(4)] + [0x02, 0x01]   # DSCP 46 + each ECN; bare ECT(0), ECT(1)
    for tc in classes:
        assert interop.ping(interop.A, interop.B6 if v6 else interop.B4, count=1,
                            extra=("-Q", hex(tc))).returncode == 0
    packets = [p for p in capture() if p.haslayer(IPv6ExtHdrSegmentRouting)]
    assert len(packets) == len(classes)
    inner = [(p[IPv6ExtHdrSegmentRouting].payload.tc if v6 else p[IPv6ExtHdrSegmentRouting].payload.tos)
             for p in packets]
    assert inner == classes                       # ping set what we asked
    assert [p[IPv6].tc for p in packets] == classes


def test_path_mtu_full_size_packets_fit(interop, capture):
    """Route MTU = device MTU - overhead: the biggest ping that fits goes
    through; one byte more is refused locally with the right MTU, not
    dropped silently on the way; nothing on the wire exceeds the MTU."""
    interop.attach()
    out, = json.loads(mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "-j",
                            netns=interop.A).stdout)
    mtu = out["route_mtu"]
    assert mtu == 1500 - layout.encap_len(1)
    biggest = mtu - 40 - 8
    assert interop.ping(interop.A, interop.B6, count=2, size=biggest, extra=("-M", "do")).returncode == 0
    too_big = interop.ping(interop.A, interop.B6, count=1, size=biggest + 1, extra=("-M", "do"))
    assert too_big.returncode != 0 and f"mtu:{mtu}" in (too_big.stdout + too_big.stderr).replace(" ", "")
    # TCP uses full-size segments of the reduced MSS and its data arrives
    # intact.  A veth hands GSO super-packets to its peer unsegmented, so
    # segment on A (as a NIC would) to see real frames on the wire.
    interop.t.exec(interop.A, ["ethtool", "-K", "a0", "tso", "off", "gso", "off"])
    sent, received = interop.transfer(interop.A, interop.B, interop.B6, nbytes=1 << 20)
    assert sent == received
    frames = [len(p) for p in capture() if p.haslayer("TCP")]
    assert frames and max(frames) == 1500 + 14   # full size, and not a byte more


def test_packets_too_big_are_counted_not_sent_raw(interop, capture):
    """A packet that ignores the route MTU (sent from a packet socket, as
    the stack would not) cannot be encapsulated: it is dropped and
    counted, never sent unencapsulated."""
    from scapy.layers.l2 import Ether
    from scapy.layers.inet6 import ICMPv6EchoRequest
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=interop.A)
    frame = (Ether(src=interop.mac(interop.A, "a0"), dst=interop.mac(interop.R, "r0")) /
             IPv6(src=interop.A6, dst=interop.B6) / ICMPv6EchoRequest(data=b"x" * 1452))
    assert len(frame) == 1514
    interop.inject(interop.A, "a0", [frame, frame])
    c = interop.counters()
    assert c["tx_drop_too_big"] == 2 and c["tx_encap"] == 0
    assert not [p for p in capture() if p.haslayer(ICMPv6EchoRequest)]
