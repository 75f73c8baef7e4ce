"""More peers than the LRU of learnt state holds (issue 28): every peer's
packets still spread over its paths, none falls back on path 0, and the
evictions are counted.

The real mrc_tx, run by BPF_PROG_TEST_RUN on packets to MRC_MAX_ACTIVE_PEERS
(16,384) + 44 peers of one path template in turn (as the issue sent
them: with more peers than the LRU held, before the fix every packet of
every peer took path 0).  The witness is each frame out: the peer it is
for (the SRH's last segment, its SID), the path it took (the TLV's path
id) and that the path is really that one (the outer destination is the
path's spine), read at the wire's offsets for all of them and by scapy
for a sample, which must agree; the datapath's counters and the LRU's own
entry count say what happened to the learnt state.
"""
from __future__ import annotations

import collections
import ctypes
import ipaddress
import os

import pytest
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import paths as cp, spray
from mrc_ebpf.datapath import bpfsys, layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import COUNTERS

pytestmark = pytest.mark.root

ROW = 9                                   # the template's row
N_PATHS = 16
SPINES = [f"fc00:0:e{i:x}::" for i in range(1, N_PATHS + 1)]
ACTIVE = C["MRC_MAX_ACTIVE_PEERS"]
PEERS = ACTIVE + 44                       # the 300 at the LRU size it had then (256)


def _template(dp, n_peers: int, policy: str = "rr") -> dict[str, int]:
    """Row ROW with N_PATHS paths (one per spine), and n_peers peers on it
    as `path bulk` writes them; their SID -> peer number."""
    tpl = layout.Peer(peer_id=ROW, template_id=ROW, n_paths=N_PATHS, policy=cp.POLICIES[policy])
    for i, spine in enumerate(SPINES):
        path = layout.Path(n_segments=2, state=cp.UP, weight=1, flowlabel=0x100 + i, oif=1)
        ctypes.memmove(path.segments[1].addr, ipaddress.IPv6Address(spine).packed, 16)
        ctypes.memmove(path.nexthop, ipaddress.IPv6Address(spine).packed, 16)
        dp.att.maps["paths"].update(cp.path_index(ROW, i), path)
    spray.rebuild(dp.att, tpl, sids=False)
    sids = {}
    for h in range(n_peers):
        sid = ipaddress.IPv6Address(f"fc00:1:{h // 256:x}:{h % 256:x}::")
        peer = layout.Peer(peer_id=cp.MAX_PEERS + h, template_id=ROW, n_paths=N_PATHS,
                           policy=cp.POLICIES[policy], flags=C["MRC_PEER_F_LAST_HOP"])
        ctypes.memmove(peer.sid.addr, sid.packed, 16)
        dp.att.maps["peers"].update(cp.peer_key(cp.parse_prefix(f"fd00:1:{h // 256:x}:{h % 256:x}::/64")),
                                    peer)
        dp.att.maps["peer_by_sid"].update(layout.Sid.from_buffer_copy(sid.packed), layout.u32(peer.peer_id))
        sids[str(sid)] = h
    return sids


@pytest.fixture
def one_cpu():
    """The test runs stay on one CPU (the LRU's free lists are per CPU);
    the affinity is given back after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _send_in_turn(dp, n_peers: int, rounds: int) -> tuple[list[bytes], dict]:
    """`rounds` packets to each of n_peers, one peer after the other;
    the frames out and the counters' deltas."""
    before = dp.counters()
    out = []
    frames = [bytes(F.eth() / IPv6(src="fd00:a::1", dst=f"fd00:1:{h // 256:x}:{h % 256:x}::9") /
                    F.UDP(sport=1, dport=9) / Raw(b"x")) for h in range(n_peers)]
    for _ in range(rounds):
        for frame in frames:
            ret, _, pkt = bpfsys.prog_test_run(dp.tx.fd, frame, 1)
            assert ret == 0, ret
            out.append(pkt)
    after = dp.counters()
    return out, {n: a - b for n, a, b in zip(COUNTERS, after, before) if a != b}


