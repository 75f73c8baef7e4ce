"""Shared fixtures.  Root tests build real namespaces and always remove
them (and the datapath's pins) in finalizers, also when a test fails."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mrc_ebpf.lab import procs
from mrc_ebpf.lab.topology import Diamond, KernelPeerLine, Topology

ROOT = Path(__file__).resolve().parent.parent
# attaches share compiled builds (datapath/build_cache.py) in the tree, not
# in /var/cache; the Makefile sets the same
os.environ.setdefault("MRC_EBPF_CACHE", str(ROOT / "build" / "bpf-cache"))
MRCCTL = procs.MRCCTL
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
    result = procs.run([*cmd, *args], check=False, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"mrcctl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


class Interop(KernelPeerLine):
    """mrc_ebpf.lab.topology.KernelPeerLine plus what the tests do on it."""

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


@pytest.fixture(scope="session")
def datapath():
    """The datapath compiled once per session, not attached: for tests
    that run its programs with BPF_PROG_TEST_RUN (tests/datapath/) or
    read what bcc compiled (test_layout)."""
    from datapath.harness import Datapath
    dp = Datapath()
    try:
        yield dp
    finally:
        dp.close()


# each test's topology its own namespace names: things are kept by name
# (test_all_or_nothing's pin directories), and a name drawn from the clock
# came round again within one run
_TOPOLOGIES = itertools.count()


@pytest.fixture
def topo():
    t = Topology(prefix=f"mrct{os.getpid()}t{next(_TOPOLOGIES)}")
    try:
        yield t
    finally:
        t.destroy()


@pytest.fixture
def interop(topo):
    return Interop(topo)


UDP_SEND = [sys.executable, str(ROOT / "tests" / "tools" / "udp_send.py")]


class Spray(Diamond):
    """Diamond with mrc-ebpf on both hosts and one path per router each way."""

    def attach(self, policy="rr", *options):
        """POLICY None: path add's default."""
        mrcctl("attach", "a0", "--sid", self.A_SID, *options, netns=self.A)
        mrcctl("attach", "b0", "--sid", self.B_SID, *options, netns=self.B)
        for k in range(1, self.n + 1):
            mrcctl("path", "add", "fd00:b::/64", *self.path_args(k, self.B_SID), netns=self.A)
            mrcctl("path", "add", "fd00:a::/64", *self.path_args(k, self.A_SID), netns=self.B)
        if policy:
            self.policy(policy)

    def policy(self, name, ns=None):
        mrcctl("path", "policy", "fd00:b::/64", name, netns=ns or self.A)

    def sent(self, ns=None, prefix="fd00:b::/64", what="tx_packets") -> dict[int, int]:
        """Packets (or tx_bytes) sent per path id towards PREFIX (path ids are per peer)."""
        rows = json.loads(mrcctl("path", "list", "-j", netns=ns or self.A).stdout)
        return {r["path_id"]: r[what] for r in rows if r["prefix"] == prefix}

    def stats(self, ns):
        return json.loads(mrcctl("stats", "--paths", "-j", netns=ns).stdout)

    def router_tx(self, what="packets") -> list[int]:
        """Packets (or bytes) each router sent towards B: the routers' own counters."""
        out = []
        for r in self.R:
            link = json.loads(self.t.exec(r, ["ip", "-j", "-s", "link", "show", "rdown"]).stdout)
            out.append(link[0]["stats64"]["tx"][what])
        return out

    def udp(self, count, **opts):
        args = [f"--{k}={v}" for k, v in opts.items()]
        self.t.exec(self.A, [*UDP_SEND, self.B6, "9", str(count), *args], timeout=300)


@pytest.fixture
def spray(topo):
    yield from _spray(topo, usid=False)


@pytest.fixture(params=["srh", "usid"])
def spray_any(request, topo):
    """The Diamond with SRH paths, then again with compressed (uSID) ones."""
    yield from _spray(topo, usid=request.param == "usid")


def _spray(topo, usid):
    net = Spray(topo, n_paths=4, usid=usid)
    # a UDP sink on B: without one, B answers each datagram with an ICMP
    # error, traffic the tests do not count on
    sink = topo.popen(net.B, [sys.executable, "-c", "import socket\n"
                              "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
                              "s.bind(('::', 9))\n"
                              "while True: s.recv(65536)"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield net
    finally:
        sink.kill()
        sink.wait()
