"""Path sets: which segment lists reach which peer prefix.

A peer prefix owns a row (peer_id) of MRC_MAX_PATHS path slots; paths
0..n_paths-1 are in use.  Writes go path first, peer last, so the
datapath never sees a path count that covers a half-written path.
"""
from __future__ import annotations

import ctypes
import ipaddress
import zlib

from pyroute2 import IPRoute

from . import hooks, layout, pins, routes
from .datapath import Attachment
from .errors import MrcError
from .source import C

MAX_PATHS, MAX_PEERS, MAX_SEGMENTS = C["MRC_MAX_PATHS"], C["MRC_MAX_PEERS"], C["MRC_MAX_SEGMENTS"]
REDIRECT = C["MRC_PATH_F_REDIRECT"]


def _is_attached(ipr: IPRoute, index: int) -> bool:
    """Another device of this namespace that carries the datapath (a plane)."""
    links = ipr.get_links(index)
    return bool(links) and links[0].get_attr("IFLA_IFNAME") in pins.attached_devices()


def parse_prefix(text: str) -> ipaddress._BaseNetwork:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise MrcError(f"bad prefix {text!r}: expected e.g. fd00:2::/64 or 198.18.2.0/24")


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
    """Travel order (the wire holds them last-first)."""
    wire = [ipaddress.IPv6Address(bytes(path.segments[i])) for i in range(path.n_segments)]
    return [str(s) for s in reversed(wire)]


def _free_peer_id(att: Attachment) -> int:
    used = {v.peer_id for _, v in att.maps["peers"].items()}
    for peer_id in range(MAX_PEERS):
        if peer_id not in used:
            return peer_id
    raise MrcError(f"all {MAX_PEERS} peer slots are in use")


def _reset_path_state(att: Attachment, index: layout.Index) -> None:
    att.maps["path_tx"].update(index, layout.PathTx())
    att.maps["path_stats"].update(index, att.maps["path_stats"].value_type())


def _route_mtu(att: Attachment, peer: layout.Peer) -> int:
    worst = max(att.maps["paths"].lookup(path_index(peer.peer_id, i)).n_segments
                for i in range(peer.n_paths))
    return att.config.mtu - layout.encap_len(worst)


def _sync_route(att: Attachment, prefix, peer: layout.Peer) -> None:
    """The peer route goes via path 0's first hop; paths with another
    first hop are redirected to theirs by the datapath."""
    paths = att.maps["paths"]
    first = paths.lookup(path_index(peer.peer_id, 0))
    with IPRoute() as ipr:
        index = hooks.ifindex(ipr, att.device)
        routes.install(ipr, prefix, _addr(first.nexthop), index, _route_mtu(att, peer))
    for i in range(peer.n_paths):
        path = paths.lookup(path_index(peer.peer_id, i))
        redirect = path.oif != index or bytes(path.nexthop) != bytes(first.nexthop)
        flags = (path.flags | REDIRECT) if redirect else (path.flags & ~REDIRECT)
        if flags != path.flags:
            path.flags = flags
            paths.update(path_index(peer.peer_id, i), path)


def _addr(raw) -> str:
    return str(ipaddress.IPv6Address(bytes(raw)))