def _read(raw: bytes) -> tuple[str, str, str, int]:
    """(outer destination, SRH segments[1] and [0], TLV path id) at the
    wire's offsets: Ethernet, IPv6, an SRH of two segments, the TLV."""
    assert raw[12:14] == b"\x86\xdd" and raw[20] == 43 and raw[58] == 1, raw[:64].hex()
    srh_len = (raw[55] + 1) * 8
    tlv = 54 + 8 + 16 * (raw[58] + 1)
    assert raw[tlv] == C["MRC_TLV_TYPE"] and tlv < 54 + srh_len
    a = ipaddress.IPv6Address
    return (str(a(raw[38:54])), str(a(raw[78:94])), str(a(raw[62:78])),
            int.from_bytes(raw[tlv + 4:tlv + 6], "big"))


def _paths_by_peer(dp, frames: list[bytes], sids: dict[str, int]) -> dict[int, list[int]]:
    """peer -> the path id of each of its frames; each frame's outer
    destination is the spine of the path its TLV names.  Every 97th frame
    is read by scapy too, and must read the same."""
    taken = collections.defaultdict(list)
    for n, raw in enumerate(frames):
        dst, seg1, seg0, path_id = _read(raw)
        if n % 97 == 0:
            pkt = Ether(raw)
            srh = pkt[IPv6ExtHdrSegmentRouting]
            assert (pkt[IPv6].dst, srh.addresses[1], srh.addresses[0], wire.mrc_tlv(pkt).path_id) == \
                (dst, seg1, seg0, path_id), pkt.summary()
        assert dst == SPINES[path_id] == seg1, (dst, seg1, path_id)
        taken[sids[seg0]].append(path_id)
    return taken


def test_more_peers_than_the_lru_holds_still_spray(fresh, one_cpu):
    sids = _template(fresh, PEERS)
    rounds = N_PATHS
    frames, delta = _send_in_turn(fresh, PEERS, rounds)
    assert delta["tx_encap"] == PEERS * rounds and "tx_drop_no_path" not in delta
    taken = _paths_by_peer(fresh, frames, sids)
    assert len(taken) == PEERS
    # every peer over at least 0.9 of its paths (here: all of them)
    spread = {h: len(set(ids)) for h, ids in taken.items()}
    assert min(spread.values()) >= 0.9 * N_PATHS, sorted(spread.items(), key=lambda kv: kv[1])[:5]
    # and no path is a fallback: path 0 carries its share, no more
    per_path = collections.Counter(i for ids in taken.values() for i in ids)
    mean = PEERS * rounds / N_PATHS
    assert per_path[0] <= 1.1 * mean and max(per_path.values()) <= 1.1 * mean, per_path
    # the learnt state: the LRU held at most its size while PEERS peers
    # were served, and the peers that lost theirs were counted
    held = sum(1 for _ in fresh.att.maps["peer_state"].keys())
    assert held <= ACTIVE
    new, remade = delta.get("state_new", 0), delta.get("state_remade", 0)
    assert new - remade == PEERS            # each peer new once; every other start a remake
    assert remade >= PEERS * (rounds - 1) // 2, delta     # most packets found theirs evicted
    assert "state_fail" not in delta


def test_peers_the_lru_holds_keep_their_turns(fresh, one_cpu):
    """Fewer peers than the LRU holds: one new state each, then plain rr
    turns from the peer's offset (consecutive paths, nothing remade)."""
    n_peers = 40
    sids = _template(fresh, n_peers)
    frames, delta = _send_in_turn(fresh, n_peers, N_PATHS)
    taken = _paths_by_peer(fresh, frames, sids)
    assert delta.get("state_new") == n_peers and "state_remade" not in delta
    for h, ids in taken.items():
        assert ids == [(ids[0] + j) % N_PATHS for j in range(N_PATHS)], (h, ids)
    # the peers start on different paths: each path is some peers' first
    firsts = collections.Counter(ids[0] for ids in taken.values())
    assert len(firsts) == N_PATHS and max(firsts.values()) <= -(-n_peers // N_PATHS) + 1, firsts
