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
import socket

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

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


def next_hop(ipr: IPRoute, segment: str) -> tuple[int, str]:
    """(device index, gateway) towards `segment`; the segment itself if on-link."""
    try:
        found = ipr.route("get", dst=segment)
    except NetlinkError as e:
        raise MrcError(f"no route to first segment {segment}: {e.args[-1]}")
    route = found[0]
    return route.get_attr("RTA_OIF"), route.get_attr("RTA_GATEWAY") or segment


def install(ipr: IPRoute, prefix: ipaddress._BaseNetwork, gateway: str, index: int, mtu: int) -> None:
    kwargs = dict(dst=str(prefix.network_address), dst_len=prefix.prefixlen, oif=index,
                  proto=ROUTE_PROTO, priority=ROUTE_METRIC)
    if prefix.version == 6:
        kwargs.update(family=socket.AF_INET6, gateway=gateway,
                      metrics={"RTAX_MTU": mtu, "RTAX_ADVMSS": mtu - 60})
    else:  # IPv4 over an IPv6 next hop (RTA_VIA)
        kwargs.update(family=socket.AF_INET, via={"family": socket.AF_INET6, "addr": gateway},
                      metrics={"RTAX_MTU": mtu, "RTAX_ADVMSS": mtu - 40})
    try:
        ipr.route("replace", **kwargs)
    except NetlinkError as e:
        raise MrcError(f"cannot install the route to {prefix}: {e.args[-1]}")


def remove(ipr: IPRoute, prefix: ipaddress._BaseNetwork, index: int) -> None:
    family = socket.AF_INET6 if prefix.version == 6 else socket.AF_INET
    try:
        ipr.route("del", family=family, dst=str(prefix.network_address), dst_len=prefix.prefixlen,
                  oif=index, proto=ROUTE_PROTO, priority=ROUTE_METRIC)
    except NetlinkError:
        pass


def remove_all(ipr: IPRoute, index: int) -> int:
    """Remove every route mrcctl installed out of device `index`."""
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


def snapshot(ipr: IPRoute, prefix: ipaddress._BaseNetwork) -> list[tuple[int, str, int]]:
    """(device index, gateway, MTU) of each route of ours to PREFIX."""
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
        out.append((route.get_attr("RTA_OIF"), gateway, mtu))
    return sorted(out)


def restore(prefix: ipaddress._BaseNetwork, saved: list[tuple[int, str, int]]) -> None:
    """Make PREFIX's routes of ours exactly SAVED (a snapshot) again."""
    with IPRoute() as ipr:
        for index, _, _ in snapshot(ipr, prefix):
            remove(ipr, prefix, index)
        for index, gateway, mtu in saved:
            install(ipr, prefix, gateway, index, mtu)
