"""Path sets: which segment lists reach which peer prefix.

A peer prefix owns a row (peer_id) of MRC_MAX_PATHS path slots; paths
0..n_paths-1 are in use.  Writes go path first, peer last, so the
datapath never sees a path count that covers a half-written path.
What the datapath learns about a peer (sequence numbers, acknowledgements,
health, counters) is in the peer_state LRU, created by the peer's first
packet: `learnt` reads it (zero when there is none yet, or it was evicted).
"""
from __future__ import annotations

import ctypes
import ipaddress
import zlib

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.control import classes
from mrc_ebpf.control import ev_trace
from mrc_ebpf.control import shared_fate
from mrc_ebpf.datapath import routes
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import C

MAX_PATHS, MAX_PEERS, MAX_SEGMENTS = C["MRC_MAX_PATHS"], C["MRC_MAX_PEERS"], C["MRC_MAX_SEGMENTS"]
REDIRECT, USID, ENTROPY = C["MRC_PATH_F_REDIRECT"], C["MRC_PATH_F_USID"], C["MRC_PATH_F_ENTROPY"]
LAST_HOP = C["MRC_PEER_F_LAST_HOP"]
USID_BLOCK_BITS, USID_ID_BITS = C["MRC_USID_BLOCK_BITS"], C["MRC_USID_ID_BITS"]
UP, UNUSED, DENIED = C["MRC_PATH_UP"], C["MRC_PATH_UNUSED"], C["MRC_PATH_DENIED"]
# MRC's names for a path's (an EV's) state
STATE_UP, STATE_BAD, STATE_DENIED, STATE_UNKNOWN = "up", "assumed-bad", "denied", "unknown"
MAX_CLASSES, SLOTS = C["MRC_MAX_CLASSES"], C["MRC_SPRAY_SLOTS"]
POLICIES = {name[len("MRC_POLICY_"):].lower(): value
            for name, value in C.items() if name.startswith("MRC_POLICY_")}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}
MAX_WEIGHT = 1000
ETH_HLEN = 14       # TC egress counts the Ethernet header in skb->len


def parse_prefix(text: str) -> ipaddress._BaseNetwork:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise MrcError(f"bad prefix {text!r}: expected e.g. fd00:2::/64 or 198.18.2.0/24")


def exact_prefix(text: str) -> str:
    """TEXT if it is a prefix with no host bits set, as `ip route` wants
    one: `fd00:c2::1/64` is refused, not silently taken as fd00:c2::/64
    (what the operator meant is not known).  The CLI's PREFIX arguments
    and bulk files are checked so; config files canonicalize instead."""
    prefix = parse_prefix(text)
    if "/" in text and prefix.network_address != ipaddress.ip_address(text.split("/")[0]):
        raise MrcError(f"invalid prefix for given prefix length: {text} has host bits set "
                       f"(the prefix is {prefix}?)")
    return text


def parse_segments(text: str) -> list[ipaddress.IPv6Address]:
    items = [s for s in text.split(",") if s.strip()]
    if not items:
        raise MrcError("--via needs at least one segment")
    if len(items) > MAX_SEGMENTS:
        raise MrcError(f"--via has {len(items)} segments; at most {MAX_SEGMENTS} are supported")
    out = []
    for s in items:
        try:
            seg = ipaddress.IPv6Address(s.strip())
        except ValueError:
            raise MrcError(f"bad segment {s!r}: expected an IPv6 address (SID)")
        if seg.is_multicast or seg.is_unspecified or seg.is_link_local:
            raise MrcError(f"bad segment {s!r}: must be a unicast SID")
        out.append(seg)
    return out


