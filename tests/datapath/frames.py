"""Frames for the packet tables and the fuzzer, built with scapy and the
project's MRC TLV layer (mrc_ebpf/datapath/wire.py)."""
from __future__ import annotations

import ipaddress

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import (HBHOptUnknown, IPv6, IPv6ExtHdrDestOpt,
                                IPv6ExtHdrSegmentRouting, PadN)
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire
from mrc_ebpf.datapath.source import C

from .harness import MAC_PEER, MAC_US, SID

PEER_SID = "fc00:0:b::"         # a configured peer: its feedback is filed
STRANGER_SID = "fc00:0:99::"    # an MRC sender we have no path to


def eth(ethertype: int = 0x86DD) -> Ether:
    return Ether(src=MAC_PEER, dst=MAC_US, type=ethertype)


def inner6(tc: int = 0, l4: str = "udp", payload: bytes = b"inner") -> IPv6:
    transport = TCP(sport=40000, dport=5201, flags="PA") if l4 == "tcp" else UDP(sport=40000, dport=9999)
    return IPv6(src="fd00:b::2", dst="fd00:a::1", tc=tc) / transport / Raw(payload)


def inner4(tos: int = 0, l4: str = "udp", payload: bytes = b"inner") -> IP:
    transport = TCP(sport=40000, dport=5201, flags="PA") if l4 == "tcp" else UDP(sport=40000, dport=9999)
    return IP(src="198.18.2.2", dst="198.18.1.1", tos=tos) / transport / Raw(payload)


def mrc_tlv(**fields) -> wire.MrcTLV:
    return wire.MrcTLV(**{"path_id": 3, "path_seq": 7, "peer_seq": 11, **fields})


def srh_packet(inner=None, segs=(SID,), segleft=0, tlvs=None, src=PEER_SID, dst=SID, tc=0,
               **srh_fields):
    """Outer IPv6 + SRH (RFC 8754) + inner: the L3 packet."""
    inner = inner6() if inner is None else inner
    tlvs = [mrc_tlv()] if tlvs is None else tlvs
    nh = 4 if isinstance(inner, IP) else 41
    srh = IPv6ExtHdrSegmentRouting(nh=nh, addresses=list(segs), segleft=segleft,
                                   lastentry=len(segs) - 1, tlv_objects=tlvs, **srh_fields)
    return IPv6(src=src, dst=dst, tc=tc, hlim=62) / srh / inner


def doh_header(mrc: wire.MrcTLV | None = None, nh: int = 41, options=None) -> IPv6ExtHdrDestOpt:
    """The Destination Options header of a uSID path: the MRC option
    (same layout as the TLV, type MRC_OPT_TYPE), then PadN to 8 bytes."""
    if options is None:
        body = bytes(mrc if mrc is not None else mrc_tlv())
        options = [HBHOptUnknown(otype=C["MRC_OPT_TYPE"], optlen=body[1], optdata=body[2:]),
                   PadN(optdata=b"\0" * 4)]
    return IPv6ExtHdrDestOpt(nh=nh, autopad=0, options=options)


def usid_packet(inner=None, mrc=None, src=PEER_SID, dst=SID, tc=0, options=None):
    inner = inner6() if inner is None else inner
    nh = 4 if isinstance(inner, IP) else 41
    return IPv6(src=src, dst=dst, tc=tc, hlim=62) / doh_header(mrc, nh, options) / inner


def ipaddress_of(raw) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(bytes(raw))


def frame(l3) -> bytes:
    return bytes(eth() / l3)


def patch(data: bytes, offset: int, value: bytes) -> bytes:
    """`data` with bytes at `offset` (from the start of the frame) replaced."""
    b = bytearray(data)
    b[offset:offset + len(value)] = value
    return bytes(b)


def decapsulated(inner) -> bytes:
    """What RX passes up: the same Ethernet addresses, the inner packet."""
    return bytes(eth(0x0800 if isinstance(inner, IP) else 0x86DD) / inner)
