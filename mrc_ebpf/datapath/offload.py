"""Spraying granularity: what the TC program gets to see as "a packet".

The TC egress hook runs before the device's GSO: TCP hands it super-
packets (bursts of up to 64 KB), encapsulated once and cut into segments
after us, so every segment of one burst takes the same path.  The
device's gso_max_segs bounds how many segments TCP puts in one burst
(sk_gso_max_segs comes from it), so it is the one knob:

- packet: gso_max_segs 1, every segment its own path.  Costs the stack
  its segmentation offload: one flow runs at the kernel's no-GSO rate
  (0.75 Gbit/s here against 10-17 with GSO).
- burst: the device's own maximum, bursts of up to 64 KB.
- auto (the default): bursts of at most BURST_US of the slowest link's
  time (the device's own speed unless `--link-rate` names a slower
  fabric link).  At 10-400 Gbit/s that is the full 64 KB burst (5 us at
  100 Gbit/s); on a 200 Mbit/s fabric one segment, i.e. per packet.

TCP's autosizing shrinks bursts further for a flow that is slow (about
1 ms of its pacing rate), so a burst is never longer than either bound.
"""
from __future__ import annotations

import json
import re
import subprocess

# layout of mrc_device.granularity (MRC_GRAN_* in bpf/mrc_common.h)
GRANULARITIES = ("auto", "packet", "burst")
BURST_US = 50               # a burst lasts at most this much of the slowest link's time
GSO_MAX_SEGS = 65535        # the kernel's default: no bound but the 64 KB of a burst
BURST_MAX_BYTES = 65536     # what one burst holds without BIG TCP
TURN_MAX_BYTES = 512 << 10  # the largest packet TC can be handed (BIG TCP's GSO_MAX_SIZE)


def gso_max_segs(device: str) -> int:
    out = subprocess.run(["ip", "-d", "-j", "link", "show", "dev", device],
                         capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)[0]["gso_max_segs"])


def set_gso_max_segs(device: str, segs: int) -> None:
    subprocess.run(["ip", "link", "set", "dev", device, "gso_max_segs", str(segs)],
                   capture_output=True, text=True, check=True)


def link_mbps(device: str) -> int:
    """The device's speed as its driver reports it, 0 when unknown.
    Asked of ethtool (netlink, in the caller's namespace): /sys/class/net
    may be another namespace's after a setns."""
    out = subprocess.run(["ethtool", device], capture_output=True, text=True).stdout
    m = re.search(r"Speed:\s*(\d+)\s*Mb/s", out)
    return int(m.group(1)) if m else 0


def kind(device: str) -> str:
    """The link's kind as iproute2 names it (veth, vxlan, ...), '' for a NIC."""
    out = subprocess.run(["ip", "-d", "-j", "link", "show", "dev", device],
                         capture_output=True, text=True).stdout
    try:
        return json.loads(out)[0].get("linkinfo", {}).get("info_kind", "")
    except (ValueError, IndexError):
        return ""


def burst_segs(mtu: int, mbps: int) -> int:
    """The gso_max_segs that keeps a burst within BURST_US at MBPS."""
    if mbps <= 0:
        return GSO_MAX_SEGS
    budget = mbps * 1_000_000 // 8 * BURST_US // 1_000_000
    if budget >= BURST_MAX_BYTES:
        return GSO_MAX_SEGS
    return max(1, budget // max(mtu, 1))


def choose(granularity: str, device: str, mtu: int, link_rate_mbps: int = 0) -> int:
    """The gso_max_segs that gives DEVICE this granularity; auto sizes
    bursts for LINK_RATE_MBPS, or the device's own speed when 0."""
    if granularity == "packet":
        return 1
    if granularity == "burst":
        return GSO_MAX_SEGS
    return burst_segs(mtu, link_rate_mbps or wire_mbps(device))


def wire_mbps(device: str) -> int:
    """The speed of the device's wire, 0 for none: a veth's reported 10
    Gbit/s is nominal (it moves what the CPU moves, 20-30 Gbit/s here)."""
    return 0 if kind(device) == "veth" else link_mbps(device)


def describe(granularity: str, segs: int, mbps: int, mtu: int) -> dict:
    """What a device runs and why, for attach and status."""
    if segs == 1:
        what = "per-packet"
    elif segs >= GSO_MAX_SEGS:
        what = f"per-burst (up to {BURST_MAX_BYTES // 1024} KB)"
    else:
        what = f"per-burst (up to {segs} segments)"
    if granularity == "packet":
        why = "asked for (--granularity packet): no segmentation offload"
    elif granularity == "burst":
        why = "asked for (--granularity burst): the device's own GSO bound"
    elif granularity == "auto" and mbps:
        burst = min(segs * mtu, BURST_MAX_BYTES)
        why = (f"auto: a burst within {BURST_US} us of a {_rate(mbps)} link "
               f"({burst} B take {burst * 8 / mbps:.1f} us)")
    elif granularity == "auto":
        why = "auto: no wire speed (veth, or none reported): bursts as large as GSO makes them"
    else:
        why = "set outside mrcctl (gso_max_segs)"
    return {"granularity": granularity, "what": what, "gso_max_segs": segs,
            "link_mbps": mbps, "why": why}


def _rate(mbps: int) -> str:
    return f"{mbps / 1000:g} Gbit/s" if mbps >= 1000 else f"{mbps} Mbit/s"


def granularity(device: str) -> str:
    """What the device's gso_max_segs makes of spraying (a device whose
    attachment recorded nothing, or any device)."""
    try:
        segs = gso_max_segs(device)
    except (OSError, subprocess.CalledProcessError, KeyError, ValueError):
        return "unknown"
    if segs == 1:
        return "per-packet"
    return f"per-burst (up to {segs} segments share a path)"
