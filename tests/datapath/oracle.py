"""What RX must do with a frame, judged from the RFCs and the MRC wire
format (bpf/mrc_common.h's constants), not from bpf/mrc_rx.c.

    RFC 8200  IPv6: version, payload length, extension headers, options
    RFC 4291  section 2.7: a multicast address is never a source
    RFC 8754  the SRH: lengths, Last Entry, Segments Left, TLVs
    RFC 8986  End.DT46 at the last segment: Segments Left must be 0
    RFC 9800  uSID (NEXT-C-SID): the last ID made the destination our SID
    RFC 2473  the tunnel payload is one whole inner packet
    RFC 6040  ECN at decapsulation (normal mode)

A frame is `ours` when it claims the MRC encapsulation: Ethernet type
IPv6, a whole fixed IPv6 header, destination our SID, first next header
Routing (43) or Destination Options (60).  The verdicts:

    NOT_OURS  passed up untouched
    MALFORMED must not be decapsulated (dropped)
    STRICTER  valid by the RFCs, but dropped by a documented rule of ours
              (docs/design/rx-validation.md; each has a name here)
    ECN_DROP  RFC 6040: CE on a Not-ECT inner packet
    CONSUMED  valid, feedback only (MRC_F_CONTROL): dropped after filing
    DECAP     valid: passed up as `out`
    TRIMMED   cut by a switch (issue 29): valid but for an inner packet cut
              after its whole header, outer DSCP MRC_TRIM_DSCP; filed, then
              handed on as its inner header (`out`, after the metadata word)

One rule of the MRC format needs the frames before: a TLV carrying its
path's newest sequence number again is a later wire segment of a burst
(segmentation copies the TLV into every segment; docs/design/spraying.md),
counted as one (`rx_segment`) and not filed again.  `Newest` keeps what
that rule needs, per sender and path.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mrc_ebpf.datapath.source import C

NOT_OURS, MALFORMED, STRICTER, ECN_DROP, CONSUMED, DECAP, TRIMMED = \
    "not_ours", "malformed", "stricter", "ecn_drop", "consumed", "decap", "trimmed"
TRIM_DSCP = C["MRC_TRIM_DSCP"]

MRC_TLV_TYPE, MRC_OPT_TYPE = C["MRC_TLV_TYPE"], C["MRC_OPT_TYPE"]
MRC_TLV_LEN, MRC_VERSION = C["MRC_TLV_LEN"], C["MRC_VERSION"]
MAX_TLVS, MAX_PATHS = C["MRC_MAX_TLVS"], C["MRC_MAX_PATHS"]
F_FEEDBACK, F_CONTROL, F_FB_CE = C["MRC_F_FEEDBACK"], C["MRC_F_CONTROL"], C["MRC_F_FB_CE"]

# RFC 6040 section 4.2, Figure 4: (inner, outer) -> inner after decap,
# None: drop.  Not-ECT 0, ECT(1) 1, ECT(0) 2, CE 3.
ECN_TABLE = {
    (0, 0): 0, (0, 2): 0, (0, 1): 0, (0, 3): None,
    (2, 0): 2, (2, 2): 2, (2, 1): 1, (2, 3): 3,
    (1, 0): 1, (1, 2): 1, (1, 1): 1, (1, 3): 3,
    (3, 0): 3, (3, 2): 3, (3, 1): 3, (3, 3): 3,
}


@dataclass
class Judgement:
    verdict: str
    why: str = ""
    out: bytes | None = None                        # DECAP: the frame passed up
    counters: dict = field(default_factory=dict)    # DECAP/CONSUMED/ECN_DROP: non-outcome counters


class Newest:
    """The newest path_seq per (sender, path) and the epoch it is of."""

    def __init__(self):
        self.seq: dict[tuple[bytes, int], tuple[int, int]] = {}

    def is_segment(self, src: bytes, mrc: bytes) -> bool:
        """Whether this TLV repeats its path's newest number; files it."""
        path_id, seq = struct.unpack_from("!H", mrc, 4)[0], struct.unpack_from("!I", mrc, 8)[0]
        epoch = struct.unpack_from("!I", mrc, 48)[0]
        key = (src, path_id)
        old = self.seq.get(key)
        if old is None or old[0] != epoch:
            self.seq[key] = (epoch, seq)
            return False
        if seq == old[1]:
            return True
        if (seq - old[1]) & 0xFFFFFFFF < 0x80000000:     # ahead (serial arithmetic)
            self.seq[key] = (epoch, seq)
        return False


