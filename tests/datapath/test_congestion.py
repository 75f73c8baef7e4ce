"""Congestion apart from failure, and the probe budget, through the real
programs with BPF_PROG_TEST_RUN (issue #29, items 1 and 5).

* RX counts a CE-marked packet on its path (rx_paths.ce) and the next
  report to the sender names that path with MRC_F_FB_CE, once.
* TX files a report with MRC_F_FB_CE (rx_fb_ce, path_live.ce_reports) and skips
  the path's next --skip-rotations turns (the packets' TLVs show the
  path each took), never taking it down; the floor (--min-active, and at
  least one path) holds.
* A down path's probe interval doubles from probe_us to probe_max_us; a
  probe copy through a first hop whose budget is spent is held back.
"""
from __future__ import annotations

import itertools
import time

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import events as ev
from mrc_ebpf.control import paths as cp
from mrc_ebpf.control.path_spec import PathSpec
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import provision
from .test_tables import decap

pytestmark = pytest.mark.root

PREFIX, PEER = "fd00:b::/64", "fc00:0:b::"
SPINES = ("fc00:0:e1::", "fc00:0:e2::", "fc00:0:e3::", "fc00:0:e4::")
CE_FLAG = C["MRC_F_FB_CE"]


def set_config(dp, **fields):
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    for k, v in fields.items():
        setattr(cfg, k, v)
    dp.att.maps["config"].update(layout.Index(0), cfg)


def clear_events(dp):
    """configure() restarts the log's sequence: earlier tests' entries go."""
    for key, e in list(dp.att.maps["events"].items()):
        if e.seq:
            dp.att.maps["events"].update(key, layout.Event())


@pytest.fixture
def four_paths(fresh):
    """Peer 0 (fd00:b::/64, SID fc00:0:b::) over 4 SRH paths, one a
    spine, rr; its hops assigned as `path add` does."""
    dp = fresh
    att = dp.att
    clear_events(dp)
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    for i in range(C["MRC_MAX_HOPS"]):
        att.maps["hops"].update(layout.Index(i), layout.Hop())
    provision(att, 0, PREFIX, [PathSpec.via(f"{spine},{PEER}") for spine in SPINES], fate=True)
    # no feedback acknowledges these paths: at the default ack timeout
    # (1 ms, x16 for silence) a test slowed by a busy machine saw paths go
    # down between two sends; what is tested here is turns, not silence
    set_config(dp, ack_timeout_us=5_000_000)
    return dp


def state(dp, peer_id=0):
    return dp.att.maps["peer_state"].lookup(layout.Index(peer_id))


def put(dp, st, peer_id=0):
    dp.att.maps["peer_state"].update(layout.Index(peer_id), st)


def row(dp, peer_id=0):
    """The learnt state of the peer's paths: its row's (its own here)."""
    return dp.att.maps["row_state"].lookup(layout.Index(peer_id))


def put_row(dp, rs, peer_id=0):
    dp.att.maps["row_state"].update(layout.Index(peer_id), rs)


def send(dp, dst="fd00:b::2"):
    """One packet to the peer: (the path id its TLV says, its TLV, deltas)."""
    r = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst=dst) / Raw(b"data")))
    assert r.verdict in ("TC_ACT_OK", "TC_ACT_REDIRECT"), r
    tlv = wire.mrc_tlv(Ether(r.out))
    return tlv.path_id, tlv, r.delta


_report_seq = itertools.count(1)


def report(dp, path_id, ce=True, src=PEER):
    """A feedback frame from the peer naming our path `path_id` (with
    MRC_F_FB_CE when `ce`): the RX verdict and deltas.  Each its own
    sequence number: one repeated would be a segment of the burst before."""
    flags = C["MRC_F_FEEDBACK"] | (CE_FLAG if ce else 0)
    tlv = F.mrc_tlv(flags=flags, fb_path_id=path_id, fb_qdelay_us=10, path_seq=next(_report_seq))
    inner = F.inner6()
    r = dp.run_rx(F.frame(F.srh_packet(inner, tlvs=[tlv], src=src)))
    assert r.verdict == "XDP_PASS", r
    return r, inner


def events(dp):
    return ev.read(dp.att)


# --------------------------------------------------------------------------- RX: CE per path

