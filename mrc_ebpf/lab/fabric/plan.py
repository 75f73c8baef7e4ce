"""The fabric's shape, names and address plan, from its spec alone (no kernel state)."""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from mrc_ebpf.errors import MrcError


STATE_DIR = Path(os.environ.get("MRC_FABRIC_STATE", "/run/mrc-fabric"))
DEFAULT_NAME = "mrc"
DEFAULT_RATE = "100mbit"
ENCODINGS = ("srh", "usid", "ev")
# --encoding ev: entropy paths a host gets to each other host (fabric attach --entropy)
DEFAULT_ENTROPY = 64
QUEUE_LATENCY = "20ms"
DEFAULT_MTU = 1500
# The address plan's two /32s (a fabric description may move them within
# fc00::/16 and fd00::/16, which the hosts' and leaves' broad routes cover):
# the uSID block of every SID, and the block of the hosts' data prefixes.
DEFAULT_SID_BLOCK, DEFAULT_DATA_BLOCK = "fc00::/32", "fd00::/32"
# Jumbo frames as datacenter fabrics run them.  Above 3506 (a page less
# XDP headroom and skb_shared_info) a veth takes no native XDP program
# without multi-buffer support, and `mrcctl attach` falls back to generic
# (skb) XDP; `status` says which.
MIN_MTU, MAX_MTU = 1280, 9000
SYSCTL_RE = re.compile(r"^net\.[A-Za-z0-9_.]+=\S+$")

MAX_PLANES, MAX_SPINES, MAX_LEAVES, MAX_HOSTS = 8, 255, 255, 4000
# A description may be larger than this machine builds (`fabric up`
# keeps the limits above) when it is only rendered: MRC's 131,072 NICs are
# 512 leaves of 256.  Beyond NARROW_HOSTS a host's number no longer fits
# the 16-bit ID of the narrow plan, and the plan widens (Fabric.wide).
RENDER_MAX_LEAVES, RENDER_MAX_HOSTS = 4096, 262143
# Spines a plane, rendered: beyond MAX_SPINES a spine's number no longer
# fits the byte of the narrow spine ID, and the IDs widen (Fabric.spine_id).
RENDER_MAX_SPINES = 0xFFF
# Paths to one peer: a path id is one byte on the wire and in the per-path
# state (bpf: MRC_MAX_PATHS).  A fabric with more (plane, spine) pairs
# than this gives each peer a share of every plane's spines
# (Fabric.spine_groups).
PEER_PATHS = 256
NARROW_HOSTS = 0x1FFF
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(|k|m|g|t)(bit|bps)$", re.I)
MODES = ("down", "blackhole", "loss")
# How the leaves hash a flow onto a spine (`fabric up --hash`), as
# fib_multipath_hash_{policy,fields} for IPv6 and IPv4:
#   l4         the 5-tuple (policy 3, fields src,dst,proto,sport,dport =
#              0x37): what policy 1 means on a switch.  Policy 1 itself
#              would reuse skb->hash when the skb has an L4 hash, and a
#              veth carries the sending socket's random txhash across
#              namespaces.  A flow stays on its spine whatever its host does.
#   flowlabel  the kernel's defaults (policy 0): IPv6 addresses + flow label
#              + next header, IPv4 addresses.  Linux TCP draws a new flow
#              label on every RTO (net.core.txrehash, auto_flowlabels) and
#              PLB on persistent congestion, so a connection can move.
HASHES = {"l4": {"policy": 3, "fields": 0x37}, "flowlabel": {"policy": 0, "fields": None}}
DEFAULT_HASH = "l4"


def check_hash(name: str) -> str:
    if name not in HASHES:
        raise MrcError(f"bad hash {name!r}: l4 (5-tuple) or flowlabel (addresses + IPv6 flow label, "
                       f"the kernel's default)")
    return name


def hash_sysctls(name: str) -> list[str]:
    h = HASHES[check_hash(name)]
    keys = []
    for fam in ("ipv6", "ipv4"):
        keys.append(f"net.{fam}.fib_multipath_hash_policy={h['policy']}")
        if h["fields"] is not None:
            keys.append(f"net.{fam}.fib_multipath_hash_fields=0x{h['fields']:x}")
    return keys