def parse_usid(text: str) -> tuple[ipaddress.IPv6Address, ipaddress.IPv6Address]:
    """(container, the peer's SID) of a compressed path: a 32-bit block,
    then 16-bit IDs, zeros after the last; the peer is the last ID."""
    try:
        container = ipaddress.IPv6Address(text.strip())
    except ValueError:
        raise MrcError(f"bad uSID path {text!r}: expected an IPv6 address such as fc00:0:101:e002::")
    slots = (128 - USID_BLOCK_BITS) // USID_ID_BITS
    value = int(container)
    ids = [(value >> (128 - USID_BLOCK_BITS - USID_ID_BITS * (i + 1))) & ((1 << USID_ID_BITS) - 1)
           for i in range(slots)]
    used = [i for i, v in enumerate(ids) if v]
    if not used or container.is_multicast:
        raise MrcError(f"bad uSID path {text!r}: no ID after the {USID_BLOCK_BITS}-bit block")
    last = used[-1]
    if len(used) != last + 1:
        raise MrcError(f"bad uSID path {text!r}: a zero ID before the last one ends the path early")
    block = value >> (128 - USID_BLOCK_BITS) << (128 - USID_BLOCK_BITS)
    peer = ipaddress.IPv6Address(block | ids[last] << (128 - USID_BLOCK_BITS - USID_ID_BITS))
    return container, peer


def parse_peer_sid(text: str) -> ipaddress.IPv6Address:
    try:
        sid = ipaddress.IPv6Address(text.strip())
    except ValueError:
        raise MrcError(f"bad --sid {text!r}: expected the peer's SID, an IPv6 address")
    if sid.is_multicast or sid.is_unspecified or sid.is_link_local or sid.is_loopback:
        raise MrcError(f"bad --sid {text!r}: must be a unicast SID")
    return sid


class PathSpec:
    """One path as given: an SRH segment list, a uSID container, or an
    entropy path (no segment list: the peer's SID and an outer flow label
    that the fabric's ECMP hashes)."""

    def __init__(self, segments: list[ipaddress.IPv6Address], peer_sid: ipaddress.IPv6Address,
                 usid: bool, entropy: bool = False):
        self.segments, self.peer_sid, self.usid, self.entropy = segments, peer_sid, usid, entropy

    @classmethod
    def ev(cls, peer_sid: ipaddress.IPv6Address) -> "PathSpec":
        # encapsulated as a uSID path whose container is the peer's SID
        return cls([peer_sid], peer_sid, True, entropy=True)

    @property
    def flags(self) -> int:
        return (USID if self.usid else 0) | (ENTROPY if self.entropy else 0)

    @classmethod
    def via(cls, text: str) -> "PathSpec":
        segments = parse_segments(text)
        return cls(segments, segments[-1], False)

    @classmethod
    def compressed(cls, text: str) -> "PathSpec":
        container, peer = parse_usid(text)
        return cls([container], peer, True)

    @property
    def first_hop(self) -> ipaddress.IPv6Address:
        return self.segments[0]

    @property
    def overhead(self) -> int:
        return layout.encap_len(len(self.segments), self.usid)

    def describe(self) -> dict:
        if self.entropy:
            return {"encoding": "entropy", "peer_sid": str(self.peer_sid)}
        if self.usid:
            return {"encoding": "usid", "usid": str(self.segments[0]), "peer_sid": str(self.peer_sid)}
        return {"encoding": "srh", "segments": [str(s) for s in self.segments],
                "peer_sid": str(self.peer_sid)}


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


def flowlabel(prefix, path_id: int, segments) -> int:
    """Stable per-path entropy for the outer flow label (20 bits, never 0)."""
    raw = f"{prefix}|{path_id}|{','.join(map(str, segments))}".encode()
    return (zlib.crc32(raw) & 0xFFFFF) or 1


def _segments_of(path: layout.Path) -> list[str]:
    """Travel order (the wire holds them last-first); a uSID path's one
    entry is its container, an entropy path's the peer's SID."""
    wire = [ipaddress.IPv6Address(bytes(path.segments[i].addr)) for i in range(path.n_segments)]
    return [str(s) for s in reversed(wire)]


def encoding_of(path: layout.Path) -> str:
    if path.flags & ENTROPY:
        return "entropy"
    return "usid" if path.flags & USID else "srh"


def _unique_labels(prefix, ids: list[int], specs: list[PathSpec], taken: set[int]) -> list[int]:
    """The outer flow label of each new path: stable per (prefix, id,
    segments); an entropy path's label is its EV, so no two of a peer's
    paths share one (a clash is moved on to the next free value)."""
    out = []
    for path_id, spec in zip(ids, specs):
        label = flowlabel(prefix, path_id, spec.segments)
        while label in taken:
            label = label % 0xFFFFF + 1
        taken.add(label)
        out.append(label)
    return out


def _overhead(path: layout.Path) -> int:
    return layout.encap_len(path.n_segments, bool(path.flags & USID))


