"""The kernel route that steers a peer prefix into the datapath.

The TC program sees a packet only after the kernel routed it, so each peer
prefix gets a route out of the attached device, via the next hop towards
the first segment (so neighbour resolution succeeds), with the MTU reduced
by the encapsulation overhead: TCP then advertises and uses a fitting MSS,
and ping and UDP see the smaller path MTU instead of silent drops.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import struct

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.errors import MrcError

ROUTE_PROTO = 0x4D     # rtm_protocol of the routes mrcctl owns ('M')
ROUTE_METRIC = 77      # below the kernel's default IPv6 metric (1024)
# iproute2 shows ROUTE_PROTO by this name (`ip route ... proto mrc`)
PROTO_NAME = "mrc"
PROTO_FILE = "/etc/iproute2/rt_protos.d/mrc.conf"


def name_protocol(path: str = PROTO_FILE) -> bool:
    """Name ROUTE_PROTO for iproute2 (rt_protos.d), once; False when the
    file cannot be written (the routes still work, shown as `proto 77`)."""
    line = f"{ROUTE_PROTO}\t{PROTO_NAME}\n"
    try:
        with open(path) as f:
            if f.read() == line:
                return True
    except OSError:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(line)
        return True
    except OSError:
        return False


# What TCP needs over sprayed paths, put on the peer route so that it
# applies to MRC's traffic alone (docs/design/tcp.md has the why and the
# numbers).  iproute2's names; values as `ip route` prints them.
#  rto_min 5ms: the RTO floor (locked, else TCP ignores it): 200 ms is for
#    the Internet; a fabric's RTT is microseconds plus its queues.
#  reordering 127: the packets TCP waits for before it takes a hole for a
#    loss until RACK has seen reordering (3 is a single path's number;
#    spraying reorders by up to a few packets per path).
#  No quickack: an ACK for every burst doubled the ACKs the sender takes
#    in (each through its slow path) and cost 30% of 4 flows' rate on an
#    unshaped fabric, while failover was no better with it (docs/design/
#    tcp.md).  quickack 1, features ecn (only where the fabric marks) and
#    congctl NAME (only if asked) are taken as overrides.
DEFAULT_TCP_METRICS = {"rto_min": "5ms", "reordering": "127"}
RTAX = {"rto_min": "RTAX_RTO_MIN", "reordering": "RTAX_REORDERING", "quickack": "RTAX_QUICKACK",
        "features": "RTAX_FEATURES", "congctl": "RTAX_CC_ALGO"}
_LOCKED = {"rto_min": 13, "reordering": 9}       # bit = RTAX_* number: locked as iproute2 does
RTAX_FEATURE_ECN = 1
MAX_REORDERING = 300        # net.ipv4.tcp_max_reordering's default


def _parse_ms(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|us)?", text.strip())
    if not m:
        raise ValueError
    scale = {"s": 1000.0, "ms": 1.0, "us": 0.001, None: 1.0}[m.group(2)]
    ms = float(m.group(1)) * scale
    if ms != int(ms) or not 1 <= ms <= 60000:
        raise ValueError
    return int(ms)


def _available_congestion() -> list[str]:
    try:
        with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


def parse_metric(text: str) -> tuple[str, str | None]:
    """KEY=VALUE of `--route-metric` -> (key, value as `ip route` shows it);
    value None (`KEY=none`) removes a default."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or key not in RTAX:
        raise MrcError(f"bad --route-metric {text!r}: KEY=VALUE with KEY one of {', '.join(RTAX)}")
    if value == "none":
        return key, None
    try:
        if key == "rto_min":
            return key, f"{_parse_ms(value)}ms"
        if key == "reordering":
            n = int(value)
            if not 1 <= n <= MAX_REORDERING:
                raise ValueError
            return key, str(n)
        if key == "quickack":
            if value not in ("0", "1"):
                raise ValueError
            return key, value
        if key == "features":
            if value != "ecn":
                raise ValueError
            return key, value
        if value not in _available_congestion():
            raise ValueError
        return key, value
    except ValueError:
        hint = {"rto_min": "a time of 1ms..60s, e.g. 5ms", "reordering": f"1..{MAX_REORDERING}",
                "quickack": "0 or 1", "features": "ecn",
                "congctl": "one of " + " ".join(_available_congestion())}[key]
        raise MrcError(f"bad --route-metric {text!r}: {key} takes {hint} (or none)")


