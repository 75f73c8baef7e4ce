"""Port status (issue 29; MRC's Port Status Update): when one of the
attachment's devices (a plane's NIC) goes down, carrier or admin, its
peers are told at once, so they stop sending into that plane without
waiting for their acknowledgement clocks.

Where the kernel lets it, fentry hooks on the kernel's carrier and flags
changes set config.ports_down themselves the instant a device changes
(bpf/mrc_ports.c, datapath/port_hook.py), and `mrcctl ports watch`, woken
by the event they log, only does (2) below.  Without them, `mrcctl ports
watch` listens to the kernel's link events (rtnetlink, RTNLGRP_LINK) for
the attachment's devices and, when the set of down ones changes, (1)
writes it to config.ports_down, which the TX program copies
into every TLV it sends (mrc_tlv.ports_down: bit i, devices[i]), and (2)
sends one feedback-only packet to each peer the datapath has state for,
on a path through a plane that is up: an empty IPv6 packet to the peer's
prefix, marked MRC_PROBE_COPY_MARK | path id, which mrc_tx encapsulates
on that path as a control packet (the peer files it and drops it; it is
counted as a probe copy).  The peer's RX takes its paths through that
plane out (bpf/lib/ports.h).  Planes are numbered by the order of the
devices in `attach` on every host alike (`fabric attach`: eth0 eth1 ...).
"""
from __future__ import annotations

import select
import socket
import struct
import time

from mrc_ebpf.control import peer_table
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C

IFF_UP, IFF_LOWER_UP = 0x1, 0x10000
PROBE_COPY_MARK = C["MRC_PROBE_COPY_MARK"]
UP = C["MRC_PATH_UP"]
ETH_P_IPV6, ETH_P_IP = 0x86DD, 0x0800
IPPROTO_NONE = 59
SO_MARK = getattr(socket, "SO_MARK", 36)


def devices(att) -> list[dict]:
    """The attachment's devices in plane order: ifindex, name, plane."""
    from mrc_ebpf.datapath.hooks import ifname_of
    cfg = att.maps["config"].lookup(layout.Index(0))
    return [{"plane": i, "ifindex": cfg.devices[i].ifindex, "dev": ifname_of(cfg.devices[i].ifindex)}
            for i in range(min(cfg.n_devices, len(cfg.devices)))]


def link_down(flags: int) -> bool:
    """Down for carrying traffic: admin down or no carrier."""
    return not (flags & IFF_UP) or not (flags & IFF_LOWER_UP)


def current_mask(att, ipr=None) -> int:
    """Bit i set: the attachment's device of plane i is down now."""
    from pyroute2 import IPRoute
    own = ipr is None
    ipr = ipr or IPRoute()
    try:
        mask = 0
        for d in devices(att):
            links = ipr.get_links(d["ifindex"])
            if not links or link_down(links[0]["flags"]):
                mask |= 1 << d["plane"]
        return mask
    finally:
        if own:
            ipr.close()


def published(att) -> int:
    return att.maps["config"].lookup(layout.Index(0)).ports_down


def publish(att, mask: int) -> None:
    """config.ports_down = MASK: every TLV sent from now on carries it."""
    cfg = att.maps["config"].lookup(layout.Index(0))
    cfg.ports_down = mask
    att.maps["config"].update(layout.Index(0), cfg)


def _peer_targets(att) -> dict[int, tuple]:
    """peer_id -> (an address in one of its prefixes, its peer entry), for
    the peers the datapath has learnt state for; IPv6 prefixes first."""
    learnt = {k.value for k in att.maps["peer_state"].keys()}
    found: dict[int, tuple] = {}
    for key, peer in att.maps["peers"].items():
        if peer.peer_id not in learnt:
            continue
        net = peer_table.key_prefix(key)
        if peer.peer_id not in found or (net.version == 6 and found[peer.peer_id][0].version == 4):
            found[peer.peer_id] = (net.network_address, peer)
    return found


def _path_for(att, peer: layout.Peer, mask: int, planes: dict[int, int]) -> int | None:
    """A path of the peer through a plane that is up (the datapath's up
    ones first), or None."""
    row = peer_table.row_learnt(att, peer.template_id)
    fallback = None
    for i in range(peer.n_paths):
        p = att.maps["paths"].lookup(layout.Index(peer.template_id * C["MRC_MAX_PATHS"] + i))
        plane = planes.get(p.oif) if p else None
        if p is None or p.state != UP or plane is None or mask >> plane & 1:
            continue
        if not row.paths[i].live.down_ns:
            return i
        fallback = i if fallback is None else fallback
    return fallback


def _empty_packet(dst) -> tuple[bytes, int]:
    """An empty packet to DST (no next header): what mrc_tx makes a control packet of."""
    if dst.version == 6:
        return struct.pack("!IHBB16s16s", 6 << 28, 0, IPPROTO_NONE, 64, bytes(16), dst.packed), ETH_P_IPV6
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20, 0, 0x4000, 64, IPPROTO_NONE, 0, bytes(4), dst.packed)
    words = struct.unpack("!10H", head)
    total = sum(words)
    total = (total & 0xFFFF) + (total >> 16)
    total += total >> 16
    return head[:10] + struct.pack("!H", ~total & 0xFFFF) + head[12:], ETH_P_IP


