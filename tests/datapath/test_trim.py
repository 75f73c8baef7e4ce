"""Trimming (issue #29, item 2) through the real programs with
BPF_PROG_TEST_RUN: the lab switch (bpf/lab/trim.c) cuts a packet mrc_tx
built to its headers and marks it; mrc_rx counts that trimmed frame on
its path, never delivers it (it goes on to mrc_fb as its inner header
alone, with MRC_TRIM_META in its XDP metadata: mrc_fb answers it at
once and drops it), and its sequence number is no loss; the next
report to the sender names the path with MRC_F_FB_CE.
"""
from __future__ import annotations

import struct

import pytest
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import bpfsys, build_cache, wire
from mrc_ebpf.datapath.source import C
from mrc_ebpf.lab import ecn_marks, trims

from . import frames as F
from .test_tables import drop, seen

pytestmark = pytest.mark.root

TRIM_TC = C["MRC_TRIM_DSCP"] << 2
CE_FLAG = C["MRC_F_FB_CE"]


def trimmed(packet: IPv6, tc: int = TRIM_TC) -> bytes:
    """What the switch leaves of an L3 packet: outer IPv6 + SRH + the
    inner fixed header (40 bytes), outer payload length and DSCP set."""
    raw = bytes(packet)
    ext = (raw[41] + 1) * 8
    keep = raw[:40 + ext + 40]
    out = bytearray(keep)
    struct.pack_into("!H", out, 4, len(keep) - 40)
    first = struct.unpack_from("!I", out, 0)[0]
    first = (first & 0xF00FFFFF) | (tc << 20)
    struct.pack_into("!I", out, 0, first)
    return bytes(out)


def test_a_trimmed_frame_is_counted_on_its_path_handed_on_marked_and_is_no_loss(fresh):
    dp = fresh
    inner = F.inner6(payload=b"x" * 200)
    whole = lambda seq: F.frame(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=2, path_seq=seq)]))
    assert dp.run_rx(whole(1)).verdict == "XDP_PASS"
    cut = F.eth() / Raw(trimmed(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=2, path_seq=2)])))
    r = dp.run_rx(bytes(cut))
    # counted once, as trimmed; its TLV filed (rx_mrc_tlv), not decapsulated
    assert (r.verdict, r.delta) == ("XDP_PASS", seen(rx_trimmed=1, rx_mrc_tlv=1)), r
    # handed on as: metadata word, Ethernet, the inner header the switch kept
    meta, frame = r.out[:4], r.out[4:]
    assert struct.unpack("=I", meta)[0] == C["MRC_TRIM_META"]
    e = Ether(frame)
    assert e.type == 0x86DD and bytes(e.payload)[:40] == bytes(inner)[:40]
    assert dp.run_rx(whole(3)).verdict == "XDP_PASS"
    rx = {k.path_id: v for k, v in dp.att.maps["rx_paths"].items()}
    # 1, 2 (trimmed), 3: nothing lost, one trim
    assert (rx[2].trimmed, rx[2].lost, rx[2].packets) == (1, 0, 3)
    # the next packet to the sender names the path, congested
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    tlv = wire.mrc_tlv(Ether(out.out))
    assert tlv.flags & C["MRC_F_FEEDBACK"] and tlv.flags & CE_FLAG and tlv.fb_path_id == 2
    assert tlv.fb_lost == 0


def test_a_gap_is_still_a_loss_beside_a_trim(fresh):
    dp = fresh
    inner = F.inner6(payload=b"x" * 200)
    dp.run_rx(F.frame(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=4, path_seq=1)])))
    dp.run_rx(bytes(F.eth() / Raw(trimmed(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=4, path_seq=2)])))))
    dp.run_rx(F.frame(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=4, path_seq=4)])))   # 3 lost
    rx = {k.path_id: v for k, v in dp.att.maps["rx_paths"].items()}
    assert (rx[4].trimmed, rx[4].lost) == (1, 1)


def test_a_cut_frame_without_the_mark_is_broken_not_trimmed(fresh):
    dp = fresh
    inner = F.inner6(payload=b"x" * 200)
    cut = trimmed(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=2, path_seq=2)]), tc=0)
    r = dp.run_rx(bytes(F.eth() / Raw(cut)))
    assert (r.verdict, r.delta) == ("XDP_DROP", drop("inner_header"))
    assert not any(v.trimmed for _, v in dp.att.maps["rx_paths"].items())


def test_the_mark_on_a_whole_packet_changes_nothing(fresh):
    """DSCP 51 on an intact packet (a sender's own choice) is decapsulated."""
    dp = fresh
    inner = F.inner6(payload=b"x" * 200)
    r = dp.run_rx(F.frame(F.srh_packet(inner, tlvs=[F.mrc_tlv(path_id=2, path_seq=1)], tc=TRIM_TC)))
    assert r.verdict == "XDP_PASS" and "rx_trimmed" not in r.delta and r.delta.get("rx_decap") == 1


@pytest.fixture(scope="module")
def switch():
    """bpf/lab/trim.c, as the fabric's switches load it, and its queue map."""
    module, fn = build_cache.one_program(trims.SOURCE, "trim_queue")
    queues = bpfsys.PinnedMap.from_fd(module[b"queues"].map_fd, trims.QueueKey, trims.Queue, False, "queues")
    yield fn, queues
    module.cleanup()


def test_the_lab_switch_trims_what_mrc_tx_sent(fresh, switch):
    """A real packet of mrc_tx through the switch, its queue past the
    threshold: cut to outer IPv6 + SRH (TLV) + inner header, marked."""
    dp = fresh
    fn, queues = switch
    payload = b"y" * 1000
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(payload)))
    sent = Ether(out.out)
    key = ecn_marks.key_of(sent.src, trims.QueueKey)
    # threshold 1 ns, a virtual queue that never drains: past it from the second packet on
    queues.update(key, trims.Queue(ns_per_kbyte=10 ** 12, threshold_ns=1))
    ret, _, first = bpfsys.prog_test_run(fn.fd, bytes(sent), 1)
    assert ret == 0 and len(first) == len(bytes(sent))          # an empty queue: whole
    ret, _, cut = bpfsys.prog_test_run(fn.fd, bytes(sent), 1)
    q = queues.lookup(key)
    assert ret == 0 and (q.packets, q.mrc, q.trimmed) == (2, 2, 1)
    srh = sent[IPv6ExtHdrSegmentRouting]
    head = 14 + 40 + (srh.len + 1) * 8 + 40
    assert len(cut) == head and q.trimmed_bytes == len(bytes(sent)) - head
    got = Ether(cut)
    assert got[IPv6].tc >> 2 == C["MRC_TRIM_DSCP"] and got[IPv6].plen == head - 54
    assert bytes(got[IPv6ExtHdrSegmentRouting])[:(srh.len + 1) * 8] == bytes(srh)[:(srh.len + 1) * 8]
    queues.delete(key)
    # what is left is an MRC packet valid up to its inner header: the
    # receiver's table rows above take it from here
    assert wire.mrc_tlv(got).path_seq == wire.mrc_tlv(sent).path_seq


def test_trim_threshold_errors_are_one_line():
    from mrc_ebpf.errors import MrcError
    with pytest.raises(MrcError, match="bad trim threshold"):
        trims.parse_threshold("fast")