def _free_peer_id(att: Attachment) -> int:
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


def _change_learnt(att: Attachment, peer_id: int, change) -> None:
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


def _forget_peer(att: Attachment, peer_id: int) -> None:
    """A new peer in a reused row starts with no learnt state."""
    att.maps["peer_state"].delete(layout.Index(peer_id))


def _reset_path_state(att: Attachment, peer_id: int, path_ids: list[int]) -> None:
    def reset(state):
        for i in path_ids:
            state.paths[i] = layout.PathState()
    _change_learnt(att, peer_id, reset)


def _used(att: Attachment, peer: layout.Peer) -> list[tuple[int, layout.Path]]:
    """(path id, path) of the peer's paths in use (its template's, for a
    template's peer: the last hop left open)."""
    paths = att.maps["paths"]
    out = []
    for i in range(peer.n_paths):
        path = paths.lookup(path_index(peer.template_id, i))
        if path.state != UNUSED:
            out.append((i, path))
    return out


def _route_mtu(att: Attachment, peer: layout.Peer) -> int:
    return att.config.mtu - max(_overhead(p) for _, p in _used(att, peer))


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


def _rebuild(att: Attachment, peer: layout.Peer, sids: bool = True) -> None:
    """Spray lists of every class, and the SID -> peer index for feedback.

    Class k sprays over the paths reserved for it, or the shared paths
    (class 0) when it has none; class 0 only over the shared ones."""
    used = [(i, p) for i, p in _used(att, peer) if p.state == UP]
    quantum = _route_mtu(att, peer) + ETH_HLEN if used else 0
    shared = [(i, p) for i, p in used if p.tclass == 0]
    for tclass in range(MAX_CLASSES):
        members = [(i, p) for i, p in used if p.tclass == tclass] if tclass else []
        members = members or shared
        if peer.policy == POLICIES["weighted"]:
            ids = smooth_weighted({i: p.weight for i, p in members})
        else:
            # EVs with traced hops rotate over them (ev_trace.rotation)
            ids = ev_trace.rotation(members, SLOTS) or [i for i, _ in members]
        spray = layout.Spray(n=len(ids), quantum=quantum)
        spray.ids[:len(ids)] = ids
        att.maps["spray"].update(layout.Index(peer.peer_id * MAX_CLASSES + tclass), spray)
    # the floor (min_active): how many may be used, how many the datapath took out
    att.maps["peer_floor"].update(layout.Index(peer.peer_id), layout.PeerFloor(usable=len(used)))

    def recount(state):
        state.floor_out = sum(1 for i, _ in used if state.paths[i].live.down_ns)
    _change_learnt(att, peer.peer_id, recount)
    if not sids:
        return
    by_sid = att.maps["peer_by_sid"]
    for key, value in list(by_sid.items()):
        if value.value == peer.peer_id:
            by_sid.delete(key)
    for _, path in _used(att, peer):
        by_sid.update(layout.Sid.from_buffer_copy(bytes(path.peer_sid)), layout.u32(peer.peer_id))


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
    used = _used(att, peer)
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
        routes.install(ipr, prefix, _addr(first.nexthop), index, _route_mtu(att, peer), tcp)
    for i, path in used:
        redirect = path.oif != index or bytes(path.nexthop) != bytes(first.nexthop)
        flags = (path.flags | REDIRECT) if redirect else (path.flags & ~REDIRECT)
        if flags != path.flags:
            path.flags = flags
            paths.update(path_index(peer.peer_id, i), path)


def _addr(raw) -> str:
    return str(ipaddress.IPv6Address(bytes(raw)))


