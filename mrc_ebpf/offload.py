"""Spraying granularity: what the TC program gets to see as "a packet".

The TC egress hook runs before the device's GSO: TCP hands it super-
packets of up to 64 KB (TCP builds them whatever the device's GSO/TSO
flags say), encapsulated once and cut into segments after us, so every
segment of one takes the same path: per-burst spraying.  The device's
gso_max_segs bounds how many segments TCP may put in one skb; at 1, TCP
builds single segments and each gets its own path: per-packet spraying.
`attach --granularity packet` (the default) sets it and detach restores it.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
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


def gso_max_segs(device: str) -> int:
    out = subprocess.run(["ip", "-d", "-j", "link", "show", "dev", device],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["gso_max_segs"])


def set_gso_max_segs(device: str, segs: int) -> None:
    subprocess.run(["ip", "link", "set", "dev", device, "gso_max_segs", str(segs)],
                   capture_output=True, text=True, check=True)


def granularity(device: str) -> str:
    try:
        segs = gso_max_segs(device)
    except (OSError, subprocess.CalledProcessError, KeyError, ValueError):
        return "unknown"
    if segs == 1:
        return "per-packet"
    return f"per-burst (up to {segs} segments share a path)"
