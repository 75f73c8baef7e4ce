"""Shared fixtures.  Root tests build real namespaces and always remove
them (and the datapath's pins) in finalizers, also when a test fails."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrc_ebpf.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
MRCCTL = [sys.executable, "-m", "cli.mrcctl"]
XFER = [sys.executable, str(ROOT / "tests" / "tools" / "xfer.py")]
INJECT = [sys.executable, str(ROOT / "tests" / "tools" / "inject.py")]


def _why_no_kernel() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "needs bcc (python3-bpfcc)"
    if not Path("/proc/sys/net/ipv6/conf/all/seg6_enabled").exists():
        return "kernel without SRv6"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_no_kernel()
    if reason is None:
        return
    for item in items:
        if "root" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def mrcctl(*args, netns: str | None = None, check: bool = True, via_ip_netns: bool = False):
    """Run mrcctl as a user would: a new process each time."""
    cmd = list(MRCCTL)
    if netns and via_ip_netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    elif netns:
        cmd += ["--netns", netns]
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"mrcctl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


class Interop:
    """A --- R --- B.  A runs mrc-ebpf on a0 (SID fc00:a::6); R is a kernel
    SRv6 router (End at fc00:1::); B is the kernel's own SRv6 host
    (End.DT6 at fc00:b::6, End.DX4 at fc00:b::4)."""

    A_SID, R_SID, B_DT6, B_DX4 = "fc00:a::6", "fc00:1::", "fc00:b::6", "fc00:b::4"
    A6, B6, A4, B4 = "fd00:1::a", "fd00:2::b", "198.18.1.1", "198.18.2.2"

    def __init__(self, topo: Topology):
        t = self.t = topo
        self.A, self.R, self.B = t.ns("A"), t.ns("R", forwarding=True), t.ns("B")
        t.link(self.A, "a0", self.R, "r0")
        t.link(self.R, "r1", self.B, "b0")
        t.addr(self.A, "a0", "fd00:1::a/64")
        t.addr(self.R, "r0", "fd00:1::1/64")
        t.addr(self.R, "r1", "fd00:2::1/64")
        t.addr(self.B, "b0", "fd00:2::b/64")
        t.addr(self.A, "a0", "198.18.1.1/24")
        t.addr(self.B, "b0", "198.18.2.2/24")
        t.route(self.A, "fc00::/16", "via", "fd00:1::1")
        t.route(self.A, "fd00:2::/64", "via", "fd00:1::1")   # plain, until a path overrides it
        t.route(self.B, "fc00::/16", "via", "fd00:2::1")
        t.route(self.R, "fc00:a::/48", "via", "fd00:1::a")
        t.route(self.R, "fc00:b::/48", "via", "fd00:2::b")
        t.exec(self.R, ["ip", "-6", "route", "add", "fc00:1::/128", "encap", "seg6local",
                        "action", "End", "dev", "r0"])
        t.exec(self.B, ["ip", "-6", "route", "add", "fc00:b::6/128", "encap", "seg6local",
                        "action", "End.DT6", "table", "local", "dev", "b0"])
        t.exec(self.B, ["ip", "-6", "route", "add", "fc00:b::4/128", "encap", "seg6local",
                        "action", "End.DX4", "nh4", self.B4, "dev", "b0"])
        # B answers A through the kernel's own encapsulation to A's SID
        t.exec(self.B, ["ip", "-6", "route", "add", "fd00:1::/64", "encap", "seg6", "mode", "encap",
                        "segs", self.A_SID, "via", "fd00:2::1", "dev", "b0"])
        t.exec(self.B, ["ip", "route", "add", "198.18.1.0/24", "encap", "seg6", "mode", "encap",
                        "segs", self.A_SID, "via", "inet6", "fd00:2::1", "dev", "b0"])

    def attach(self, *extra):
        mrcctl("attach", "a0", "--sid", self.A_SID, *extra, netns=self.A)

    def ping(self, ns, dst, count=3, size=56, extra=()):
        return self.t.exec(ns, ["ping", "-c", str(count), "-i", "0.2", "-W", "2", "-s", str(size),
                                *extra, dst], check=False)

    def transfer(self, src_ns, dst_ns, dst_addr, nbytes=4 << 20, port=5201):
        server = self.t.popen(dst_ns, [*XFER, "serve", dst_addr, str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            sent = self.t.exec(src_ns, [*XFER, "send", dst_addr, str(port), str(nbytes)], timeout=60)
            received, _ = server.communicate(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        return sent.stdout.strip(), received.strip()

    def inject(self, ns, dev, frames):
        """Send raw frames (scapy packets) out of `dev` in `ns`."""
        self.t.exec(ns, [*INJECT, dev, *(bytes(f).hex() for f in frames)])

    def mac(self, ns, dev):
        link = json.loads(self.t.exec(ns, ["ip", "-j", "link", "show", dev]).stdout)
        return link[0]["address"]

    def counters(self):
        return json.loads(mrcctl("stats", "-j", netns=self.A).stdout)["counters"]


@pytest.fixture
def topo():
    t = Topology(prefix=f"mrct{os.getpid() % 10000}{int(time.time() * 1000) % 1000}")
    try:
        yield t
    finally:
        t.destroy()


@pytest.fixture
def interop(topo):
    return Interop(topo)