def _same_path(path: layout.Path, spec: PathSpec) -> bool:
    return bool(path.flags & USID) == spec.usid and bool(path.flags & ENTROPY) == spec.entropy and \
        _segments_of(path) == [str(s) for s in spec.segments]


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
        entropy_sid: str | None = None, route_metrics_: list[str] = ()) -> list[dict]:
    """Add paths in one go: segment lists ("S1,S2"), uSID containers and
    `entropy` entropy paths (EVs) to the peer SID `entropy_sid`;
    `route_metrics_` (KEY=VALUE) override the peer route's TCP metrics.

    A path the prefix already has (same segments, same encoding) is left
    as it is and reported with "existed": True; one that differs from the
    existing only in weight or class is refused.  Entropy paths count: a
    peer with k EVs to the SID keeps them, and only N - k more are added."""
    from pyroute2 import IPRoute
    overrides = dict(routes.parse_metric(m) for m in route_metrics_)
    specs = [PathSpec.via(v) for v in vias] + [PathSpec.compressed(u) for u in usids]
    if entropy or entropy_sid:
        if not entropy_sid:
            raise MrcError("--entropy N needs --sid PEER_SID (where the entropy paths end)")
        if not 1 <= entropy <= MAX_PATHS:
            raise MrcError(f"bad --entropy {entropy}: 1..{MAX_PATHS} paths")
        sid = parse_peer_sid(entropy_sid)
        specs += [PathSpec.ev(sid) for _ in range(entropy)]
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
        row = _free_peer_id(att)
        peer = layout.Peer(peer_id=row, n_paths=0, policy=POLICIES["rr"], template_id=row)
    used = _used(att, peer) if not new_peer else []
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
        mtu = _route_mtu(att, peer)
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
    taken = {p.flowlabel for _, p in _used(att, peer)} if not new_peer else set()
    labels = _unique_labels(prefix, free_ids, fresh, taken)
    for path_id, spec, (oif, gateway), label in zip(free_ids, fresh, resolved, labels):
        path = layout.Path(n_segments=len(spec.segments), state=UP, weight=weight, tclass=tclass,
                           flowlabel=label, oif=oif, flags=spec.flags)
        ctypes.memmove(path.nexthop, ipaddress.IPv6Address(gateway).packed, 16)
        ctypes.memmove(path.peer_sid.addr, spec.peer_sid.packed, 16)
        for i, seg in enumerate(reversed(spec.segments)):
            ctypes.memmove(path.segments[i].addr, seg.packed, 16)
        index = path_index(peer.peer_id, path_id)
        att.maps["paths"].update(index, path)
        shared_fate.assign(att, index, path)
        peer.n_paths = max(peer.n_paths, path_id + 1)
        results.append({"prefix": str(prefix), "path_id": path_id, **spec.describe(), "flowlabel": label,
                        "weight": weight, "class": class_label,
                        "overhead": spec.overhead, "existed": False})
    if new_peer:
        _forget_peer(att, peer.peer_id)
    _reset_path_state(att, peer.peer_id, [r["path_id"] for r in results])
    _forget_acks(att, peer.peer_id, [r["path_id"] for r in results])
    _rebuild(att, peer)       # spray lists first: the peer entry makes them live
    peers.update(key, peer)
    _sync_route(att, prefix, peer, overrides)
    mtu = _route_mtu(att, peer)
    metrics = route_metrics(att, prefix)
    return [{**r, "route_mtu": mtu, "route_metrics": metrics} for r in existing + results]


def _describe_spec(spec: PathSpec) -> str:
    return f"usid {spec.segments[0]}" if spec.usid else f"via {','.join(map(str, spec.segments))}"


def _forget_acks(att: Attachment, peer_id: int, ids: list[int]) -> None:
    """A path id used before keeps the peer's acknowledgement of it: a new
    path there starts unknown, never yet acknowledged."""
    def forget(state):
        for i in ids:
            state.acks.ns[i] = 0
    _change_learnt(att, peer_id, forget)


def path_state(att: Attachment, peer: layout.Peer, path_id: int, path: layout.Path,
               state: layout.PeerState | None = None) -> str:
    """up, assumed-bad (taken out by the datapath, probed), denied (by the
    operator) or unknown (never yet acknowledged by the peer)."""
    if path.state == DENIED:
        return STATE_DENIED
    state = learnt(att, peer.peer_id) if state is None else state
    if state.paths[path_id].live.down_ns:
        return STATE_BAD
    if not state.acks.ns[path_id]:
        return STATE_UNKNOWN
    return STATE_UP