def judge(frame: bytes, sid: bytes, peer_sids: set[bytes], newest: Newest | None = None) -> Judgement:
    if len(frame) < 14 + 40 or frame[12:14] != b"\x86\xdd":
        return Judgement(NOT_OURS, "not a whole IPv6 header")
    l3 = frame[14:]
    if l3[24:40] != sid or l3[6] not in (43, 60):
        return Judgement(NOT_OURS, "not to our SID with a Routing or Destination Options header")
    if l3[0] >> 4 != 6:
        return Judgement(MALFORMED, "RFC 8200 3: version is not 6")
    if l3[8] == 0xFF:
        return Judgement(MALFORMED, "RFC 4291 2.7: multicast source")
    plen = struct.unpack_from("!H", l3, 4)[0]
    if 40 + plen > len(l3):
        return Judgement(MALFORMED, "RFC 8200 3: payload length beyond the frame")
    if 40 + plen < len(l3):
        return Judgement(STRICTER, "trailing-bytes")
    ext = _srh(l3) if l3[6] == 43 else _dstopts(l3)
    if isinstance(ext, Judgement):
        return ext
    ext_len, nexthdr, mrc = ext
    inner = l3[40 + ext_len:]
    if nexthdr not in (41, 4):
        return Judgement(STRICTER, "inner-ip-only")
    bad = _inner_ok(nexthdr, inner)
    trimmed = bad and mrc is not None and _trimmed(l3, nexthdr, inner)
    if bad and not trimmed:
        return Judgement(MALFORMED, bad)

    counters = {}
    if mrc is not None:
        counters["rx_mrc_tlv"] = 1
        flags = mrc[3]
        fb_path_id = struct.unpack_from("!H", mrc, 24)[0]
        if newest is not None and newest.is_segment(l3[8:24], mrc):
            counters["rx_segment"] = 1
        elif flags & F_FEEDBACK and l3[8:24] in peer_sids and fb_path_id < MAX_PATHS:
            counters["rx_feedback"] = 1
            if flags & F_FB_CE:         # the feedback says our path was CE-marked
                counters["rx_fb_ce"] = 1
        if trimmed:
            ethertype = b"\x86\xdd" if nexthdr == 41 else b"\x08\x00"
            return Judgement(TRIMMED, "trimmed by a switch", out=frame[:12] + ethertype + bytes(inner),
                             counters=counters)
        if flags & F_CONTROL:
            return Judgement(CONSUMED, "MRC_F_CONTROL: feedback only", counters=counters)

    outer_ecn = (struct.unpack_from("!I", l3, 0)[0] >> 20) & 3
    inner = bytearray(inner)
    if nexthdr == 41:
        inner_ecn = (struct.unpack_from("!I", inner, 0)[0] >> 20) & 3
    else:
        inner_ecn = inner[1] & 3
    new = ECN_TABLE[(inner_ecn, outer_ecn)]
    if new is None:
        return Judgement(ECN_DROP, "RFC 6040: CE on Not-ECT", counters=counters)
    if new != inner_ecn:
        if new == 3:
            counters["rx_ce"] = 1
        if nexthdr == 41:
            inner[1] = (inner[1] & 0xCF) | (new << 4)
        else:
            old_word = struct.unpack_from("!H", inner, 0)[0]
            inner[1] = (inner[1] & 0xFC) | new
            new_word = struct.unpack_from("!H", inner, 0)[0]
            # RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m')
            total = (~struct.unpack_from("!H", inner, 10)[0] & 0xFFFF) + (~old_word & 0xFFFF) + new_word
            while total >> 16:
                total = (total & 0xFFFF) + (total >> 16)
            struct.pack_into("!H", inner, 10, ~total & 0xFFFF)
    ethertype = b"\x86\xdd" if nexthdr == 41 else b"\x08\x00"
    counters["rx_decap_bytes"] = len(inner)
    return Judgement(DECAP, "valid", out=frame[:12] + ethertype + bytes(inner), counters=counters)