def parse_rate(text: str | None) -> int:
    """A tc rate ('100mbit', '1gbit', '10Mbps') in bit/s; 0 for none."""
    if text is None or str(text).lower() in ("", "0", "none", "unlimited"):
        return 0
    m = RATE_RE.match(str(text).strip())
    if not m:
        raise MrcError(f"bad rate {text!r}: expected e.g. 100mbit, 1gbit, 500kbit or none")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if m.group(3).lower() == "bps":
        value *= 8
    if value < 8000:
        raise MrcError(f"rate {text!r} is too low (at least 8kbit)")
    return int(value)


def parse_mode(text: str) -> tuple[str, float]:
    """'down', 'blackhole' or 'loss=P' (P in (0, 1], or a percentage)."""
    t = text.strip().lower()
    if t in ("down", "blackhole"):
        return t, 1.0
    if t.startswith("loss="):
        v = t[5:]
        try:
            p = float(v[:-1]) / 100 if v.endswith("%") else float(v)
        except ValueError:
            p = -1.0
        if not 0 < p <= 1:
            raise MrcError(f"bad loss {v!r}: a probability in (0, 1] (or a percentage like 5%)")
        return "loss", p
    raise MrcError(f"bad fault mode {text!r}: down, blackhole or loss=P")



def _block32(block: str) -> str:
    """"fc00:0" of "fc00::/32": the two hextets every address of the plan starts with."""
    net = ipaddress.IPv6Network(block)
    if net.prefixlen != 32:
        raise MrcError(f"address block {block}: a /32")
    v = int(net.network_address) >> 96
    return f"{v >> 16:x}:{v & 0xffff:x}"


