"""A row's spray lists: the order the datapath takes a peer's paths in,
per traffic class, and the floor and SID index that go with them.
Rewritten whenever a row's paths, weights or policy change.
"""
from __future__ import annotations

import ipaddress

from mrc_ebpf.control.path_spec import ENTROPY, SPARE, hop_of
from mrc_ebpf.control.peer_table import (MAX_CLASSES, POLICIES, SLOTS, UP, change_row,
                                         used_paths)
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.datapath.offload import TURN_MAX_BYTES


def smooth_weighted(weights: dict[int, int], slots: int = SLOTS) -> list[int]:
    """Path ids repeated by weight and interleaved (smooth weighted round
    robin), at most `slots` long; weights are scaled down to fit."""
    total = sum(weights.values())
    if total > slots:
        weights = {k: max(1, w * slots // total) for k, w in weights.items()}
        while sum(weights.values()) > slots:
            biggest = max(weights, key=weights.get)
            weights[biggest] -= 1
        total = sum(weights.values())
    current = {k: 0 for k in weights}
    order = []
    for _ in range(total):
        for k, w in weights.items():
            current[k] += w
        pick = max(current, key=lambda k: (current[k], -k))
        current[pick] -= total
        order.append(pick)
    return order


def rebuild(att: Attachment, peer: layout.Peer, sids: bool = True, leave_out: frozenset = frozenset()) -> None:
    """Spray lists of every class, and the SID -> peer index for feedback.

    Class k sprays over the paths reserved for it, or the shared paths
    (class 0) when it has none; class 0 only over the shared ones.
    LEAVE_OUT: path ids left out as if not up (a path about to be
    rewritten in place: templates.replace_paths)."""
    used = [(i, p) for i, p in used_paths(att, peer) if p.state == UP and i not in leave_out]
    # bytes, adaptive: a turn follows the peer's own packets, a segment or
    # a burst (lib/path_select.h), so it holds whatever the granularity
    # now is; the quantum only bounds it, and says turns are of bytes
    quantum = TURN_MAX_BYTES if used else 0
    # spares are in no list: they take an out path's turns (spares_of)
    sprayed = [(i, p) for i, p in used if not p.flags & SPARE]
    shared = [(i, p) for i, p in sprayed if p.tclass == 0]
    lists = []
    for tclass in range(MAX_CLASSES):
        members = [(i, p) for i, p in sprayed if p.tclass == tclass] if tclass else []
        members = members or shared
        if peer.policy == POLICIES["weighted"]:
            ids = smooth_weighted({i: p.weight for i, p in members})
        else:
            # EVs with traced hops rotate over them (rotation, below)
            ids = rotation(members, SLOTS) or [i for i, _ in members]
        spray = layout.Spray(n=len(ids), quantum=quantum)
        spray.ids[:len(ids)] = ids
        lists.append((layout.Index(peer.peer_id * MAX_CLASSES + tclass), spray))
    att.maps["spray"].update_many(lists)
    # the floor (min_active): how many may be used, how many the datapath took out
    # and which of them leave by each plane's device (a peer's port status: bpf/lib/ports.h);
    # spares count: one in use stands in for a path taken out
    att.maps["peer_floor"].update(layout.Index(peer.peer_id), floor_of(att, used))
    plan = spares_of(used)
    if plan:
        spares = layout.Spares()
        for i, spare in plan.items():
            spares.of[i] = spare + 1
        att.maps["spares"].update(layout.Index(peer.peer_id), spares)
    elif att.maps["spares"].lookup(layout.Index(peer.peer_id)) is not None:
        att.maps["spares"].delete(layout.Index(peer.peer_id))

    def recount(state):
        state.floor_out = sum(1 for i, _ in used if state.paths[i].live.down_ns)
    change_row(att, peer.template_id, recount)
    if not sids:
        return
    by_sid = att.maps["peer_by_sid"]
    for key, value in list(by_sid.items()):
        if value.value == peer.peer_id:
            by_sid.delete(key)
    for _, path in used_paths(att, peer):
        by_sid.update(layout.Sid.from_buffer_copy(bytes(path.peer_sid)), layout.u32(peer.peer_id))


def plane_of(path: layout.Path) -> tuple:
    """What a spare must share with the path it stands in for: the
    device, the traffic class and the first-tier hop `path trace
    --order` recorded (None: not traced)."""
    return path.oif, path.tclass, hop_of(path)


def spares_of(used: list[tuple[int, layout.Path]]) -> dict[int, int]:
    """Path id -> the spare EV (id) that takes its turns while it is out
    (struct mrc_spares): among the usable spares of its plane (plane_of;
    an EV with no recorded hop: of its device and class), the plane's EVs
    in id order take the plane's spares in turn, so that paths out
    together stand on different spares while there are enough.  Only
    entropy paths have spares; a plane without spares: none."""
    spares = [(i, p) for i, p in used if p.flags & SPARE]
    if not spares:
        return {}
    by_plane: dict[tuple, list[int]] = {}
    for i, p in spares:
        by_plane.setdefault(plane_of(p), []).append(i)
    by_dev: dict[tuple, list[int]] = {}
    for i, p in spares:
        by_dev.setdefault(plane_of(p)[:2], []).append(i)
    taken: dict[tuple, int] = {}
    out = {}
    for i, p in used:
        if p.flags & SPARE or not p.flags & ENTROPY:
            continue
        plane = plane_of(p)
        group = by_plane.get(plane) if plane[2] is not None else by_dev.get(plane[:2])
        if not group:
            continue
        k = taken.get(plane, 0)
        taken[plane] = k + 1
        out[i] = group[k % len(group)]
    return out


def floor_of(att: Attachment, used: list[tuple[int, layout.Path]]) -> layout.PeerFloor:
    """The row's peer_floor: its usable paths, and per plane (the index of
    the path's device in config.devices) the bitmap of their ids."""
    floor = layout.PeerFloor(usable=len(used))
    cfg = att.maps["config"].lookup(layout.Index(0))
    planes = {cfg.devices[i].ifindex: i for i in range(min(cfg.n_devices, len(cfg.devices)))} if cfg else {}
    for i, p in used:
        plane = planes.get(p.oif)
        if plane is not None:
            floor.plane_paths[plane].ids[i // 64] |= 1 << (i % 64)
    return floor


def rotation(members: list[tuple[int, layout.Path]], slots: int) -> list[int] | None:
    """The spray order of `members` (path id, path) when some have a
    recorded hop, else None (id order).  Hops in address order; in each
    round every hop gets one turn, its EVs in id order, so consecutive
    turns go to different hops and each hop gets the same count.  Rounds:
    as many as the biggest hop has EVs (at most what `slots` takes), so
    every EV is in the list -- carrying, acknowledged, probed when down;
    the EVs of a hop with fewer take two turns (or more) per list.  A
    smaller hop's EVs are repeated rather than a bigger hop's surplus left
    out as spares: an EV left out is never acknowledged nor probed, and a
    spare brought in on failover would need the control plane in the loop.
    EVs without a hop (no answer to the trace) go at the end, once each."""
    groups: dict[ipaddress.IPv6Address, list[int]] = {}
    loose = []
    for i, p in members:
        hop = hop_of(p)
        if hop is None:
            loose.append(i)
        else:
            groups.setdefault(hop, []).append(i)
    if not groups:
        return None
    order = [sorted(groups[h]) for h in sorted(groups)]
    rounds = max(len(g) for g in order)
    rounds = max(1, min(rounds, (slots - len(loose)) // len(order)))
    out = [g[r % len(g)] for r in range(rounds) for g in order]
    return out + sorted(loose)
