"""scapy layer for the MRC TLV, so captures decode.

This is the second definition of the wire format (the first is struct
mrc_tlv in bpf/mrc_common.h); tests/test_layout.py checks the two agree
field by field.
"""
from __future__ import annotations

from scapy.fields import (ByteField, IntField, LongField, ShortField, StrFixedLenField, XByteField,
                          XLongField, XStrFixedLenField)
from scapy.layers.inet6 import IPv6ExtHdrSegmentRoutingTLV

from mrc_ebpf.datapath.source import C


class MrcTLV(IPv6ExtHdrSegmentRoutingTLV):
    name = "MRC metadata TLV"
    fields_desc = [ByteField("type", C["MRC_TLV_TYPE"]),
                   ByteField("len", C["MRC_TLV_LEN"]),
                   ByteField("version", C["MRC_VERSION"]),
                   XByteField("flags", 0),
                   ShortField("path_id", 0),
                   ByteField("tclass", 0),
                   ByteField("fb_block", 0),
                   IntField("path_seq", 0),
                   IntField("peer_seq", 0),
                   LongField("tx_ns", 0),
                   ShortField("fb_path_id", 0),
                   ShortField("fb_qdelay_us", 0),
                   IntField("fb_lost", 0),
                   XLongField("fb_heard", 0),
                   IntField("fb_since_ns32", 0),
                   IntField("fb_path_tx32", 0),
                   IntField("epoch", 0),
                   ByteField("key_id", 0),
                   StrFixedLenField("reserved", b"\0" * 3, 3),
                   XStrFixedLenField("mac", b"\0" * 8, 8)]


MrcTLV.register_variant()


def mrc_tlv(packet) -> MrcTLV | None:
    """The MRC TLV of a captured packet, from its SRH or, on a uSID path,
    its Destination Options (same layout, option type MRC_OPT_TYPE)."""
    from scapy.layers.inet6 import IPv6ExtHdrDestOpt, IPv6ExtHdrSegmentRouting
    srh = packet.getlayer(IPv6ExtHdrSegmentRouting)
    if srh is not None:
        for tlv in srh.tlv_objects:
            if isinstance(tlv, MrcTLV):
                return tlv
    doh = packet.getlayer(IPv6ExtHdrDestOpt)
    if doh is not None:
        for option in doh.options:
            if getattr(option, "otype", None) == C["MRC_OPT_TYPE"]:
                return MrcTLV(bytes(option))
    return None
