"""A path as given and as the paths map holds it (layout.Path): parsing
`mrcctl path add`'s arguments, the one encoder of a Path, and reading one
back (its segments, hops, encoding).  No map access: the control modules
and the tests' packet-table harness build on it.
"""
from __future__ import annotations

import ctypes
import ipaddress
import zlib

from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

MAX_SEGMENTS = C["MRC_MAX_SEGMENTS"]
REDIRECT, USID, ENTROPY = C["MRC_PATH_F_REDIRECT"], C["MRC_PATH_F_USID"], C["MRC_PATH_F_ENTROPY"]
SPARE = C["MRC_PATH_F_SPARE"]     # a spare EV: held back from the spray (control/spray.py, spares_of)
USID_BLOCK_BITS, USID_ID_BITS = C["MRC_USID_BLOCK_BITS"], C["MRC_USID_ID_BITS"]
UP = C["MRC_PATH_UP"]
MAX_WEIGHT = 1000
HOP_SLOT = 1        # segments[HOP_SLOT] of an entropy path: its recorded hop (control/ev_trace.py)


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
                 usid: bool, entropy: bool = False, spare: bool = False):
        self.segments, self.peer_sid, self.usid, self.entropy = segments, peer_sid, usid, entropy
        self.spare = spare

    @classmethod
    def ev(cls, peer_sid: ipaddress.IPv6Address, spare: bool = False) -> "PathSpec":
        # encapsulated as a uSID path whose container is the peer's SID
        return cls([peer_sid], peer_sid, True, entropy=True, spare=spare)

    @property
    def flags(self) -> int:
        return (USID if self.usid else 0) | (ENTROPY if self.entropy else 0) | (SPARE if self.spare else 0)

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
            return {"encoding": "entropy", "peer_sid": str(self.peer_sid), "spare": self.spare}
        if self.usid:
            return {"encoding": "usid", "usid": str(self.segments[0]), "peer_sid": str(self.peer_sid)}
        return {"encoding": "srh", "segments": [str(s) for s in self.segments],
                "peer_sid": str(self.peer_sid)}



def encode(spec: PathSpec, nexthop: ipaddress.IPv6Address, oif: int, flowlabel: int,
           weight: int = 1, tclass: int = 0, flags: int = 0) -> layout.Path:
    """The paths map's entry for SPEC, up: segments last-first as the SRH
    carries them; FLAGS are added to the spec's own (a template's
    REDIRECT)."""
    path = layout.Path(n_segments=len(spec.segments), state=UP, weight=weight, tclass=tclass,
                       flowlabel=flowlabel, oif=oif, flags=spec.flags | flags)
    ctypes.memmove(path.nexthop, nexthop.packed, 16)
    ctypes.memmove(path.peer_sid.addr, spec.peer_sid.packed, 16)
    for i, seg in enumerate(reversed(spec.segments)):
        ctypes.memmove(path.segments[i].addr, seg.packed, 16)
    return path


def flowlabel(prefix, path_id: int, segments) -> int:
    """Stable per-path entropy for the outer flow label (20 bits, never 0)."""
    raw = f"{prefix}|{path_id}|{','.join(map(str, segments))}".encode()
    return (zlib.crc32(raw) & 0xFFFFF) or 1


def segments_of(path: layout.Path) -> list[str]:
    """Travel order (the wire holds them last-first); a uSID path's one
    entry is its container, an entropy path's the peer's SID."""
    wire = [ipaddress.IPv6Address(bytes(path.segments[i].addr)) for i in range(path.n_segments)]
    return [str(s) for s in reversed(wire)]


def encoding_of(path: layout.Path) -> str:
    if path.flags & ENTROPY:
        return "entropy"
    return "usid" if path.flags & USID else "srh"


def unique_labels(prefix, ids: list[int], specs: list[PathSpec], taken: set[int]) -> list[int]:
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


def overhead(path: layout.Path) -> int:
    return layout.encap_len(path.n_segments, bool(path.flags & USID))


def hops_of(path: layout.Path) -> list[ipaddress.IPv6Address]:
    """The SIDs a path crosses, in travel order: its segments, or each ID
    of its uSID container as a SID under the block (an entropy path
    names no hop: the fabric's hash picks them, unless `path trace
    --order` recorded the one it crosses)."""
    if path.flags & ENTROPY:
        hop = hop_of(path)
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


def addr_text(raw) -> str:
    return str(ipaddress.IPv6Address(bytes(raw)))


def hop_of(path: layout.Path) -> ipaddress.IPv6Address | None:
    """The first-tier hop recorded on an entropy path, or None."""
    if not path.flags & ENTROPY:
        return None
    raw = bytes(path.segments[HOP_SLOT].addr)
    return ipaddress.IPv6Address(raw) if any(raw) else None
