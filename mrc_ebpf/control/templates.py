"""Path templates, and the many peers that share them.

A template is a named row of paths (the spines and planes towards one
destination leaf) whose last hop is left open; a peer added with
`--template NAME --sid SID` is one LPM entry that points at the template's
row and carries its own SID, which the datapath puts in as the last hop of
each path (bpf/lib/template.h).  What is learnt of the paths (up or
down, health, counters) is the template row's, shared by its peers
(row_state: a spine that fails fails for all of them); what is learnt of a
peer (sequence numbers, acknowledgements) is its own, in peer_state, under
its own peer_id; those ids start above the rows (MRC_MAX_PEERS) so they
never meet an own-path peer's.  Adding a peer is two map writes and, unless it is left to an
aggregate route, one kernel route: 131,072 of them fit in the maps'
memory target (docs/design/scale.md).
"""
from __future__ import annotations

import ctypes
import ipaddress

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.control import bulk, classes, shared_fate
from mrc_ebpf.control import path_spec, peer_table as pt, spray
from mrc_ebpf.control.config.schema import DEFAULT_POLICY
from mrc_ebpf.datapath import layout, routes
from mrc_ebpf.datapath.journal import InjectedFailure
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import C

LAST_HOP = C["MRC_PEER_F_LAST_HOP"]
MAX_PEER_PREFIXES = C["MRC_MAX_PEER_PREFIXES"]
NAME_MAX = ctypes.sizeof(layout.TemplateName) - 1
OPEN = ipaddress.IPv6Address("::")     # the last hop of a template's path: each peer's own


def name_key(name: str) -> layout.TemplateName:
    raw = name.encode()
    if not name or len(raw) > NAME_MAX or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise MrcError(f"bad template name {name!r}: 1..{NAME_MAX} letters, digits, '-', '_', '.'")
    return layout.TemplateName(raw)


def get(att: Attachment, name: str) -> layout.Peer:
    tpl = att.maps["templates"].lookup(name_key(name))
    if tpl is None:
        raise MrcError(f"no template {name!r} (mrcctl path template add {name} --via SPINE_SID)")
    return tpl


def names(att: Attachment) -> dict[int, str]:
    """row -> template name."""
    return {v.template_id: bytes(k.name).rstrip(b"\0").decode() for k, v in att.maps["templates"].items()}


def rows_in_use(att: Attachment) -> set[int]:
    return {v.template_id for _, v in att.maps["templates"].items()}


def add(att: Attachment, name: str, vias: list[str], weight: int = 1,
        tclass_name: str | None = None) -> list[dict]:
    """Add SRH paths to template NAME (made if new): each --via lists the
    segments before the last hop, which every peer of the template fills
    with its own SID."""
    from pyroute2 import IPRoute
    key = name_key(name)
    if not vias:
        raise MrcError("a template path needs --via SEG1,... (the hops before the peer's own SID)")
    if not 1 <= weight <= path_spec.MAX_WEIGHT:
        raise MrcError(f"bad weight {weight}: 1..{path_spec.MAX_WEIGHT}")
    tclass = classes.class_id(att, tclass_name) if tclass_name else 0
    specs = []
    for via in vias:
        segments = path_spec.parse_segments(via)
        if len(segments) >= path_spec.MAX_SEGMENTS:
            raise MrcError(f"--via {via}: at most {path_spec.MAX_SEGMENTS - 1} segments before the last hop")
        specs.append(path_spec.PathSpec(segments + [OPEN], OPEN, False))
    tpl = att.maps["templates"].lookup(key)
    new = tpl is None
    if new:
        row = pt.free_peer_id(att)
        tpl = layout.Peer(peer_id=row, template_id=row, n_paths=0, policy=pt.POLICIES[DEFAULT_POLICY])
    used = pt.used_paths(att, tpl) if not new else []
    have = {tuple(path_spec.segments_of(p)) for _, p in used}
    fresh = [s for s in specs if tuple(map(str, s.segments)) not in have]
    free_ids = [i for i in range(pt.MAX_PATHS) if i not in {i for i, _ in used}]
    if len(free_ids) < len(fresh):
        raise MrcError(f"template {name} has room for {len(free_ids)} more paths, not {len(fresh)}")
    resolved = []
    with IPRoute() as ipr:
        hops = routes.next_hops(ipr, sorted({str(spec.first_hop) for spec in fresh}))
        for spec in fresh:
            if att.config.mtu - spec.overhead < 1280:
                raise MrcError(f"{len(spec.segments)} segments leave less than the minimum MTU on "
                               f"{att.device} (MTU {att.config.mtu}, overhead {spec.overhead})")
            oif, gateway = hops[str(spec.first_hop)]
            if oif not in att.ifindexes:
                raise MrcError(f"first hop {spec.first_hop} is not routed out of a device "
                               f"mrc-ebpf is attached to")
            resolved.append((oif, gateway))
    taken = {p.flowlabel for _, p in used}
    labels = path_spec.unique_labels(f"template:{name}", free_ids, fresh, taken)
    results, fates = [], []
    for path_id, spec, (oif, gateway), label in zip(free_ids, fresh, resolved, labels):
        path = path_spec.encode(spec, ipaddress.IPv6Address(gateway), oif, label, weight, tclass,
                                path_spec.REDIRECT)
        fates.append((pt.path_index(tpl.template_id, path_id), path))
        tpl.n_paths = max(tpl.n_paths, path_id + 1)
        results.append({"template": name, "path_id": path_id,
                        "segments": [str(s) for s in spec.segments[:-1]] + ["<peer SID>"],
                        "weight": weight, "overhead": spec.overhead})
    att.maps["paths"].update_many(fates)       # one undo step for them all
    shared_fate.assign_many(att, fates)
    if new:
        pt.forget_row(att, tpl.template_id)
    else:
        fresh_ids = [r["path_id"] for r in results]

        def fresh_row(state):
            for i in fresh_ids:
                state.paths[i] = layout.PathState()
        pt.change_row(att, tpl.template_id, fresh_row)
    _rebuild(att, tpl)
    att.maps["templates"].update(key, tpl)
    if not new:
        _refresh_peers(att, tpl)
    return results