def set_denied(att: Attachment, prefix_text: str, path_ids: list[int], deny: bool) -> dict:
    """Deny paths (never used nor probed) or allow them again (fresh: no
    datapath verdict carried over)."""
    prefix = parse_prefix(prefix_text)
    key, peer = _lookup_peer(att, prefix)
    used = dict(_used(att, peer))
    for path_id in path_ids:
        if path_id not in used:
            raise MrcError(f"{prefix} has no path {path_id} (it has "
                           f"{', '.join(map(str, sorted(used)))})")
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
            _change_learnt(att, peer.peer_id, fresh)
        path.state = want
        att.maps["paths"].update(index, path)
        changed.append(path_id)
    if not deny:
        _forget_acks(att, peer.peer_id, changed)
    _rebuild(att, peer)
    left = sum(1 for _, p in _used(att, peer) if p.state == UP)
    return {"prefix": str(prefix), "action": "deny" if deny else "allow", "path_ids": list(path_ids),
            "changed": changed, "usable": left}


def hops_of(path: layout.Path) -> list[ipaddress.IPv6Address]:
    """The SIDs a path crosses, in travel order: its segments, or each ID
    of its uSID container as a SID under the block (an entropy path
    names no hop: the fabric's hash picks them, unless `path trace
    --order` recorded the one it crosses)."""
    if path.flags & ENTROPY:
        hop = ev_trace.hop_of(path)
        return [hop] if hop is not None else []
    wire = [ipaddress.IPv6Address(bytes(path.segments[i].addr)) for i in range(path.n_segments)]
    if not path.flags & USID:
        return list(reversed(wire))
    value = int(wire[0])
    block = value >> (128 - USID_BLOCK_BITS) << (128 - USID_BLOCK_BITS)
    out = []
    for i in range((128 - USID_BLOCK_BITS) // USID_ID_BITS):
        shift = 128 - USID_BLOCK_BITS - USID_ID_BITS * (i + 1)
        ident = (value >> shift) & ((1 << USID_ID_BITS) - 1)
        if not ident:
            break
        out.append(ipaddress.IPv6Address(block | ident << (128 - USID_BLOCK_BITS - USID_ID_BITS)))
    return out


def set_denied_hop(att: Attachment, hop_text: str, deny: bool, prefix_text: str | None = None) -> list[dict]:
    """Deny (or allow) every path of every peer (or of one prefix) that
    crosses the SID `hop_text`: draining a switch for maintenance."""
    try:
        hop = ipaddress.IPv6Address(hop_text.strip())
    except ValueError:
        raise MrcError(f"bad --hop {hop_text!r}: expected a SID (IPv6 address)")
    only = peer_key(parse_prefix(prefix_text)) if prefix_text else None
    if only is not None:
        _lookup_peer(att, parse_prefix(prefix_text))
    results = []
    for key, peer in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        if only is not None and bytes(key) != bytes(only):
            continue
        ids = [i for i, p in _used(att, peer) if hop in hops_of(p)]
        if ids:
            results.append(set_denied(att, str(key_prefix(key)), ids, deny))
    if not results:
        raise MrcError(f"no path crosses {hop}")
    return results


def _lookup_peer(att: Attachment, prefix, own: bool = True) -> tuple[layout.PeerKey, layout.Peer]:
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


def delete(att: Attachment, prefix_text: str, path_id: int | None = None) -> dict:
    """Delete all of a prefix's paths, or one; the others keep their ids
    (and so their sequence numbers: the receiver sees no false loss)."""
    from pyroute2 import IPRoute
    prefix = parse_prefix(prefix_text)
    key, peer = _lookup_peer(att, prefix, own=False)
    if peer.flags & LAST_HOP:
        if path_id is not None:
            raise MrcError(f"{prefix} has its template's paths: change the template, or "
                           f"`mrcctl path del {prefix}` the peer")
        from mrc_ebpf.control import templates
        return templates.delete_peer(att, key, peer, prefix)
    used = dict(_used(att, peer))
    if path_id is not None and path_id not in used:
        raise MrcError(f"{prefix} has no path {path_id} (it has {', '.join(map(str, sorted(used)))})")
    if path_id is None or len(used) == 1:
        att.maps["peers"].delete(key)
        _forget_peer(att, peer.peer_id)
        with IPRoute() as ipr:
            att.route_change(ipr, prefix)
            for index in att.ifindexes:
                routes.remove(ipr, prefix, index)
        for i in used:
            att.maps["paths"].update(path_index(peer.peer_id, i), layout.Path())
        _rebuild(att, peer)
        return {"prefix": str(prefix), "removed": "peer"}
    att.maps["paths"].update(path_index(peer.peer_id, path_id), layout.Path())
    _rebuild(att, peer)
    _sync_route(att, prefix, peer)
    return {"prefix": str(prefix), "removed": "path", "path_id": path_id}


def set_policy(att: Attachment, prefix_text: str, policy: str) -> dict:
    if policy not in POLICIES:
        raise MrcError(f"bad policy {policy!r}: one of {', '.join(POLICIES)}")
    prefix = parse_prefix(prefix_text)
    key, peer = _lookup_peer(att, prefix)
    peer.policy = POLICIES[policy]
    _rebuild(att, peer)
    att.maps["peers"].update(key, peer)
    return {"prefix": str(prefix), "policy": policy}


class UsedCache:
    """_used per row, read once: a template's many peers share one."""

    def __init__(self, att: Attachment):
        self.att, self.rows = att, {}

    def __call__(self, peer: layout.Peer) -> list[tuple[int, layout.Path]]:
        key = (peer.template_id, peer.n_paths)
        if key not in self.rows:
            self.rows[key] = _used(self.att, peer)
        return self.rows[key]


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
            row.update(template_row=p.template_id, sid=_addr(p.sid))
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
        for path_id, path in used(peer):
            path = _with_last_hop(path, peer)
            mine = peer_state.paths[path_id]
            health, live = mine.health, mine.live
            state = path_state(att, peer, path_id, path, peer_state)
            rows.append({
                "prefix": str(prefix), "path_id": path_id, "segments": _segments_of(path),
                "encoding": encoding_of(path),
                "peer_sid": _addr(path.peer_sid), "oif": path.oif,
                "state": state, "weight": path.weight, "downs": live.downs,
                "class": names.get(path.tclass, str(path.tclass)),
                "policy": POLICY_NAMES.get(peer.policy, str(peer.policy)),
                "flowlabel": path.flowlabel, "ev": path.flowlabel if path.flags & ENTROPY else None,
                "hop": str(ev_trace.hop_of(path) or "") or None,
                "overhead": _overhead(path),
                "tx_packets": mine.tx_packets,
                "tx_bytes": mine.tx_bytes,
                "next_seq": mine.seq,
                "nexthop": _addr(path.nexthop), "redirect": bool(path.flags & REDIRECT),
                "route_metrics": metrics, "template": bool(peer.flags & LAST_HOP),
                "feedback": None if not health.updated_ns else {
                    "qdelay_us": health.qdelay_us, "lost": health.lost,
                    "age_ms": round((now - health.updated_ns) / 1e6, 1)},
            })
    return rows


def _monotonic_ns() -> int:
    import time
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def set_attrs(att: Attachment, prefix_text: str, path_id: int, weight: int, tclass: int) -> dict:
    """Change a path's weight and class in place: it keeps its id,
    sequence numbers and counters (`mrcctl apply` of a changed file)."""
    if not 1 <= weight <= MAX_WEIGHT:
        raise MrcError(f"bad weight {weight}: 1..{MAX_WEIGHT}")
    prefix = parse_prefix(prefix_text)
    key, peer = _lookup_peer(att, prefix)
    used = dict(_used(att, peer))
    if path_id not in used:
        raise MrcError(f"{prefix} has no path {path_id}")
    path = used[path_id]
    if (path.weight, path.tclass) != (weight, tclass):
        path.weight, path.tclass = weight, tclass
        att.maps["paths"].update(path_index(peer.peer_id, path_id), path)
        _rebuild(att, peer)
    return {"prefix": str(prefix), "path_id": path_id, "weight": weight, "tclass": tclass}


def set_route_metrics(att: Attachment, prefix_text: str, metrics: dict[str, str | None]) -> dict:
    """Make the peer route's TCP metrics exactly METRICS (parse_metric's
    values; a key absent or None is removed)."""
    prefix = parse_prefix(prefix_text)
    _, peer = _lookup_peer(att, prefix)
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
                    "paths": [{"path_id": i, "encoding": encoding_of(p), "segments": _segments_of(p),
                               "peer_sid": _addr(p.peer_sid), "weight": p.weight,
                               "class": names.get(p.tclass, str(p.tclass)), "denied": p.state == DENIED}
                              for i, p in _used(att, peer)]})
    return out
