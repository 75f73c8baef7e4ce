"""The TCP metrics `path add` puts on the peer route (rto_min, reordering;
quickack, features ecn and congctl on request), read back from the kernel
with pyroute2: present by default, overridable, refused with one line and
nothing changed when bad, shown by `path list`/`status`, and gone with the
path."""
from __future__ import annotations

import json
import socket
import subprocess

import pytest
from pyroute2 import NetNS

from conftest import mrcctl

pytestmark = pytest.mark.root

PREFIX6, PREFIX4 = "fd00:2::/64", "198.18.2.0/24"
RTAX_LOCK_RTO_MIN, RTAX_LOCK_REORDERING = 1 << 13, 1 << 9


def installed(ns: str, prefix: str) -> dict | None:
    """The metrics of mrcctl's route to `prefix` (proto 77) in `ns`, as the kernel has them."""
    dst, dst_len = prefix.split("/")
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with NetNS(ns) as ipr:
        for route in ipr.get_routes(family=family, proto=0x4D):
            if route.get_attr("RTA_DST") == dst and route["dst_len"] == int(dst_len):
                raw = route.get_attr("RTA_METRICS")
                return {name: raw.get_attr(name) for name in
                        ("RTAX_LOCK", "RTAX_MTU", "RTAX_RTO_MIN", "RTAX_REORDERING", "RTAX_QUICKACK",
                         "RTAX_FEATURES", "RTAX_CC_ALGO")}
    return None


def test_route_carries_tcp_metrics_overrides_and_goes_with_the_path(interop):
    A = interop.A
    interop.attach()
    mrcctl("path", "add", PREFIX6, "--via", interop.B_DT6, netns=A)
    m = installed(A, PREFIX6)
    assert m["RTAX_RTO_MIN"] == 5 and m["RTAX_LOCK"] & RTAX_LOCK_RTO_MIN
    assert m["RTAX_REORDERING"] == 127 and m["RTAX_LOCK"] & RTAX_LOCK_REORDERING
    assert not m["RTAX_QUICKACK"] and not m["RTAX_FEATURES"] and m["RTAX_CC_ALGO"] is None
    assert m["RTAX_MTU"]                   # the MTU metric is still there
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert rows[0]["route_metrics"] == {"rto_min": "5ms", "reordering": "127"}
    status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
    assert {"prefix": PREFIX6, "route_metrics": rows[0]["route_metrics"]} in status["routes"]
    assert "rto_min 5ms" in mrcctl("path", "list", netns=A).stdout

    # overrides: on a later `path add`, the others kept
    mrcctl("path", "add", PREFIX6, "--via", f"{interop.R_SID},{interop.B_DT6}",
           "--route-metric", "rto_min=20ms", "--route-metric", "features=ecn",
           "--route-metric", "quickack=1", "--route-metric", "reordering=none",
           "--route-metric", "congctl=reno", netns=A)
    m = installed(A, PREFIX6)
    assert m["RTAX_RTO_MIN"] == 20 and m["RTAX_FEATURES"] == 1 and not m["RTAX_REORDERING"]
    assert m["RTAX_QUICKACK"] == 1 and m["RTAX_CC_ALGO"] == "reno"
    # a path deleted (the route re-installed) keeps them
    mrcctl("path", "del", PREFIX6, "--id", "1", netns=A)
    m = {**m, "RTAX_MTU": installed(A, PREFIX6)["RTAX_MTU"]}     # one segment less to carry
    assert installed(A, PREFIX6) == m

    # bad keys and values: one line, non-zero, nothing changed
    before = mrcctl("path", "list", "-j", netns=A).stdout
    for bad in ("rto=5ms", "rto_min=fast", "rto_min=0ms", "reordering=0", "reordering=100000",
                "quickack=2", "features=sack", "congctl=nosuch", "rto_min"):
        r = mrcctl("path", "add", PREFIX6, "--via", f"{interop.R_SID},{interop.B_DT6}",
                   "--route-metric", bad, netns=A, check=False)
        assert r.returncode != 0 and "Traceback" not in r.stderr, bad
        assert len(r.stderr.strip().splitlines()) == 1 and "--route-metric" in r.stderr, r.stderr
    assert installed(A, PREFIX6) == m
    assert mrcctl("path", "list", "-j", netns=A).stdout == before

    # IPv4 peers get them too; and they go with the path
    mrcctl("path", "add", PREFIX4, "--via", interop.B_DX4, "--route-metric", "rto_min=10ms", netns=A)
    m4 = installed(A, PREFIX4)
    assert m4["RTAX_RTO_MIN"] == 10 and m4["RTAX_REORDERING"] == 127 and not m4["RTAX_QUICKACK"]
    mrcctl("path", "del", PREFIX6, netns=A)
    mrcctl("path", "del", PREFIX4, netns=A)
    assert installed(A, PREFIX6) is None and installed(A, PREFIX4) is None


def test_tcp_uses_the_route_rto_floor(interop):
    """A TCP connection over the peer route runs with the route's floor:
    ss shows its RTO near 5 ms, not the kernel's 200 ms."""
    A, B = interop.A, interop.B
    interop.attach()
    mrcctl("path", "add", PREFIX6, "--via", interop.B_DT6, netns=A)
    server = interop.t.popen(B, ["python3", "-c", "import socket,time\n"
                                 "s=socket.socket(socket.AF_INET6);s.setsockopt(1,2,1)\n"
                                 f"s.bind(('{interop.B6}',5301));s.listen();print('ready',flush=True)\n"
                                 "c,_=s.accept();time.sleep(3)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        r = interop.t.exec(A, ["python3", "-c", "import socket,subprocess,time\n"
                               f"c=socket.create_connection(('{interop.B6}',5301))\n"
                               "c.send(b'x'*1000);time.sleep(0.5)\n"
                               "print(subprocess.run(['ss','-tin','dport','5301'],capture_output=True,"
                               "text=True).stdout)"], timeout=30)
    finally:
        server.kill()
        server.wait()
    rto = float(r.stdout.split("rto:")[1].split()[0])
    assert 5 <= rto < 100, r.stdout


def test_tune_host_changes_only_on_request(topo):
    """`mrcctl tune-host` shows the host-wide setting a route cannot carry;
    only --apply / --restore change it (read back with sysctl)."""
    ns = topo.ns("H")

    def wlen():
        return topo.exec(ns, ["sysctl", "-n", "net.ipv4.tcp_min_rtt_wlen"]).stdout.strip()

    assert wlen() == "300"
    rows = json.loads(mrcctl("tune-host", "-j", netns=ns).stdout)
    assert rows == [{"sysctl": "net.ipv4.tcp_min_rtt_wlen", "current": "300", "tuned": "0",
                     "kernel_default": "300", "why": rows[0]["why"]}] and wlen() == "300"
    mrcctl("tune-host", "--apply", netns=ns)
    assert wlen() == "0"
    mrcctl("tune-host", "--restore", netns=ns)
    assert wlen() == "300"
    r = mrcctl("tune-host", "--apply", "--restore", netns=ns, check=False)
    assert r.returncode != 0 and wlen() == "300"