def replace_paths(att: Attachment, name: str, changes: list[tuple[int, str, int | None, int | None]]) -> list[dict]:
    """Write new paths into the slots of template NAME's paths: CHANGES
    are (path id, new --via, weight, class id; None keeps the old one's).
    The way to change a full template (no free slot to add before
    deleting), and all or nothing.

    Everything is checked first (ids, segments, first hops, MTU).  Then:
    the ids are taken out of the spray lists (the template's other paths
    carry its peers' packets meanwhile); the kernel is waited on until no
    program still sends on what it read before (bpfsys.wait_for_programs:
    a packet that chose the id from the old lists has left), so none sees
    a half-written path; the new paths are written, what the row learnt of
    the old ones (verdict, health, counters) is forgotten, and the ids go
    back into the spray.  The peers' sequence numbers of the ids go on, so
    the receivers see no gap.  Every write is the transaction's: a failure
    anywhere puts back the old paths, then the old lists."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath import bpfsys
    tpl = get(att, name)
    used = dict(pt.used_paths(att, tpl))
    ids = [c[0] for c in changes]
    if len(set(ids)) != len(ids):
        raise MrcError(f"template {name}: a path id is given twice")
    specs = []
    for path_id, via, _, _ in changes:
        if path_id not in used:
            raise MrcError(f"template {name} has no path {path_id} (it has {len(used)} paths, ids "
                           f"{min(used)}..{max(used)})" if used else f"template {name} has no paths")
        segments = path_spec.parse_segments(via)
        if len(segments) >= path_spec.MAX_SEGMENTS:
            raise MrcError(f"--via {via}: at most {path_spec.MAX_SEGMENTS - 1} segments before the last hop")
        specs.append(path_spec.PathSpec(segments + [OPEN], OPEN, False))
    kept = {tuple(path_spec.segments_of(p)) for i, p in used.items() if i not in ids}
    seen = set()
    for spec in specs:
        ident_ = tuple(map(str, spec.segments))
        if ident_ in kept or ident_ in seen:
            raise MrcError(f"template {name} already has a path via "
                           f"{','.join(map(str, spec.segments[:-1]))}")
        seen.add(ident_)
    # the template's peers' routes carry an MTU for its longest path: a
    # longer one would leave them too big (change those peers instead)
    longest = max(path_spec.overhead(p) for p in used.values())
    for spec in specs:
        if spec.overhead > longest:
            raise MrcError(f"template {name}: a path via {','.join(map(str, spec.segments[:-1]))} adds "
                           f"{spec.overhead} bytes, more than its paths now ({longest}): its peers' route "
                           f"MTU would be too big")
    resolved = []
    with IPRoute() as ipr:
        hops = routes.next_hops(ipr, sorted({str(spec.first_hop) for spec in specs}))
    for spec in specs:
        oif, gateway = hops[str(spec.first_hop)]
        if oif not in att.ifindexes:
            raise MrcError(f"first hop {spec.first_hop} is not routed out of a device mrc-ebpf is attached to")
        resolved.append((oif, gateway))
    taken = {p.flowlabel for i, p in used.items() if i not in ids}
    labels = path_spec.unique_labels(f"template:{name}", ids, specs, taken)
    new_paths = []
    for (path_id, _, weight, tclass), spec, (oif, gateway), label in zip(changes, specs, resolved, labels):
        old = used[path_id]
        weight = old.weight if weight is None else weight
        if not 1 <= weight <= path_spec.MAX_WEIGHT:
            raise MrcError(f"bad weight {weight}: 1..{path_spec.MAX_WEIGHT}")
        path = path_spec.encode(spec, ipaddress.IPv6Address(gateway), oif, label, weight,
                                old.tclass if tclass is None else tclass, path_spec.REDIRECT)
        path.state = old.state          # a denied path stays denied
        new_paths.append((pt.path_index(tpl.template_id, path_id), path))

    out = frozenset(ids)
    spray.rebuild(att, tpl, sids=False, leave_out=out)
    bpfsys.wait_for_programs()
    att.maps["paths"].update_many(new_paths)
    shared_fate.assign_many(att, new_paths)

    def fresh_row(state):
        for i in ids:
            state.paths[i] = layout.PathState()
    pt.change_row(att, tpl.template_id, fresh_row)
    _rebuild(att, tpl)
    return [{"template": name, "path_id": path_id, "replaced": path_vias(used[path_id]),
             "segments": [str(s) for s in spec.segments[:-1]] + ["<peer SID>"], "overhead": spec.overhead}
            for (path_id, *_), spec in zip(changes, specs)]


def _rebuild(att: Attachment, tpl: layout.Peer) -> None:
    """Spray lists and floor of the template's row (no SIDs: its peers
    file theirs)."""
    spray.rebuild(att, tpl, sids=False)


def _refresh_peers(att: Attachment, tpl: layout.Peer) -> None:
    """The template's peers carry its path count and policy: keep them equal."""
    bulk.refresh(att, tpl)


