"""Which first-tier hop each entropy value (EV) crosses, and a spray list
that rotates over those hops (`mrcctl path trace`).

An EV goes wherever the fabric's ECMP hash sends it.  Sprayed in path-id
order, consecutive turns land on the spines in the hash's irregular order
and unequal counts, the spines' queues drift apart and TCP retransmits
what is only late (docs/design/entropy.md, "What limits it").  Knowing
which EVs share a hop, the spray list can rotate over the hops with equal
counts, as a list of SRH paths through distinct spines does.

How a hop is learnt (Paris traceroute): a probe with the EV's exact outer
header -- source our SID, destination the peer's SID, the EV as flow
label, next header Destination Options as the data carries -- so that a
leaf hashes it exactly as the EV's data, and hop limit 2: the leaf
forwards it, the spine it crosses answers ICMPv6 Time Exceeded (RFC 4443
3.3), and the answer's source names the hop.  The quoted header inside
the answer says which EV it was (its flow label), so probes need no ids
and may be sent all at once.  Replies come back to our SID, which is not
a local address of the host: they are read from a packet socket on the
path's device (classic BPF filter: ICMPv6 type 3 only); mrc_rx passes
them (not Routing / Destination Options to our SID), mrc_tx leaves the
probes alone (the peer SID is no peer prefix).

Switches rate-limit ICMPv6 errors (Linux: net.ipv6.icmp.ratelimit per
destination, 6 at once then one per interval; icmp_msgs_per_sec overall;
hardware: CoPP).  Probes are paced and unanswered ones sent again over a
few rounds; the lab fabric sets its spines' per-destination limit to 0.

The hop is recorded on the path in segments[1] (an entropy path sends
segments[0] only, n_segments stays 1; bpf/mrc_common.h): `path list`
shows it, `path deny --hop` matches it, and spray.rebuild orders the spray
list with `spray.rotation` whenever a peer's paths have recorded hops.
"""
from __future__ import annotations

import ctypes
import ipaddress
import select
import socket
import struct
import time

from mrc_ebpf.control.path_spec import ENTROPY, HOP_SLOT, parse_prefix
from mrc_ebpf.control.peer_table import (LAST_HOP, MAX_CLASSES, key_prefix, lookup_peer, path_index,
                                         path_state, used_paths)
from mrc_ebpf.control.spray import rebuild
from mrc_ebpf.datapath import layout
from mrc_ebpf.errors import MrcError

ETH_P_IPV6 = 0x86DD
NH_DOPT, NH_NONE, NH_ICMP6 = 60, 59, 58
ICMP6_TIME_EXCEEDED = 3
SO_ATTACH_FILTER = 26

# Ethernet + IPv6 + ICMPv6 type 3 (Time Exceeded): ldh [12]; ldb [20]; ldb [54]
_FILTER = [(0x28, 0, 0, 12), (0x15, 0, 5, ETH_P_IPV6), (0x30, 0, 0, 20), (0x15, 0, 3, NH_ICMP6),
           (0x30, 0, 0, 54), (0x15, 0, 1, ICMP6_TIME_EXCEEDED), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]


def probe_packet(src: bytes, dst: bytes, ev: int, hop_limit: int = 2) -> bytes:
    """The EV's outer IPv6 header (version, traffic class 0, flow label EV,
    next header Destination Options) and an 8-byte Destination Options
    header holding only PadN, nothing after it (next header 59)."""
    doh = struct.pack("!BBBB4x", NH_NONE, 0, 1, 4)      # PadN of 4 bytes
    first = (6 << 28) | (ev & 0xFFFFF)
    return struct.pack("!IHBB", first, len(doh), NH_DOPT, hop_limit) + src + dst + doh


def parse_reply(frame: bytes) -> tuple[str, bytes, bytes, int] | None:
    """(hop, quoted source, quoted destination, quoted flow label) of an
    Ethernet frame holding ICMPv6 Time Exceeded, else None."""
    if len(frame) < 14 + 40 + 8 + 40:
        return None
    if struct.unpack_from("!H", frame, 12)[0] != ETH_P_IPV6 or frame[20] != NH_ICMP6 or \
            frame[54] != ICMP6_TIME_EXCEEDED:
        return None
    hop = str(ipaddress.IPv6Address(frame[22:38]))
    q = 62                                              # the invoking packet
    if frame[q] >> 4 != 6:
        return None
    label = struct.unpack_from("!I", frame, q)[0] & 0xFFFFF
    return hop, frame[q + 8:q + 24], frame[q + 24:q + 40], label


def _listener(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6))
    prog = (ctypes.c_ubyte * (8 * len(_FILTER)))()
    for i, (code, jt, jf, k) in enumerate(_FILTER):
        struct.pack_into("HBBI", prog, 8 * i, code, jt, jf, k)
    fprog = struct.pack("HxxxxxxQ", len(_FILTER), ctypes.addressof(prog))
    s.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    s.bind((ifname, 0))
    s.setblocking(False)
    while True:         # what arrived before the filter was attached
        try:
            s.recv(65536)
        except BlockingIOError:
            break
    return s


