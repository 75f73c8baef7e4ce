"""Shared fate's state machine (bpf/lib/shared_fate.h), driven with
BPF_PROG_TEST_RUN through the real TX program.

Three peers, each with two SRH paths: path 0 through hop A, path 1
through hop B.  Peer X's path 0 is made overdue and the TX program takes
it out: alone, that suspects nothing; then peer Z's path 0 too, and hop A
is suspect from X's down on: peer Y's path 0, through the same hop, is
tested at once: skipped for a probe copy, and taken out when
acknowledgements of later sends on its other path arrive but not of the
probe, or used again when the probe is acknowledged.  The acknowledgements are written to the peers' learnt
state (peer_state) as the RX program files them (tests/datapath/test_tables.py covers the filing).
The hop's watch (its oldest unheard send, judged by any peer's packet
through it) is tested apart: the down tests give it up first.
"""
from __future__ import annotations

import ipaddress
import time

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import events as ev
from mrc_ebpf.control.path_spec import PathSpec
from mrc_ebpf.control.peer_table import path_index
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import provision

pytestmark = pytest.mark.root

HOP_A, HOP_B = "fc00:0:e1::", "fc00:0:e2::"
X, Y, Z = ("fd00:b::/64", "fc00:0:b::"), ("fd00:c::/64", "fc00:0:c::"), ("fd00:d::/64", "fc00:0:d::")
DST = ("fd00:b::2", "fd00:c::2", "fd00:d::2")
WINDOW_NS = C["MRC_DEFAULT_ACK_TIMEOUT_US"] * 1000


@pytest.fixture
def two_peers(fresh):
    """X = peer 0, Y = peer 1, Z = peer 2, paths [A, B] each, rr, shared
    fate on, every peer already heard from (their acknowledgement clocks
    run)."""
    dp = fresh
    att = dp.att
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    for i in range(C["MRC_MAX_HOPS"]):
        att.maps["hops"].update(layout.Index(i), layout.Hop())
    cfg = att.maps["config"].lookup(layout.Index(0))
    cfg.shared_fate = 1
    cfg.probe_us = 100_000      # a hold of 0.4 s: longer than any test here takes
    att.maps["config"].update(layout.Index(0), cfg)
    now = time.monotonic_ns()
    for peer_id, (prefix_text, sid) in enumerate((X, Y, Z)):
        provision(att, peer_id, prefix_text, [PathSpec.via(f"{h},{sid}") for h in (HOP_A, HOP_B)],
                  fate=True)
        # heard from, but none of these paths yet
        st = layout.PeerState()
        st.acks = layout.PeerAcks(max_ns=now - 10 * WINDOW_NS, last_ns=now)
        put(dp, peer_id, st)
    return dp


def state(dp, peer_id):
    return dp.att.maps["peer_state"].lookup(layout.Index(peer_id))


def put(dp, peer_id, st):
    dp.att.maps["peer_state"].update(layout.Index(peer_id), st)


def send(dp, peer_id: int, turn: int):
    """One packet to the peer whose rr turn is path `turn`: (path id it
    took, counter deltas).  Its sequence number is turn + 2 (2 paths): 0
    is a new state's, whose turns start at its template's rotation."""
    st = state(dp, peer_id)
    st.tx.seq = turn + 2
    put(dp, peer_id, st)
    r = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst=DST[peer_id]) / Raw(b"data")))
    assert r.verdict in ("TC_ACT_OK", "TC_ACT_REDIRECT"), r
    return wire.mrc_tlv(Ether(r.out)).path_id, r.delta


def row(dp, peer_id):
    """The learnt state of the peer's paths: its row's (its own here)."""
    return dp.att.maps["row_state"].lookup(layout.Index(peer_id))


def put_row(dp, peer_id, rs):
    dp.att.maps["row_state"].update(layout.Index(peer_id), rs)


def live(dp, peer_id, path_id):
    return row(dp, peer_id).paths[path_id].live


