"""Fuzz cases for RX: valid MRC frames (SRH and uSID, IPv6 and IPv4
inner, TCP and UDP) built with scapy, then mutated at random at the byte
level: bit flips, bytes set, truncation, every length field, SRH and
Destination Options fields, TLVs and options, inner headers, the outer
header; and random garbage, some of it addressed to our SID.

Deterministic for a seed: `cases(seed, n)` yields (description, frame).
"""
from __future__ import annotations

import ipaddress
import random
import struct

from scapy.layers.inet6 import (IPv6ExtHdrSegmentRoutingTLV, IPv6ExtHdrSegmentRoutingTLVPad1,
                                IPv6ExtHdrSegmentRoutingTLVPadN)

from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import PEER_SIDS, SID

SID_BYTES = ipaddress.IPv6Address(SID).packed
PADN = 56 + C["MRC_TLV_SIZE"]       # the PadN after the MRC option in a uSID path's Destination Options
SOURCES = [F.PEER_SID, F.STRANGER_SID, *PEER_SIDS.values(), "fd00:b::9"]
FLAGS = [0, C["MRC_F_FEEDBACK"], C["MRC_F_CONTROL"], C["MRC_F_FEEDBACK"] | C["MRC_F_CONTROL"],
         C["MRC_F_PROBE"]]


class Base:
    """A valid frame and where its fields are (offsets in the frame)."""

    def __init__(self, data: bytes, enc: str, ext_len: int, tlvs: list[tuple[int, int]],
                 nseg: int, inner_fam: int):
        self.data, self.enc, self.ext_len, self.tlvs = data, enc, ext_len, tlvs
        self.nseg, self.inner_fam = nseg, inner_fam
        self.inner_off = 54 + ext_len


def _tlvs(rng: random.Random, mrc) -> list:
    """The MRC TLV among padding and unknown TLVs, or none (the kernel's
    encapsulation), 8-byte aligned with the segment list."""
    items = [mrc] if rng.random() < 0.9 else []
    for _ in range(rng.choice([0, 0, 0, 1, 2, 3])):
        kind = rng.random()
        if kind < 0.3:
            t = IPv6ExtHdrSegmentRoutingTLVPad1()
        elif kind < 0.6:
            t = IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"\0" * rng.randrange(0, 6))
        else:
            n = rng.randrange(0, 12)
            t = IPv6ExtHdrSegmentRoutingTLV(type=rng.choice([5, 6, 125, 126, 200]), len=n,
                                            value=bytes(rng.randrange(256) for _ in range(n)))
        items.insert(rng.randrange(len(items) + 1), t)
    size = sum(len(bytes(t)) for t in items)
    pad = -size % 8
    if pad == 1:
        items.append(IPv6ExtHdrSegmentRoutingTLVPad1())
    elif pad:
        items.append(IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"\0" * (pad - 2)))
    return items


