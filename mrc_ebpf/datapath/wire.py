"""scapy layer for the MRC TLV, so captures decode.

A scapy user loads it on its own: `from mrc_ebpf.datapath import wire`
registers MrcTLV as an SRH TLV (scapy then dissects it in any packet), and
`wire.mrc_tlv(pkt)` / `wire.describe(pkt)` find it in an SRH or, on a
uSID path, in the Destination Options header.  It needs only scapy and
the package's bpf/mrc_common.h (no bcc, no root).

This is the second definition of the wire format (the first is struct
mrc_tlv in bpf/mrc_common.h); it is registered as a mirror of it
(mirrors.py), and tests/test_layout.py checks the two agree field by field.
"""
from __future__ import annotations

from scapy.fields import (ByteField, IntField, LongField, ShortField, StrFixedLenField, XByteField,
                          XLongField, XStrFixedLenField)
from scapy.layers.inet6 import IPv6ExtHdrSegmentRoutingTLV

from mrc_ebpf.datapath import layout, mirrors
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
                   ByteField("ports_down", 0),
                   StrFixedLenField("reserved", b"\0" * 2, 2),
                   XStrFixedLenField("mac", b"\0" * 8, 8)]


MrcTLV.register_variant()
mirrors.register(MrcTLV, "struct mrc_tlv", kind="scapy", of=layout.MrcTlv)


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


FLAGS = {C["MRC_F_PROBE"]: "probe", C["MRC_F_FEEDBACK"]: "feedback", C["MRC_F_CONTROL"]: "control",
         C["MRC_F_FB_CE"]: "fb-ce"}


def describe(packet) -> dict | None:
    """A packet's MRC view: outer addresses, encoding, segments, the
    path and its sequences, the send timestamp, and the feedback it
    carries (None when it has no MRC TLV)."""
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
    tlv = mrc_tlv(packet)
    if tlv is None:
        return None
    outer = packet.getlayer(IPv6)
    srh = packet.getlayer(IPv6ExtHdrSegmentRouting)
    flags = [name for bit, name in sorted(FLAGS.items()) if tlv.flags & bit]
    inner = srh.payload if srh is not None else None
    if srh is None:
        from scapy.layers.inet6 import IPv6ExtHdrDestOpt
        doh = packet.getlayer(IPv6ExtHdrDestOpt)
        inner = doh.payload if doh is not None else None
    return {
        "src": outer.src, "dst": outer.dst, "encoding": "srh" if srh is not None else "usid",
        # travel order (the SRH lists them last hop first)
        "segments": list(reversed(srh.addresses)) if srh is not None else [outer.dst],
        "path_id": tlv.path_id, "path_seq": tlv.path_seq, "peer_seq": tlv.peer_seq,
        "tx_ns": tlv.tx_ns, "tclass": tlv.tclass, "flags": flags,
        "inner": inner.name if inner is not None and inner.name != "Raw" else None,
        "feedback": None if not tlv.flags & C["MRC_F_FEEDBACK"] else {
            "path_id": tlv.fb_path_id, "qdelay_us": tlv.fb_qdelay_us, "lost": tlv.fb_lost,
            "heard": f"{tlv.fb_heard:016x}", "block": tlv.fb_block,
            "since_ns32": tlv.fb_since_ns32, "path_tx32": tlv.fb_path_tx32},
    }