def probe_ns(dp, peer_id, path_id):
    """The send time of the probe copy shared fate sent on the path (its
    row's: a template's is shared by its peers)."""
    return row(dp, peer_id).paths[path_id].fate_probe_ns


def fate(dp, peer_id, path_id):
    return dp.att.maps["path_fate"].lookup(path_index(peer_id, path_id))


def set_acks(dp, peer_id, **fields):
    st = state(dp, peer_id)
    acks = st.acks
    for k, v in fields.items():
        if k.startswith("ns"):
            st.clocks[int(k[2:])].acked_ns = v
        else:
            setattr(acks, k, v)
    put(dp, peer_id, st)


def unwatch(dp):
    """Every hop's watch given up: the rule of downs alone is tested (the
    watch, tested below, would suspect the hop at the first overdue send)."""
    for i in range(C["MRC_MAX_HOPS"]):
        h = dp.att.maps["hops"].lookup(layout.Index(i))
        if h.watch_ns or h.watch2_ns:
            h.watch_ns = h.watch_who = h.watch2_ns = h.watch2_who = 0
            dp.att.maps["hops"].update(layout.Index(i), h)


def take_out(dp, peer_id):
    """The peer's path 0 has an unacknowledged send while later sends on
    path 1 are acknowledged: the next packet whose turn it is takes it
    out (the hop's watch given up first).  Two sends on path 0: a lone
    unheard send would be tested by the next packet, not judged
    (lib/failover.h, failover_lone)."""
    for _ in range(2):
        took, _ = send(dp, peer_id, 0)
        assert took == 0
    unwatch(dp)
    sent = state(dp, peer_id).clocks[0].unacked_since_ns
    assert sent
    set_acks(dp, peer_id, ns1=sent + 2 * WINDOW_NS, max_ns=sent + 2 * WINDOW_NS)
    took, _ = send(dp, peer_id, 0)
    assert took == 1 and live(dp, peer_id, 0).down_ns


def take_out_x0(dp):
    """X's path 0, then Z's, out through hop A: it is suspect."""
    take_out(dp, 0)
    take_out(dp, 2)


def hop(dp, sid):
    ident = fate(dp, 0, 0 if sid == HOP_A else 1).hop
    return dp.att.maps["hops"].lookup(layout.Index(ident))


def test_paths_through_one_first_hop_share_a_hop_id(two_peers):
    dp = two_peers
    a, b = fate(dp, 0, 0).hop, fate(dp, 0, 1).hop
    assert a and b and a != b
    assert (fate(dp, 1, 0).hop, fate(dp, 1, 1).hop) == (a, b)
    assert ipaddress.IPv6Address(bytes(hop(dp, HOP_A).sid.addr)) == ipaddress.IPv6Address(HOP_A)


def test_one_path_out_alone_suspects_nothing(two_peers):
    """A lone down (most often a false one on a loaded machine) suspects
    nothing, nor does the same path still out at its next probe."""
    dp = two_peers
    take_out(dp, 0)
    assert hop(dp, HOP_A).suspects == 0
    rs = row(dp, 0)
    rs.paths[0].live.next_probe_ns = 0      # due a probe now
    put_row(dp, 0, rs)
    took, delta = send(dp, 0, 0)
    assert took == 1 and delta.get("tx_probe") == 1
    assert hop(dp, HOP_A).suspects == 0
    took, delta = send(dp, 1, 0)        # Y's path through A: used, not probed
    assert took == 0 and "tx_probe" not in delta