def make_base(rng: random.Random) -> Base:
    fam, l4, enc = rng.choice([6, 4]), rng.choice(["tcp", "udp"]), rng.choice(["srh", "usid"])
    payload = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 64, rng.randrange(300)])))
    ecn_in, ecn_out = rng.randrange(4), rng.randrange(4)
    inner = F.inner6(tc=rng.randrange(64) << 2 | ecn_in, l4=l4, payload=payload) if fam == 6 else \
        F.inner4(tos=rng.randrange(64) << 2 | ecn_in, l4=l4, payload=payload)
    fields = dict(flags=rng.choice(FLAGS), path_id=rng.randrange(300), path_seq=rng.randrange(1 << 32),
                  peer_seq=rng.randrange(1 << 32), tx_ns=rng.randrange(1 << 63),
                  fb_path_id=rng.choice([0, rng.randrange(300)]), fb_lost=rng.randrange(100),
                  fb_heard=rng.randrange(1 << 64), fb_block=rng.randrange(8),
                  fb_since_ns32=rng.randrange(1 << 32), fb_path_tx32=rng.randrange(1 << 32))
    src, tc = rng.choice(SOURCES), rng.randrange(64) << 2 | ecn_out
    if enc == "usid":
        l3 = F.usid_packet(inner, mrc=F.mrc_tlv(type=C["MRC_OPT_TYPE"], **fields), src=src, tc=tc)
        data = F.frame(l3)
        return Base(data, enc, C["MRC_DOH_LEN"], [(56, C["MRC_TLV_SIZE"]), (PADN, 6)], 0, fam)
    nseg = rng.choice([1, 1, 2, 3, 4])
    segs = [SID] + [f"fc00:0:e{i}::" for i in range(1, nseg)]
    l3 = F.srh_packet(inner, segs=segs, tlvs=_tlvs(rng, F.mrc_tlv(**fields)), src=src, tc=tc)
    data = F.frame(l3)
    ext_len = (data[55] + 1) * 8
    tlvs, off = [], 54 + 8 + 16 * nseg
    while off < 54 + ext_len:
        n = 1 if data[off] == 0 else 2 + data[off + 1]
        tlvs.append((off, n))
        off += n
    return Base(data, enc, ext_len, tlvs, nseg, fam)


def _fix_plen(b: bytearray) -> None:
    if len(b) >= 54:
        struct.pack_into("!H", b, 18, (len(b) - 54) & 0xFFFF)


def _rand16(rng, old):
    return rng.choice([0, 1, 0xFFFF, old + rng.randint(-8, 8), rng.randrange(1 << 16)]) & 0xFFFF


def _rand8(rng, old):
    return rng.choice([0, 1, 0xFF, old + rng.randint(-3, 3), rng.randrange(256)]) & 0xFF


def mutate(rng: random.Random, base: Base) -> tuple[str, bytes]:
    b = bytearray(base.data)
    ops = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.choice(MUTATIONS)
        try:
            ops.append(op(rng, b, base) or op.__name__)
        except (IndexError, struct.error):      # an earlier cut took the field away
            ops.append(f"{op.__name__}(gone)")
        if len(b) < 14:
            b = b + bytes(14 - len(b))
    return "+".join(ops), bytes(b)


def _header_offset(rng, b, base):
    return rng.randrange(min(len(b), base.inner_off + 48))


def m_bitflip(rng, b, base):
    for _ in range(rng.choice([1, 1, 2, 4])):
        i = _header_offset(rng, b, base) if rng.random() < 0.8 else rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)


def m_byte(rng, b, base):
    b[_header_offset(rng, b, base)] = rng.randrange(256)


def m_truncate(rng, b, base):
    if len(b) <= 15:
        return "truncate(nothing to cut)"
    cut = rng.randrange(14, len(b))
    del b[cut:]
    if rng.random() < 0.6:
        _fix_plen(b)
    return f"truncate@{cut}"


def m_extend(rng, b, base):
    b.extend(bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 8, 40]))))
    if rng.random() < 0.5:
        _fix_plen(b)


def m_length(rng, b, base):
    """One of the frame's length fields, set to a boundary or random value."""
    choices = ["outer_plen", "ext_hdrlen", "inner_len"]
    if base.enc == "srh":
        choices += ["last_entry", "segleft"] + (["tlv_len"] if base.tlvs else [])
    else:
        choices += ["opt_len", "padn_len"]
    which = rng.choice(choices)
    if which == "outer_plen":
        struct.pack_into("!H", b, 18, _rand16(rng, struct.unpack_from("!H", b, 18)[0]))
        return "len:outer_plen"
    if which == "ext_hdrlen":
        b[55] = _rand8(rng, b[55])
    elif which == "last_entry":
        b[58] = _rand8(rng, b[58])
    elif which == "segleft":
        b[57] = _rand8(rng, b[57])
    elif which == "tlv_len":
        off, n = rng.choice(base.tlvs)
        if n > 1:
            b[off + 1] = _rand8(rng, b[off + 1])
    elif which == "opt_len":
        b[57] = _rand8(rng, b[57])
    elif which == "padn_len":
        b[105] = _rand8(rng, b[105])
    elif which == "inner_len":
        if base.inner_fam == 6:
            o = base.inner_off + 4
        else:
            o = base.inner_off + 2 if rng.random() < 0.7 else None
            if o is None:
                b[base.inner_off] = 0x40 | rng.randrange(16)    # IHL
                return "len:ihl"
        struct.pack_into("!H", b, o, _rand16(rng, struct.unpack_from("!H", b, o)[0]))
    if rng.random() < 0.3:
        _fix_plen(b)
    return f"len:{which}"


