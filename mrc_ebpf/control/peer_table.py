"""The peer and path rows in the maps, as the control modules share them.

A peer prefix owns a row (peer_id) of MRC_MAX_PATHS path slots; a
template owns one too and its peers point at it (template_id).  Here:
the keys and indexes of those rows, reading the paths in use, the peer's
learnt state (peer_state), and finding and freeing rows.  paths,
templates and ev_trace build on it, so that none of them needs another's
internals (they imported each other in a circle).
"""
from __future__ import annotations

import ctypes
import ipaddress

from mrc_ebpf.control.path_spec import overhead
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

MAX_PATHS, MAX_PEERS = C["MRC_MAX_PATHS"], C["MRC_MAX_PEERS"]
LAST_HOP = C["MRC_PEER_F_LAST_HOP"]
UP, UNUSED, DENIED = C["MRC_PATH_UP"], C["MRC_PATH_UNUSED"], C["MRC_PATH_DENIED"]
MAX_CLASSES, SLOTS = C["MRC_MAX_CLASSES"], C["MRC_SPRAY_SLOTS"]
POLICIES = {name[len("MRC_POLICY_"):].lower(): value
            for name, value in C.items() if name.startswith("MRC_POLICY_")}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}
# MRC's names for a path's (an EV's) state
STATE_UP, STATE_BAD, STATE_DENIED, STATE_UNKNOWN = "up", "assumed-bad", "denied", "unknown"
# up, but left out of the spray for a while: the peer reported it CE-marked
# (congestion, never a failure: lib/failover.h, failover_skip)
STATE_SKIP = "skip"
# a spare EV held back: in no spray list, standing in for no path out
STATE_SPARE = "spare"
SPARE = C["MRC_PATH_F_SPARE"]


def peer_key(prefix: ipaddress._BaseNetwork) -> layout.PeerKey:
    """IPv4 prefixes live in the trie as IPv4-mapped IPv6 (::ffff:0:0/96)."""
    key = layout.PeerKey()
    if prefix.version == 4:
        ctypes.memmove(key.addr, ipaddress.IPv6Address(f"::ffff:{prefix.network_address}").packed, 16)
        key.prefixlen = 96 + prefix.prefixlen
    else:
        ctypes.memmove(key.addr, prefix.network_address.packed, 16)
        key.prefixlen = prefix.prefixlen
    return key


def key_prefix(key: layout.PeerKey) -> ipaddress._BaseNetwork:
    addr = ipaddress.IPv6Address(bytes(key.addr))
    if addr.ipv4_mapped is not None and key.prefixlen >= 96:
        return ipaddress.ip_network(f"{addr.ipv4_mapped}/{key.prefixlen - 96}")
    return ipaddress.ip_network(f"{addr}/{key.prefixlen}")


def path_index(peer_id: int, path_id: int) -> layout.Index:
    return layout.Index(peer_id * MAX_PATHS + path_id)


def free_peer_id(att: Attachment) -> int:
    """A free row of the paths map (own-path peers and templates share them)."""
    used = {v.template_id for _, v in att.maps["peers"].items()}
    used |= {v.template_id for _, v in att.maps["templates"].items()}
    for peer_id in range(MAX_PEERS):
        if peer_id not in used:
            return peer_id
    raise MrcError(f"all {MAX_PEERS} rows of paths are in use (peers with paths of their own and "
                   f"templates): share templates (mrcctl path template add)")


def learnt(att: Attachment, peer_id: int) -> layout.PeerState:
    """The peer's learnt state (peer_state), or the zeroed state a first
    packet would create."""
    state = att.maps["peer_state"].lookup(layout.Index(peer_id))
    return state if state is not None else layout.PeerState()


def change_learnt(att: Attachment, peer_id: int, change) -> None:
    """Apply `change(state)` to the peer's learnt state if it has any (none:
    its first packet starts it zeroed anyway).  The value is written back
    whole, over what the datapath changed meanwhile: only when `change`
    changed something."""
    state = att.maps["peer_state"].lookup(layout.Index(peer_id))
    if state is None:
        return
    before = bytes(state)
    change(state)
    if bytes(state) != before:
        att.maps["peer_state"].update(layout.Index(peer_id), state)


def forget_peer(att: Attachment, peer_id: int) -> None:
    """A new peer in a reused row starts with no learnt state."""
    att.maps["peer_state"].delete(layout.Index(peer_id))


def row_learnt(att: Attachment, row: int) -> layout.RowState:
    """What the datapath learnt of the paths of ROW (a template's, or an
    own-path peer's: its template_id), shared by the row's peers."""
    state = att.maps["row_state"].lookup(layout.Index(row))
    return state if state is not None else layout.RowState()


