"""Malformed SRv6 packets for our SID are dropped and counted by reason,
never decapsulated; the kernel's End.DT6 would take some of them.

Frames are built with scapy and sent from R into A's a0; a socket on A
listening for the inner payload is the witness that nothing got through.
"""
from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire

pytestmark = pytest.mark.root

SID = "fc00:a::6"


def srv6(inner=None, segs=(SID,), segleft=0, tlvs=None, **srh_kw):
    inner = inner if inner is not None else IPv6(src="fd00:2::b", dst="fd00:1::a") / UDP(dport=9999) / Raw(b"bad")
    tlvs = [wire.MrcTLV(path_id=1, path_seq=5)] if tlvs is None else tlvs
    return IPv6(src="fc00:b::6", dst=SID) / IPv6ExtHdrSegmentRouting(
        addresses=list(segs), segleft=segleft, lastentry=len(segs) - 1, tlv_objects=tlvs, **srh_kw) / inner


def raw_bytes(pkt) -> bytes:
    return bytes(pkt)


def patch(pkt, offset, value: bytes) -> bytes:
    """Rewrite bytes at an offset from the start of the outer IPv6 header."""
    b = bytearray(raw_bytes(pkt))
    b[offset:offset + len(value)] = value
    return bytes(b)


def udp_listener(interop, ns, port=9999):
    """Prints the first datagram to `port` (or nothing after 8 s)."""
    proc = interop.t.popen(ns, ["timeout", "8", sys.executable, "-c",
                                "import socket;s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM);"
                                f"s.bind(('::',{port}));print('ready',flush=True);"
                                "print(s.recv(100),flush=True)"],
                           stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def cases():
    good = srv6()
    nseg_off = 40 + 8
    yield "payload_len", patch(good, 4, struct.pack("!H", len(raw_bytes(good)) - 40 + 8))
    yield "truncated", patch(good, 4, struct.pack("!H", 4))[:44]      # SRH cut after 4 bytes
    yield "routing_type", patch(good, 40 + 2, b"\x03")
    yield "srh_len", patch(good, 40 + 1, b"\x7f")                       # hdr_ext_len past the packet
    yield "srh_len", patch(good, 40 + 4, b"\x05")                       # last_entry past hdr_ext_len
    yield "segments_left", patch(srv6(segs=(SID, "fc00:1::")), 40 + 3, b"\x01")  # not the last
    yield "segments_left", patch(good, 40 + 3, b"\x02")                 # > last_entry
    yield "active_segment", raw_bytes(srv6(segs=("fc00:99::1",)))
    yield "tlv", patch(good, nseg_off + 16 + 1, b"\x40")                # TLV length overruns SRH
    yield "mrc_tlv", patch(good, nseg_off + 16 + 2, b"\x09")            # bad MRC version
    yield "inner_proto", patch(good, 40, b"\x11")                       # next header UDP
    yield "inner_header", raw_bytes(srv6(inner=IPv6(src="fd00:2::b", dst="fd00:1::a", plen=500) /
                                         UDP(dport=9999) / Raw(b"bad")))
    yield "inner_header", raw_bytes(srv6(inner=IP(src="198.18.2.2", dst="198.18.1.1", len=999) /
                                         UDP(dport=9999) / Raw(b"bad")))


def test_each_malformation_dropped_by_its_reason(interop):
    interop.attach()
    a_mac, r_mac = interop.mac(interop.A, "a0"), interop.mac(interop.R, "r0")
    listener = udp_listener(interop, interop.A)
    expected: dict[str, int] = {}
    frames = []
    for reason, ip_bytes in cases():
        frames.append(Ether(src=r_mac, dst=a_mac, type=0x86DD) / Raw(ip_bytes))
        expected[f"rx_drop_{reason}"] = expected.get(f"rx_drop_{reason}", 0) + 1
    before = interop.counters()
    interop.inject(interop.R, "r0", frames)
    after = interop.counters()
    delta = {k: after[k] - before[k] for k in after}
    for name, n in expected.items():
        assert delta[name] == n, (name, {k: v for k, v in delta.items() if v})
    assert delta["rx_decap"] == 0
    assert delta["rx_seen"] >= len(frames)
    # a valid one through the same path is decapsulated and delivered
    interop.inject(interop.R, "r0", [Ether(src=r_mac, dst=a_mac) /
                                     srv6(inner=IPv6(src="fd00:2::b", dst="fd00:1::a") /
                                          UDP(dport=9999) / Raw(b"good"))])
    out, _ = listener.communicate(timeout=15)
    assert "good" in out and "bad" not in out
    assert interop.counters()["rx_decap"] - after["rx_decap"] == 1


@pytest.mark.parametrize("offset,value", [(48 + 16 + 1, b"\x40"),   # TLV overruns the SRH
                                          (43, b"\x05")])            # segments left > last entry
def test_kernel_end_dt6_decapsulates_what_we_drop(interop, offset, value):
    """The comparison the issue asks us to beat: the kernel's End.DT6 on B
    still delivers packets that our XDP drops (test above)."""
    b_mac, r_mac = interop.mac(interop.B, "b0"), interop.mac(interop.R, "r1")
    listener = udp_listener(interop, interop.B)
    bad = IPv6(src="fc00:a::6", dst="fc00:b::6") / IPv6ExtHdrSegmentRouting(
        addresses=["fc00:b::6"], segleft=0, lastentry=0, tlv_objects=[wire.MrcTLV()]) / \
        IPv6(src="fd00:1::a", dst="fd00:2::b") / UDP(dport=9999) / Raw(b"bad")
    frame = Ether(src=r_mac, dst=b_mac, type=0x86DD) / Raw(patch(bad, offset, value))
    interop.inject(interop.R, "r1", [frame])
    out, _ = listener.communicate(timeout=15)
    assert "bad" in out   # the kernel delivered it; our XDP would not (test above)