def peer_counts(att: Attachment) -> dict[int, int]:
    """template row -> how many peers use it."""
    counts: dict[int, int] = {}
    for t in bulk.Peers(att).templated().values():
        counts[t[4]] = counts.get(t[4], 0) + 1
    return counts


def path_vias(path: layout.Path) -> list[str]:
    """A template path's hops before the peer's SID, in travel order."""
    return path_spec.segments_of(path)[:-1]


def paths_of(att: Attachment, name: str) -> list[tuple[int, layout.Path]]:
    return pt.used_paths(att, get(att, name))


def remove_paths(att: Attachment, name: str, path_ids: list[int]) -> dict:
    """Take paths out of template NAME (its peers keep the others; a
    template keeps at least one)."""
    key, tpl = name_key(name), get(att, name)
    used = dict(pt.used_paths(att, tpl))
    left = [i for i in used if i not in path_ids]
    if not left:
        raise MrcError(f"template {name} would have no paths left: delete the template instead")
    for i in path_ids:
        if i in used:
            att.maps["paths"].update(pt.path_index(tpl.template_id, i), layout.Path())
    tpl.n_paths = max(left) + 1
    _rebuild(att, tpl)
    att.maps["templates"].update(key, tpl)
    _refresh_peers(att, tpl)
    return {"template": name, "removed": sorted(path_ids)}


def set_path_attrs(att: Attachment, name: str, path_id: int, weight: int, tclass: int) -> None:
    """A template path's weight and class, changed in place (it keeps its id)."""
    if not 1 <= weight <= path_spec.MAX_WEIGHT:
        raise MrcError(f"bad weight {weight}: 1..{path_spec.MAX_WEIGHT}")
    tpl = get(att, name)
    path = dict(pt.used_paths(att, tpl))[path_id]
    if (path.weight, path.tclass) != (weight, tclass):
        path.weight, path.tclass = weight, tclass
        att.maps["paths"].update(pt.path_index(tpl.template_id, path_id), path)
        _rebuild(att, tpl)


def set_policy(att: Attachment, name: str, policy: str) -> dict:
    if policy not in pt.POLICIES:
        raise MrcError(f"bad policy {policy!r}: one of {', '.join(pt.POLICIES)}")
    tpl = get(att, name)
    tpl.policy = pt.POLICIES[policy]
    _rebuild(att, tpl)
    att.maps["templates"].update(name_key(name), tpl)
    _refresh_peers(att, tpl)
    return {"template": name, "policy": policy}


def delete(att: Attachment, name: str) -> dict:
    tpl = get(att, name)
    users = peer_counts(att).get(tpl.template_id, 0)
    if users:
        raise MrcError(f"template {name} still has {users} peers: `mrcctl path del PREFIX` them first")
    for i, _ in pt.used_paths(att, tpl):
        att.maps["paths"].update(pt.path_index(tpl.template_id, i), layout.Path())
    tpl.n_paths = 0
    _rebuild(att, tpl)
    att.maps["templates"].delete(name_key(name))
    return {"template": name, "removed": True}