def test_a_ce_marked_frame_is_counted_on_its_path_and_reported_once(fresh):
    dp = fresh
    ect0 = F.inner6(tc=0x02)
    r = dp.run_rx(F.frame(F.srh_packet(ect0, tlvs=[F.mrc_tlv(path_id=3, path_seq=1)], tc=0x03)))
    assert (r.verdict, r.delta) == ("XDP_PASS", decap(ect0, ce=True))
    r = dp.run_rx(F.frame(F.srh_packet(ect0, tlvs=[F.mrc_tlv(path_id=5, path_seq=1)], tc=0x02)))
    assert r.delta == decap(ect0)           # ECT(0), not marked
    rx = {k.path_id: v for k, v in dp.att.maps["rx_paths"].items()}
    assert (rx[3].ce, rx[3].packets, rx[5].ce) == (1, 1, 0)
    # the next packet to the sender names path 3 with the flag ...
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    tlv = wire.mrc_tlv(Ether(out.out))
    assert tlv.flags & C["MRC_F_FEEDBACK"] and tlv.flags & CE_FLAG and tlv.fb_path_id == 3
    assert "fb-ce" in wire.describe(Ether(out.out))["flags"]
    # ... once: the mark is told, then forgotten
    out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
    assert not wire.mrc_tlv(Ether(out.out)).flags & CE_FLAG


def test_a_loss_is_reported_before_a_ce_mark(fresh):
    """The one exact slot of a report: a loss first (it is failover's and
    adaptive's news), then the mark."""
    dp = fresh
    ect0 = F.inner6(tc=0x02)
    dp.run_rx(F.frame(F.srh_packet(ect0, tlvs=[F.mrc_tlv(path_id=2, path_seq=1)], tc=0x03)))
    dp.run_rx(F.frame(F.srh_packet(ect0, tlvs=[F.mrc_tlv(path_id=4, path_seq=1)])))
    dp.run_rx(F.frame(F.srh_packet(ect0, tlvs=[F.mrc_tlv(path_id=4, path_seq=3)])))    # 2 lost
    told = []
    for _ in range(3):
        out = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::7") / Raw(b"x")))
        tlv = wire.mrc_tlv(Ether(out.out))
        told.append((tlv.fb_path_id, bool(tlv.flags & CE_FLAG), tlv.fb_lost))
    assert told[:2] == [(4, False, 1), (2, True, 0)]
    assert not told[2][1]


# --------------------------------------------------------------------------- TX: skip

def test_a_ce_report_makes_tx_skip_the_path_for_n_turns(four_paths):
    dp = four_paths
    set_config(dp, skip_rotations=2)
    r, inner = report(dp, 1)
    assert r.delta == {**decap(inner), "rx_feedback": 1, "rx_fb_ce": 1}
    assert row(dp).paths[1].live.ce_reports == 1
    took, deltas = [], []
    for _ in range(10):
        path_id, _, delta = send(dp)
        took.append(path_id)
        deltas.append(delta.get("tx_skip", 0))
        if len(took) == 2:
            # skipped, not down: MRC's state skip
            peer = dp.att.maps["peers"].lookup(cp.peer_key(cp.parse_prefix(PREFIX)))
            path = dp.att.maps["paths"].lookup(cp.path_index(0, 1))
            assert cp.path_state(dp.att, peer, 1, path) == cp.STATE_SKIP
    # rr over 0 1 2 3: path 1's next two turns are skipped (the packet
    # takes the next turn), then it is used again
    assert took == [0, 2, 3, 0, 2, 3, 0, 1, 2, 3], took
    assert sum(deltas) == 2 and "tx_reroute" not in delta
    live = row(dp).paths[1].live
    assert (live.skip, live.down_ns, live.downs) == (1 << 32, 0, 0)     # report 1 acted on, 0 left
    assert row(dp).floor_out == 0         # its floor place given back
    kinds = [(e["type"], e["path_id"], e["state"]) for e in events(dp)]
    assert kinds == [("skip", 1, "skip")]


def test_skip_shows_in_path_state_and_a_new_report_restarts_it(four_paths):
    dp = four_paths
    set_config(dp, skip_rotations=3)
    report(dp, 2)
    assert [send(dp)[0] for _ in range(3)] == [0, 1, 3]        # path 2's turn skipped
    peer = dp.att.maps["peers"].lookup(cp.peer_key(cp.parse_prefix(PREFIX)))
    path = dp.att.maps["paths"].lookup(cp.path_index(0, 2))
    assert cp.path_state(dp.att, peer, 2, path) == cp.STATE_SKIP
    assert row(dp).paths[2].live.skip_left == 2 and row(dp).floor_out == 1
    report(dp, 2)                           # CE again: 3 turns from now
    took = [send(dp)[0] for _ in range(16)]
    assert took == [0, 1, 3, 0, 1, 3, 0, 1, 3, 0, 1, 2, 3, 0, 1, 2], took
    assert [e["type"] for e in events(dp)] == ["skip"]        # one skip, restarted


