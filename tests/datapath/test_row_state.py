"""What is learnt of a path is its row's (issue 28): the peers of one
template share each path's verdict.  One peer's evidence takes a path out
for all of them, and one peer's acknowledgement of a send after the down
(a probe's) brings it back for all; each peer's acknowledgement clock
stays its own.  The real mrc_tx and mrc_rx under BPF_PROG_TEST_RUN; the
witness is the path id each frame out carries."""
from __future__ import annotations

import time

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import paths as cp
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .test_tables import _template_peers

pytestmark = pytest.mark.root

ROW = 5                         # _template_peers' row: 2 paths, hosts 1..3


def peer_id(h: int) -> int:
    return cp.MAX_PEERS + h


def send(dp, h: int, turn: int | None = None) -> int:
    """One packet to host h, whose rr turn is path `turn` if given (the
    first packet makes its state and notes its row: no turn): the path it
    took."""
    if turn is not None:
        st = cp.learnt(dp.att, peer_id(h))
        st.tx.seq = 2 + turn        # 0 would be a new state's (lib/peer_state.h)
        dp.att.maps["peer_state"].update(layout.Index(peer_id(h)), st)
    inner = IPv6(src="fd00:a::1", dst=f"fd00:1:{h}::9") / F.UDP(sport=1, dport=9) / Raw(b"x")
    r = dp.run_tx(bytes(F.eth() / inner))
    assert r.verdict in ("TC_ACT_OK", "TC_ACT_REDIRECT"), r
    return wire.mrc_tlv(Ether(r.out)).path_id


def test_one_peers_evidence_takes_a_path_out_for_its_row_and_one_answer_brings_it_back(fresh):
    dp = fresh
    sids = _template_peers(dp)
    for h in (2, 3):
        send(dp, h)                 # each has learnt state, and its row noted
        assert cp.learnt(dp.att, peer_id(h)).row1 == ROW + 1
    now = time.monotonic_ns()
    for h in (2, 3):                # both have heard from their peer lately
        st = cp.learnt(dp.att, peer_id(h))
        st.acks.last_ns = st.acks.max_ns = now
        if h == 2:                  # host 2's send on path 0 went unheard for 50 ms
            st.clocks[0].unacked_since_ns = now - 50_000_000
            st.clocks[0].clock_after_ns = 1
        dp.att.maps["peer_state"].update(layout.Index(peer_id(h)), st)
    # host 2's turn on path 0: its clock takes the path out (the row's)
    assert send(dp, 2, 0) == 1
    live = cp.row_learnt(dp.att, ROW).paths[0].live
    assert live.down_ns and live.downs == 1
    # host 3 never lost a packet there, yet its turn on path 0 is skipped too
    assert send(dp, 3, 0) == 1
    assert cp.learnt(dp.att, peer_id(3)).clocks[0].unacked_since_ns == 0     # its clock is its own
    # host 3 acknowledges a send on path 0 from after the down: back for both
    heard32 = time.monotonic_ns() & 0xFFFFFFFF
    tlv = F.mrc_tlv(flags=C["MRC_F_FEEDBACK"], fb_path_id=0, fb_qdelay_us=5, fb_path_tx32=heard32)
    r = dp.run_rx(F.frame(F.srh_packet(F.inner6(), tlvs=[tlv], src=sids[3])))
    assert r.delta.get("rx_feedback") == 1, r
    assert cp.row_learnt(dp.att, ROW).paths[0].heard_ns >= live.down_after_ns
    assert send(dp, 2, 0) == 0
    assert cp.row_learnt(dp.att, ROW).paths[0].live.down_ns == 0
    # the health host 3 reported is the path's, seen for host 2's sends too
    assert cp.row_learnt(dp.att, ROW).paths[0].health.qdelay_us == 5
