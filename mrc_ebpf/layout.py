"""ctypes mirrors of the structs in bpf/mrc_common.h.

Sizes come from the header (source.C); tests/test_layout.py compiles the
datapath with bcc and checks every field offset and size here against the
Key/Leaf types bcc derives from the C, so a drift fails the tests.
"""
from __future__ import annotations

import ctypes

from .source import C

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
Addr = u8 * 16


class MrcTlv(ctypes.BigEndianStructure):
    """The MRC TLV as it is on the wire (network byte order)."""
    _pack_ = 1
    _fields_ = [("type", u8), ("len", u8), ("version", u8), ("flags", u8),
                ("path_id", u16), ("tclass", u8), ("reserved", u8),
                ("path_seq", u32), ("peer_seq", u32), ("tx_ns", u64)]


class PeerKey(ctypes.Structure):
    _fields_ = [("prefixlen", u32), ("addr", Addr)]


class Peer(ctypes.Structure):
    _fields_ = [("peer_id", u32), ("n_paths", u16), ("policy", u8), ("flags", u8)]


class Path(ctypes.Structure):
    _fields_ = [("segments", Addr * C["MRC_MAX_SEGMENTS"]), ("nexthop", Addr), ("oif", u32),
                ("flowlabel", u32), ("weight", u16), ("n_segments", u8), ("state", u8),
                ("flags", u8), ("pad", u8 * 3)]


class PeerTx(ctypes.Structure):
    _fields_ = [("seq", u64)]


class PathTx(ctypes.Structure):
    _fields_ = [("seq", u64)]


class PathStats(ctypes.Structure):
    _fields_ = [("tx_packets", u64), ("tx_bytes", u64)]


class Config(ctypes.Structure):
    _fields_ = [("sid", Addr), ("mtu", u32), ("flags", u32)]


Index = u32

# name in lib/maps.h -> (key type, value type, per-CPU)
MAPS = {
    "config": (Index, Config, False),
    "peers": (PeerKey, Peer, False),
    "paths": (Index, Path, False),
    "peer_tx": (Index, PeerTx, False),
    "path_tx": (Index, PathTx, False),
    "path_stats": (Index, PathStats, True),
    "counters": (Index, u64, True),
}


def srh_len(n_segments: int) -> int:
    return 8 + 16 * n_segments + C["MRC_TLV_SIZE"]


def encap_len(n_segments: int) -> int:
    """Bytes encapsulation adds to a packet (outer IPv6 + SRH + TLV)."""
    return 40 + srh_len(n_segments)