def test_no_skip_without_skip_rotations(four_paths):
    dp = four_paths
    r, inner = report(dp, 1)
    assert r.delta.get("rx_fb_ce") == 1      # filed and counted all the same
    assert [send(dp)[0] for _ in range(4)] == [0, 1, 2, 3]


def test_two_skipped_paths_in_a_row_are_both_skipped(four_paths):
    dp = four_paths
    set_config(dp, skip_rotations=2)
    report(dp, 1)
    report(dp, 2)
    took = [send(dp)[0] for _ in range(6)]
    assert took == [0, 3, 0, 3, 0, 1], took
    assert [(e["type"], e["path_id"]) for e in events(dp)] == [("skip", 1), ("skip", 2)]


def test_the_floor_holds_against_skip(four_paths):
    """--min-active 3 of 4 paths: one path may be skipped, not two."""
    dp = four_paths
    set_config(dp, skip_rotations=4, min_active=3)
    report(dp, 1)
    report(dp, 2)
    took = [send(dp)[0] for _ in range(4)]
    assert took == [0, 2, 3, 0], took           # 1 skipped; 2 refused by the floor, used
    kinds = [(e["type"], e["path_id"]) for e in events(dp)]
    assert kinds == [("skip", 1)]
    assert row(dp).floor_out == 1


def test_every_path_ce_keeps_one_in_the_spray(four_paths):
    dp = four_paths
    set_config(dp, skip_rotations=1000)
    for p in range(4):
        report(dp, p)
    took = [send(dp) for _ in range(8)]
    # at most three skipped (the floor keeps one path), every packet sent:
    # no fail-open, nothing assumed-bad
    assert all("tx_fail_open" not in d and "tx_drop_no_path" not in d for _, _, d in took), took
    skipped = [e["path_id"] for e in events(dp) if e["type"] == "skip"]
    assert 2 <= len(skipped) <= 3 and len(set(skipped)) == len(skipped), skipped
    assert row(dp).floor_out == len(skipped)
    assert not [e for e in events(dp) if e["type"] in ("down", "fail-open")]
    assert all(row(dp).paths[p].live.downs == 0 for p in range(4))


# --------------------------------------------------------------------------- probes: backoff, budget

def take_down(dp, path_id, now=None, due_in_ns=None, gap_us=None):
    """Path `path_id` out, as the datapath takes a path out, due a probe
    now (or in `due_in_ns`), its probe interval probe_us (or `gap_us`).
    The peer state is started first if it has none."""
    now = now or time.monotonic_ns()
    st = state(dp)
    if st is None:
        send(dp)
        st = state(dp)
    st.acks.last_ns = now
    put(dp, st)
    rs = row(dp)
    live = rs.paths[path_id].live
    live.down_ns = now - 1000
    live.down_after_ns = now - 2000
    live.next_probe_ns = 0 if due_in_ns is None else now + due_in_ns
    live.probe_gap_us = gap_us or dp.att.maps["config"].lookup(layout.Index(0)).probe_us
    rs.floor_out += 1
    put_row(dp, rs)


def test_a_down_paths_probe_interval_doubles_to_the_max(four_paths):
    dp = four_paths
    set_config(dp, probe_us=100_000, probe_max_us=800_000)
    take_down(dp, 0)
    gaps = []
    for _ in range(5):
        rs = row(dp)
        rs.paths[0].live.next_probe_ns = 0     # due now
        put_row(dp, rs)
        st = state(dp)
        st.tx.seq = len(SPINES)               # path 0's turn (0 would be a new state: peer_state_turn)
        put(dp, st)
        before = time.monotonic_ns()
        took, _, delta = send(dp)
        after = time.monotonic_ns()
        live = row(dp).paths[0].live
        assert took == 1 and delta.get("tx_probe") == 1, delta     # a copy tests path 0
        gap_ns = live.probe_gap_us * 1000
        assert before + gap_ns <= live.next_probe_ns <= after + gap_ns
        gaps.append(live.probe_gap_us)
    assert gaps == [200_000, 400_000, 800_000, 800_000, 800_000]
    # not due (for 0.8 s): its turn is skipped, no probe
    st = state(dp)
    st.tx.seq = len(SPINES)
    put(dp, st)
    took, _, delta = send(dp)
    assert took == 1 and "tx_probe" not in delta


