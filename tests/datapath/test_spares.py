"""Spare EVs (issue #29, item 4) through the real programs with
BPF_PROG_TEST_RUN: an EV out (assumed bad) has its turns taken by a
spare of its plane, which is in no spray list; when the EV is back the
spare is held back again.  The packets' TLVs say the path each took.

The rows: 4 EVs + 2 spares on one device, traced over two first-tier
hops A and B (EVs 0, 1 and spare 4 cross A; EVs 2, 3 and spare 5 cross
B), so the spray rotates A B A B: 0 2 1 3.
"""
from __future__ import annotations

import ctypes
import ipaddress

import pytest

from mrc_ebpf.control import paths as cp
from mrc_ebpf.control import spray
from mrc_ebpf.control.path_spec import HOP_SLOT, PathSpec
from mrc_ebpf.datapath import layout

from .harness import provision
from .test_congestion import PEER, PREFIX, clear_events, put, row, send, set_config, state, take_down

pytestmark = pytest.mark.root

HOP_A, HOP_B = "fc00:0:e1::1", "fc00:0:e2::1"
HOPS = (HOP_A, HOP_A, HOP_B, HOP_B, HOP_A, HOP_B)      # EVs 0..3, spares 4, 5


def _peer(att):
    return att.maps["peers"].lookup(cp.peer_key(cp.parse_prefix(PREFIX)))


def _provision(dp, spares: bool = True, hops=HOPS):
    att = dp.att
    clear_events(dp)
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    sid = ipaddress.IPv6Address(PEER)
    specs = [PathSpec.ev(sid) for _ in range(4)] + [PathSpec.ev(sid, spare=spares) for _ in range(2)]
    peer = provision(att, 0, PREFIX, specs)
    for i, hop in enumerate(hops):      # as `path trace --order` records them
        path = att.maps["paths"].lookup(cp.path_index(0, i))
        ctypes.memmove(path.segments[HOP_SLOT].addr, ipaddress.IPv6Address(hop).packed, 16)
        att.maps["paths"].update(cp.path_index(0, i), path)
    spray.rebuild(att, peer)
    # turns, not silence, are tested: no timeout between two sends
    set_config(dp, ack_timeout_us=5_000_000, probe_us=5_000_000)
    return peer


@pytest.fixture
def evs(fresh):
    _provision(fresh)
    return fresh


def take_out(dp, path_id, due_in_ns=10**10):
    """EV `path_id` out, as failover takes a path out; its probe due in
    `due_in_ns`."""
    take_down(dp, path_id, due_in_ns=due_in_ns, gap_us=5_000_000)


def at_turn(dp, pos):
    """The next packet takes list position `pos` (of 4; sequence 0 would
    be a new state: peer_state_turn)."""
    st = state(dp)
    st.tx.seq = 4 + pos
    put(dp, st)


def test_spares_are_in_no_spray_list_and_each_ev_has_one_of_its_plane(evs):
    att = evs.att
    listed = att.maps["spray"].lookup(layout.Index(0))
    assert list(listed.ids[:listed.n]) == [0, 2, 1, 3]       # A B A B, spares left out
    of = att.maps["spares"].lookup(layout.Index(0)).of
    assert [of[i] - 1 for i in range(4)] == [4, 4, 5, 5]      # each EV: the spare of its hop
    assert all(of[i] == 0 for i in range(4, 256))
    rows = {r["path_id"]: r for r in cp.list_paths(att)}
    assert [rows[i]["spare"] for i in range(6)] == [False] * 4 + [True] * 2
    assert rows[4]["state"] == rows[5]["state"] == cp.STATE_SPARE


def test_an_evs_turns_go_to_the_spare_of_its_plane_and_back(evs):
    dp = evs
    send(dp)                    # starts the peer's state (its first turn: its own offset)
    at_turn(dp, 0)
    assert [send(dp)[0] for _ in range(4)] == [0, 2, 1, 3]
    take_out(dp, 2)
    at_turn(dp, 0)
    took = [send(dp) for _ in range(8)]
    # EV 2 (hop B) out: its turns go to spare 5 (hop B), the rotation and
    # the hops' shares as they were; nothing rerouted to another hop
    assert [t[0] for t in took] == [0, 5, 1, 3, 0, 5, 1, 3], took
    assert not any("tx_reroute" in d or "tx_probe" in d or "tx_fail_open" in d for _, _, d in took)
    rows = {r["path_id"]: r for r in cp.list_paths(dp.att)}
    assert rows[5]["stands_in_for"] == [2] and rows[5]["state"] != cp.STATE_SPARE
    assert rows[4]["stands_in_for"] == [] and rows[4]["state"] == cp.STATE_SPARE
    assert rows[2]["state"] == cp.STATE_BAD
    # EV 2 back: news of a send after its down (what a probe's
    # acknowledgement is) brings it up, and the spare is held back again
    st = state(dp)
    st.clocks[2].acked_ns = row(dp).paths[2].live.down_after_ns + 1
    put(dp, st)
    at_turn(dp, 0)
    assert [send(dp)[0] for _ in range(8)] == [0, 2, 1, 3, 0, 2, 1, 3]
    assert row(dp).paths[2].live.down_ns == 0
    assert cp.path_state(dp.att, _peer(dp.att), 5, dp.att.maps["paths"].lookup(cp.path_index(0, 5))) \
        == cp.STATE_SPARE