class Announcer:
    """What to send each peer when a plane goes down, made ahead (`refresh`)
    so that telling them (`send`) is a few system calls: per peer with
    learnt state, its empty packet and, per plane, a path of it avoiding
    that plane."""

    def __init__(self, att):
        self.att = att
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM)
        self.devs = devices(att)
        self.plan: list[tuple[int, str, bytes, int, dict[int, int | None]]] = []
        self.refresh()

    def close(self):
        self.sock.close()

    def refresh(self) -> None:
        planes = {d["ifindex"]: d["plane"] for d in self.devs}
        plan = []
        for peer_id, (dst, peer) in sorted(_peer_targets(self.att).items()):
            frame, proto = _empty_packet(dst)
            avoid = {d["plane"]: _path_for(self.att, peer, 1 << d["plane"], planes) for d in self.devs}
            plan.append((peer_id, str(dst), frame, proto, avoid))
        self.plan = plan

    def send(self, mask: int) -> list[dict]:
        """One feedback-only packet to each peer, on a path through a plane
        that is up, sent by a device that is up: [{peer_id, to, path_id}]."""
        out = [d["dev"] for d in self.devs if not mask >> d["plane"] & 1 and d["dev"]]
        if not out:
            return []
        down = [d["plane"] for d in self.devs if mask >> d["plane"] & 1]
        sent = []
        for peer_id, to, frame, proto, avoid in self.plan:
            # the path avoiding the lowest plane that is down (one plane a
            # change, as a rule); None: the peer has no path elsewhere
            path_id = avoid.get(down[0]) if down else next(iter(avoid.values()), None)
            if path_id is None:
                continue
            self.sock.setsockopt(socket.SOL_SOCKET, SO_MARK, PROBE_COPY_MARK | path_id)
            # the kernel writes the Ethernet header; mrc_tx sends the
            # control packet on to the path's own next hop (redirect_neigh)
            self.sock.sendto(frame, (out[0], proto, 0, 0, b"\xff" * 6))
            sent.append({"peer_id": peer_id, "to": to, "path_id": path_id})
        return sent


def announce(att, mask: int) -> list[dict]:
    """One feedback-only packet to each peer with learnt state, on a path
    through a plane that is up: [{peer_id, to, path_id}] of those sent."""
    a = Announcer(att)
    try:
        return a.send(mask)
    finally:
        a.close()


def watch(att, count: int | None = None, timeout: float | None = None, stop=None, refresh_s: float = 1.0,
          kernel: bool | None = None):
    """Yields one dict per change of the down set, after it was published
    and announced: {ns (CLOCK_MONOTONIC when the change was read), mask,
    was, told, done_ns, by}.  What to send each peer is made ahead, every
    REFRESH_S while idle.

    The link events' own flags say which devices are down (no query on
    the way); a set that differs from config.ports_down is published here
    (`by` "netlink"; the state at start counts as a change).  KERNEL
    (default: whether the attachment's kernel hooks are on,
    datapath/port_hook.py): the hooks set config.ports_down themselves,
    often before netlink tells, and ring the event ring, which wakes this
    to announce what they set (`by` "kernel", `hook_ns` the hook's own
    instant); netlink still publishes what they missed (an admin down the
    link-watch hooks see only when the kernel's link-watch work runs)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.rtnl import RTMGRP_LINK
    from mrc_ebpf.datapath import port_hook
    from mrc_ebpf.datapath.loader import EVENT_RING
    from mrc_ebpf.datapath.ringbuf import Doorbell
    import ctypes
    if kernel is None:
        kernel = port_hook.in_kernel(att)
    ends = time.monotonic() + timeout if timeout else None
    n = 0
    ann = Announcer(att)
    bell = Doorbell(str(att.dir / EVENT_RING), ctypes.sizeof(layout.Event)) if kernel else None
    told = published(att)           # what the peers were told last
    try:
        with IPRoute() as ipr:
            ipr.bind(groups=RTMGRP_LINK)
            plane_of = {d["ifindex"]: d["plane"] for d in ann.devs}
            seen = current_mask(att)    # its own socket: a query on the bound one lost its events
            news = True
            refreshed = time.monotonic()
            while True:
                by = "kernel"
                if news and seen != published(att):
                    publish(att, seen)
                    by = "netlink"
                news = False
                mask = published(att)
                if mask != told:
                    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                    sent = ann.send(mask)
                    change = {"ns": now, "mask": mask, "was": told, "told": sent,
                              "done_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC), "by": by}
                    if kernel:
                        change["hook_ns"] = att.maps["port_hook"].lookup(layout.Index(0)).last_ns
                    told = mask
                    yield change
                    n += 1
                    if count and n >= count:
                        return
                if (stop and stop.is_set()) or (ends and time.monotonic() >= ends):
                    return
                if time.monotonic() - refreshed >= refresh_s:
                    ann.refresh()
                    refreshed = time.monotonic()
                left = 0.2 if ends is None else max(0.0, min(0.2, ends - time.monotonic()))
                ready = select.select([ipr] + ([bell] if bell else []), [], [], left)[0]
                if bell is not None and bell in ready:
                    bell.wait(0)        # the edge taken; the mask is read above
                if ipr not in ready:
                    continue
                for m in ipr.get():
                    plane = plane_of.get(m.get("index"))
                    if plane is None or m.get("event") not in ("RTM_NEWLINK", "RTM_DELLINK"):
                        continue
                    gone = m.get("event") == "RTM_DELLINK" or link_down(m["flags"])
                    seen = seen | 1 << plane if gone else seen & ~(1 << plane)
                    news = True
    finally:
        ann.close()
        if bell is not None:
            bell.close()
