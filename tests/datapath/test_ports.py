"""Port status (issue #29, item 3) through the real programs with
BPF_PROG_TEST_RUN: TX sends config.ports_down in every TLV; a frame from
a peer whose TLV says one of its planes is down is filed, and our paths
to it through that plane (their own device: plane 1 here) are taken out
at once, those of the other plane untouched; TX then sprays over the
live plane only; the bit clearing makes the out paths due a probe now.
"""
from __future__ import annotations

import ctypes
import time

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import events as ev
from mrc_ebpf.control import paths as cp, spray
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import COUNTERS

pytestmark = pytest.mark.root

PREFIX, PEER = "fd00:b::/64", "fc00:0:b::"
# path id -> (spine, our device): paths 0, 1 leave by ifindex 1 (plane 0), 2, 3 by 2 (plane 1)
PATHS = {0: ("fc00:0:e1::", 1), 1: ("fc00:0:e2::", 1), 2: ("fc00:0:e3::", 2), 3: ("fc00:0:e4::", 2)}


@pytest.fixture
def two_planes(fresh):
    dp = fresh
    att = dp.att
    cfg = att.maps["config"].lookup(layout.Index(0))
    cfg.n_devices = 2
    cfg.devices[1] = layout.Device(ifindex=2, mtu=1500)
    att.maps["config"].update(layout.Index(0), cfg)
    for key, e in list(att.maps["events"].items()):
        if e.seq:
            att.maps["events"].update(key, layout.Event())
    for key in list(att.maps["peers"].keys()):
        att.maps["peers"].delete(key)
    prefix = cp.parse_prefix(PREFIX)
    for path_id, (spine, oif) in PATHS.items():
        spec = cp.PathSpec.via(f"{spine},{PEER}")
        path = layout.Path(n_segments=2, state=cp.UP, weight=1, oif=oif,
                           flowlabel=cp.flowlabel(prefix, path_id, spec.segments))
        ctypes.memmove(path.nexthop, spec.first_hop.packed, 16)
        ctypes.memmove(path.peer_sid.addr, spec.peer_sid.packed, 16)
        for i, seg in enumerate(reversed(spec.segments)):
            ctypes.memmove(path.segments[i].addr, seg.packed, 16)
        att.maps["paths"].update(cp.path_index(0, path_id), path)
    peer = layout.Peer(peer_id=0, template_id=0, n_paths=len(PATHS), policy=cp.POLICIES["rr"])
    spray.rebuild(att, peer)
    att.maps["peers"].update(cp.peer_key(prefix), peer)
    return dp


def send(dp):
    r = dp.run_tx(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:b::2") / Raw(b"data")))
    assert r.verdict in ("TC_ACT_OK", "TC_ACT_REDIRECT"), r
    return wire.mrc_tlv(Ether(r.out))


def now32():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) & 0xFFFFFFFF


def from_peer(dp, ports, seq, heard32=0):
    """A data frame from the peer whose TLV says `ports` (its planes down),
    with feedback acknowledging every path's sends up to `heard32` (our
    clock's low bits; a peer that never sent feedback has no failover
    clock: nothing is taken out for it)."""
    before = dp.counters()
    heard32 = heard32 or now32()
    tlv = F.mrc_tlv(path_id=0, path_seq=seq, ports_down=ports, flags=C["MRC_F_FEEDBACK"], fb_block=0,
                    fb_heard=0b1111, fb_since_ns32=heard32, fb_path_id=0, fb_path_tx32=heard32)
    r = dp.run_rx(F.frame(F.srh_packet(F.inner6(), tlvs=[tlv], src=PEER)))
    assert r.verdict == "XDP_PASS" and r.delta.get("rx_decap") == 1, r
    return {COUNTERS[i]: a - b for i, (a, b) in enumerate(zip(dp.counters(), before)) if a != b}


def live(dp, path_id):
    return dp.att.maps["row_state"].lookup(layout.Index(0)).paths[path_id].live