def test_two_paths_out_make_their_hop_suspect_and_a_third_peers_path_is_probed_then_out(two_peers):
    dp = two_peers
    before = time.monotonic_ns()
    take_out(dp, 0)
    x_down = live(dp, 0, 0).down_ns
    take_out(dp, 2)
    a = hop(dp, HOP_A)
    # suspect from the first down on
    assert a.suspects == 1 and before <= a.suspect_ns == x_down <= time.monotonic_ns()
    assert hop(dp, HOP_B).suspects == 0
    # Y's turn on path 0 (through A, not heard since): the packet takes
    # path 1 and a probe copy tests path 0
    took, delta = send(dp, 1, 0)
    assert took == 1
    assert delta.get("tx_probe") == 1
    probe = probe_ns(dp, 1, 0)
    assert probe >= a.suspect_ns
    assert not live(dp, 1, 0).down_ns
    # while the probe is out the path is skipped, and no second probe goes
    took, delta = send(dp, 1, 0)
    assert took == 1 and "tx_probe" not in delta
    assert probe_ns(dp, 1, 0) == probe
    # Y's path 1 (through B) is untouched: its own turn takes it
    assert send(dp, 1, 1)[0] == 1
    # later sends on path 1 are acknowledged, the probe is not: out
    set_acks(dp, 1, ns1=probe + 2 * WINDOW_NS, max_ns=probe + 2 * WINDOW_NS)
    took, _ = send(dp, 1, 0)
    assert took == 1
    assert live(dp, 1, 0).down_ns
    assert hop(dp, HOP_A).shared_downs == 1
    kinds = [(e["peer_id"], e["path_id"], e["type"]) for e in ev.read(dp.att)]
    assert kinds[-3:] == [(0, 0, "down"), (2, 0, "down"), (1, 0, "shared-down")]


def test_an_answered_probe_clears_the_path(two_peers):
    dp = two_peers
    take_out_x0(dp)
    took, delta = send(dp, 1, 0)
    assert took == 1 and delta.get("tx_probe") == 1
    probe = probe_ns(dp, 1, 0)
    set_acks(dp, 1, ns0=probe, max_ns=probe)        # the probe was heard
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    assert not live(dp, 1, 0).down_ns and hop(dp, HOP_A).shared_downs == 0


def test_a_path_heard_since_the_suspicion_is_not_probed(two_peers):
    dp = two_peers
    take_out_x0(dp)
    set_acks(dp, 1, ns0=hop(dp, HOP_A).suspect_ns + 1)
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    assert probe_ns(dp, 1, 0) == 0


def who(peer_id, path_id):
    return peer_id << 16 | path_id


def test_an_overdue_watched_send_makes_its_hop_suspect_at_once(two_peers):
    """X's send on path 0 is hop A's watch; X acknowledges later sends on
    path 1 but not it: the next packet of any peer through A (Y's) finds
    the hop suspect before X's path 0 has had another turn, and its path
    through A is skipped for a probe copy."""
    dp = two_peers
    took, _ = send(dp, 0, 0)
    assert took == 0
    sent = state(dp, 0).clocks[0].unacked_since_ns
    a = hop(dp, HOP_A)
    assert a.watch_who == who(0, 0) and sent <= a.watch_ns
    # Y's path through A while X's send is merely not heard yet: used,
    # and the watch stays on the older, unheard send
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    assert hop(dp, HOP_A).watch_who == who(0, 0) and hop(dp, HOP_A).suspects == 0
    watched = hop(dp, HOP_A).watch_ns
    # X hears later sends on path 1, a window after, and not the watched one
    set_acks(dp, 0, ns1=watched + 2 * WINDOW_NS, max_ns=watched + 2 * WINDOW_NS)
    # Y's path 0 was used since the suspicion began only by a send not yet
    # heard: skipped, tested by a probe copy
    took, delta = send(dp, 1, 0)
    assert took == 1 and delta.get("tx_probe") == 1
    a = hop(dp, HOP_A)
    assert a.suspects == 1 and a.watch_suspects == 1 and a.suspect_ns == watched
    assert not live(dp, 0, 0).down_ns          # X's path: its own turn judges it
    assert hop(dp, HOP_B).suspects == 0
    # Z, heard on path 0 after the watched send: its path is clear
    set_acks(dp, 2, ns0=watched + 1)
    took, delta = send(dp, 2, 0)
    assert took == 0 and "tx_probe" not in delta


