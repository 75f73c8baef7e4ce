"""Small networks of namespaces for tests, the demo and (later) fabrics.

Every namespace and link made through a Topology is removed by
`destroy()`, also after a failure half-way; use it as a context manager.
Only test addresses go here: fd00::/8, fc00::/16, 198.18.0.0/15.
"""
from __future__ import annotations

import subprocess

from mrc_ebpf.lab import procs
from mrc_ebpf.lab.netns import Namespaces
from mrc_ebpf.lab.procs import CommandError, timeout_scale  # noqa: F401 - the tests' too


class Topology:
    def __init__(self, prefix: str | None = None):
        import os
        self.prefix = prefix or f"mrc{os.getpid() % 100000}"
        self._made = Namespaces()

    @property
    def namespaces(self) -> list[str]:
        return self._made.made

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def ns(self, short: str, forwarding: bool = False, seg6: bool = True) -> str:
        sysctls = ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]
        if forwarding:
            sysctls += ["net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1"]
        if seg6:
            sysctls += ["net.ipv6.conf.all.seg6_enabled=1", "net.ipv6.conf.default.seg6_enabled=1"]
        return self._made.create(f"{self.prefix}-{short}", sysctls)

    def sysctl(self, ns: str, key: str, value) -> None:
        self.exec(ns, ["sysctl", "-qw", f"{key}={value}"])

    def link(self, ns1: str, if1: str, ns2: str, if2: str, mtu: int | None = None) -> None:
        procs.run(["ip", "link", "add", if1, "netns", ns1, "type", "veth", "peer", "name", if2, "netns", ns2])
        for ns, dev in ((ns1, if1), (ns2, if2)):
            if mtu:
                self.exec(ns, ["ip", "link", "set", dev, "mtu", str(mtu)])
            self.sysctl(ns, f"net.ipv6.conf.{dev}.seg6_enabled", 1)
            self.exec(ns, ["ip", "link", "set", dev, "up"])

    def addr(self, ns: str, dev: str, address: str) -> None:
        family = ["-6"] if ":" in address else []
        self.exec(ns, ["ip", *family, "addr", "add", address, "dev", dev, *(["nodad"] if family else [])])

    def route(self, ns: str, *args: str) -> None:
        family = ["-6"] if ":" in args[0] else []
        self.exec(ns, ["ip", *family, "route", "add", *args])

    def exec(self, ns: str, cmd: list[str], check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return procs.run(cmd, ns=ns, check=check, timeout=timeout)

    def popen(self, ns: str, cmd: list[str], **kw) -> subprocess.Popen:
        return procs.popen(cmd, ns, **kw)

    def destroy(self) -> None:
        """Every namespace made here, mrc-ebpf's pins in it first."""
        self._made.close()


class KernelPeerLine:
    """A --- R --- B: the smallest network with a kernel SRv6 peer.

    A runs mrc-ebpf on a0 (SID fc00:a::6).  R is a kernel SRv6 router
    (End at fc00:1::).  B is the kernel's own SRv6 host: End.DT6 at
    fc00:b::6, End.DX4 at fc00:b::4, and it answers A with the kernel's
    own `encap seg6` to A's SID, so only A's XDP can read its replies.
    """

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
        t.addr(self.A, "a0", f"{self.A4}/24")
        t.addr(self.B, "b0", f"{self.B4}/24")
        t.route(self.A, "fc00::/16", "via", "fd00:1::1")
        t.route(self.A, "fd00:2::/64", "via", "fd00:1::1")   # plain, until a path overrides it
        t.route(self.B, "fc00::/16", "via", "fd00:2::1")
        t.route(self.R, "fc00:a::/48", "via", "fd00:1::a")
        t.route(self.R, "fc00:b::/48", "via", "fd00:2::b")
        t.exec(self.R, ["ip", "-6", "route", "add", f"{self.R_SID}/128", "encap", "seg6local",
                        "action", "End", "dev", "r0"])
        t.exec(self.B, ["ip", "-6", "route", "add", f"{self.B_DT6}/128", "encap", "seg6local",
                        "action", "End.DT6", "table", "local", "dev", "b0"])
        t.exec(self.B, ["ip", "-6", "route", "add", f"{self.B_DX4}/128", "encap", "seg6local",
                        "action", "End.DX4", "nh4", self.B4, "dev", "b0"])
        t.exec(self.B, ["ip", "-6", "route", "add", "fd00:1::/64", "encap", "seg6", "mode", "encap",
                        "segs", self.A_SID, "via", "fd00:2::1", "dev", "b0"])
        t.exec(self.B, ["ip", "route", "add", "198.18.1.0/24", "encap", "seg6", "mode", "encap",
                        "segs", self.A_SID, "via", "inet6", "fd00:2::1", "dev", "b0"])


class Diamond:
    """A --- L1 ===(R1..Rn)=== L2 --- B: n paths between two hosts.

    Each Rk is a kernel SRv6 End router (SID fc00:1:k::; with usid=True an
    End with the next-csid flavor, and the hosts' SIDs under its block) on
    its own pair of links (rup towards A, rdown towards B); L1 and L2 are plain IPv6 routers.  A (SID fc00:a::1, address
    fd00:a::a) and B (SID fc00:b::1, fd00:b::b) are the hosts that run
    mrc-ebpf.  `path_via(k, dst_sid)` is the segment list through Rk.

    With entropy=True the routers are plain IPv6 routers (SRv6 off) and
    L1 and L2 reach the far host's SID by kernel ECMP over all of them,
    hashing addresses and flow label (fib_multipath_hash_policy 0): the
    network for entropy paths, which choose a router only by their label.
    """

    A_SID, B_SID = "fc00:a::1", "fc00:b::1"
    A6, B6 = "fd00:a::a", "fd00:b::b"

    def __init__(self, topo: Topology, n_paths: int = 4, usid: bool = False, entropy: bool = False):
        t = self.t = topo
        self.n = n_paths
        self.usid = usid
        self.entropy = entropy
        if usid:
            # compressed paths: block fc00:1::/32, router k is ID k, the
            # hosts IDs e00a and e00b; a path is fc00:1:<k>:<host>::
            self.A_SID, self.B_SID = "fc00:1:e00a::", "fc00:1:e00b::"
        self.A, self.B = t.ns("A"), t.ns("B")
        self.L1, self.L2 = t.ns("L1", forwarding=True), t.ns("L2", forwarding=True)
        self.R = [t.ns(f"R{k}", forwarding=True, seg6=not entropy) for k in range(1, n_paths + 1)]
        t.link(self.A, "a0", self.L1, "l1a")
        t.link(self.L2, "l2b", self.B, "b0")
        t.addr(self.A, "a0", f"{self.A6}/64")
        t.addr(self.L1, "l1a", "fd00:a::1/64")
        t.addr(self.B, "b0", f"{self.B6}/64")
        t.addr(self.L2, "l2b", "fd00:b::1/64")
        t.route(self.A, "fc00::/16", "via", "fd00:a::1")
        t.route(self.A, "fd00:b::/64", "via", "fd00:a::1")
        t.route(self.B, "fc00::/16", "via", "fd00:b::1")
        t.route(self.B, "fd00:a::/64", "via", "fd00:b::1")
        t.route(self.L1, "fc00:a::/48", "via", self.A6)
        t.route(self.L2, "fc00:b::/48", "via", self.B6)
        if usid:
            t.route(self.L1, f"{self.A_SID}/48", "via", self.A6)
            t.route(self.L2, f"{self.B_SID}/48", "via", self.B6)
        for k, r in enumerate(self.R, start=1):
            up, down = f"fd00:10:{k:x}::", f"fd00:20:{k:x}::"
            t.link(self.L1, f"l1r{k}", r, "rup")
            t.link(r, "rdown", self.L2, f"l2r{k}")
            t.addr(self.L1, f"l1r{k}", f"{up}1/64")
            t.addr(r, "rup", f"{up}2/64")
            t.addr(r, "rdown", f"{down}2/64")
            t.addr(self.L2, f"l2r{k}", f"{down}1/64")
            t.route(self.L1, f"fc00:1:{k:x}::/48", "via", f"{up}2")
            t.route(self.L2, f"fc00:1:{k:x}::/48", "via", f"{down}2")
            t.route(r, "fc00:b::/48", "via", f"{down}1")
            t.route(r, "fc00:a::/48", "via", f"{up}1")
            t.route(r, "fd00:b::/64", "via", f"{down}1")
            t.route(r, "fd00:a::/64", "via", f"{up}1")
            if entropy:
                for dev in ("rup", "rdown"):
                    t.sysctl(r, f"net.ipv6.conf.{dev}.seg6_enabled", 0)
                continue
            if usid:
                t.route(r, f"{self.B_SID}/48", "via", f"{down}1")
                t.route(r, f"{self.A_SID}/48", "via", f"{up}1")
                t.exec(r, ["ip", "-6", "route", "add", f"fc00:1:{k:x}::/48", "encap", "seg6local",
                           "action", "End", "flavors", "next-csid", "lblen", "32", "nflen", "16",
                           "dev", "rup"])
            else:
                t.exec(r, ["ip", "-6", "route", "add", f"fc00:1:{k:x}::/128", "encap", "seg6local",
                           "action", "End", "dev", "rup"])
        if entropy:
            for leaf, side, sid in ((self.L1, "10", self.B_SID), (self.L2, "20", self.A_SID)):
                t.sysctl(leaf, "net.ipv6.fib_multipath_hash_policy", 0)
                hops = [a for k in range(1, n_paths + 1)
                        for a in ("nexthop", "via", f"fd00:{side}:{k:x}::2")]
                t.exec(leaf, ["ip", "-6", "route", "replace", f"{sid}/48", *hops])
        # plain (unencapsulated) traffic between the hosts goes via R1
        t.route(self.L1, "fd00:b::/64", "via", "fd00:10:1::2")
        t.route(self.L2, "fd00:a::/64", "via", "fd00:20:1::2")

    @staticmethod
    def path_via(k: int, dst_sid: str) -> str:
        return f"fc00:1:{k:x}::,{dst_sid}"

    def path_args(self, k: int, dst_sid: str) -> list[str]:
        """`mrcctl path add` options for the path through Rk to dst_sid."""
        if self.usid:
            host_id = dst_sid.split(":")[2]
            return ["--usid", f"fc00:1:{k:x}:{host_id}::"]
        return ["--via", self.path_via(k, dst_sid)]