def test_without_probe_max_the_interval_stays(four_paths):
    dp = four_paths
    set_config(dp, probe_us=3000, probe_max_us=0)
    take_down(dp, 0)
    for _ in range(3):
        rs = row(dp)
        rs.paths[0].live.next_probe_ns = 0
        put_row(dp, rs)
        st = state(dp)
        st.tx.seq = len(SPINES)
        put(dp, st)
        assert send(dp)[2].get("tx_probe") == 1
        assert row(dp).paths[0].live.probe_gap_us == 3000


def test_the_probe_budget_holds_back_a_second_probe_through_one_hop(fresh):
    """Two peers' paths 0 through one first hop, both down and due: with a
    budget of 1 probe a second the first is probed, the second held back
    (due again at once, its interval not doubled)."""
    from .test_shared_fate import X, Y
    dp = fresh
    att = dp.att
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    for i in range(C["MRC_MAX_HOPS"]):
        att.maps["hops"].update(layout.Index(i), layout.Hop())
    for peer_id, (prefix_text, sid) in enumerate((X, Y)):
        provision(att, peer_id, prefix_text, [PathSpec.via(f"{spine},{sid}") for spine in SPINES[:2]], fate=True)
    set_config(dp, probe_us=1000, probe_max_us=64000, probe_budget=1)
    dst = ("fd00:b::2", "fd00:c::2")
    now = time.monotonic_ns()
    for peer_id in (0, 1):
        send(dp, dst[peer_id])
        st = state(dp, peer_id)
        st.acks.last_ns = now
        st.tx.seq = len(SPINES)
        put(dp, st, peer_id)
        rs = row(dp, peer_id)
        live = rs.paths[0].live
        live.down_ns, live.down_after_ns, live.next_probe_ns = now - 1000, now - 2000, 0
        live.probe_gap_us = 1000
        put_row(dp, rs, peer_id)
    took, _, first = send(dp, dst[0])
    assert took == 1 and first.get("tx_probe") == 1 and "tx_probe_held" not in first
    took, _, second = send(dp, dst[1])
    assert took == 1 and second.get("tx_probe") == 1 and second.get("tx_probe_held") == 1
    held = row(dp, 1).paths[0].live
    assert held.probes == 0 and held.next_probe_ns <= time.monotonic_ns()    # due again at once
    ident = att.maps["path_fate"].lookup(cp.path_index(0, 0)).hop
    assert ident == att.maps["path_fate"].lookup(cp.path_index(1, 0)).hop
    h = att.maps["hops"].lookup(layout.Index(ident))
    assert h.probes_held == 1 and h.probe_next_ns > now
    # with no budget, both go
    set_config(dp, probe_budget=0)
    st = state(dp, 1)
    st.tx.seq = len(SPINES)
    put(dp, st, 1)
    took, _, third = send(dp, dst[1])
    assert third.get("tx_probe") == 1 and "tx_probe_held" not in third


# --------------------------------------------------------------------------- congestion is not failure: the ack clock

def overdue(dp, path_id, behind_ns, now):
    """Our oldest unacknowledged send to the peer on `path_id` is `behind_ns`
    older than the newest send the peer has acknowledged (on other paths):
    by the failover rule (lib/failover.h) overdue past any window below it."""
    st = state(dp)
    st.acks.last_ns = st.acks.max_ns = now
    clock = st.clocks[path_id]
    sent = (now - behind_ns) & ~1          # a send's clock starts on an even ns (failover_path_sent)
    clock.unacked_since_ns, clock.clock_after_ns, clock.acked_ns = sent, 1, 0
    put(dp, st)
    rs = row(dp)
    rs.paths[path_id].live.last_sent_ns = sent      # that send was the path's latest
    put_row(dp, rs)


def ce_stamp(ns):
    """path_health.ce_stamp of the instant `ns` (lib/peer_state.h)."""
    return ((ns >> C["MRC_CE_STAMP_SHIFT"]) & 0xFFFF) or 1


