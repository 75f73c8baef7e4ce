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

import json
import subprocess


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