def m_ext_field(rng, b, base):
    """SRH or Destination Options fields other than lengths."""
    if base.enc == "srh":
        which = rng.choice(["nh", "type", "flags", "tag", "seg0", "seg_other"])
        if which == "nh":
            b[54] = rng.choice([4, 41, 0, 6, 17, 43, 59, 60, rng.randrange(256)])
        elif which == "type":
            b[56] = rng.choice([0, 2, 3, 5, rng.randrange(256)])
        elif which == "flags":
            b[59] = rng.randrange(256)
        elif which == "tag":
            b[60], b[61] = rng.randrange(256), rng.randrange(256)
        elif which == "seg0":
            b[62 + rng.randrange(16)] ^= 1 << rng.randrange(8)
        elif base.nseg > 1:
            b[78 + rng.randrange(16 * (base.nseg - 1))] = rng.randrange(256)
        return f"srh:{which}"
    which = rng.choice(["nh", "opt_type", "padn_type", "padn_data"])
    if which == "nh":
        b[54] = rng.choice([4, 41, 0, 6, 17, 43, 59, 60, rng.randrange(256)])
    elif which == "opt_type":
        b[56] = rng.choice([0, 1, 0x1F, 0x5E, 0x9E, 0xDE, rng.randrange(256)])
    elif which == "padn_type":
        b[PADN] = rng.choice([0, 1, 0x1E, 0x40, 0x80, rng.randrange(256)])
    else:
        b[106 + rng.randrange(4)] = rng.randrange(256)
    return f"doh:{which}"


def m_tlv(rng, b, base):
    """The MRC TLV's own fields, another TLV's type, or TLVs added/removed."""
    if base.enc == "srh" and not base.tlvs:
        return m_ext_field(rng, b, base)
    mrc = 56 if base.enc == "usid" else next((o for o, n in base.tlvs if b[o] == C["MRC_TLV_TYPE"]), None)
    which = rng.choice(["type", "version", "flags", "fb_path_id", "insert", "remove"])
    if which == "type":
        off = mrc if mrc is not None and rng.random() < 0.5 else \
            (rng.choice(base.tlvs)[0] if base.tlvs else 56)
        b[off] = rng.choice([0, 1, 4, 5, C["MRC_TLV_TYPE"], C["MRC_OPT_TYPE"], rng.randrange(256)])
    elif which in ("version", "flags", "fb_path_id") and mrc is not None:
        if which == "version":
            b[mrc + 2] = rng.choice([0, 2, 255, rng.randrange(256)])
        elif which == "flags":
            b[mrc + 3] = rng.randrange(256)
        else:
            struct.pack_into("!H", b, mrc + 24, rng.choice([0, 255, 256, 0xFFFF, rng.randrange(1 << 16)]))
    elif which == "insert":
        # bytes at a TLV boundary; the header and payload lengths follow
        # when they stay whole 8-byte units
        at = rng.choice([o for o, _ in base.tlvs] + [base.inner_off])
        n = rng.choice([1, 2, 8, 8, 16])
        item = bytes([0] * n) if rng.random() < 0.3 else \
            bytes([rng.choice([0, 1, 4, 126, C["MRC_TLV_TYPE"]]), n - 2] + [0] * (n - 2)) if n >= 2 else b"\0"
        b[at:at] = item
        if n % 8 == 0 and rng.random() < 0.8:
            b[55] = (b[55] + n // 8) & 0xFF
            _fix_plen(b)
    elif which == "remove" and base.tlvs:
        off, n = rng.choice(base.tlvs)
        del b[off:off + n]
        if n % 8 == 0:
            b[55] = (b[55] - n // 8) & 0xFF
        _fix_plen(b)
    return f"tlv:{which}"


def m_inner(rng, b, base):
    o = base.inner_off
    if o + 20 > len(b):
        return m_bitflip(rng, b, base)
    which = rng.choice(["version", "ecn", "l4", "addr", "payload", "replace"])
    if which == "version":
        b[o] = (rng.randrange(16) << 4) | (b[o] & 15)
    elif which == "ecn":
        if base.inner_fam == 6:
            b[o + 1] = (b[o + 1] & 0xCF) | rng.randrange(4) << 4
        else:
            b[o + 1] = (b[o + 1] & 0xFC) | rng.randrange(4)
    elif which == "l4":
        l4 = o + (40 if base.inner_fam == 6 else 20)
        if l4 + 4 <= len(b):
            b[l4 + rng.randrange(4)] = rng.randrange(256)
    elif which == "addr":
        b[o + 8 + rng.randrange(16 if base.inner_fam == 6 else 4)] = rng.randrange(256)
    elif which == "payload":
        b[rng.randrange(o, len(b))] ^= 0xFF
    else:   # the inner packet replaced by garbage, the outer length kept right
        del b[o:]
        b.extend(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80))))
        _fix_plen(b)
    return f"inner:{which}"