def test_the_loader_files_each_planes_paths(two_planes):
    floor = two_planes.att.maps["peer_floor"].lookup(layout.Index(0))
    assert (floor.usable, floor.plane_paths[0].ids[0], floor.plane_paths[1].ids[0]) == (4, 0b0011, 0b1100)


def test_tx_sends_our_port_status_in_every_tlv(two_planes):
    dp = two_planes
    assert send(dp).ports_down == 0
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    cfg.ports_down = 0b10
    dp.att.maps["config"].update(layout.Index(0), cfg)
    assert [send(dp).ports_down for _ in range(4)] == [0b10] * 4


def test_a_peers_port_down_takes_that_planes_paths_out_at_once(two_planes):
    dp = two_planes
    assert [send(dp).path_id for _ in range(4)] == [0, 1, 2, 3]      # state made, row noted
    heard = now32()                           # the peer heard those four
    d = from_peer(dp, 0, 1, heard)
    assert "rx_port_status" not in d
    d = from_peer(dp, 0b10, 2, heard)         # the peer's plane 1 is down
    assert (d.get("rx_port_status"), d.get("rx_port_down_paths")) == (1, 2), d
    assert [bool(live(dp, i).down_ns) for i in range(4)] == [False, False, True, True]
    assert (live(dp, 2).downs, live(dp, 0).downs) == (1, 0)
    evs = [e for e in ev.read(dp.att) if e["type"] == "port-down"]
    assert len(evs) == 1 and evs[0]["path_id"] == C["MRC_EV_PLANE"] + 1 and evs[0]["peer_id"] == 0
    # the same news again changes nothing
    d = from_peer(dp, 0b10, 3, heard)
    assert "rx_port_status" not in d and "rx_port_down_paths" not in d
    # TX sprays over plane 0 only (no probe is due before probe_us)
    took = [send(dp).path_id for _ in range(8)]
    assert set(took) == {0, 1}, took
    # the peer's plane is back: its out paths are due a probe now
    d = from_peer(dp, 0, 4, heard)
    assert d.get("rx_port_status") == 1 and "rx_port_down_paths" not in d
    before = dp.counters()
    send(dp)
    delta = {COUNTERS[i]: a - b for i, (a, b) in enumerate(zip(dp.counters(), before)) if a != b}
    assert delta.get("tx_probe", 0) >= 1, delta


def test_a_port_status_before_any_send_is_filed_and_walks_nothing(two_planes):
    """No learnt state for the peer (never sent to): nothing to stop, and
    the news is filed (the next change is against it)."""
    dp = two_planes
    d = from_peer(dp, 0b01, 1)
    assert d.get("rx_port_status") == 1 and "rx_port_down_paths" not in d
    d = from_peer(dp, 0b01, 2)
    assert "rx_port_status" not in d


def test_our_own_plane_down_takes_our_paths_through_it_out_with_the_next_packet(two_planes):
    """config.ports_down (set by the kernel hooks, bpf/mrc_ports.c, the
    instant our device goes) counts as the peer's own news: the next
    packet from the peer takes our plane-1 paths to it out, and TX sprays
    over plane 0 only; the bit cleared, they are due a probe at once."""
    dp = two_planes
    assert [send(dp).path_id for _ in range(4)] == [0, 1, 2, 3]
    heard = now32()
    from_peer(dp, 0, 1, heard)
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    cfg.ports_down = 0b10
    dp.att.maps["config"].update(layout.Index(0), cfg)
    d = from_peer(dp, 0, 2, heard)              # the peer's own status: all up
    assert (d.get("rx_port_status"), d.get("rx_port_down_paths")) == (1, 2), d
    assert [bool(live(dp, i).down_ns) for i in range(4)] == [False, False, True, True]
    assert set(send(dp).path_id for _ in range(8)) == {0, 1}
    # the peer then says its plane 1 is down too: nothing new for us
    d = from_peer(dp, 0b10, 3, heard)
    assert "rx_port_status" not in d, d
    cfg.ports_down = 0
    dp.att.maps["config"].update(layout.Index(0), cfg)
    d = from_peer(dp, 0b10, 4, heard)           # ours back, the peer's still down
    assert "rx_port_status" not in d, d
    d = from_peer(dp, 0, 5, heard)              # both back: due a probe now
    assert d.get("rx_port_status") == 1 and "rx_port_down_paths" not in d, d