def _netlink_metrics(tcp: dict[str, str | None]) -> dict:
    out, lock = {}, 0
    for key, value in tcp.items():
        if value is None:
            continue
        if key == "rto_min":
            out[RTAX[key]] = _parse_ms(value)
        elif key == "features":
            out[RTAX[key]] = RTAX_FEATURE_ECN
        elif key == "congctl":
            out[RTAX[key]] = value
        else:
            out[RTAX[key]] = int(value)
        if key in _LOCKED:
            lock |= 1 << _LOCKED[key]
    if lock:
        out["RTAX_LOCK"] = lock
    return out


def tcp_metrics_of(route) -> dict[str, str]:
    """The TCP metrics of an installed route (pyroute2's), as `ip route` names them."""
    raw = route.get_attr("RTA_METRICS")
    if raw is None:
        return {}
    return _tcp_metrics({rtax: raw.get_attr(rtax) for rtax in RTAX.values()})


def _tcp_metrics(raw: dict) -> dict[str, str]:
    """RTAX name -> value of a route's metrics, as `ip route` names them."""
    out = {}
    for key, rtax in RTAX.items():
        value = raw.get(rtax)
        if value is None:
            continue
        if key == "rto_min":
            out[key] = f"{value}ms"
        elif key == "features":
            if value & RTAX_FEATURE_ECN:
                out[key] = "ecn"
        else:
            out[key] = str(value)
    return out


def find(ipr: IPRoute, prefix: ipaddress._BaseNetwork, indexes) -> object | None:
    """mrcctl's route to `prefix` out of one of `indexes`, or None."""
    family = socket.AF_INET6 if prefix.version == 6 else socket.AF_INET
    for route in ipr.get_routes(family=family, proto=ROUTE_PROTO):
        if (route.get_attr("RTA_OIF") in indexes and route["dst_len"] == prefix.prefixlen
                and route.get_attr("RTA_DST") == str(prefix.network_address)):
            return route
    return None


def next_hop(ipr: IPRoute, segment: str) -> tuple[int, str]:
    """(device index, gateway) towards `segment`; the segment itself if on-link."""
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        found = ipr.route("get", dst=segment)
    except NetlinkError as e:
        raise MrcError(f"no route to first segment {segment}: {e.args[-1]}")
    route = found[0]
    return route.get_attr("RTA_OIF"), route.get_attr("RTA_GATEWAY") or segment


def next_hops(ipr: IPRoute, segments: list[str]) -> dict[str, tuple[int, str]]:
    """next_hop of many segments: one `ip -batch` of `route get`s (256 of
    them in ~10 ms, where pyroute2 takes ~4 ms each); a segment it did not
    answer goes through next_hop (and its error)."""
    import json
    import subprocess
    out: dict[str, tuple[int, str]] = {}
    wanted = {str(ipaddress.IPv6Address(s)): s for s in segments}
    try:
        r = subprocess.run(["ip", "-6", "-j", "-force", "-batch", "-"], capture_output=True, text=True,
                           input="".join(f"route get {s}\n" for s in wanted), timeout=30)
        for line in r.stdout.splitlines():
            for route in json.loads(line) if line.strip() else []:
                seg = wanted.get(str(ipaddress.IPv6Address(route.get("dst", "::"))))
                if seg is not None and "dev" in route:
                    out[seg] = (socket.if_nametoindex(route["dev"]), route.get("gateway") or seg)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    for seg in segments:
        if seg not in out:
            out[seg] = next_hop(ipr, seg)
    return out


def install(ipr: IPRoute, prefix: ipaddress._BaseNetwork, gateway: str, index: int, mtu: int,
            tcp: dict[str, str | None] | None = None) -> None:
    """`tcp`: the route's TCP metrics (parse_metric's form), None for none."""
    install_many([(str(prefix), gateway, index, mtu, tcp)])