class Fabric:
    """The plan of a fabric: every name, address, link and route, computed
    from its spec alone (so `down` and `heal` need nothing else)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = spec["name"]
        self.planes, self.spines, self.leaves, self.hosts_per_leaf = spec["planes"], spec["spines"], spec["leaves"], spec["hosts_per_leaf"]
        self.host_count = self.leaves * self.hosts_per_leaf
        self.encoding = spec["encoding"]
        self.rate, self.host_rate = spec["rate"], spec["host_rate"]
        self.mtu = spec.get("mtu", DEFAULT_MTU)
        self.host_sysctls = spec.get("host_sysctls", [])
        self.hash = spec.get("hash", DEFAULT_HASH)
        self.sid32 = _block32(spec.get("sid_block", DEFAULT_SID_BLOCK))      # "fc00:0"
        self.data32 = _block32(spec.get("data_block", DEFAULT_DATA_BLOCK))   # "fd00:0"
        # the wide plan (only rendered, never built): host h's SID is
        # SID_BLOCK:e000:0:0 + h in its 4th hextet up (a /64 each), its
        # prefix DATA_BLOCK + h the same way; both step by a /64 per host
        self.wide = self.host_count > NARROW_HOSTS
        # more spines than a byte numbers (only rendered, never built):
        # plane p's spine s is (p + 1) << 12 | s, a /36 of IDs a plane
        self.wide_spines = self.spines > MAX_SPINES

    # -- names
    @staticmethod
    def spine(p: int, s: int) -> str:
        return f"s{s}" if p == 0 else f"p{p}s{s}"

    @staticmethod
    def leaf(p: int, l: int) -> str:
        return f"l{l}" if p == 0 else f"p{p}l{l}"

    @staticmethod
    def host(h: int) -> str:
        return f"h{h}"

    def ns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def leaf_of(self, h: int) -> int:
        return (h - 1) // self.hosts_per_leaf + 1

    def hosts(self) -> list[int]:
        return list(range(1, self.host_count + 1))

    def nodes(self) -> dict[str, dict]:
        """node -> {kind, plane, index, ns}; hosts have plane None."""
        out = {}
        for p in range(self.planes):
            for s in range(1, self.spines + 1):
                out[self.spine(p, s)] = {"kind": "spine", "plane": p, "index": s}
            for l in range(1, self.leaves + 1):
                out[self.leaf(p, l)] = {"kind": "leaf", "plane": p, "index": l}
        for h in self.hosts():
            out[self.host(h)] = {"kind": "host", "plane": None, "index": h}
        for node, d in out.items():
            d["ns"] = self.ns(node)
        return out

    def namespaces(self) -> list[str]:
        return [d["ns"] for d in self.nodes().values()]

    # -- addresses
    def spine_id(self, p: int, s: int) -> int:
        if self.wide_spines:
            return (p + 1) << 12 | s
        return 0x100 * (p + 1) + s

    def plane_spines(self, p: int) -> str:
        """The block of plane P's spine SIDs (a host routes it out of eth{p})."""
        if self.wide_spines:
            return f"{self.sid32}:{(p + 1) << 12:x}::/36"
        return f"{self.sid32}:{0x100 * (p + 1):x}::/40"

    @staticmethod
    def host_id(h: int) -> int:
        return 0xE000 + h

    def sid(self, ident: int) -> str:
        return f"{self.sid32}:{ident:x}::"

    def host_sid(self, h: int) -> str:
        if self.wide:
            return str(ipaddress.IPv6Address(self._base(self.sid32) | 0xE000 << 80 | h << 64))
        return self.sid(self.host_id(h))

    @staticmethod
    def _base(block32: str) -> int:
        hi, lo = (int(x, 16) for x in block32.split(":"))
        return (hi << 16 | lo) << 96

    def sid_step(self) -> int:
        """The bit length of the step between consecutive hosts' SIDs and
        prefixes (a host config's peer blocks, control/blocks.py)."""
        return 64 if self.wide else 48

    def spine_sid(self, p: int, s: int) -> str:
        return self.sid(self.spine_id(p, s))

    def addr6(self, h: int) -> str:
        if self.wide:
            return str(ipaddress.IPv6Address(self._base(self.data32) | h << 64 | 1))
        return f"{self.data32}:{h:x}::1"

    def prefix6(self, h: int) -> str:
        if self.wide:
            return f"{ipaddress.IPv6Address(self._base(self.data32) | h << 64)}/64"
        return f"{self.data32}:{h:x}::/64"

    @staticmethod
    def addr4(h: int) -> str:
        return f"198.18.{h // 256}.{h % 256}"

    def prefix4(self, h: int) -> str:
        return f"{self.addr4(h)}/32"

    @staticmethod
    def link_net(p: int, s: int, l: int) -> str:
        return f"fd01:{p:x}:{s:x}:{l:x}::"

    # -- links
    def links(self) -> list[dict]:
        """Every link: name, kind, plane, rate and its two ends (a, b).
        Fabric links: a = spine, b = leaf.  Host links: a = host, b = leaf."""
        out = []
        for p in range(self.planes):
            for s in range(1, self.spines + 1):
                for l in range(1, self.leaves + 1):
                    net = self.link_net(p, s, l)
                    sp, lf = self.spine(p, s), self.leaf(p, l)
                    out.append({"name": f"{sp}-{lf}", "kind": "fabric", "plane": p, "rate": self.rate,
                                "a": {"node": sp, "ns": self.ns(sp), "dev": f"l{l}", "addr": f"{net}1"},
                                "b": {"node": lf, "ns": self.ns(lf), "dev": f"s{s}", "addr": f"{net}2"}})
        for h in self.hosts():
            for p in range(self.planes):
                hn, lf = self.host(h), self.leaf(p, self.leaf_of(h))
                out.append({"name": f"{hn}-{lf}", "kind": "host", "plane": p, "rate": self.host_rate,
                            "a": {"node": hn, "ns": self.ns(hn), "dev": f"eth{p}", "addr": "fe80::2"},
                            "b": {"node": lf, "ns": self.ns(lf), "dev": f"h{h}", "addr": "fe80::1"}})
        return out

    def link_index(self) -> dict[frozenset, dict]:
        return {frozenset((lk["a"]["node"], lk["b"]["node"])): lk for lk in self.links()}

    # -- paths
    def spine_groups(self) -> int:
        """How many groups a plane's spines are dealt into, so that one
        group of every plane makes at most PEER_PATHS paths: 1 while every
        (plane, spine) fits (each peer gets all of them).  Spine s is in
        group (s - 1) mod k: a group is every k-th spine, so each spans
        the plane, and groups differ in size by one at most."""
        per_plane = max(1, PEER_PATHS // self.planes)
        return -(-self.spines // per_plane)

    def spine_group(self, a: int, b: int) -> int:
        """The group of spines host a's paths to host b cross: (a + b) mod
        k, so a host's peers, and the hosts behind one leaf, take the
        groups in turn and every spine carries an equal share of the
        fabric's pairs."""
        return (a + b) % self.spine_groups()

    def group_spines(self, group: int) -> list[int]:
        k = self.spine_groups()
        return list(range(group + 1, self.spines + 1, k))

    def path_choice(self) -> str | None:
        """What a peer's paths are when the fabric has more (plane, spine)
        pairs than a peer can use, and why; None when it uses them all."""
        k = self.spine_groups()
        if k == 1:
            return None
        per = len(self.group_spines(0))
        return (f"{self.planes * per} paths a peer of {self.planes * self.spines}: a path id is one byte "
                f"(at most {PEER_PATHS} paths a peer), so each plane's {self.spines} spines are dealt into "
                f"{k} groups (spine s in group (s-1) mod {k}: {per} spines apart by {k}) and host a "
                f"reaches host b over group (a+b) mod {k} of every plane")

    def paths(self, a: int, b: int, entropy: int = DEFAULT_ENTROPY) -> list[dict]:
        """Host a -> host b: one path per (plane, spine) of its spine
        group (spine_group: all the spines while they fit); for ev,
        `entropy` entropy paths to b's SID, which the leaves' ECMP spreads."""
        out = []
        dst = self.host_id(b)
        if self.encoding == "ev":
            return [{"plane": 0, "spine": None, "entropy": entropy, "sid": self.host_sid(b),
                     "args": ["--entropy", str(entropy), "--sid", self.host_sid(b)]}]
        spines = self.group_spines(self.spine_group(a, b))
        for p in range(self.planes):
            for s in spines:
                sid = self.spine_id(p, s)
                path = {"plane": p, "spine": self.spine(p, s)}
                if self.encoding == "usid":
                    path["usid"] = f"{self.sid32}:{sid:x}:{dst:x}::"
                    path["args"] = ["--usid", path["usid"]]
                else:
                    path["via"] = f"{self.sid(sid)},{self.host_sid(b)}"
                    path["args"] = ["--via", path["via"]]
                out.append(path)
        return out

    def path_add_args(self, a: int, b: int, prefix: str | None = None,
                      entropy: int = DEFAULT_ENTROPY) -> list[str]:
        args = ["path", "add", prefix or self.prefix6(b)]
        for path in self.paths(a, b, entropy):
            args += path["args"]
        return args

    # -- per-namespace configuration
    def sysctls(self, node: str) -> list[str]:
        info = self.nodes()[node]
        keys = ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
                "net.ipv6.conf.all.seg6_enabled=1", "net.ipv6.conf.default.seg6_enabled=1",
                "net.ipv6.conf.all.keep_addr_on_down=1", "net.ipv6.conf.default.keep_addr_on_down=1",
                "net.ipv6.conf.all.ignore_routes_with_linkdown=1",
                "net.ipv6.conf.default.ignore_routes_with_linkdown=1",
                "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
                "net.ipv4.conf.default.ignore_routes_with_linkdown=1",
                "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]
        if info["kind"] == "host":
            keys += self.host_sysctls
        elif self.encoding == "ev":
            # a fabric without SRv6, whose ECMP hashes what entropy paths
            # vary: policy 0 is addresses + flow label for IPv6
            keys = [k for k in keys if "seg6_enabled" not in k]
            keys += ["net.ipv6.conf.all.seg6_enabled=0", "net.ipv6.conf.default.seg6_enabled=0",
                     "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1",
                     "net.ipv6.fib_multipath_hash_policy=0",
                     "net.ipv4.fib_multipath_hash_policy=3", "net.ipv4.fib_multipath_hash_fields=0x37"]
            if info["kind"] == "spine":
                # `path trace` learns each EV's spine from its ICMPv6 Time
                # Exceeded: no per-destination limit (6, then 1 per 250 ms)
                keys.append("net.ipv6.icmp.ratelimit=0")
        else:
            # ECMP as the fabric's --hash says (HASHES)
            keys += ["net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1", *hash_sysctls(self.hash)]
        return keys

    def dev_sysctls(self, node: str) -> list[str]:
        keys = []
        seg6 = 0 if self.encoding == "ev" and self.nodes()[node]["kind"] != "host" else 1
        for dev in ["lo", *self.devices(node)]:
            keys += [f"net.ipv6.conf.{dev}.seg6_enabled={seg6}", f"net.ipv6.conf.{dev}.accept_dad=0",
                     f"net.ipv6.conf.{dev}.keep_addr_on_down=1", f"net.ipv4.conf.{dev}.rp_filter=0"]
        return keys

    def leaf_nodes(self) -> list[str]:
        return [self.leaf(p, l) for p in range(self.planes) for l in range(1, self.leaves + 1)]

    def marking_devices(self) -> list[tuple[str, str, int]]:
        """(namespace, device, rate) of every switch port that queues: both
        ends of each rate-limited leaf-spine link."""
        rate = parse_rate(self.rate)
        return [(end["ns"], end["dev"], rate) for lk in self.links() if lk["kind"] == "fabric" and rate
                for end in (lk["a"], lk["b"])]

    def ends(self, node: str) -> list[tuple[dict, dict, dict]]:
        """(link, this end, other end) for every link of node."""
        out = []
        for lk in self.links():
            if lk["a"]["node"] == node:
                out.append((lk, lk["a"], lk["b"]))
            elif lk["b"]["node"] == node:
                out.append((lk, lk["b"], lk["a"]))
        return out

    def devices(self, node: str) -> list[str]:
        return [me["dev"] for _, me, _ in self.ends(node)]

    def addr_cmds(self, node: str) -> list[str]:
        """`ip -batch` lines: devices up with their addresses (idempotent)."""
        info = self.nodes()[node]
        cmds = ["link set lo up"]
        if info["kind"] == "host":
            h = info["index"]
            cmds += [f"addr replace {self.addr6(h)}/128 dev lo nodad",
                     f"addr replace {self.addr4(h)}/32 dev lo"]
        for lk, me, _ in self.ends(node):
            cmds.append(f"link set {me['dev']} mtu {self.mtu} up")
            cmds.append(f"addr replace {me['addr']}/64 dev {me['dev']} nodad")
        return cmds

    def route_cmds(self, node: str) -> list[str]:
        """`ip -batch` lines: every route of node (replace: idempotent)."""
        info = self.nodes()[node]
        kind, p = info["kind"], info["plane"]
        cmds = []
        if kind == "host":
            h = info["index"]
            for q in range(self.planes):
                cmds.append(f"route replace {self.plane_spines(q)} via fe80::1 dev eth{q}")
            cmds += ["route replace fc00::/16 via fe80::1 dev eth0",
                     "route replace fd00::/16 via fe80::1 dev eth0",
                     f"route replace 198.18.0.0/15 via inet6 fe80::1 dev eth0 src {self.addr4(h)}"]
            return cmds
        if kind == "leaf":
            l = info["index"]
            ups = [(f"s{s}", f"{self.link_net(p, s, l)}1") for s in range(1, self.spines + 1)]
            for s, (dev, gw) in enumerate(ups, start=1):
                cmds.append(f"route replace {self.spine_sid(p, s)}/48 via {gw} dev {dev}")
            ecmp6 = " ".join(f"nexthop via {gw} dev {dev}" for dev, gw in ups)
            ecmp4 = " ".join(f"nexthop via inet6 {gw} dev {dev}" for dev, gw in ups)
            # remote hosts: kernel ECMP over the plane's spines (the baseline)
            cmds += [f"route replace {self.sid32}:e000::/35 {ecmp6}",
                     f"route replace fd00::/16 {ecmp6}",
                     f"route replace 198.18.0.0/15 {ecmp4}"]
            for h in self.hosts():
                if self.leaf_of(h) == l:
                    cmds += [f"route replace {self.host_sid(h)}/48 via fe80::2 dev h{h}",
                             f"route replace {self.prefix6(h)} via fe80::2 dev h{h}",
                             f"route replace {self.prefix4(h)} via inet6 fe80::2 dev h{h}"]
            return cmds
        # spine
        s = info["index"]
        for h in self.hosts():
            l = self.leaf_of(h)
            gw, dev = f"{self.link_net(p, s, l)}2", f"l{l}"
            cmds += [f"route replace {self.host_sid(h)}/48 via {gw} dev {dev}",
                     f"route replace {self.prefix6(h)} via {gw} dev {dev}",
                     f"route replace {self.prefix4(h)} via inet6 {gw} dev {dev}"]
        if self.encoding == "ev":
            return cmds          # a plain IPv6 router: no SID of its own
        flavor = " flavors next-csid lblen 32 nflen 16" if self.encoding == "usid" else ""
        cmds.append(f"route replace {self.spine_sid(p, s)}/48 encap seg6local action End{flavor} dev l1")
        return cmds

    def tc_cmds(self, node: str) -> list[str]:
        cmds = []
        for lk, me, _ in self.ends(node):
            rate = parse_rate(lk["rate"])
            if rate:
                burst = max(rate // 8 // 1000, 2 * (self.mtu + 14))   # 1 ms worth, at least two frames
                cmds.append(f"qdisc replace dev {me['dev']} root tbf rate {rate}bit burst {burst} "
                            f"latency {QUEUE_LATENCY}")
            else:
                # veth drops when the peer's (XDP) ring is full unless a qdisc queues
                cmds.append(f"qdisc replace dev {me['dev']} root pfifo limit 1000")
        return cmds

    # -- targets (fail / heal)
    def resolve_target(self, target: str) -> list[tuple[dict, list[dict], bool]]:
        """TARGET -> [(link, [receiving ends], whole link?)]."""
        nodes = self.nodes()
        index = self.link_index()
        t = target.strip()
        m = re.fullmatch(r"([a-z0-9]+)>([a-z0-9]+)", t)
        if m:
            a, b = m.groups()
            lk = index.get(frozenset((a, b)))
            if lk is None or a == b:
                raise MrcError(f"no link {a}>{b} in fabric {self.name} ({self._target_help()})")
            end = lk["a"] if lk["a"]["node"] == b else lk["b"]
            return [(lk, [end], False)]
        m = re.fullmatch(r"([a-z0-9]+)-([a-z0-9]+)", t)
        if m:
            lk = index.get(frozenset(m.groups()))
            if lk is None or m.group(1) == m.group(2):
                raise MrcError(f"no link {t} in fabric {self.name} ({self._target_help()})")
            return [(lk, [lk["a"], lk["b"]], True)]
        if t in nodes:
            return [(lk, [lk["a"], lk["b"]], True) for lk, _, _ in self.ends(t)]
        raise MrcError(f"no link or node {target!r} in fabric {self.name} ({self._target_help()})")

    def _target_help(self) -> str:
        ex = self.links()[0]["name"]
        return f"links are e.g. {ex} or {ex.replace('-', '>')}, nodes e.g. s1, l1, h1; see fabric show"

    @staticmethod
    def down_end(lk: dict, node_target: str | None) -> dict:
        """Which end a `down` fault sets down: the named node's own end for a
        switch node, else the upper end (spine of a fabric link, leaf of a
        host link), whose routes heal re-applies.  Hosts keep their ends up,
        so their routes (and the datapath's) survive."""
        if node_target and node_target == lk["b"]["node"]:
            return lk["b"]
        if node_target and node_target == lk["a"]["node"] and lk["kind"] == "fabric":
            return lk["a"]
        return lk["a"] if lk["kind"] == "fabric" else lk["b"]