def test_without_spares_the_turn_goes_to_the_other_hop(fresh):
    """The same 4 EVs without spares: EV 2's turn is skipped, and hop B
    carries 1 of 3 turns (the plane's share falls)."""
    dp = fresh
    att = dp.att
    clear_events(dp)
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    sid = ipaddress.IPv6Address(PEER)
    peer = provision(att, 0, PREFIX, [PathSpec.ev(sid) for _ in range(4)])
    for i, hop in enumerate(HOPS[:4]):
        path = att.maps["paths"].lookup(cp.path_index(0, i))
        ctypes.memmove(path.segments[HOP_SLOT].addr, ipaddress.IPv6Address(hop).packed, 16)
        att.maps["paths"].update(cp.path_index(0, i), path)
    spray.rebuild(att, peer)
    set_config(dp, ack_timeout_us=5_000_000, probe_us=5_000_000)
    assert att.maps["spares"].lookup(layout.Index(0)) is None
    send(dp)
    take_out(dp, 2)
    at_turn(dp, 0)
    took = [send(dp)[0] for _ in range(6)]
    assert took == [0, 1, 3, 0, 1, 3], took         # A A B: hop B's share falls to 1/3


def test_an_ev_due_a_probe_is_probed_by_a_copy_and_that_packet_takes_the_next_turn(evs):
    dp = evs
    send(dp)
    take_out(dp, 2, due_in_ns=-1)       # due now
    at_turn(dp, 1)                      # EV 2's turn
    took, _, delta = send(dp)
    # the copy tests EV 2; the packet takes the next turn, as without
    # spares (one turn a probe interval); then the spare again
    assert took == 1 and delta.get("tx_probe") == 1, delta
    at_turn(dp, 1)
    assert send(dp)[0] == 5


def test_a_spare_out_itself_stands_in_for_nothing(evs):
    dp = evs
    send(dp)
    take_out(dp, 2)
    take_out(dp, 5)
    at_turn(dp, 0)
    took = [send(dp)[0] for _ in range(6)]
    assert took == [0, 1, 3, 0, 1, 3], took         # EV 2's turn skipped, as without spares
    rows = {r["path_id"]: r for r in cp.list_paths(dp.att)}
    assert rows[5]["state"] == cp.STATE_BAD and rows[5]["stands_in_for"] == []


def test_evs_without_a_traced_hop_use_any_spare_of_their_device(fresh):
    dp = fresh
    _provision(dp, hops=())         # no hop recorded: one plane (the device)
    of = dp.att.maps["spares"].lookup(layout.Index(0)).of
    assert [of[i] - 1 for i in range(4)] == [4, 5, 4, 5]      # the plane's spares in turn
    send(dp)
    take_out(dp, 1)
    take_out(dp, 2)
    at_turn(dp, 0)
    assert [send(dp)[0] for _ in range(4)] == [0, 5, 4, 3]


def test_a_spare_out_and_due_a_probe_is_probed_while_its_ev_is_out(evs):
    """A spare is in no list: it is tested (a copy, the packet taking the
    next turn) when a turn it would take finds it due, and comes back on
    the news; else nothing would ever bring it back."""
    dp = evs
    send(dp)
    take_out(dp, 2)
    take_out(dp, 5, due_in_ns=-1)
    at_turn(dp, 1)
    took, _, delta = send(dp)
    assert took == 1 and delta.get("tx_probe") == 1, delta
    live = row(dp).paths[5].live
    assert live.probes == 1
    st = state(dp)                      # the probe's acknowledgement
    st.clocks[5].acked_ns = live.last_sent_ns or live.down_after_ns + 1
    put(dp, st)
    at_turn(dp, 1)
    assert send(dp)[0] == 5
    assert row(dp).paths[5].live.down_ns == 0