def _srh(l3: bytes):
    """RFC 8200 4.4, RFC 8754 2 and 4.3, RFC 8986 4.6: (length, next header, MRC TLV)."""
    if len(l3) < 48:
        return Judgement(MALFORMED, "RFC 8200 4.4: routing header cut")
    nexthdr, hdrlen, rtype, segleft, last = l3[40:45]
    length = (hdrlen + 1) * 8
    if 40 + length > len(l3):
        return Judgement(MALFORMED, "RFC 8200 4.4: Hdr Ext Len beyond the packet")
    if rtype != 4:
        if segleft:
            return Judgement(MALFORMED, "RFC 8200 4.4: unknown routing type with Segments Left > 0")
        return Judgement(STRICTER, "srh-only")
    if last > hdrlen // 2 - 1:
        return Judgement(MALFORMED, "RFC 8754 4.3.1.1 S08: Last Entry beyond Hdr Ext Len")
    if segleft > last + 1:
        return Judgement(MALFORMED, "RFC 8754 4.3.1.1 S08: Segments Left > Last Entry + 1")
    if segleft:
        return Judgement(MALFORMED, "RFC 8986 4.6: End.DT with Segments Left > 0")
    srh = l3[40:40 + length]
    if srh[8:24] != l3[24:40]:
        return Judgement(MALFORMED, "RFC 8754 2: the destination is not Segment List[Segments Left]")
    off, items, mrc = 8 + (last + 1) * 16, 0, None
    while off < length:
        items += 1
        if srh[off] == 0:           # Pad1
            off += 1
            continue
        if off + 2 > length or off + 2 + srh[off + 1] > length:
            return Judgement(MALFORMED, "RFC 8754 2.1: a TLV overruns the SRH")
        if srh[off] == MRC_TLV_TYPE:
            if srh[off + 1] != MRC_TLV_LEN or srh[off + 2] != MRC_VERSION:
                return Judgement(MALFORMED, "mrc_common.h: MRC TLV of wrong length or version")
            mrc = srh[off:off + 2 + MRC_TLV_LEN]
        off += 2 + srh[off + 1]
    if items > MAX_TLVS:
        return Judgement(STRICTER, "tlv-count")
    return length, nexthdr, mrc


def _dstopts(l3: bytes):
    """RFC 8200 4.2 and 4.6 (options), RFC 9800 (uSID: no SRH, the TLV
    rides in Destination Options)."""
    if len(l3) < 42:
        return Judgement(MALFORMED, "RFC 8200 4.6: Destination Options cut")
    nexthdr, hdrlen = l3[40], l3[41]
    length = (hdrlen + 1) * 8
    if 40 + length > len(l3):
        return Judgement(MALFORMED, "RFC 8200 4.6: Hdr Ext Len beyond the packet")
    doh = l3[40:40 + length]
    off, options, mrc = 2, [], None
    while off < length:
        if doh[off] == 0:           # Pad1
            options.append((0, 0))
            off += 1
            continue
        if off + 2 > length or off + 2 + doh[off + 1] > length:
            return Judgement(MALFORMED, "RFC 8200 4.2: an option overruns the header")
        otype, olen = doh[off], doh[off + 1]
        if otype == MRC_OPT_TYPE:
            if olen != MRC_TLV_LEN or doh[off + 2] != MRC_VERSION:
                return Judgement(MALFORMED, "mrc_common.h: MRC option of wrong length or version")
            mrc = doh[off:off + 2 + olen]
        elif otype != 1 and otype >> 6 != 0:
            return Judgement(MALFORMED, "RFC 8200 4.2: unknown option whose action is discard")
        options.append((otype, olen))
        off += 2 + olen
    if options != [(MRC_OPT_TYPE, MRC_TLV_LEN), (1, 4)]:
        return Judgement(STRICTER, "dstopts-exact")
    return length, nexthdr, mrc


def _trimmed(l3: bytes, nexthdr: int, inner: bytes) -> bool:
    """A switch's cut (bpf/lab/trim.c): the mark, and a whole inner header
    that claims more than is left."""
    if (struct.unpack_from("!I", l3, 0)[0] >> 22) & 0x3F != TRIM_DSCP:
        return False
    if nexthdr == 41:
        return len(inner) >= 40 and inner[0] >> 4 == 6 and 40 + struct.unpack_from("!H", inner, 4)[0] > len(inner)
    return (len(inner) >= 20 and inner[0] >> 4 == 4 and inner[0] & 15 >= 5 and (inner[0] & 15) * 4 <= len(inner)
            and struct.unpack_from("!H", inner, 2)[0] > len(inner))


def _inner_ok(nexthdr: int, inner: bytes) -> str | None:
    """RFC 2473 3 with RFC 8200 3 / RFC 791: one whole inner packet."""
    if nexthdr == 41:
        if len(inner) < 40 or inner[0] >> 4 != 6:
            return "RFC 8200 3: inner IPv6 header cut or not version 6"
        if 40 + struct.unpack_from("!H", inner, 4)[0] != len(inner):
            return "RFC 2473: inner IPv6 payload length disagrees with the tunnel payload"
        return None
    if len(inner) < 20 or inner[0] >> 4 != 4 or inner[0] & 15 < 5:
        return "RFC 791: inner IPv4 header cut, not version 4, or IHL < 5"
    total = struct.unpack_from("!H", inner, 2)[0]
    if total != len(inner) or (inner[0] & 15) * 4 > total:
        return "RFC 2473 / RFC 791: inner IPv4 total length disagrees with the tunnel payload"
    return None