def change_row(att: Attachment, row: int, change) -> None:
    """Apply `change(state)` to ROW's learnt path state, written back
    whole (as change_learnt) only when `change` changed something."""
    state = row_learnt(att, row)
    before = bytes(state)
    change(state)
    if bytes(state) != before:
        att.maps["row_state"].update(layout.Index(row), state)


def forget_row(att: Attachment, row: int) -> None:
    """A row given to a new peer or template starts with no verdicts."""
    att.maps["row_state"].update(layout.Index(row), layout.RowState())


def forget_paths(att: Attachment, peer: layout.Peer, path_ids: list[int]) -> None:
    """New paths in ids used before: no verdict, health or counters of the
    old ones in the row, and for the peer, never yet acknowledged (its
    other peers' clocks of those ids run out or are met as before)."""
    def fresh_row(state):
        for i in path_ids:
            state.paths[i] = layout.PathState()

    def fresh_clock(state):
        for i in path_ids:
            state.clocks[i] = layout.PathClock()
    change_row(att, peer.template_id, fresh_row)
    change_learnt(att, peer.peer_id, fresh_clock)


def used_paths(att: Attachment, peer: layout.Peer) -> list[tuple[int, layout.Path]]:
    """(path id, path) of the peer's paths in use (its template's, for a
    template's peer: the last hop left open)."""
    paths = att.maps["paths"]
    out = []
    for i in range(peer.n_paths):
        path = paths.lookup(path_index(peer.template_id, i))
        if path.state != UNUSED:
            out.append((i, path))
    return out


def route_mtu(att: Attachment, peer: layout.Peer) -> int:
    return att.config.mtu - max(overhead(p) for _, p in used_paths(att, peer))


def lookup_peer(att: Attachment, prefix, own: bool = True) -> tuple[layout.PeerKey, layout.Peer]:
    """The peer entry of PREFIX; with `own`, one with paths of its own
    (a template's peer is changed through its template)."""
    key = peer_key(prefix)
    peer = att.maps["peers"].lookup_exact(key)
    if peer is None:
        raise MrcError(f"no paths to {prefix} on {att.device}")
    if own and peer.flags & LAST_HOP:
        raise MrcError(f"{prefix} has the paths of a template: change the template "
                       f"(mrcctl path template ...)")
    return key, peer


class UsedCache:
    """used_paths per row, read once: a template's many peers share one."""

    def __init__(self, att: Attachment):
        self.att, self.rows = att, {}

    def __call__(self, peer: layout.Peer) -> list[tuple[int, layout.Path]]:
        key = (peer.template_id, peer.n_paths)
        if key not in self.rows:
            self.rows[key] = used_paths(self.att, peer)
        return self.rows[key]


def stands_in(att: Attachment, peer: layout.Peer, row: layout.RowState) -> dict[int, list[int]]:
    """Spare id -> the paths out (down_ns, in the row's learnt state ROW)
    whose turns it takes, as TX chooses (lib/path_select.h,
    path_select_spare: a spare not out itself; TX leaves a path's turn to
    it except for the packet that probes the path)."""
    spares = att.maps["spares"].lookup(layout.Index(peer.template_id))
    out: dict[int, list[int]] = {}
    if spares is None:
        return out
    for i in range(MAX_PATHS):
        c = spares.of[i]
        if c and row.paths[i].live.down_ns and not row.paths[c - 1].live.down_ns:
            out.setdefault(c - 1, []).append(i)
    return out


def path_state(att: Attachment, peer: layout.Peer, path_id: int, path: layout.Path,
               state: layout.PeerState | None = None, row: layout.RowState | None = None) -> str:
    """up, assumed-bad (taken out by the datapath, probed), skip (up, left
    out of the spray for a few turns: the peer reported CE on it), denied
    (by the operator), spare (a spare EV held back: standing in for no
    path out) or unknown (never yet acknowledged by the peer).
    The first four are the row's (shared by a template's peers), unknown
    the peer's own."""
    if path.state == DENIED:
        return STATE_DENIED
    row = row_learnt(att, peer.template_id) if row is None else row
    if row.paths[path_id].live.down_ns:
        return STATE_BAD
    if path.flags & SPARE and not stands_in(att, peer, row).get(path_id):
        return STATE_SPARE
    if row.paths[path_id].live.skip_left:
        return STATE_SKIP
    state = learnt(att, peer.peer_id) if state is None else state
    if not state.clocks[path_id].acked_ns:
        return STATE_UNKNOWN
    return STATE_UP