def remove(ipr: IPRoute, prefix: ipaddress._BaseNetwork, index: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    family = socket.AF_INET6 if prefix.version == 6 else socket.AF_INET
    try:
        ipr.route("del", family=family, dst=str(prefix.network_address), dst_len=prefix.prefixlen,
                  oif=index, proto=ROUTE_PROTO, priority=ROUTE_METRIC)
    except NetlinkError:
        pass


def remove_all(ipr: IPRoute, index: int) -> int:
    """Remove every route mrcctl installed out of device `index` (one dump,
    netlink batches: detach of 131,071 peers' routes one by one took minutes)."""
    gone = [prefix for prefix, entries in dump_ours().items() for e in entries if e[0] == index]
    _batch([_route_msg(RTM_DELROUTE, prefix, None, index, 0, None) for prefix in gone], gone,
           missing_ok=True)
    return len(gone)


def snapshot(ipr: IPRoute, prefix: ipaddress._BaseNetwork) -> list[tuple]:
    """(device index, gateway, MTU, TCP metrics) of each route of ours to PREFIX."""
    return dump_ours(prefix.version).get(str(prefix), [])


def restore(prefix: ipaddress._BaseNetwork, saved: list[tuple[int, str, int]]) -> None:
    """Make PREFIX's routes of ours exactly SAVED (a snapshot) again."""
    restore_many([(str(prefix), saved)])


def restore_many(items: list[tuple[str, list]]) -> None:
    """Make each prefix's routes of ours exactly its snapshot again (the
    undo of a change, journal.py): one dump, then netlink batches."""
    if not items:
        return
    table = dump_ours()
    gone = [(prefix, entry[0]) for prefix, _ in items for entry in table.get(canonical(prefix), [])]
    _batch([_route_msg(RTM_DELROUTE, prefix, None, index, 0, None) for prefix, index in gone],
           [prefix for prefix, _ in gone], missing_ok=True)
    install_many([(prefix, gw, index, mtu, dict(tcp)) for prefix, saved in items
                  for index, gw, mtu, tcp in saved])


# ---- netlink by hand, in batches ----------------------------------------------
# pyroute2 waits for each route's answer (~1 ms a route: `path bulk` of
# 10,000 peers spent 10 s in it); here many requests go in one send and
# their acknowledgements are read after.  The one encoder of our routes:
# install() and the journal's restore use it too, so a route put back is
# the route that was there.

RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_REPLACE, NLM_F_CREATE = 1, 4, 0x300, 0x100, 0x400
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_TABLE, RTA_VIA = 1, 4, 5, 6, 8, 15, 18
RT_TABLE_MAIN, RTN_UNICAST = 254, 1
RTAX_NUM = {"RTAX_LOCK": 1, "RTAX_MTU": 2, "RTAX_ADVMSS": 8, "RTAX_REORDERING": 9, "RTAX_FEATURES": 12,
        "RTAX_RTO_MIN": 13, "RTAX_QUICKACK": 15, "RTAX_CC_ALGO": 16}
RTAX_NAME = {v: k for k, v in RTAX_NUM.items()}
_HDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_NLA = struct.Struct("=HH")
CHUNK = 256         # requests per send: well inside the socket's buffers


def _nla(kind: int, payload: bytes) -> bytes:
    raw = _NLA.pack(_NLA.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def canonical(prefix: str) -> str:
    """PREFIX's text as dump_ours keys it (inet_ntop's)."""
    family, dst, length = _split(prefix)
    return f"{socket.inet_ntop(family, dst)}/{length}"


def _split(prefix: str) -> tuple[int, bytes, int]:
    addr, _, length = prefix.partition("/")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return family, socket.inet_pton(family, addr), int(length)


def _route_msg(kind: int, prefix: str, gateway: str | None, index: int, mtu: int,
               tcp: dict[str, str | None] | None) -> tuple[int, bytes]:
    """(nlmsg type, body) of a request about our route to PREFIX out of INDEX."""
    family, dst, length = _split(prefix)
    body = _RTMSG.pack(family, length, 0, 0, RT_TABLE_MAIN, ROUTE_PROTO, 0, RTN_UNICAST, 0)
    body += _nla(RTA_TABLE, struct.pack("=I", RT_TABLE_MAIN)) + _nla(RTA_DST, dst)
    body += _nla(RTA_PRIORITY, struct.pack("=I", ROUTE_METRIC)) + _nla(RTA_OIF, struct.pack("=I", index))
    if kind == RTM_NEWROUTE:
        gw = socket.inet_pton(socket.AF_INET6, gateway)
        if family == socket.AF_INET6:
            body += _nla(RTA_GATEWAY, gw)
        else:       # IPv4 over an IPv6 next hop
            body += _nla(RTA_VIA, struct.pack("=H", socket.AF_INET6) + gw)
        metrics = {"RTAX_MTU": mtu, "RTAX_ADVMSS": mtu - (60 if family == socket.AF_INET6 else 40),
                   **_netlink_metrics(tcp or {})}
        nested = b"".join(_nla(RTAX_NUM[k], v.encode() + b"\0" if isinstance(v, str) else struct.pack("=I", v))
                          for k, v in metrics.items())
        body += _nla(RTA_METRICS, nested)
    return kind, body


def install_many(items: list[tuple[str, str, int, int, dict | None]]) -> None:
    """Install (or replace) our routes: (prefix, gateway, device index,
    MTU, TCP metrics) each, in netlink batches."""
    msgs = [_route_msg(RTM_NEWROUTE, p, gw, index, mtu, tcp) for p, gw, index, mtu, tcp in items]
    _batch(msgs, [item[0] for item in items], flags=NLM_F_CREATE | NLM_F_REPLACE)


def _batch(msgs: list[tuple[int, bytes]], names: list[str], flags: int = 0, missing_ok: bool = False) -> None:
    """Send MSGS, CHUNK at a time, each acknowledged; the first refusal is
    raised (after the rest of its chunk was read: the kernel carries on
    with the requests after a refused one)."""
    if not msgs:
        return
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((0, 0))
        failure = None
        for start in range(0, len(msgs), CHUNK):
            chunk = msgs[start:start + CHUNK]
            out = bytearray()
            for seq, (kind, body) in enumerate(chunk, start=start + 1):
                out += _HDR.pack(_HDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_ACK | flags, seq, 0) + body
            s.send(bytes(out))
            pending = len(chunk)
            while pending:
                data = s.recv(1 << 20)
                for kind, seq, payload in _messages(data):
                    if kind != NLMSG_ERROR:
                        continue
                    pending -= 1
                    err = -struct.unpack_from("=i", payload)[0]
                    if err and failure is None and not (missing_ok and err in (errno.ESRCH, errno.ENOENT)):
                        failure = (names[seq - 1], err)
        if failure:
            what = "install" if msgs[0][0] == RTM_NEWROUTE else "remove"
            raise MrcError(f"cannot {what} the route to {failure[0]}: {os.strerror(failure[1])}")


def _messages(data: bytes):
    """(type, seq, payload) of each netlink message in DATA."""
    at = 0
    while at + _HDR.size <= len(data):
        length, kind, _, seq, _ = _HDR.unpack_from(data, at)
        if length < _HDR.size:
            break
        yield kind, seq, data[at + _HDR.size:at + length]
        at += (length + 3) & ~3


def _attrs(data: bytes, at: int = 0) -> dict[int, bytes]:
    out = {}
    while at + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, at)
        if length < _NLA.size:
            break
        out[kind & 0x3FFF] = data[at + _NLA.size:at + length]
        at += (length + 3) & ~3
    return out


def dump_ours(version: int | None = None) -> dict[str, list[tuple]]:
    """Every route of ours, by prefix text: a snapshot() of each, from one
    netlink dump per IP version (a `path bulk` reads this once, not once
    per peer)."""
    out: dict[str, list] = {}
    families = {4: [socket.AF_INET], 6: [socket.AF_INET6], None: [socket.AF_INET6, socket.AF_INET]}[version]
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((0, 0))
        for family in families:
            body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            s.send(_HDR.pack(_HDR.size + len(body), RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
            done = False
            while not done:
                for kind, _, payload in _messages(s.recv(1 << 20)):
                    if kind == NLMSG_DONE:
                        done = True
                        break
                    if kind == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", payload)[0]
                        if err:
                            raise MrcError(f"cannot read the routes: {os.strerror(err)}")
                        continue
                    fam, length, _, _, _, proto, _, _, _ = _RTMSG.unpack_from(payload)
                    if proto != ROUTE_PROTO:
                        continue
                    attrs = _attrs(payload, _RTMSG.size)
                    if RTA_DST in attrs:
                        dst = socket.inet_ntop(fam, attrs[RTA_DST])
                    else:
                        dst = "::" if fam == socket.AF_INET6 else "0.0.0.0"
                    if RTA_GATEWAY in attrs:
                        gw = socket.inet_ntop(fam, attrs[RTA_GATEWAY])
                    elif RTA_VIA in attrs:
                        via = attrs[RTA_VIA]
                        gw = socket.inet_ntop(struct.unpack_from("=H", via)[0], via[2:])
                    else:
                        gw = None
                    metrics = {}
                    for k, v in _attrs(attrs.get(RTA_METRICS, b"")).items():
                        name = RTAX_NAME.get(k)
                        if name:
                            metrics[name] = v.rstrip(b"\0").decode() if name == "RTAX_CC_ALGO" \
                                else struct.unpack_from("=I", v)[0]
                    oif = struct.unpack_from("=I", attrs[RTA_OIF])[0] if RTA_OIF in attrs else 0
                    tcp = tuple(sorted(_tcp_metrics(metrics).items()))
                    out.setdefault(f"{dst}/{length}", []).append((oif, gw, metrics.get("RTAX_MTU", 0), tcp))
    return {k: sorted(v) for k, v in out.items()}


def ours(ipr: IPRoute, version: int, indexes) -> list:
    """mrcctl's routes of one IP version out of any of `indexes`."""
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    return [r for r in ipr.get_routes(family=family, proto=ROUTE_PROTO)
            if r.get_attr("RTA_OIF") in indexes]
