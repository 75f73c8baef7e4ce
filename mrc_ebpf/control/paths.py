"""Path sets: which segment lists reach which peer prefix.

A peer prefix owns a row (peer_id) of MRC_MAX_PATHS path slots; paths
0..n_paths-1 are in use.  Writes go path first, peer last, so the
datapath never sees a path count that covers a half-written path.
What the datapath learns about a row's paths (up or down, health,
counters) is in row_state, shared by a template's peers (`row_learnt`);
what it learns about a peer (sequence numbers, acknowledgements) in the
peer_state LRU, created by the peer's first packet: `learnt` reads it
(zero when there is none yet, or it was evicted).
"""
from __future__ import annotations

import ctypes
import ipaddress

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.control import classes
from mrc_ebpf.control import shared_fate
# Also the names other modules know as paths.X (constants, parsers, keys).
from mrc_ebpf.control.path_spec import (ENTROPY, MAX_SEGMENTS, MAX_WEIGHT, REDIRECT, SPARE, USID,  # noqa: F401
                                        PathSpec, addr_text, encode, encoding_of, exact_prefix, flowlabel,
                                        hop_of, hops_of, overhead, parse_peer_sid, parse_prefix,
                                        parse_segments, parse_usid, segments_of, unique_labels)
from mrc_ebpf.control.peer_table import (DENIED, LAST_HOP, MAX_CLASSES, MAX_PATHS, MAX_PEERS,  # noqa: F401
                                         POLICIES, POLICY_NAMES, STATE_BAD, STATE_DENIED, STATE_SKIP, STATE_SPARE,
                                         STATE_UNKNOWN, STATE_UP, UP, UsedCache, change_learnt, change_row,
                                         forget_paths, forget_peer, forget_row, free_peer_id, key_prefix, learnt,
                                         lookup_peer, path_index, path_state, peer_key, route_mtu, row_learnt,
                                         stands_in, used_paths)
from mrc_ebpf.control.config.schema import DEFAULT_POLICY
from mrc_ebpf.control.spray import rebuild
from mrc_ebpf.datapath import routes
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError


def route_metrics(att: Attachment, prefix) -> dict[str, str]:
    """The TCP metrics on the peer route as installed (routes.DEFAULT_TCP_METRICS
    with the user's overrides), read back from the kernel."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        route = routes.find(ipr, prefix, att.ifindexes)
        return routes.tcp_metrics_of(route) if route is not None else {}


def _sync_route(att: Attachment, prefix, peer: layout.Peer,
                overrides: dict[str, str | None] | None = None) -> None:
    """The peer route goes via the first used path's first hop; paths with
    another first hop (another router, another plane's device) are
    redirected to theirs by the datapath.  The route keeps the TCP metrics
    it has (a new one gets the defaults), with `overrides` applied."""
    from pyroute2 import IPRoute
    paths = att.maps["paths"]
    used = used_paths(att, peer)
    first = used[0][1]
    index = first.oif
    with IPRoute() as ipr:
        att.route_change(ipr, prefix)
        current = routes.find(ipr, prefix, att.ifindexes)
        tcp = dict(routes.DEFAULT_TCP_METRICS) if current is None else routes.tcp_metrics_of(current)
        tcp.update(overrides or {})
        for other in att.ifindexes:     # it may have moved to another plane
            if other != index:
                routes.remove(ipr, prefix, other)
        routes.install(ipr, prefix, addr_text(first.nexthop), index, route_mtu(att, peer), tcp)
    for i, path in used:
        redirect = path.oif != index or bytes(path.nexthop) != bytes(first.nexthop)
        flags = (path.flags | REDIRECT) if redirect else (path.flags & ~REDIRECT)
        if flags != path.flags:
            path.flags = flags
            paths.update(path_index(peer.peer_id, i), path)


def _same_path(path: layout.Path, spec: PathSpec) -> bool:
    return bool(path.flags & USID) == spec.usid and bool(path.flags & ENTROPY) == spec.entropy and \
        bool(path.flags & SPARE) == spec.spare and segments_of(path) == [str(s) for s in spec.segments]


def _check_sid_room(att: Attachment, specs: list[PathSpec]) -> None:
    """peer_by_sid must take every new peer SID: refuse before writing."""
    by_sid = att.maps["peer_by_sid"]
    known = {bytes(k) for k in by_sid.keys()}
    new = {spec.peer_sid.packed for spec in specs} - known
    if len(known) + len(new) > by_sid.max_entries:
        raise MrcError(f"the peer SID table is full: {len(known)} of {by_sid.max_entries} SIDs in "
                       f"use, these paths need {len(new)} more")


def add(att: Attachment, prefix_text: str, vias: list[str] = (), weight: int = 1,
        tclass_name: str | None = None, usids: list[str] = (), entropy: int = 0,
        entropy_sid: str | None = None, route_metrics_: list[str] = (), spare: int = 0) -> list[dict]:
    """Add paths in one go: segment lists ("S1,S2"), uSID containers and
    `entropy` entropy paths (EVs) to the peer SID `entropy_sid`, and
    `spare` more EVs held back as spares (each stands in for an EV of its
    plane while that one is out: control/spray.py, spares_of);
    `route_metrics_` (KEY=VALUE) override the peer route's TCP metrics.

    A path the prefix already has (same segments, same encoding) is left
    as it is and reported with "existed": True; one that differs from the
    existing only in weight or class is refused.  Entropy paths count: a
    peer with k EVs to the SID keeps them, and only N - k more are added."""
    from pyroute2 import IPRoute
    overrides = dict(routes.parse_metric(m) for m in route_metrics_)
    specs = [PathSpec.via(v) for v in vias] + [PathSpec.compressed(u) for u in usids]
    if spare and not entropy:
        raise MrcError("--spare M needs --entropy N (spares are entropy paths, held back for the N)")
    if entropy or entropy_sid:
        if not entropy_sid:
            raise MrcError("--entropy N needs --sid PEER_SID (where the entropy paths end)")
        if not 1 <= entropy <= MAX_PATHS:
            raise MrcError(f"bad --entropy {entropy}: 1..{MAX_PATHS} paths")
        if not 0 <= spare <= MAX_PATHS - entropy:
            raise MrcError(f"bad --spare {spare}: 0..{MAX_PATHS - entropy} (entropy and spare paths "
                           f"together at most {MAX_PATHS})")
        sid = parse_peer_sid(entropy_sid)
        specs += [PathSpec.ev(sid) for _ in range(entropy)] + [PathSpec.ev(sid, True) for _ in range(spare)]
    if not specs:
        raise MrcError("a path needs --via SEG1,SEG2,..., --usid CONTAINER or --entropy N --sid SID")
    prefix = parse_prefix(prefix_text)
    if not 1 <= weight <= MAX_WEIGHT:
        raise MrcError(f"bad weight {weight}: 1..{MAX_WEIGHT}")
    tclass = classes.class_id(att, tclass_name) if tclass_name else 0
    seen = set()
    for spec in specs:
        if spec.entropy:
            continue        # each is another EV towards the same SID
        ident = (spec.usid, tuple(spec.segments))
        if ident in seen:
            raise MrcError(f"the same path is given twice: {_describe_spec(spec)}")
        seen.add(ident)
    peers = att.maps["peers"]
    key = peer_key(prefix)
    peer = peers.lookup_exact(key)
    if peer is not None and peer.flags & LAST_HOP:
        raise MrcError(f"{prefix} has the paths of a template: `mrcctl path del {prefix}` first "
                       f"to give it paths of its own")
    new_peer = peer is None
    if new_peer:
        row = free_peer_id(att)
        peer = layout.Peer(peer_id=row, n_paths=0, policy=POLICIES[DEFAULT_POLICY], template_id=row)
    used = used_paths(att, peer) if not new_peer else []
    class_label = tclass_name or classes.DEFAULT
    existing, fresh, matched = [], [], set()
    for spec in specs:
        match = next(((i, p) for i, p in used if i not in matched and _same_path(p, spec)), None)
        if match is None:
            fresh.append(spec)
            continue
        path_id, path = match
        matched.add(path_id)
        if (path.weight, path.tclass) != (weight, tclass):
            have = classes.names(att).get(path.tclass, str(path.tclass))
            raise MrcError(f"{prefix} already has path {path_id} {_describe_spec(spec)} with weight "
                           f"{path.weight}, class {have}: `mrcctl path del {prefix} --id {path_id}` "
                           f"first to change them")
        existing.append({"prefix": str(prefix), "path_id": path_id, **spec.describe(),
                         "weight": weight, "class": class_label, "overhead": spec.overhead,
                         "existed": True})
    if not fresh:
        mtu = route_mtu(att, peer)
        return [{**r, "route_mtu": mtu} for r in existing]
    used_ids = {i for i, _ in used}
    free_ids = [i for i in range(MAX_PATHS) if i not in used_ids]
    if len(free_ids) < len(fresh):
        raise MrcError(f"{prefix} has room for {len(free_ids)} more paths, not {len(fresh)} "
                       f"(at most {MAX_PATHS})")
    _check_sid_room(att, fresh)
    # check everything before touching any map; a failure after this is
    # rolled back by the attachment's journal (Attachment.transaction)
    resolved = []
    attached = att.ifindexes
    hops: dict[str, tuple[int, str]] = {}     # paths often share a first hop: one lookup each
    mtu = att.config.mtu
    with IPRoute() as ipr:
        for spec in fresh:
            if mtu - spec.overhead < (1280 if prefix.version == 6 else 576):
                raise MrcError(f"{len(spec.segments)} segments leave less than the minimum MTU on "
                               f"{att.device} (MTU {mtu}, overhead {spec.overhead})")
            first = str(spec.first_hop)
            if first not in hops:
                hops[first] = routes.next_hop(ipr, first)
            oif, gateway = hops[first]
            if oif not in attached:
                name = ipr.get_links(oif)[0].get_attr("IFLA_IFNAME") if oif else "?"
                raise MrcError(f"first hop {spec.first_hop} is routed out of {name}, "
                               f"where mrc-ebpf is not attached")
            resolved.append((oif, gateway))

    results = []
    taken = {p.flowlabel for _, p in used_paths(att, peer)} if not new_peer else set()
    labels = unique_labels(prefix, free_ids, fresh, taken)
    for path_id, spec, (oif, gateway), label in zip(free_ids, fresh, resolved, labels):
        path = encode(spec, ipaddress.IPv6Address(gateway), oif, label, weight, tclass)
        index = path_index(peer.peer_id, path_id)
        att.maps["paths"].update(index, path)
        shared_fate.assign(att, index, path)
        peer.n_paths = max(peer.n_paths, path_id + 1)
        results.append({"prefix": str(prefix), "path_id": path_id, **spec.describe(), "flowlabel": label,
                        "weight": weight, "class": class_label,
                        "overhead": spec.overhead, "existed": False})
    if new_peer:
        forget_peer(att, peer.peer_id)
        forget_row(att, peer.template_id)
    forget_paths(att, peer, [r["path_id"] for r in results])
    rebuild(att, peer)       # spray lists first: the peer entry makes them live
    peers.update(key, peer)
    _sync_route(att, prefix, peer, overrides)
    mtu = route_mtu(att, peer)
    metrics = route_metrics(att, prefix)
    return [{**r, "route_mtu": mtu, "route_metrics": metrics} for r in existing + results]


def _describe_spec(spec: PathSpec) -> str:
    return f"usid {spec.segments[0]}" if spec.usid else f"via {','.join(map(str, spec.segments))}"


def set_denied(att: Attachment, prefix_text: str, path_ids: list[int], deny: bool) -> dict:
    """Deny paths (never used nor probed) or allow them again (fresh: no
    datapath verdict carried over)."""
    prefix = parse_prefix(prefix_text)
    key, peer = lookup_peer(att, prefix)
    used = dict(used_paths(att, peer))
    for path_id in path_ids:
        if path_id not in used:
            raise MrcError(f"{prefix} has no path {path_id} (it has "
                           f"{', '.join(map(str, sorted(used)))})")
    # TX drops a packet whose path is not up: a path being denied leaves
    # the spray lists first, and the kernel is waited on until no packet
    # that chose it from the old lists is still on its way (as
    # templates.replace_paths), so draining loses none
    going = frozenset(i for i in path_ids if deny and used[i].state == UP)
    if going:
        from mrc_ebpf.datapath import bpfsys
        rebuild(att, peer, leave_out=going)
        bpfsys.wait_for_programs()
    changed = []
    for path_id in path_ids:
        path = used[path_id]
        want = DENIED if deny else UP
        if path.state == want:
            continue
        index = path_index(peer.peer_id, path_id)
        if not deny:
            def fresh(state, i=path_id):
                state.paths[i].live = layout.PathLive()
            change_row(att, peer.template_id, fresh)
        path.state = want
        att.maps["paths"].update(index, path)
        changed.append(path_id)
    if not deny:
        def unheard(state):
            for i in changed:
                state.clocks[i] = layout.PathClock()
        change_learnt(att, peer.peer_id, unheard)
    rebuild(att, peer)
    left = sum(1 for _, p in used_paths(att, peer) if p.state == UP)
    return {"prefix": str(prefix), "action": "deny" if deny else "allow", "path_ids": list(path_ids),
            "changed": changed, "usable": left}


def set_denied_hop(att: Attachment, hop_text: str, deny: bool, prefix_text: str | None = None) -> list[dict]:
    """Deny (or allow) every path of every peer (or of one prefix) that
    crosses the SID `hop_text`: draining a switch for maintenance."""
    try:
        hop = ipaddress.IPv6Address(hop_text.strip())
    except ValueError:
        raise MrcError(f"bad --hop {hop_text!r}: expected a SID (IPv6 address)")
    only = peer_key(parse_prefix(prefix_text)) if prefix_text else None
    if only is not None:
        lookup_peer(att, parse_prefix(prefix_text))
    results = []
    for key, peer in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        if only is not None and bytes(key) != bytes(only):
            continue
        ids = [i for i, p in used_paths(att, peer) if hop in hops_of(p)]
        if ids:
            results.append(set_denied(att, str(key_prefix(key)), ids, deny))
    if not results:
        raise MrcError(f"no path crosses {hop}")
    return results


def delete(att: Attachment, prefix_text: str, path_id: int | None = None) -> dict:
    """Delete all of a prefix's paths, or one; the others keep their ids
    (and so their sequence numbers: the receiver sees no false loss)."""
    from pyroute2 import IPRoute
    prefix = parse_prefix(prefix_text)
    key, peer = lookup_peer(att, prefix, own=False)
    if peer.flags & LAST_HOP:
        if path_id is not None:
            raise MrcError(f"{prefix} has its template's paths: change the template, or "
                           f"`mrcctl path del {prefix}` the peer")
        from mrc_ebpf.control import templates
        return templates.delete_peer(att, key, peer, prefix)
    used = dict(used_paths(att, peer))
    if path_id is not None and path_id not in used:
        raise MrcError(f"{prefix} has no path {path_id} (it has {', '.join(map(str, sorted(used)))})")
    if path_id is None or len(used) == 1:
        att.maps["peers"].delete(key)
        forget_peer(att, peer.peer_id)
        with IPRoute() as ipr:
            att.route_change(ipr, prefix)
            for index in att.ifindexes:
                routes.remove(ipr, prefix, index)
        for i in used:
            att.maps["paths"].update(path_index(peer.peer_id, i), layout.Path())
        rebuild(att, peer)
        return {"prefix": str(prefix), "removed": "peer"}
    att.maps["paths"].update(path_index(peer.peer_id, path_id), layout.Path())
    rebuild(att, peer)
    _sync_route(att, prefix, peer)
    return {"prefix": str(prefix), "removed": "path", "path_id": path_id}


def set_policy(att: Attachment, prefix_text: str, policy: str) -> dict:
    if policy not in POLICIES:
        raise MrcError(f"bad policy {policy!r}: one of {', '.join(POLICIES)}")
    prefix = parse_prefix(prefix_text)
    key, peer = lookup_peer(att, prefix)
    peer.policy = POLICIES[policy]
    rebuild(att, peer)
    att.maps["peers"].update(key, peer)
    return {"prefix": str(prefix), "policy": policy}


def _with_last_hop(path: layout.Path, peer: layout.Peer) -> layout.Path:
    """A template's path as the datapath sends it to this peer."""
    if not peer.flags & LAST_HOP:
        return path
    mine = layout.Path.from_buffer_copy(bytes(path))
    ctypes.memmove(mine.segments[0].addr, bytes(peer.sid.addr), 16)
    ctypes.memmove(mine.peer_sid.addr, bytes(peer.sid.addr), 16)
    return mine


def peers(att: Attachment) -> list[dict]:
    used = UsedCache(att)
    out = []
    for k, p in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        row = {"prefix": str(key_prefix(k)), "peer_id": p.peer_id,
               "policy": POLICY_NAMES.get(p.policy, str(p.policy)), "paths": len(used(p))}
        if p.flags & LAST_HOP:
            row.update(template_row=p.template_id, sid=addr_text(p.sid))
        else:
            row["route_metrics"] = route_metrics(att, key_prefix(k))
        out.append(row)
    return out


def list_paths(att: Attachment, every_template_peer: bool = False) -> list[dict]:
    """Every path of every peer with paths of its own, and of each
    template's peer that has learnt state (has been sent to lately): the
    others are the template's paths, unused.  every_template_peer: those
    too, with the zeroed state their first packet would start (the
    exporter shows template peers before they carry traffic)."""
    rows = []
    names = classes.names(att)
    now = _monotonic_ns()
    used = UsedCache(att)
    rows_learnt: dict[int, layout.RowState] = {}
    for key, peer in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        prefix = key_prefix(key)
        if peer.flags & LAST_HOP:
            peer_state = att.maps["peer_state"].lookup(layout.Index(peer.peer_id))
            if peer_state is None:
                if not every_template_peer:
                    continue
                peer_state = layout.PeerState()
            metrics = {}
        else:
            metrics = route_metrics(att, prefix)
            peer_state = learnt(att, peer.peer_id)
        if peer.template_id not in rows_learnt:
            rows_learnt[peer.template_id] = row_learnt(att, peer.template_id)
        row = rows_learnt[peer.template_id]
        standing = stands_in(att, peer, row)
        # bytes, adaptive: the turn the peer's packets have made (None
        # before its first packet)
        turns = peer.policy in (POLICIES["bytes"], POLICIES["adaptive"])
        turn_bytes = (peer_state.tx.turn_len or None) if turns else None
        for path_id, path in used(peer):
            path = _with_last_hop(path, peer)
            mine = row.paths[path_id]
            health, live = mine.health, mine.live
            state = path_state(att, peer, path_id, path, peer_state, row)
            rows.append({
                "prefix": str(prefix), "path_id": path_id, "segments": segments_of(path),
                "encoding": encoding_of(path),
                "peer_sid": addr_text(path.peer_sid), "oif": path.oif,
                "state": state, "weight": path.weight, "downs": live.downs,
                # congestion: turns still to skip, the peer's reports that said CE
                "skip_left": live.skip_left, "ce_reports": live.ce_reports,
                # down: the interval to its next probe (doubling up to --probe-max-us)
                "probe_gap_ms": round(live.probe_gap_us / 1e3, 3) if live.down_ns else None,
                "class": names.get(path.tclass, str(path.tclass)),
                "policy": POLICY_NAMES.get(peer.policy, str(peer.policy)),
                "turn_bytes": turn_bytes,
                "flowlabel": path.flowlabel, "ev": path.flowlabel if path.flags & ENTROPY else None,
                # a spare EV, and the paths out whose turns it takes now
                "spare": bool(path.flags & SPARE), "stands_in_for": standing.get(path_id, []),
                "hop": str(hop_of(path) or "") or None,
                "overhead": overhead(path),
                # the peer's own packets on the path (the sequence numbers
                # it took); bytes are counted per row: a template's peers
                # share theirs (its peers' total: "template": true)
                "tx_packets": peer_state.next_seq(path_id),
                "tx_bytes": mine.tx_bytes,
                "next_seq": peer_state.next_seq(path_id),
                "nexthop": addr_text(path.nexthop), "redirect": bool(path.flags & REDIRECT),
                "route_metrics": metrics, "template": bool(peer.flags & LAST_HOP),
                "feedback": None if not health.updated_ns else {
                    "qdelay_us": health.qdelay_us, "lost": health.lost,
                    "age_ms": round((now - health.updated_ns) / 1e6, 1),
                    # since the peer last reported congestion (CE, trim):
                    # its ack clock waits longer while < reorder_max
                    "congested_ms": congested_ms(health.ce_stamp, now)},
            })
    return rows


def congested_ms(stamp: int, now: int) -> float | None:
    """Milliseconds since the congestion news path_health.ce_stamp notes
    (16 bits of 2^MRC_CE_STAMP_SHIFT ns: known modulo 68.7 s); None: never."""
    if not stamp:
        return None
    shift = C["MRC_CE_STAMP_SHIFT"]
    return round((((now >> shift) - stamp) & 0xFFFF) * (1 << shift) / 1e6, 1)


def _monotonic_ns() -> int:
    import time
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def set_attrs(att: Attachment, prefix_text: str, path_id: int, weight: int, tclass: int) -> dict:
    """Change a path's weight and class in place: it keeps its id,
    sequence numbers and counters (`mrcctl apply` of a changed file)."""
    if not 1 <= weight <= MAX_WEIGHT:
        raise MrcError(f"bad weight {weight}: 1..{MAX_WEIGHT}")
    prefix = parse_prefix(prefix_text)
    key, peer = lookup_peer(att, prefix)
    used = dict(used_paths(att, peer))
    if path_id not in used:
        raise MrcError(f"{prefix} has no path {path_id}")
    path = used[path_id]
    if (path.weight, path.tclass) != (weight, tclass):
        path.weight, path.tclass = weight, tclass
        att.maps["paths"].update(path_index(peer.peer_id, path_id), path)
        rebuild(att, peer)
    return {"prefix": str(prefix), "path_id": path_id, "weight": weight, "tclass": tclass}


def set_route_metrics(att: Attachment, prefix_text: str, metrics: dict[str, str | None]) -> dict:
    """Make the peer route's TCP metrics exactly METRICS (parse_metric's
    values; a key absent or None is removed)."""
    prefix = parse_prefix(prefix_text)
    _, peer = lookup_peer(att, prefix)
    overrides = {k: None for k in routes.DEFAULT_TCP_METRICS}
    overrides.update({k: None for k in route_metrics(att, prefix)})
    overrides.update(metrics)
    _sync_route(att, prefix, peer, overrides)
    return {"prefix": str(prefix), "route_metrics": route_metrics(att, prefix)}


def configured(att: Attachment) -> list[dict]:
    """What was configured, without the counters and learnt state
    list_paths reads: per peer (by peer id) its prefix, policy, route
    metrics and paths (by path id).  One route dump for every peer."""
    from pyroute2 import IPRoute
    names = classes.names(att)
    with IPRoute() as ipr:
        installed = {}
        for family in (4, 6):
            for route in routes.ours(ipr, family, att.ifindexes):
                installed[(family, route.get_attr("RTA_DST"), route["dst_len"])] = route
    out = []
    from mrc_ebpf.control import bulk     # template peers are blocks (control/blocks.py), not listed here
    for key, peer in sorted(bulk.own_peers(att), key=lambda kv: kv[1].peer_id):
        prefix = key_prefix(key)
        route = installed.get((prefix.version, str(prefix.network_address), prefix.prefixlen))
        out.append({"prefix": str(prefix), "peer_id": peer.peer_id,
                    "policy": POLICY_NAMES.get(peer.policy, str(peer.policy)),
                    "route_metrics": routes.tcp_metrics_of(route) if route is not None else {},
                    "paths": [{"path_id": i, "encoding": encoding_of(p), "segments": segments_of(p),
                               "spare": bool(p.flags & SPARE),
                               "peer_sid": addr_text(p.peer_sid), "weight": p.weight,
                               "class": names.get(p.tclass, str(p.tclass)), "denied": p.state == DENIED}
                              for i, p in used_paths(att, peer)]})
    return out