def list_templates(att: Attachment) -> list[dict]:
    counts = peer_counts(att)
    out = []
    for key, tpl in sorted(att.maps["templates"].items(), key=lambda kv: kv[1].template_id):
        used = pt.used_paths(att, tpl)
        out.append({"template": bytes(key.name).rstrip(b"\0").decode(), "row": tpl.template_id,
                    "policy": pt.POLICY_NAMES.get(tpl.policy, str(tpl.policy)),
                    "paths": [{"path_id": i, "segments": path_spec.segments_of(p)[:-1] + ["<peer SID>"],
                               "weight": p.weight, "state": "denied" if p.state == pt.DENIED else "up"}
                              for i, p in used],
                    "peers": counts.get(tpl.template_id, 0)})
    return out


def _next_peer_id(att: Attachment) -> int:
    top = max((p.peer_id for _, p in att.maps["peers"].items() if p.flags & LAST_HOP),
              default=pt.MAX_PEERS - 1)
    return top + 1


def parse_line(line: str, number: int) -> tuple[str, str, str]:
    parts = line.split()
    if len(parts) != 3:
        raise MrcError(f"line {number}: expected PREFIX TEMPLATE SID, got {line.strip()!r}")
    try:
        path_spec.exact_prefix(parts[0])
    except MrcError as e:
        raise MrcError(f"line {number}: {e}")
    return parts[0], parts[1], parts[2]


def add_peers(att: Attachment, entries: list[tuple[str, str, str]], route: bool = True) -> dict:
    """Add (prefix, template, SID) peers, all or nothing: checked first,
    then written in batches (control/bulk.py); a peer already there as
    given is left alone.  `route`: install each prefix's kernel route
    (else the operator routes an aggregate out of the attached device)."""
    tpls: dict[str, layout.Peer] = {}
    wanted = []
    for prefix_text, name, sid_text in entries:
        length, value = bulk.prefix_int(prefix_text)
        sid = bulk.sid_int(sid_text)
        tpl = tpls.get(name)
        if tpl is None:
            tpl = tpls[name] = get(att, name)
            if not tpl.n_paths:
                raise MrcError(f"template {name} has no paths")
        wanted.append((bulk.KEY.pack(length, value.to_bytes(16, "big")), sid.to_bytes(16, "big"), tpl))
    result = bulk.sync(att, wanted)
    out = {"added": result["added"], "updated": result["updated"], "unchanged": result["unchanged"],
           "peers": att.maps["peers"].dump()[2]}
    if route:       # every peer's, not only the new ones': a rerun mends what is missing
        out["routes"] = _routes(att, [(bulk.prefix_text(*bulk.KEY.unpack(k)), tpl) for k, _, tpl in wanted])
    return out


def _routes(att: Attachment, items: list[tuple[str, layout.Peer]]) -> int:
    """A kernel route per prefix (text), out of its template's first path,
    where it is missing or differs; returns how many were written.  One
    route dump and netlink batches for them all, so this is linear in the
    peers (it was a dump per peer: 1,000 peers took 220 s), and one undo
    step on the journal for them all."""
    table = routes.dump_ours()
    here = set(att.ifindexes)
    firsts: dict[int, tuple] = {}
    plan, saved = [], []
    for prefix, tpl in items:
        if tpl.template_id not in firsts:
            first = pt.used_paths(att, tpl)[0][1]
            firsts[tpl.template_id] = (pt.route_mtu(att, tpl), path_spec.addr_text(first.nexthop), first.oif)
        mtu, gateway, oif = firsts[tpl.template_id]
        have = table.get(prefix, [])
        current = [e for e in have if e[0] in here]
        # a route that is there keeps its TCP metrics; a new one gets the defaults
        tcp = dict(current[0][3]) if current else dict(routes.DEFAULT_TCP_METRICS)
        if have == [(oif, gateway, mtu, tuple(sorted(tcp.items())))]:
            continue
        plan.append((prefix, gateway, oif, mtu, tcp))
        saved.append((prefix, have))
    if not plan:
        return 0
    journal = att.journal
    fail_at = journal.reserve(len(plan), "route") if journal is not None else None
    if journal is not None:
        journal.record_routes(saved)
    if fail_at is not None:
        failing = journal.writes
        routes.install_many(plan[:fail_at])
        raise InjectedFailure(f"failure injected at write {failing} (route {plan[fail_at][0]}) "
                              f"by MRC_FAIL_WRITE")
    routes.install_many(plan)
    return len(plan)


def delete_peer(att: Attachment, key: layout.PeerKey, peer: layout.Peer, prefix) -> dict:
    from pyroute2 import IPRoute
    att.maps["peers"].delete(key)
    att.maps["peer_by_sid"].delete(layout.Sid.from_buffer_copy(bytes(peer.sid)))
    pt.forget_peer(att, peer.peer_id)
    with IPRoute() as ipr:
        att.route_change(ipr, prefix)
        for index in att.ifindexes:
            routes.remove(ipr, prefix, index)
    return {"prefix": str(prefix), "removed": "peer"}
