"""Packet tables: frame in -> verdict, frame out, counter deltas, run
through the real RX (XDP) and TX (TC) programs with BPF_PROG_TEST_RUN.

A row is (name, frame, verdict, expected frame out, counter deltas).  The
frame out is SAME for "passed untouched", None when not checked (a
drop).  Counter deltas are exact: every counter that moved, and by how
much.  Rows the fuzzer found are read from cases/*.json as well.  A new
wire rule is a new row.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.layers.inet import IP
from scapy.layers.inet6 import (HBHOptUnknown, ICMPv6EchoRequest, IPv6, IPv6ExtHdrHopByHop,
                                IPv6ExtHdrSegmentRouting, IPv6ExtHdrSegmentRoutingTLVPadN, PadN)
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import COUNTERS, SID, outcomes

pytestmark = pytest.mark.root

SAME = "same"
CASES = Path(__file__).parent / "cases"


@dataclass
class Row:
    name: str
    frame: bytes
    verdict: str
    out: bytes | str | None
    counters: dict = field(default_factory=dict)


def seen(**deltas) -> dict:
    return {"rx_seen": 1, **deltas}


def decap(inner, mrc=True, ce=False) -> dict:
    d = seen(rx_decap=1, rx_decap_bytes=len(bytes(inner)))
    if mrc:
        d["rx_mrc_tlv"] = 1
    if ce:
        d["rx_ce"] = 1
    return d


def drop(reason) -> dict:
    return seen(**{f"rx_drop_{reason}": 1})


PASS = seen(rx_pass=1)

# RX drop reasons no frame can reach: bpf_xdp_adjust_head fails only when
# less than an Ethernet header would remain, and the inner-header check
# before it needs a whole inner IPv4/IPv6 header.
UNREACHABLE = {"rx_drop_decap_fail"}


def rx_rows() -> list[Row]:
    rows = []

    def row(name, l3_or_frame, verdict, out, counters):
        data = l3_or_frame if isinstance(l3_or_frame, bytes) else F.frame(l3_or_frame)
        rows.append(Row(name, data, verdict, out, counters))

    # ---- decapsulated: both encapsulations, both inner families, TCP/UDP
    for l4 in ("udp", "tcp"):
        i6, i4 = F.inner6(l4=l4), F.inner4(l4=l4)
        row(f"decap srh ipv6/{l4}", F.srh_packet(i6), "XDP_PASS", F.decapsulated(i6), decap(i6))
        row(f"decap srh ipv4/{l4}", F.srh_packet(i4), "XDP_PASS", F.decapsulated(i4), decap(i4))
        row(f"decap usid ipv6/{l4}", F.usid_packet(i6), "XDP_PASS", F.decapsulated(i6), decap(i6))
        row(f"decap usid ipv4/{l4}", F.usid_packet(i4), "XDP_PASS", F.decapsulated(i4), decap(i4))
    i6 = F.inner6()
    row("decap srh without MRC TLV (the kernel's seg6 encap)", F.srh_packet(i6, tlvs=[]),
        "XDP_PASS", F.decapsulated(i6), decap(i6, mrc=False))
    row("decap srh 3 segments, all visited", F.srh_packet(i6, segs=(SID, "fc00:0:e2::", "fc00:0:e1::")),
        "XDP_PASS", F.decapsulated(i6), decap(i6))
    row("decap srh Pad1, PadN and an unknown TLV skipped",
        F.srh_packet(i6, tlvs=[IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"\0" * 4), F.mrc_tlv(),
                               wire.IPv6ExtHdrSegmentRoutingTLV(type=126, len=6, value=b"x" * 6),
                               IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"")]),
        "XDP_PASS", F.decapsulated(i6), decap(i6))
    # RFC 8754 4.3.1.1's bound is Segments Left <= Last Entry + 1 in transit;
    # at the last segment only 0 is valid
    row("decap srh with flags and tag set (ignored on receipt)", F.srh_packet(i6, tag=0x1234),
        "XDP_PASS", F.decapsulated(i6), decap(i6))

    # ---- ECN, RFC 6040 normal mode (outer -> inner at decap)
    for name, outer, inner_ecn, result, ce in (
            ("CE onto ECT(0)", 3, 2, 3, True), ("CE onto ECT(1)", 3, 1, 3, True),
            ("CE onto CE", 3, 3, 3, False), ("ECT(1) onto ECT(0)", 1, 2, 1, False),
            ("ECT(1) onto ECT(1)", 1, 1, 1, False), ("ECT(1) onto Not-ECT", 1, 0, 0, False),
            ("ECT(0) onto Not-ECT", 2, 0, 0, False), ("ECT(0) onto ECT(1)", 2, 1, 1, False),
            ("Not-ECT onto ECT(0)", 0, 2, 2, False), ("Not-ECT onto CE", 0, 3, 3, False)):
        tos = 0x88     # a DSCP, kept
        for fam, mk in (("ipv6", lambda e: F.inner6(tc=tos | e)), ("ipv4", lambda e: F.inner4(tos=tos | e))):
            inner, expected = mk(inner_ecn), mk(result)
            for enc, build in (("srh", F.srh_packet), ("usid", F.usid_packet)):
                if enc == "usid" and fam == "ipv4" and not ce:
                    continue
                row(f"ecn {name} {fam} {enc}", build(inner, tc=0x20 | outer), "XDP_PASS",
                    F.decapsulated(expected), decap(inner, ce=ce))
    for dscp in (0, 0x0a, 0x2e, 0x3f):      # the mark changes two bits, the DSCP none
        for fam, mk in (("ipv6", lambda e: F.inner6(tc=dscp << 2 | e)),
                        ("ipv4", lambda e: F.inner4(tos=dscp << 2 | e))):
            row(f"ecn CE onto ECT(0) {fam} dscp {dscp:#x}", F.srh_packet(mk(2), tc=3), "XDP_PASS",
                F.decapsulated(mk(3)), decap(mk(2), ce=True))
    for fam, inner in (("ipv6", F.inner6()), ("ipv4", F.inner4())):
        row(f"ecn CE onto Not-ECT {fam}: dropped", F.srh_packet(inner, tc=3), "XDP_DROP", None, {**drop("ecn"), "rx_mrc_tlv": 1})
    row("ecn CE onto Not-ECT usid: dropped", F.usid_packet(F.inner6(), tc=3), "XDP_DROP", None, {**drop("ecn"), "rx_mrc_tlv": 1})

    # ---- feedback-only packets are consumed
    row("control srh: consumed", F.srh_packet(tlvs=[F.mrc_tlv(flags=C["MRC_F_CONTROL"])]), "XDP_DROP",
        None, seen(rx_control=1, rx_mrc_tlv=1))
    row("control usid: consumed", F.usid_packet(mrc=F.mrc_tlv(type=C["MRC_OPT_TYPE"], flags=C["MRC_F_CONTROL"])),
        "XDP_DROP", None, seen(rx_control=1, rx_mrc_tlv=1))

    # ---- not ours: untouched
    other = F.srh_packet(dst="fc00:0:99::", segs=("fc00:0:99::",))
    row("not ours: srh to another SID", other, "XDP_PASS", SAME, PASS)
    row("not ours: plain IPv6 to a host", F.inner6(), "XDP_PASS", SAME, PASS)
    row("not ours: ICMPv6 echo to our SID", IPv6(src=F.PEER_SID, dst=SID) / ICMPv6EchoRequest(),
        "XDP_PASS", SAME, PASS)
    row("not ours: hop-by-hop first, to our SID",
        IPv6(src=F.PEER_SID, dst=SID) / IPv6ExtHdrHopByHop() / IPv6ExtHdrSegmentRouting(addresses=[SID]) / F.inner6(),
        "XDP_PASS", SAME, PASS)
    row("not ours: IPv4", bytes(F.eth(0x0800) / F.inner4()), "XDP_PASS", SAME, PASS)
    row("not ours: ARP", bytes(Ether(src=F.MAC_PEER, dst="ff:ff:ff:ff:ff:ff") / ARP()), "XDP_PASS", SAME, PASS)
    row("not ours: IPv6 header cut short", F.frame(F.srh_packet())[:14 + 39], "XDP_PASS", SAME, PASS)
    row("not ours: Ethernet header only", F.frame(F.srh_packet())[:14], "XDP_PASS", SAME, PASS)
    row("not ours: version 5 to another address (the kernel drops it)",
        F.patch(F.frame(other), 14, b"\x50"), "XDP_PASS", SAME, PASS)

    # ---- dropped, by reason, in the order mrc_rx.c checks
    good, good_usid = F.frame(F.srh_packet()), F.frame(F.usid_packet())
    for v in (0, 4, 5, 15):
        row(f"outer_header: version {v}", F.patch(good, 14, bytes([v << 4])), "XDP_DROP", None, drop("outer_header"))
    row("outer_header: version 4, usid", F.patch(good_usid, 14, b"\x40"), "XDP_DROP", None, drop("outer_header"))
    row("outer_header: multicast source (RFC 4291 2.7)", F.frame(F.srh_packet(src="ff02::1")),
        "XDP_DROP", None, drop("outer_header"))
    plen = len(good) - 54
    row("payload_len: longer than the frame", F.patch(good, 18, struct.pack("!H", plen + 8)),
        "XDP_DROP", None, drop("payload_len"))
    row("payload_len: trailing bytes", good + b"\0" * 8, "XDP_DROP", None, drop("payload_len"))
    row("payload_len: usid, cut frame", good_usid[:-4], "XDP_DROP", None, drop("payload_len"))
    row("truncated: SRH cut after 4 bytes", F.patch(good, 18, struct.pack("!H", 4))[:58],
        "XDP_DROP", None, drop("truncated"))
    row("truncated: Destination Options cut after 4 bytes", F.patch(good_usid, 18, struct.pack("!H", 4))[:58],
        "XDP_DROP", None, drop("truncated"))
    row("routing_type: 3 (RPL), segments left 0", F.patch(good, 54 + 2, b"\x03"), "XDP_DROP", None,
        drop("routing_type"))
    row("routing_type: 0 (deprecated)", F.patch(good, 54 + 2, b"\x00"), "XDP_DROP", None, drop("routing_type"))
    row("srh_len: hdr_ext_len past the packet", F.patch(good, 54 + 1, b"\x7f"), "XDP_DROP", None, drop("srh_len"))
    row("srh_len: last_entry past hdr_ext_len", F.patch(good, 54 + 4, b"\x05"), "XDP_DROP", None, drop("srh_len"))
    two = F.frame(F.srh_packet(segs=(SID, "fc00:0:e1::")))
    row("segments_left: 1, we are not the last segment", F.patch(two, 54 + 3, b"\x01"), "XDP_DROP", None,
        drop("segments_left"))
    row("segments_left: above last_entry", F.patch(good, 54 + 3, b"\x02"), "XDP_DROP", None,
        drop("segments_left"))
    row("active_segment: list[0] is not the destination", F.srh_packet(segs=("fc00:0:98::",)),
        "XDP_DROP", None, drop("active_segment"))
    tlv_off = 54 + 8 + 16
    row("tlv: a TLV's length overruns the SRH", F.patch(good, tlv_off + 1, b"\x40"), "XDP_DROP", None,
        drop("tlv"))
    row("tlv: more than MRC_MAX_TLVS items",
        F.srh_packet(tlvs=[F.mrc_tlv()] + [IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"")] * 20),
        "XDP_DROP", None, drop("tlv"))
    row("mrc_tlv: version 9", F.patch(good, tlv_off + 2, b"\x09"), "XDP_DROP", None, drop("mrc_tlv"))
    short = bytes(F.mrc_tlv())[:C["MRC_TLV_SIZE"] - 2]
    row("mrc_tlv: length 44",
        F.srh_packet(tlvs=[wire.IPv6ExtHdrSegmentRoutingTLV(type=C["MRC_TLV_TYPE"], len=44, value=short[2:]),
                           IPv6ExtHdrSegmentRoutingTLVPadN(padding=b"")]),
        "XDP_DROP", None, drop("mrc_tlv"))
    row("mrc_tlv: usid option version 2", F.usid_packet(mrc=F.mrc_tlv(type=C["MRC_OPT_TYPE"], version=2)),
        "XDP_DROP", None, drop("mrc_tlv"))
    row("option: hdr_ext_len 5", F.patch(good_usid, 54 + 1, b"\x05"), "XDP_DROP", None, drop("option"))
    row("option: unknown option type in the MRC slot", F.patch(good_usid, 54 + 2, b"\x1f"), "XDP_DROP", None,
        drop("option"))
    row("option: PadN replaced by an unknown option", F.patch(good_usid, 56 + C["MRC_TLV_SIZE"], b"\x1f"), "XDP_DROP", None,
        drop("option"))
    body = bytes(F.mrc_tlv(type=C["MRC_OPT_TYPE"]))
    row("option: PadN before the MRC option (RFC-valid, stricter rule)",
        F.usid_packet(options=[PadN(optdata=b"\0" * 4),
                               HBHOptUnknown(otype=C["MRC_OPT_TYPE"], optlen=len(body) - 2, optdata=body[2:])]),
        "XDP_DROP", None, drop("option"))
    row("inner_proto: UDP right after the SRH", F.patch(good, 54, b"\x11"), "XDP_DROP", None,
        drop("inner_proto"))
    row("inner_proto: No Next Header after Destination Options", F.patch(good_usid, 54, b"\x3b"),
        "XDP_DROP", None, drop("inner_proto"))
    row("inner_header: IPv6 payload length 500",
        F.srh_packet(IPv6(src="fd00:b::2", dst="fd00:a::1", plen=500) / Raw(b"x" * 8)),
        "XDP_DROP", None, drop("inner_header"))
    row("inner_header: IPv4 total length 999",
        F.srh_packet(IP(src="198.18.2.2", dst="198.18.1.1", len=999) / Raw(b"x" * 8)),
        "XDP_DROP", None, drop("inner_header"))
    inner_off = len(good) - len(bytes(F.inner6()))
    row("inner_header: inner version 4 behind next header IPv6", F.patch(good, inner_off, b"\x40"),
        "XDP_DROP", None, drop("inner_header"))
    g4 = F.frame(F.srh_packet(F.inner4()))
    row("inner_header: IPv4 IHL 4", F.patch(g4, len(g4) - len(bytes(F.inner4())), b"\x44"),
        "XDP_DROP", None, drop("inner_header"))
    row("inner_header: usid, inner cut to 30 bytes",
        F.usid_packet(Raw(bytes(F.inner6())[:30])), "XDP_DROP", None, drop("inner_header"))
    return rows


def case_rows() -> list[Row]:
    """Rows saved by the fuzzer (cases/*.json)."""
    rows = []
    for path in sorted(CASES.glob("*.json")):
        for r in json.loads(path.read_text()):
            out = r["out"] if r["out"] in (None, SAME) else bytes.fromhex(r["out"])
            rows.append(Row(f"{path.stem}: {r['name']}", bytes.fromhex(r["frame"]), r["verdict"], out,
                            r["counters"]))
    return rows


RX_ROWS = rx_rows() + case_rows()


def check(result, row: Row):
    assert result.verdict == row.verdict, (row.name, result)
    if row.out == SAME:
        assert result.out == row.frame, row.name
    elif row.out is not None:
        assert result.out.hex() == row.out.hex(), row.name
    if "rx_drop_*" in row.counters:     # a fuzz row: any drop reason
        drops = [k for k in result.delta if k.startswith("rx_drop_")]
        assert len(drops) == 1, (row.name, result.delta)
        expected = {k: v for k, v in row.counters.items() if k != "rx_drop_*"}
        assert {k: v for k, v in result.delta.items() if k != drops[0]} == expected, row.name
        return
    assert result.delta == row.counters, (row.name, result.delta)


@pytest.mark.parametrize("row", RX_ROWS, ids=[r.name for r in RX_ROWS])
def test_rx(datapath, row):
    # each row is a packet of its own: rows share TLVs, and one carrying
    # its path's newest number again is a segment of the burst before
    # (lib/rx_track.h), so the receiver's memory of the paths goes first
    rx_paths = datapath.att.maps["rx_paths"]
    for key in list(rx_paths.keys()):
        rx_paths.delete(key)
    check(datapath.run_rx(row.frame), row)


def test_rx_rows_cover_every_drop_reason():
    covered = {k for r in RX_ROWS for k in r.counters}
    reasons = {n for n in outcomes("rx_drop_")}
    assert reasons - covered == UNREACHABLE
    assert {"rx_decap", "rx_pass", "rx_control"} <= covered


def test_rx_rows_conserve():
    """Each row's counters name exactly one RX outcome (mrc_common.h)."""
    rx_out = set(outcomes("rx_"))
    for r in RX_ROWS:
        assert r.counters.get("rx_seen") == 1, r.name
        assert sum(v for k, v in r.counters.items() if k in rx_out) == 1, r.name


# --------------------------------------------------------------------------- feedback filing

def test_feedback_is_filed_in_the_senders_state(fresh):
    """A TLV carrying feedback from a configured peer updates path_health
    and peer_acks for the path it names (lib/feedback.h)."""
    dp = fresh
    now32 = time.monotonic_ns() & 0xFFFFFFFF
    tlv = F.mrc_tlv(flags=C["MRC_F_FEEDBACK"], fb_path_id=0, fb_qdelay_us=123, fb_lost=7,
                    fb_block=0, fb_heard=1, fb_since_ns32=(now32 - 5000) & 0xFFFFFFFF,
                    fb_path_tx32=(now32 - 1000) & 0xFFFFFFFF)
    inner = F.inner6()
    before = time.monotonic_ns()
    result = dp.run_rx(F.frame(F.srh_packet(inner, tlvs=[tlv], src=F.PEER_SID)))
    assert result.verdict == "XDP_PASS"
    assert result.delta == {**decap(inner), "rx_feedback": 1}
    from mrc_ebpf.control import paths as cp
    state, row = cp.learnt(dp.att, 0), cp.row_learnt(dp.att, 0)
    health = row.paths[0].health            # the path's: its row's
    assert (health.qdelay_us, health.lost) == (123, 7)
    assert before <= health.updated_ns <= time.monotonic_ns()
    acks, acked = state.acks, [c.acked_ns for c in state.clocks]    # the peer's own
    assert acked[0] & 0xFFFFFFFF == (now32 - 1000) & 0xFFFFFFFF   # exact: fb_path_tx32
    assert acked[0] <= time.monotonic_ns() and acks.last_ns >= before
    assert acks.max_ns == acked[0] == row.paths[0].heard_ns
    assert all(acked[i] == 0 for i in range(1, 256))


def test_feedback_from_an_unknown_sid_is_not_filed(fresh):
    tlv = F.mrc_tlv(flags=C["MRC_F_FEEDBACK"], fb_path_id=0, fb_qdelay_us=99, fb_lost=3)
    inner = F.inner6()
    result = fresh.run_rx(F.frame(F.srh_packet(inner, tlvs=[tlv], src=F.STRANGER_SID)))
    assert result.delta == decap(inner)
    from mrc_ebpf.control import paths as cp
    health = cp.row_learnt(fresh.att, 0).paths[0].health
    assert (health.qdelay_us, health.lost, health.updated_ns) == (0, 0, 0)


def test_received_packets_are_acknowledged_in_our_next_tlv(fresh):
    """What RX heard from a peer goes back in the TLV TX writes to it."""
    fresh.run_rx(F.frame(F.srh_packet(tlvs=[F.mrc_tlv(path_id=5, tx_ns=123456789)])))
    out = fresh.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    tlv = wire.mrc_tlv(Ether(out.out))
    assert tlv.flags & C["MRC_F_FEEDBACK"]
    assert (tlv.fb_block, tlv.fb_heard, tlv.fb_path_id, tlv.fb_path_tx32) == (0, 1 << 5, 5, 123456789)


def _hear(dp, path_id, tx_ns, seq=1):
    """A packet from the peer on its path `path_id`, sent at `tx_ns`."""
    dp.run_rx(F.frame(F.srh_packet(tlvs=[F.mrc_tlv(path_id=path_id, tx_ns=tx_ns, path_seq=seq)])))


def _report(dp):
    """The feedback in the TLV of our next packet to the peer."""
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    return wire.mrc_tlv(Ether(out.out))


def test_one_report_acknowledges_every_path_heard(fresh):
    """64 paths heard since the last report, each sent once, are all
    acknowledged by the next one, with the oldest of their sends as the
    bound: no path waits for later reports however many there are."""
    base = 1_000_000
    for p in range(64):
        _hear(fresh, p, base + 1000 * ((p * 37) % 64))
    tlv = _report(fresh)
    assert (tlv.fb_block, tlv.fb_heard) == (0, (1 << 64) - 1)
    assert tlv.fb_since_ns32 == base
    again = _report(fresh)
    assert again.fb_heard == 0     # told once: cleared


def test_a_path_that_would_drag_the_bound_is_reported_exactly(fresh):
    """Path 0 was heard and acknowledged at 10 us; its next send (20 us)
    starts a report whose bound must stay above 10 us to acknowledge it.
    Path 1's send at 15 us keeps it there and joins; path 2's at 5 us
    would not: it is left out of the bound and reported exactly."""
    _hear(fresh, 0, 10_000, seq=1)
    assert _report(fresh).fb_heard == 1
    _hear(fresh, 0, 20_000, seq=2)
    _hear(fresh, 1, 15_000)
    _hear(fresh, 2, 5_000)
    tlv = _report(fresh)
    assert (tlv.fb_heard, tlv.fb_since_ns32) == (0b11, 15_000)
    assert (tlv.fb_path_id, tlv.fb_path_tx32) == (2, 5_000)
    tlv = _report(fresh)           # nothing new: the path heard last, exactly
    assert (tlv.fb_heard, tlv.fb_path_id, tlv.fb_path_tx32) == (0, 2, 5_000)


def test_an_overtaken_packet_does_not_lower_the_bound(fresh):
    """A packet older than the path's newest send (overtaken on its path)
    adds nothing: the bound stays at the newest sends."""
    _hear(fresh, 4, 50_000, seq=2)
    _hear(fresh, 4, 40_000, seq=1)
    _hear(fresh, 5, 60_000)
    tlv = _report(fresh)
    assert (tlv.fb_heard, tlv.fb_since_ns32) == ((1 << 4) | (1 << 5), 50_000)


def test_a_report_of_every_path_is_filed_for_each(fresh):
    """The sender files a 64-path report as an acknowledgement of each
    path named (the peer's learnt acks), the exact path at its own send."""
    from mrc_ebpf.datapath import layout
    now32 = time.monotonic_ns() & 0xFFFFFFFF
    tlv = F.mrc_tlv(flags=C["MRC_F_FEEDBACK"], fb_path_id=0, fb_block=0, fb_heard=(1 << 64) - 1,
                    fb_since_ns32=(now32 - 5000) & 0xFFFFFFFF, fb_path_tx32=(now32 - 1000) & 0xFFFFFFFF)
    fresh.run_rx(F.frame(F.srh_packet(F.inner6(), tlvs=[tlv], src=F.PEER_SID)))
    acked = [c.acked_ns for c in fresh.att.maps["peer_state"].lookup(layout.Index(0)).clocks]
    assert acked[0] & 0xFFFFFFFF == (now32 - 1000) & 0xFFFFFFFF
    assert all(acked[i] & 0xFFFFFFFF == (now32 - 5000) & 0xFFFFFFFF for i in range(1, 64))
    assert all(acked[i] == 0 for i in range(64, 256))


# --------------------------------------------------------------------------- TX

def tx_expected(dp, inner, prefix: str, out: bytes, seq: int = 0) -> bytes:
    """The frame scapy builds for `inner` on PREFIX's path, with the send
    time (the one field the program makes up) taken from `out`."""
    path = dp.path(prefix)
    usid = bool(path.flags & C["MRC_PATH_F_USID"])
    segs = [str(F.ipaddress_of(path.segments[i].addr)) for i in range(path.n_segments)]
    tos = (inner.tc if isinstance(inner, IPv6) else inner.tos)
    tx_ns = wire.mrc_tlv(Ether(out)).tx_ns
    nh = 4 if isinstance(inner, IP) else 41
    if usid:
        tlv = wire.MrcTLV(type=C["MRC_OPT_TYPE"], path_id=0, path_seq=seq, peer_seq=seq, tx_ns=tx_ns)
        outer = IPv6(src=SID, dst=segs[0], tc=tos, fl=path.flowlabel, hlim=C["MRC_HOP_LIMIT"]) / \
            F.doh_header(tlv, nh)
    else:
        tlv = wire.MrcTLV(path_id=0, path_seq=seq, peer_seq=seq, tx_ns=tx_ns)
        outer = IPv6(src=SID, dst=segs[-1], tc=tos, fl=path.flowlabel, hlim=C["MRC_HOP_LIMIT"]) / \
            IPv6ExtHdrSegmentRouting(nh=nh, addresses=segs, segleft=len(segs) - 1,
                                     lastentry=len(segs) - 1, tlv_objects=[tlv])
    return bytes(Ether(src=F.MAC_PEER, dst=F.MAC_US, type=0x86DD) / outer / inner)


TX_ENCAP = [
    ("srh ipv6/udp", "fd00:b::/64", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2", tc=0xb8) /
     F.UDP(sport=1, dport=9) / Raw(b"payload")),
    ("srh ipv6/tcp, ECT(0)", "fd00:b::/64", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2", tc=0x02) /
     F.TCP(sport=40000, dport=5201) / Raw(b"payload")),
    ("usid ipv6/udp", "fd00:c::/64", lambda: IPv6(src="fd00:a::1", dst="fd00:c::2", tc=0x21) /
     F.UDP(sport=1, dport=9) / Raw(b"payload")),
    ("srh ipv4/udp", "198.18.2.0/24", lambda: IP(src="198.18.1.1", dst="198.18.2.2", tos=0x2a) /
     F.UDP(sport=1, dport=9) / Raw(b"payload")),
    ("srh ipv4/tcp", "198.18.2.0/24", lambda: IP(src="198.18.1.1", dst="198.18.2.2") /
     F.TCP(sport=1, dport=9) / Raw(b"payload")),
]


@pytest.mark.parametrize("name,prefix,build", TX_ENCAP, ids=[r[0] for r in TX_ENCAP])
def test_tx_encapsulates(fresh, name, prefix, build):
    inner = build()
    frame = bytes(F.eth(0x0800 if isinstance(inner, IP) else 0x86DD) / inner)
    before = time.monotonic_ns()
    result = fresh.run_tx(frame)
    assert result.verdict == "TC_ACT_OK"
    expected = tx_expected(fresh, inner, prefix, result.out)
    assert result.out.hex() == expected.hex()
    assert before <= wire.mrc_tlv(Ether(result.out)).tx_ns <= time.monotonic_ns()
    # the peer's first packet: its learnt state is new
    assert result.delta == {"tx_seen": 1, "tx_encap": 1, "tx_encap_bytes": len(expected), "state_new": 1}
    # the second packet on the path is the next in its sequences
    again = fresh.run_tx(frame)
    assert again.out.hex() == tx_expected(fresh, inner, prefix, again.out, seq=1).hex()



CLONES = [("ipv6", IPv6(src="fd00:b::2", dst="fd00:a::1") / F.UDP(sport=1, dport=9) / Raw(b"x" * 100)),
          ("ipv4", IP(src="198.18.2.7", dst="198.18.1.1") / F.UDP(sport=1, dport=9) / Raw(b"x" * 100))]


@pytest.mark.parametrize("reply", [True, False], ids=["feedback", "probe"])
@pytest.mark.parametrize("name,inner", CLONES, ids=[c[0] for c in CLONES])
def test_tx_turns_a_marked_clone_into_an_empty_control_packet(fresh, name, inner, reply):
    """A clone mrc_fb marked (feedback owed: back to its sender) or a probe
    copy (on to its destination) leaves as an empty packet (next header
    59, no payload), encapsulated to the peer with MRC_F_CONTROL."""
    peer, us = inner.src, inner.dst
    if not reply:
        inner = inner.copy()
        inner.src, inner.dst = us, peer
    mark = C["MRC_FB_MARK"] if reply else C["MRC_PROBE_COPY_MARK"]      # | path 0
    result = fresh.run_tx(bytes(F.eth(0x0800 if isinstance(inner, IP) else 0x86DD) / inner), mark)
    assert result.verdict in ("TC_ACT_OK", "TC_ACT_REDIRECT"), result
    assert result.delta.get("tx_control") == 1 and result.delta.get("tx_encap") == 1, result
    pkt = Ether(result.out)
    assert wire.mrc_tlv(pkt).flags & C["MRC_F_CONTROL"]
    sent = pkt[IPv6ExtHdrSegmentRouting].payload
    assert (sent.src, sent.dst) == (us, peer)
    if isinstance(sent, IP):
        assert (sent.proto, sent.len, sent.ihl, sent.flags) == (59, 20, 5, 2)
        header = IP(bytes(sent)[:20])
        del header.chksum
        assert IP(bytes(header)).chksum == sent.chksum       # what scapy computes for it
    else:
        assert (sent.nh, sent.plen) == (59, 0)
    assert not bytes(sent.payload)


TX_PASS = [
    ("not a peer", lambda: F.eth() / IPv6(src="fd00:a::1", dst="fd00:9::1") / Raw(b"x")),
    ("link-local destination", lambda: F.eth() / IPv6(src="fe80::1", dst="fe80::2") / Raw(b"x")),
    ("already ours (outer source is our SID)", lambda: F.eth() / IPv6(src=SID, dst="fd00:b::2") / Raw(b"x")),
    ("ARP", lambda: Ether(src=F.MAC_US, dst="ff:ff:ff:ff:ff:ff") / ARP()),
    ("IPv4 not a peer", lambda: F.eth(0x0800) / IP(src="198.18.1.1", dst="198.18.9.9") / Raw(b"x")),
]


@pytest.mark.parametrize("name,build", TX_PASS, ids=[r[0] for r in TX_PASS])
def test_tx_passes_untouched(fresh, name, build):
    frame = bytes(build())
    result = fresh.run_tx(frame)
    assert (result.verdict, result.out, result.delta) == ("TC_ACT_OK", frame, {"tx_seen": 1, "tx_pass": 1})


def test_tx_drops_what_would_not_fit(fresh):
    frame = bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::2") / Raw(b"x" * (1500 - 40)))
    result = fresh.run_tx(frame)
    assert (result.verdict, result.delta) == ("TC_ACT_SHOT", {"tx_seen": 1, "tx_drop_too_big": 1,
                                                              "state_new": 1})


def test_tx_then_rx_round_trip(fresh):
    """What TX writes, addressed to us at its last segment, RX takes back
    to the original packet."""
    inner = IPv6(src="fd00:b::2", dst="fd00:a::1") / F.UDP(sport=1, dport=9) / Raw(b"round trip")
    sent = fresh.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::2") / Raw(b"z")))
    pkt = Ether(sent.out)
    pkt[IPv6].src, pkt[IPv6].dst = F.PEER_SID, SID
    srh = pkt[IPv6ExtHdrSegmentRouting]
    srh.addresses, srh.segleft, srh.lastentry = [SID], 0, 0
    srh.len = None
    pkt[IPv6].plen = None
    srh.remove_payload()
    srh.add_payload(inner)
    result = fresh.run_rx(bytes(pkt))
    assert result.verdict == "XDP_PASS" and result.out == F.decapsulated(inner)


# ---- path templates: many peers on one row of paths, each its own last hop

def _template_peers(dp, row=5, spines=("fc00:0:e1::", "fc00:0:e2::"), hosts=3):
    """Row `row` as `path template add` writes it (last hop open), and
    `hosts` peers on it as `path bulk` writes them."""
    from mrc_ebpf.control import paths as cp
    from mrc_ebpf.control import path_spec, spray, templates
    from mrc_ebpf.datapath import layout
    tpl = layout.Peer(peer_id=row, template_id=row, n_paths=len(spines), policy=cp.POLICIES["rr"])
    for i, spine in enumerate(spines):
        hop = ipaddress.IPv6Address(spine)
        # (no REDIRECT: the test run has no neighbours to redirect to)
        spec = path_spec.PathSpec([hop, templates.OPEN], templates.OPEN, False)
        dp.att.maps["paths"].update(cp.path_index(row, i), path_spec.encode(spec, hop, 1, 0x100 + i))
    spray.rebuild(dp.att, tpl, sids=False)
    sids = {}
    for h in range(1, hosts + 1):
        sid = ipaddress.IPv6Address(f"fc00:0:1:{h}::")
        peer = layout.Peer(peer_id=cp.MAX_PEERS + h, template_id=row, n_paths=len(spines),
                           policy=cp.POLICIES["rr"], flags=C["MRC_PEER_F_LAST_HOP"])
        ctypes.memmove(peer.sid.addr, sid.packed, 16)
        dp.att.maps["peers"].update(cp.peer_key(cp.parse_prefix(f"fd00:1:{h}::/64")), peer)
        dp.att.maps["peer_by_sid"].update(layout.Sid.from_buffer_copy(sid.packed),
                                          layout.u32(peer.peer_id))
        sids[h] = str(sid)
    return sids


def test_template_peers_get_their_own_last_hop_and_sequences(fresh):
    sids = _template_peers(fresh)
    sent = {}
    for h in (2, 3, 2, 2):
        inner = IPv6(src="fd00:a::1", dst=f"fd00:1:{h}::9") / F.UDP(sport=1, dport=9) / Raw(b"x")
        result = fresh.run_tx(bytes(F.eth() / inner))
        assert result.verdict == "TC_ACT_OK" and result.delta["tx_encap"] == 1
        pkt = Ether(result.out)
        srh = pkt[IPv6ExtHdrSegmentRouting]
        tlv = wire.mrc_tlv(pkt)
        # the template's spine, then the peer's own SID as the last segment
        assert srh.addresses[0] == sids[h] and srh.addresses[1] in ("fc00:0:e1::", "fc00:0:e2::")
        assert pkt[IPv6].dst == srh.addresses[1] and pkt[IPv6].fl == 0x100 + tlv.path_id
        sent.setdefault(h, []).append((tlv.path_id, tlv.path_seq, tlv.peer_seq))
    # each peer its own learnt state: sequence numbers per path from 0,
    # rr turns from where the template's rotation was when its state was
    # new (lib/peer_state.h: not always path 0)
    a, b = sent[2][0][0], sent[3][0][0]
    assert sent[3] == [(b, 0, b)]
    assert sent[2] == [(a, 0, a), (1 - a, 0, a + 1), (a, 1, a + 2)]
    from mrc_ebpf.control import paths as cp
    st = cp.learnt(fresh.att, cp.MAX_PEERS + 2)
    assert (st.next_seq(a), st.next_seq(1 - a), st.tx.seq) == (2, 1, a + 3)
    assert cp.learnt(fresh.att, cp.MAX_PEERS + 1).tx.seq == 0      # never sent to
    # the paths' counters are the template row's, shared by its peers
    row = cp.row_learnt(fresh.att, 5)         # _template_peers' row
    assert (row.paths[0].tx_packets + row.paths[1].tx_packets, row.paths[b].tx_packets) == \
        (4, 1 + (2 if a == b else 1))
    # feedback from peer 3's SID: the path's health in the row (peer 2's
    # too), the acknowledgement in peer 3's own state only
    tlv = F.mrc_tlv(flags=C["MRC_F_FEEDBACK"], fb_path_id=1, fb_qdelay_us=77, fb_lost=0)
    inner = F.inner6()
    result = fresh.run_rx(F.frame(F.srh_packet(inner, tlvs=[tlv], src=sids[3])))
    assert result.delta.get("rx_feedback") == 1
    assert cp.row_learnt(fresh.att, 5).paths[1].health.qdelay_us == 77
    assert cp.learnt(fresh.att, cp.MAX_PEERS + 3).acks.last_ns > 0
    assert cp.learnt(fresh.att, cp.MAX_PEERS + 2).acks.last_ns == 0