def add(att: Attachment, prefix_text: str, via: str) -> dict:
    prefix = parse_prefix(prefix_text)
    segments = parse_segments(via)
    peers = att.maps["peers"]
    key = peer_key(prefix)
    peer = peers.lookup(key)
    new_peer = peer is None
    if new_peer:
        peer = layout.Peer(peer_id=_free_peer_id(att), n_paths=0)
    if peer.n_paths >= MAX_PATHS:
        raise MrcError(f"{prefix} already has {MAX_PATHS} paths")
    path_id = peer.n_paths
    if att.config.mtu - layout.encap_len(len(segments)) < (1280 if prefix.version == 6 else 576):
        raise MrcError(f"{len(segments)} segments leave less than the minimum MTU on {att.device} "
                       f"(MTU {att.config.mtu}, overhead {layout.encap_len(len(segments))})")
    # resolve the first hop before touching any map: nothing half-changed on error
    with IPRoute() as ipr:
        oif, gateway = routes.next_hop(ipr, str(segments[0]))
        attached = hooks.ifindex(ipr, att.device)
        if oif != attached and not _is_attached(ipr, oif):
            name = ipr.get_links(oif)[0].get_attr("IFLA_IFNAME") if oif else "?"
            raise MrcError(f"first segment {segments[0]} is routed out of {name}, "
                           f"where mrc-ebpf is not attached")

    path = layout.Path(n_segments=len(segments), state=C["MRC_PATH_UP"], weight=1,
                       flowlabel=flowlabel(prefix, path_id, segments), oif=oif)
    ctypes.memmove(path.nexthop, ipaddress.IPv6Address(gateway).packed, 16)
    for i, seg in enumerate(reversed(segments)):
        ctypes.memmove(path.segments[i], seg.packed, 16)
    index = path_index(peer.peer_id, path_id)
    att.maps["paths"].update(index, path)
    _reset_path_state(att, index)
    if new_peer:
        att.maps["peer_tx"].update(layout.Index(peer.peer_id), layout.PeerTx())
    peer.n_paths = path_id + 1
    peers.update(key, peer)
    _sync_route(att, prefix, peer)
    return {"prefix": str(prefix), "path_id": path_id, "segments": [str(s) for s in segments],
            "overhead": layout.encap_len(len(segments)), "route_mtu": _route_mtu(att, peer)}


def delete(att: Attachment, prefix_text: str, path_id: int | None = None) -> dict:
    prefix = parse_prefix(prefix_text)
    key = peer_key(prefix)
    peers = att.maps["peers"]
    peer = peers.lookup(key)
    if peer is None:
        raise MrcError(f"no paths to {prefix} on {att.device}")
    if path_id is not None and not 0 <= path_id < peer.n_paths:
        raise MrcError(f"{prefix} has no path {path_id} (it has 0..{peer.n_paths - 1})")
    if path_id is None or peer.n_paths == 1:
        peers.delete(key)
        with IPRoute() as ipr:
            routes.remove(ipr, prefix, hooks.ifindex(ipr, att.device))
        for i in range(peer.n_paths):
            att.maps["paths"].update(path_index(peer.peer_id, i), layout.Path())
        return {"prefix": str(prefix), "removed": "peer"}
    # Keep ids dense (the datapath sprays over 0..n-1): the last path
    # takes the deleted one's id, with fresh sequence numbers.
    last = peer.n_paths - 1
    paths = att.maps["paths"]
    moved = paths.lookup(path_index(peer.peer_id, last))
    peer.n_paths = last
    peers.update(key, peer)
    if path_id != last:
        paths.update(path_index(peer.peer_id, path_id), moved)
        _reset_path_state(att, path_index(peer.peer_id, path_id))
    paths.update(path_index(peer.peer_id, last), layout.Path())
    _sync_route(att, prefix, peer)
    return {"prefix": str(prefix), "removed": "path", "path_id": path_id}


def list_paths(att: Attachment) -> list[dict]:
    rows = []
    states = {C["MRC_PATH_UP"]: "up", C["MRC_PATH_UNUSED"]: "unused"}
    for key, peer in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        prefix = key_prefix(key)
        for path_id in range(peer.n_paths):
            index = path_index(peer.peer_id, path_id)
            path = att.maps["paths"].lookup(index)
            stats = att.maps["path_stats"].lookup(index)
            rows.append({
                "prefix": str(prefix), "path_id": path_id, "segments": _segments_of(path),
                "state": states.get(path.state, str(path.state)), "weight": path.weight,
                "flowlabel": path.flowlabel, "overhead": layout.encap_len(path.n_segments),
                "tx_packets": sum(s.tx_packets for s in stats),
                "tx_bytes": sum(s.tx_bytes for s in stats),
                "next_seq": att.maps["path_tx"].lookup(index).seq,
                "nexthop": _addr(path.nexthop), "redirect": bool(path.flags & REDIRECT),
            })
    return rows