def test_a_congested_path_is_skipped_not_taken_down_while_a_silent_one_goes(four_paths):
    """Paths 1 and 2 both trail the peer's acknowledgements by 50 ms, 50 x
    the 1 ms clock.  The peer reported a CE mark on path 1 (a packet of it
    arrived, queued): it is skipped, then used again, never taken down.
    Path 2 the peer never named: silence, taken down at its first turn.
    Once path 1's congestion news is older than 16 x reorder_max_us (at
    most 34 s) it is judged by the plain clock and goes down too (a black hole on a path
    that was congested is still found out).  Witness: the path each frame
    out carries, the events and the paths' state."""
    dp = four_paths
    set_config(dp, ack_timeout_us=1000, reorder_max_us=5_000_000, skip_rotations=2)
    r, _ = report(dp, 1)                    # CE on path 1 (a trim is told the same way)
    assert r.delta.get("rx_fb_ce") == 1
    assert row(dp).paths[1].health.ce_stamp
    now = time.monotonic_ns()
    for p in (1, 2):
        overdue(dp, p, 50_000_000, now)
    rs = row(dp)
    for p in (1, 2):        # sends followed the unheard one (not a lone send: failover_lone)
        rs.paths[p].live.last_sent_ns = now - 1_000
    put_row(dp, rs)
    took = [send(dp)[0] for _ in range(16)]
    assert 2 not in took and took.count(1) >= 1, took
    rs = row(dp)
    assert rs.paths[2].live.down_ns and rs.paths[2].live.downs == 1
    assert (rs.paths[1].live.down_ns, rs.paths[1].live.downs) == (0, 0)
    assert state(dp).clocks[1].unacked_since_ns == (now - 50_000_000) & ~1     # still unacknowledged
    kinds = [(e["type"], e["path_id"]) for e in events(dp)]
    assert ("skip", 1) in kinds and ("down", 2) in kinds and ("down", 1) not in kinds, kinds
    # the news ages past 16 x reorder_max_us (80 s; at most half the
    # stamp's 68.7 s wrap, 34 s): path 1's next turn takes it out
    rs.paths[1].health.ce_stamp = ce_stamp(time.monotonic_ns() - 40_000_000_000)
    put_row(dp, rs)
    took = [send(dp)[0] for _ in range(4)]
    assert 1 not in took and 2 not in took, took
    assert row(dp).paths[1].live.downs == 1
    assert ("down", 1) in [(e["type"], e["path_id"]) for e in events(dp)]


def test_without_congestion_news_the_queue_allowance_is_as_before(four_paths):
    """A report without CE leaves no stamp: path 1, 50 ms behind, is
    judged by the 1 ms clock plus its reported queue (10 us) and goes
    down at its turn."""
    dp = four_paths
    set_config(dp, ack_timeout_us=1000, reorder_max_us=5_000_000)
    report(dp, 1, ce=False)
    assert row(dp).paths[1].health.ce_stamp == 0
    now = time.monotonic_ns()
    overdue(dp, 1, 50_000_000, now)
    rs = row(dp)
    rs.paths[1].live.last_sent_ns = now - 1_000     # not a lone send
    put_row(dp, rs)
    took = [send(dp)[0] for _ in range(4)]
    assert 1 not in took, took
    assert row(dp).paths[1].live.downs == 1