def test_a_heard_watched_send_passes_the_watch_on(two_peers):
    """The watch moves to the next send through the hop once its send is
    heard; a heard send suspects nothing however late the others are."""
    dp = two_peers
    send(dp, 0, 0)
    watched = hop(dp, HOP_A).watch_ns
    set_acks(dp, 0, ns0=watched, ns1=watched + 5 * WINDOW_NS, max_ns=watched + 5 * WINDOW_NS)
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    a = hop(dp, HOP_A)
    assert a.suspects == 0 and a.watch_who == who(1, 0) and a.watch_ns > watched


def test_a_watch_is_heard_by_an_acknowledgement_past_the_send_before_it(two_peers):
    """An acknowledgement is its report block's lower bound: one past the
    path's send before the watched one means the watched one arrived."""
    dp = two_peers
    send(dp, 0, 0)
    first = hop(dp, HOP_A).watch_ns
    set_acks(dp, 0, ns0=first)
    send(dp, 0, 0)                      # the first was heard: this is watched
    a = hop(dp, HOP_A)
    assert a.watch_who == who(0, 0) and a.watch_ns > first and a.watch_after_ns == first
    later = a.watch_ns + 5 * WINDOW_NS
    set_acks(dp, 0, ns0=first + 1, ns1=later, max_ns=later)
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta and hop(dp, HOP_A).suspects == 0


def test_another_peers_send_takes_the_second_watch_and_is_judged(two_peers):
    """X's send watched and unheard: Y's send through the same hop takes
    the second watch (X's own next send does not); Y acknowledging later
    sends but not it suspects the hop, while X has reported nothing."""
    dp = two_peers
    send(dp, 0, 0)
    first = hop(dp, HOP_A).watch_ns
    send(dp, 0, 0)                      # X again: not a second watch
    a = hop(dp, HOP_A)
    assert a.watch_ns == first and a.watch_who == who(0, 0) and a.watch2_ns == 0
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    a = hop(dp, HOP_A)
    assert a.watch_ns == first and a.watch2_who == who(1, 0) and a.watch2_ns > first
    assert a.suspects == 0
    second = a.watch2_ns
    # Y hears later sends on path 1 a window after, not the watched one
    set_acks(dp, 1, ns1=second + 2 * WINDOW_NS, max_ns=second + 2 * WINDOW_NS)
    took, delta = send(dp, 2, 0)
    a = hop(dp, HOP_A)
    assert a.suspects == 1 and a.watch_suspects == 1 and a.suspect_ns == second
    assert took == 1 and delta.get("tx_probe") == 1
    assert hop(dp, HOP_B).suspects == 0


def test_shared_fate_off(two_peers):
    dp = two_peers
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    cfg.shared_fate = 0
    dp.att.maps["config"].update(layout.Index(0), cfg)
    take_out_x0(dp)
    assert hop(dp, HOP_A).suspects == 0
    took, delta = send(dp, 1, 0)
    assert took == 0 and "tx_probe" not in delta
    assert hop(dp, HOP_A).watch_ns == 0         # no watch either


def test_failing_open_takes_the_path_heard_last(two_peers):
    """Every path of Y out and none due a probe: the packet fails open on
    the one the peer heard from last (a live path taken out falsely
    rather than a silent one), not on its turn's."""
    dp = two_peers
    now = time.monotonic_ns()
    st, rs = state(dp, 1), row(dp, 1)
    for path_id in (0, 1):
        rs.paths[path_id].live.down_ns = now
        rs.paths[path_id].live.down_after_ns = now + 10 * WINDOW_NS   # no ack brings it back
        rs.paths[path_id].live.next_probe_ns = now + 10**12
    st.clocks[0].acked_ns = now - 5 * WINDOW_NS
    st.clocks[1].acked_ns = now - 2 * WINDOW_NS
    put(dp, 1, st)
    put_row(dp, 1, rs)
    took, delta = send(dp, 1, 0)
    assert took == 1 and delta.get("tx_fail_open") == 1
