"""The kernel route that steers a peer prefix into the datapath.

The TC program sees a packet only after the kernel routed it, so each peer
prefix gets a route out of the attached device, via the next hop towards
the first segment (so neighbour resolution succeeds), with the MTU reduced
by the encapsulation overhead: TCP then advertises and uses a fitting MSS,
and ping and UDP see the smaller path MTU instead of silent drops.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket

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
#  quickack 1: every segment acknowledged at once, so the sender's clock
#    (RACK, the datapath's failover) sees each path's deliveries promptly.
#  features ecn (off by default: only where the fabric marks) and
#  congctl NAME (only if asked) are taken as overrides.
DEFAULT_TCP_METRICS = {"rto_min": "5ms", "reordering": "127", "quickack": "1"}
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
    """The TCP metrics of an installed route, as `ip route` names them."""
    raw = route.get_attr("RTA_METRICS")
    out = {}
    if raw is None:
        return out
    for key, rtax in RTAX.items():
        value = raw.get_attr(rtax)
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
    from pyroute2.netlink.exceptions import NetlinkError
    extra = _netlink_metrics(tcp or {})
    kwargs = dict(dst=str(prefix.network_address), dst_len=prefix.prefixlen, oif=index,
                  proto=ROUTE_PROTO, priority=ROUTE_METRIC)
    if prefix.version == 6:
        kwargs.update(family=socket.AF_INET6, gateway=gateway,
                      metrics={"RTAX_MTU": mtu, "RTAX_ADVMSS": mtu - 60, **extra})
    else:  # IPv4 over an IPv6 next hop (RTA_VIA)
        kwargs.update(family=socket.AF_INET, via={"family": socket.AF_INET6, "addr": gateway},
                      metrics={"RTAX_MTU": mtu, "RTAX_ADVMSS": mtu - 40, **extra})
    try:
        ipr.route("replace", **kwargs)
    except NetlinkError as e:
        raise MrcError(f"cannot install the route to {prefix}: {e.args[-1]}")


def remove(ipr: IPRoute, prefix: ipaddress._BaseNetwork, index: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    family = socket.AF_INET6 if prefix.version == 6 else socket.AF_INET
    try:
        ipr.route("del", family=family, dst=str(prefix.network_address), dst_len=prefix.prefixlen,
                  oif=index, proto=ROUTE_PROTO, priority=ROUTE_METRIC)
    except NetlinkError:
        pass


def remove_all(ipr: IPRoute, index: int) -> int:
    """Remove every route mrcctl installed out of device `index`."""
    from pyroute2.netlink.exceptions import NetlinkError
    removed = 0
    for family in (socket.AF_INET6, socket.AF_INET):
        for route in ipr.get_routes(family=family, proto=ROUTE_PROTO):
            if route.get_attr("RTA_OIF") != index:
                continue
            try:
                ipr.route("del", family=family, dst=route.get_attr("RTA_DST"),
                          dst_len=route["dst_len"], oif=index, proto=ROUTE_PROTO,
                          priority=route.get_attr("RTA_PRIORITY"))
                removed += 1
            except NetlinkError:
                pass
    return removed


def snapshot(ipr: IPRoute, prefix: ipaddress._BaseNetwork) -> list[tuple]:
    """(device index, gateway, MTU, TCP metrics) of each route of ours to PREFIX."""
    family = socket.AF_INET6 if prefix.version == 6 else socket.AF_INET
    out = []
    for route in ipr.get_routes(family=family, proto=ROUTE_PROTO):
        if route.get_attr("RTA_DST") != str(prefix.network_address) or \
                route["dst_len"] != prefix.prefixlen:
            continue
        via = route.get_attr("RTA_VIA")
        gateway = route.get_attr("RTA_GATEWAY") or (via or {}).get("addr")
        metrics = route.get_attr("RTA_METRICS")
        mtu = metrics.get_attr("RTAX_MTU") if metrics else 0
        tcp = tuple(sorted(tcp_metrics_of(route).items()))
        out.append((route.get_attr("RTA_OIF"), gateway, mtu, tcp))
    return sorted(out)


def restore(prefix: ipaddress._BaseNetwork, saved: list[tuple[int, str, int]]) -> None:
    """Make PREFIX's routes of ours exactly SAVED (a snapshot) again."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        for index, *_ in snapshot(ipr, prefix):
            remove(ipr, prefix, index)
        for index, gateway, mtu, tcp in saved:
            install(ipr, prefix, gateway, index, mtu, dict(tcp))


def ours(ipr: IPRoute, version: int, indexes) -> list:
    """mrcctl's routes of one IP version out of any of `indexes`."""
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    return [r for r in ipr.get_routes(family=family, proto=ROUTE_PROTO)
            if r.get_attr("RTA_OIF") in indexes]