def m_outer(rng, b, base):
    which = rng.choice(["version", "version", "tc", "src", "dst", "nh", "hlim"])
    if which == "version":
        b[14] = (rng.randrange(16) << 4) | (b[14] & 15)
    elif which == "tc":
        b[14] = (b[14] & 0xF0) | rng.randrange(16)
        b[15] = (b[15] & 0x0F) | rng.randrange(16) << 4
    elif which == "src":
        b[22 + rng.randrange(16)] = rng.choice([0xFF, 0, rng.randrange(256)])
    elif which == "dst":
        b[38 + rng.randrange(16)] ^= 1 << rng.randrange(8)
    elif which == "nh":
        b[20] = rng.choice([0, 43, 60, 58, 41, 17, rng.randrange(256)])
    else:
        b[21] = rng.randrange(256)
    return f"outer:{which}"


def garbage(rng: random.Random) -> bytes:
    n = rng.randrange(14, 300)
    b = bytearray(rng.randrange(256) for _ in range(n))
    if rng.random() < 0.7 and n >= 54:   # claims to be ours
        b[12:14] = b"\x86\xdd"
        b[38:54] = SID_BYTES
        b[20] = rng.choice([43, 60])
        if rng.random() < 0.5:
            b[14] = 0x60 | (b[14] & 15)
            _fix_plen(b)
    return bytes(b)


MUTATIONS = [m_bitflip, m_bitflip, m_byte, m_truncate, m_extend, m_length, m_length, m_length,
             m_ext_field, m_ext_field, m_tlv, m_tlv, m_inner, m_outer]


def cases(seed: int, n: int, pool: int | None = None):
    """n (description, frame) pairs: a few valid frames unchanged, mostly
    mutated ones, some garbage."""
    rng = random.Random(seed)
    pool = pool or min(400, max(50, n // 20))
    bases = [make_base(rng) for _ in range(pool)]
    for i in range(n):
        r = rng.random()
        if r < 0.05:
            k = rng.randrange(pool)
            yield f"valid#{k}", bases[k].data
        elif r < 0.10:
            yield "garbage", garbage(rng)
        else:
            k = rng.randrange(pool)
            what, data = mutate(rng, bases[k])
            yield f"base#{k}/{bases[k].enc}/ipv{bases[k].inner_fam}:{what}", data
