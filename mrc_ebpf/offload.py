"""GSO/TSO state of a device, through the ethtool ioctl.

The TC program sees what the stack hands the device: with GSO or TSO on,
that is a super-packet of up to 64 KB, encapsulated once and cut into
segments after us, so every segment takes the same path (per-burst
spraying).  Per-packet spraying needs both off.
"""
from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GTSO, ETHTOOL_STSO = 0x1E, 0x1F
ETHTOOL_GGSO, ETHTOOL_SGSO = 0x23, 0x24


def _ethtool(device: str, cmd: int, data: int = 0) -> int:
    value = ctypes.create_string_buffer(struct.pack("II", cmd, data))
    ifreq = struct.pack("16sP", device.encode(), ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
    return struct.unpack("II", value.raw[:8])[1]


def get(device: str) -> dict:
    return {"gso": bool(_ethtool(device, ETHTOOL_GGSO)), "tso": bool(_ethtool(device, ETHTOOL_GTSO))}


def set_(device: str, gso: bool, tso: bool) -> None:
    _ethtool(device, ETHTOOL_STSO, int(tso))
    _ethtool(device, ETHTOOL_SGSO, int(gso))


def granularity(device: str) -> str:
    try:
        state = get(device)
    except OSError:
        return "unknown"
    if state["gso"] or state["tso"]:
        return "per-burst (GSO/TSO on: one path per super-packet)"
    return "per-packet"