def test_a_change_of_our_port_status_makes_feedback_owed_at_once(two_planes):
    """fb_interval (100 us) not yet over since the last feedback owed: a
    change of our port status makes it owed anyway (the peer hears of it
    with the feedback its next packet draws)."""
    dp = two_planes
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    cfg.fb_interval_us = 10_000_000                 # no feedback owed for 10 s but by the news
    dp.att.maps["config"].update(layout.Index(0), cfg)
    send(dp)                                        # our state for the peer: feedback can be owed
    from_peer(dp, 0, 1)
    key = next(k for k in dp.att.maps["rx_peers"].keys())
    assert dp.att.maps["rx_peers"].lookup(key).ports_told == 0
    state = lambda: dp.att.maps["peer_state"].lookup(layout.Index(0))   # noqa: E731
    st = state()
    st.fb_due = 0
    dp.att.maps["peer_state"].update(layout.Index(0), st)
    from_peer(dp, 0, 2)
    assert state().fb_due == 0                      # within the interval: not owed
    cfg.ports_down = 0b10
    dp.att.maps["config"].update(layout.Index(0), cfg)
    from_peer(dp, 0, 3)
    assert state().fb_due == 1 and dp.att.maps["rx_peers"].lookup(key).ports_told == 0b10


@pytest.fixture
def own_netns():
    """A namespace of the test's own (lo up), for the programs' test runs
    whose clones leave on the run's device, that namespace's lo: they stay
    there and are dropped by its stack."""
    import os
    from mrc_ebpf.lab import netns
    name = f"mrcpt{os.getpid() % 100000}"
    netns.create(name)
    try:
        yield name
    finally:
        netns.delete([name])


def run_fb(dp, frame: bytes, ns: str):
    from mrc_ebpf.lab.enter import inside
    from .harness import TC
    with inside(ns):
        return dp._run(dp.fb, TC, frame)


def test_our_port_down_is_told_to_every_peer_from_the_first_packet_in(two_planes, own_netns):
    """lib/port_tell.h: mrc_fb learns the peer from its packets; after our
    port status changes, the next packet in (from any peer) sends each
    learnt peer one feedback-only clone (`fb_port_tell`, event `port-told`
    whose path id is our lowest path to it through a live plane: 0, of
    plane 0, when plane 1 is down; 2, of plane 1, when plane 0 is), and
    the packet itself goes up unchanged (its addresses put back).  Once
    a change: the next packet tells nothing again."""
    dp = two_planes
    dp.att.maps["port_hook"].update(layout.Index(0), layout.PortHook())     # nothing learnt or told
    frame = bytes(F.eth() / IPv6(src="fd00:b::2", dst="fd00:a::1", nh=17) / Raw(b"\0" * 8 + b"data"))
    r = run_fb(dp, frame, own_netns)
    assert r.verdict == "TC_ACT_OK" and r.out == frame and "fb_port_tell" not in r.delta, r
    cfg = dp.att.maps["config"].lookup(layout.Index(0))
    for down, path_id in ((0b10, 0), (0b01, 2)):
        cfg.ports_down = down
        dp.att.maps["config"].update(layout.Index(0), cfg)
        r = run_fb(dp, frame, own_netns)
        assert r.verdict == "TC_ACT_OK" and r.out == frame, r
        assert r.delta.get("fb_port_tell") == 1, r
        told = [e for e in ev.read(dp.att) if e["type"] == "port-told"]
        assert told[-1]["peer_id"] == 0 and told[-1]["path_id"] == path_id, told
        r = run_fb(dp, frame, own_netns)
        assert r.out == frame and "fb_port_tell" not in r.delta, r
    # every plane down: no path to tell it on, nothing sent
    cfg.ports_down = 0b11
    dp.att.maps["config"].update(layout.Index(0), cfg)
    r = run_fb(dp, frame, own_netns)
    assert r.out == frame and "fb_port_tell" not in r.delta, r
