"""A burst cut into wire segments after TC: every segment carries the
burst's one TLV (lib/rx_track.h).  Each frame below is one wire segment;
the receiver must count them all on their path, take none for late or
lost, and file the burst's feedback once."""
from __future__ import annotations

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .test_tables import decap

pytestmark = pytest.mark.root


def segments(tlv, n, tc=0, inner_tc=0):
    """N segments of one burst: the same TLV, each its own inner packet."""
    return [F.frame(F.srh_packet(F.inner6(tc=inner_tc, payload=b"seg%03d" % i), tlvs=[tlv], tc=tc))
            for i in range(n)]


def rx_path(dp, path_id):
    return {k.path_id: v for k, v in dp.att.maps["rx_paths"].items()}[path_id]


def test_a_bursts_segments_are_counted_once_each_and_filed_once(fresh):
    dp = fresh
    tlv = F.mrc_tlv(path_id=2, path_seq=7, flags=C["MRC_F_FEEDBACK"], fb_path_id=0, fb_qdelay_us=55)
    deltas = [dp.run_rx(f).delta for f in segments(tlv, 5)]
    inner = F.inner6(payload=b"seg000")
    assert deltas[0] == {**decap(inner), "rx_feedback": 1}
    for d in deltas[1:]:                  # delivered, counted as a segment, not filed
        assert d == {**decap(inner), "rx_segment": 1}
    p = rx_path(dp, 2)
    assert (p.packets, p.late, p.lost, p.next_seq) == (5, 0, 0, 8)
    # the next burst on the path: in order, nothing lost
    dp.run_rx(segments(F.mrc_tlv(path_id=2, path_seq=8), 1)[0])
    p = rx_path(dp, 2)
    assert (p.packets, p.late, p.lost, p.next_seq) == (6, 0, 0, 9)


def test_an_older_number_is_still_late(fresh):
    """The control: only the path's newest number is a segment."""
    dp = fresh
    for seq in (1, 2, 3):
        dp.run_rx(segments(F.mrc_tlv(path_id=1, path_seq=seq), 1)[0])
    d = dp.run_rx(segments(F.mrc_tlv(path_id=1, path_seq=2), 1)[0]).delta
    assert "rx_segment" not in d
    assert rx_path(dp, 1).late == 1


def test_a_ce_marked_segment_is_counted_and_reported(fresh):
    """A queue may mark any segment of a burst: the mark counts even when
    the burst's first segment came unmarked."""
    dp = fresh
    tlv = F.mrc_tlv(path_id=3, path_seq=4)
    first, second = segments(tlv, 2, inner_tc=0x02)
    dp.run_rx(first)
    ce = F.frame(F.srh_packet(F.inner6(tc=0x02, payload=b"seg001"), tlvs=[tlv], tc=0x03))
    d = dp.run_rx(ce).delta
    assert d.get("rx_segment") == 1 and d.get("rx_ce") == 1
    assert (rx_path(dp, 3).ce, rx_path(dp, 3).packets) == (1, 2)
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    told = wire.mrc_tlv(Ether(out.out))
    assert told.flags & C["MRC_F_FB_CE"] and told.fb_path_id == 3
