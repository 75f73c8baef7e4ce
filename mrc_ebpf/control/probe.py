"""`mrcctl probe`: echo requests to a peer, one or more on each of its paths.

The second line of failover, for paths that carry no traffic: the datapath
learns a path is dead only from packets sent on it, so an idle path could
be dead unnoticed.  Each echo request is marked MRC_PROBE_MARK | path id
(SO_MARK), and the TX program sends it on exactly that path, flagged a
probe.  Its acknowledgement is filed like any other packet's, so the
datapath itself brings an answering path up or takes a silent one down;
this command only supplies the packets and reports the round trips.
"""
from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import time

from mrc_ebpf.control import paths
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import C

PROBE_MARK = C["MRC_PROBE_MARK"]
ECHO = {6: (128, 129), 4: (8, 0)}        # (request, reply) ICMP types


def _checksum(data: bytes) -> int:
    """RFC 1071, for ICMPv4 (the kernel fills in ICMPv6's)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total & 0xFFFF) + (total >> 16)
    total += total >> 16
    return ~total & 0xFFFF


def _peer_of(att: Attachment, address) -> tuple[str, list[int]]:
    """The configured prefix holding ADDRESS (longest match) and its path ids."""
    best = None
    for key, peer in att.maps["peers"].items():
        prefix = paths.key_prefix(key)
        if prefix.version == address.version and address in prefix:
            if best is None or prefix.prefixlen > best[0].prefixlen:
                best = (prefix, peer)
    if best is None:
        raise MrcError(f"{address} is in no peer prefix of {att.device} (mrcctl path list)")
    prefix, peer = best
    return str(prefix), [i for i, _ in paths.used_paths(att, peer)]


def probe(att: Attachment, address_text: str, path_ids: list[int] | None = None, count: int = 3,
          interval: float = 0.05, timeout: float = 1.0) -> dict:
    try:
        address = ipaddress.ip_address(address_text)
    except ValueError:
        raise MrcError(f"bad address {address_text!r}: a peer's IPv6 or IPv4 address")
    if not 1 <= count <= 255:      # the echo sequence number is path id << 8 | k
        raise MrcError(f"bad --count {count}: 1..255")
    prefix, used = _peer_of(att, address)
    chosen = path_ids if path_ids else used
    unknown = sorted(set(chosen) - set(used))
    if unknown:
        raise MrcError(f"{prefix} has no path {unknown[0]} (it has {', '.join(map(str, used))})")
    # a denied path is never probed (the datapath would drop the probe too)
    denied = {r["path_id"] for r in paths.list_paths(att) if r["prefix"] == prefix
              and r["state"] == paths.STATE_DENIED}
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    proto = socket.IPPROTO_ICMPV6 if address.version == 6 else socket.IPPROTO_ICMP
    request, reply = ECHO[address.version]
    ident = os.getpid() & 0xFFFF
    sent: dict[tuple[int, int], int] = {}      # (path id, k) -> send time
    rtts: dict[tuple[int, int], float] = {}    # (path id, k) -> round trip, us
    with socket.socket(family, socket.SOCK_RAW, proto) as s:
        s.setblocking(False)
        for k in range(count):
            for path_id in chosen:
                if path_id in denied:
                    continue
                seq = path_id << 8 | k
                header = struct.pack("!BBHHH", request, 0, 0, ident, seq)
                payload = b"mrc-probe" + bytes(7)
                packet = header + payload
                if address.version == 4:
                    packet = header[:2] + struct.pack("!H", _checksum(packet)) + header[4:] + payload
                s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, PROBE_MARK | path_id)
                sent[(path_id, k)] = time.monotonic_ns()
                try:
                    s.sendto(packet, (str(address), 0))
                except OSError as e:
                    raise MrcError(f"cannot send a probe to {address}: {e.strerror}")
            _collect(s, address, ident, reply, sent, rtts, deadline=time.monotonic() + interval)
        _collect(s, address, ident, reply, sent, rtts, deadline=time.monotonic() + timeout,
                 until_all=True)
    states = {r["path_id"]: r for r in paths.list_paths(att) if r["prefix"] == prefix}
    rows = []
    for path_id in chosen:
        got = sorted(rtt for (p, _), rtt in rtts.items() if p == path_id)
        rows.append({"path_id": path_id, "segments": states[path_id]["segments"],
                     "sent": 0 if path_id in denied else count,
                     "received": len(got), "state": states[path_id]["state"],
                     "rtt_us": None if not got else {
                         "min": round(got[0], 1), "median": round(got[len(got) // 2], 1),
                         "max": round(got[-1], 1)}})
    return {"address": str(address), "prefix": prefix, "paths": rows}


def _collect(s: socket.socket, address, ident: int, reply: int, sent: dict, rtts: dict,
             deadline: float, until_all: bool = False) -> None:
    """Echo replies until the deadline (or, with until_all, every probe answered)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (until_all and len(rtts) == len(sent)):
            return
        if not select.select([s], [], [], left)[0]:
            continue
        data, source = s.recvfrom(2048)
        now = time.monotonic_ns()
        if address.version == 4:
            data = data[(data[0] & 0x0F) * 4:]      # raw IPv4 sockets see the IP header
        if len(data) < 8 or ipaddress.ip_address(source[0]) != address:
            continue
        kind, _, _, rid, seq = struct.unpack("!BBHHH", data[:8])
        key = (seq >> 8, seq & 0xFF)
        if kind == reply and rid == ident and key in sent and key not in rtts:
            rtts[key] = (now - sent[key]) / 1000