def probe_hops(ifname: str, src: ipaddress.IPv6Address, dst: ipaddress.IPv6Address,
               evs: list[int], rounds: int = 6, wait: float = 0.25,
               pace: float = 0.0005) -> dict[int, tuple[str, float]]:
    """EV -> (hop, round-trip ms) of each EV that drew a Time Exceeded;
    probes paced `pace` s apart, the unanswered sent again each round."""
    want = set(evs)
    found: dict[int, tuple[str, float]] = {}
    sent: dict[int, float] = {}
    try:
        rx = _listener(ifname)
    except OSError as e:
        raise MrcError(f"path trace: cannot listen on {ifname}: {e.strerror}")
    try:
        tx = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except OSError as e:
        rx.close()
        raise MrcError(f"path trace: cannot open a raw socket: {e.strerror}")
    try:
        tx.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        for _ in range(rounds):
            pending = [ev for ev in evs if ev not in found]
            if not pending:
                break
            for ev in pending:
                sent[ev] = time.monotonic()
                try:
                    tx.sendto(probe_packet(src.packed, dst.packed, ev), (str(dst), 0))
                except OSError as e:
                    raise MrcError(f"path trace: sending a probe to {dst} on {ifname}: {e.strerror}")
                if pace:
                    time.sleep(pace)
            deadline = time.monotonic() + wait
            while len(found) < len(want):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([rx], [], [], left)[0]:
                    break
                while True:
                    try:
                        frame = rx.recv(65536)
                    except BlockingIOError:
                        break
                    got = parse_reply(frame)
                    if got is None:
                        continue
                    hop, qsrc, qdst, label = got
                    if qsrc == src.packed and qdst == dst.packed and label in want and label not in found:
                        found[label] = (hop, round((time.monotonic() - sent[label]) * 1000, 3))
    finally:
        rx.close()
        tx.close()
    return found


def _entropy_paths(att, prefix_text: str):
    prefix = parse_prefix(prefix_text)
    key, peer = lookup_peer(att, prefix)
    evs = [(i, p) for i, p in used_paths(att, peer) if p.flags & ENTROPY]
    if not evs:
        raise MrcError(f"{prefix} has no entropy paths to trace (mrcctl path add {prefix} --entropy N --sid SID)")
    return prefix, key, peer, evs


def trace(att, prefix_text: str, order: bool = False, forget: bool = False,
          rounds: int = 6, wait: float = 0.25) -> dict:
    """Trace the first-tier hop of each entropy path of PREFIX; with
    `order`, record it on the path (path list, deny --hop) and order the
    spray list over the hops; with `forget`, drop the recorded hops (the
    spray goes back to id order).  Denied EVs are traced too (a probe is
    no data), which lets an operator see where they go."""
    prefix, key, peer, evs = _entropy_paths(att, prefix_text)
    if order and forget:
        raise MrcError("--order and --forget exclude each other")
    found: dict[int, tuple[str, float]] = {}
    took = 0.0
    if not forget:
        src = ipaddress.IPv6Address(bytes(att.config.sid))
        by_dev: dict[tuple[int, bytes], list] = {}
        for i, p in evs:
            by_dev.setdefault((p.oif, bytes(p.peer_sid.addr)), []).append(p.flowlabel)
        started = time.monotonic()
        for (oif, sid), labels in by_dev.items():
            try:
                ifname = socket.if_indextoname(oif)
            except OSError:
                raise MrcError(f"{prefix}: the paths' device (ifindex {oif}) is gone")
            found.update(probe_hops(ifname, src, ipaddress.IPv6Address(sid), labels, rounds, wait))
        took = time.monotonic() - started
    rows = []
    for i, p in evs:
        hop, rtt = found.get(p.flowlabel, (None, None))
        rows.append({"path_id": i, "ev": p.flowlabel, "hop": hop, "rtt_ms": rtt,
                     "state": path_state(att, peer, i, p)})
    recorded = False
    if order or forget:
        for (i, p), row in zip(evs, rows):
            want = ipaddress.IPv6Address(row["hop"]).packed if order and row["hop"] else bytes(16)
            if bytes(p.segments[HOP_SLOT].addr) != want:
                ctypes.memmove(p.segments[HOP_SLOT].addr, want, 16)
                att.maps["paths"].update(path_index(peer.peer_id, i), p)
        rebuild(att, peer, sids=False)
        recorded = order
    hops: dict[str, int] = {}
    for r in rows:
        if r["hop"]:
            hops[r["hop"]] = hops.get(r["hop"], 0) + 1
    spray = att.maps["spray"].lookup(layout.Index(peer.peer_id * MAX_CLASSES))
    return {"prefix": str(prefix), "paths": rows, "hops": dict(sorted(hops.items())),
            "unanswered": [r["path_id"] for r in rows if not r["hop"]] if not forget else [],
            "recorded": recorded, "forgot": forget, "took_s": round(took, 3),
            "spray": list(spray.ids[:spray.n]) if spray is not None else []}


def trace_all(att, prefix_text: str | None, **kw) -> list[dict]:
    """trace() of PREFIX, or of every peer with entropy paths of its own."""
    if prefix_text:
        return [trace(att, prefix_text, **kw)]
    out = []
    for key, peer in sorted(att.maps["peers"].items(), key=lambda kv: kv[1].peer_id):
        if peer.flags & LAST_HOP:
            continue
        if any(p.flags & ENTROPY for _, p in used_paths(att, peer)):
            out.append(trace(att, str(key_prefix(key)), **kw))
    if not out:
        raise MrcError("no peer has entropy paths to trace (mrcctl path add PREFIX --entropy N --sid SID)")
    return out