def test_a_lone_unheard_send_on_a_congested_path_is_tested_not_judged(four_paths):
    """Paths 1, 2 and 3 were reported congested (CE, or a trim).  Path 1's
    last send went unheard 50 ms ago and nothing followed it on path 1
    (TCP stalled after a loss), while the peer heard later sends
    elsewhere: its next turn takes it (the packet tests it), the clock
    restarted at that packet; not down.  Path 2's unheard send was
    followed by others on it (silence under traffic): down at its turn.
    Path 3's lone send has no congestion news behind it (older than 16 x
    reorder_max_us): judged at once, down.  Then path 1's test packet
    goes unheard too: down at its next turn.  The sends are 20 s old
    (past the 1 s allowance of a congested path) and the news lasts 16 s
    for a lone send: nothing here depends on how fast the test runs
    (a TCG VM is 5-50x slower)."""
    dp = four_paths
    set_config(dp, ack_timeout_us=1000, reorder_max_us=1_000_000)
    for p in (1, 2, 3):
        report(dp, p)
    now = time.monotonic_ns()
    for p in (1, 2, 3):
        overdue(dp, p, 20_000_000_000, now)
    rs = row(dp)
    rs.paths[2].live.last_sent_ns = now - 1_000     # sent on since
    rs.paths[3].health.ce_stamp = ce_stamp(now - 30_000_000_000)
    put_row(dp, rs)
    took = [send(dp)[0] for _ in range(6)]
    assert 1 in took and 2 not in took and 3 not in took, took
    rs = row(dp)
    assert [rs.paths[p].live.downs for p in (1, 2, 3)] == [0, 1, 1]
    restarted = state(dp).clocks[1].unacked_since_ns
    assert restarted & 1 and restarted > now and state(dp).clocks[1].clock_after_ns == ((now - 20_000_000_000) & ~1) - 1
    # the test packet unheard while the peer heard sends 10 s later: down
    st = state(dp)
    st.clocks[1].unacked_since_ns = (now - 10_000_000_000) | 1
    put(dp, st)
    took = [send(dp)[0] for _ in range(4)]
    assert 1 not in took, took
    assert row(dp).paths[1].live.downs == 1


def lone(dp, path_id, sent):
    """Path `path_id`'s oldest unheard send is `sent`, and nothing followed it on the path."""
    st = state(dp)
    st.clocks[path_id].unacked_since_ns, st.clocks[path_id].clock_after_ns = sent & ~1, 1
    st.clocks[path_id].acked_ns = 0
    put(dp, st)
    rs = row(dp)
    rs.paths[path_id].live.last_sent_ns = sent & ~1
    put_row(dp, rs)


def test_a_send_before_a_pause_is_tested_while_the_new_sends_reports_come_in(four_paths):
    """No congestion news anywhere.  We paused, then resumed 8 s ago: what
    the peer had heard of us by then (max_at_resume) was 1 s past path 1's
    oldest unheard send, 20 s old (path 1 has sent since); the peer has
    since heard sends of now.  The report on path 1's old send can still
    be behind the new sends' reports (they take the peer's sprayed paths),
    so path 1's next turn tests it (its clock restarts at that packet), not
    down.  Path 2's lone send came after the resume: judged, down.  Path 3's lone send was overtaken by what the
    peer had heard before the pause: judged, down.  Then path 1 again,
    with reorder_max_us (1 s) since the resume run out: the new sends'
    reports are all in, judged, down.  A 2 s clock and seconds of margin:
    nothing depends on how fast the test runs (a TCG VM is 5-50x slower)."""
    dp = four_paths
    set_config(dp, ack_timeout_us=2_000_000, reorder_max_us=30_000_000)
    send(dp)                            # the peer's state is made by its first packet
    now = time.monotonic_ns()
    st = state(dp)
    st.acks.last_ns = st.acks.max_ns = now
    st.acks.resume_ns, st.acks.max_at_resume_ns = now - 8_000_000_000, now - 19_000_000_000
    st.tx.last_ns = now                  # the next sends are no new pause
    put(dp, st)
    lone(dp, 1, now - 20_000_000_000)
    lone(dp, 2, now - 5_000_000_000)
    rs = row(dp)
    rs.paths[1].live.last_sent_ns = now - 1_000     # sent on since, after the resume: tested all the same
    put_row(dp, rs)
    took = [send(dp)[0] for _ in range(6)]
    assert 1 in took and 2 not in took, took
    rs = row(dp)
    assert [rs.paths[p].live.downs for p in (1, 2)] == [0, 1]
    restarted = state(dp).clocks[1].unacked_since_ns
    assert restarted & 1 and restarted > now
    assert state(dp).clocks[1].clock_after_ns == ((now - 20_000_000_000) & ~1) - 1
    assert ("down", 1) not in [(e["type"], e["path_id"]) for e in events(dp)]
    # path 3: the peer had heard, before the pause, sends 19 s after it
    lone(dp, 3, now - 40_000_000_000)
    took = [send(dp)[0] for _ in range(4)]
    assert 3 not in took, took
    assert row(dp).paths[3].live.downs == 1
    # path 1 once more, the resume older than reorder_max_us
    set_config(dp, reorder_max_us=1_000_000)
    lone(dp, 1, now - 20_000_000_000)
    took = [send(dp)[0] for _ in range(4)]
    assert 1 not in took, took
    assert row(dp).paths[1].live.downs == 1
