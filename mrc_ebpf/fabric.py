"""An emulated two-tier leaf-spine fabric of network namespaces.

`mrcctl fabric up` builds it, `show` describes it, `down` removes it; the
state is a JSON file under STATE_DIR (on /run, which `ip netns exec`
leaves alone), so every later command finds the fabric.

Shape: P planes; plane p has K spines and L leaves, every leaf linked to
every spine of its plane.  Hosts 1..L*H each have one NIC per plane (eth<p>)
to leaf (h-1)//H+1 of that plane.

Names (nodes are namespaces NAME-<node>; devices are short and repeat
across namespaces):

  plane 0:  spines s1..sK, leaves l1..lL      plane p>0: p<p>s1.., p<p>l1..
  hosts:    h1..h<L*H> (one per plane-independent host)
  devices:  host eth<p> (its NIC in plane p); leaf s<k> (uplink to spine
            k) and h<h> (to host h); spine l<l> (to leaf l)
  links:    "<spine>-<leaf>" (s1-l2, p1s1-p1l2), "<host>-<leaf>" (h1-l1,
            h1-p1l1); either order is accepted.  "a>b" is the direction a
            to b only (a fault is installed on b's ingress).  A node name
            (s1, l2, h3) stands for all of its links.

Addressing (test ranges only):

  uSID block fc00:0::/32, 16-bit IDs.  Spine s of plane p: ID
  0x100*(p+1)+s, SID fc00:0:<id>:: (End, or End with NEXT-C-SID for uSID).
  Host h: ID 0xe000+h, SID fc00:0:<id>:: on every plane.
  Host data: fd00:0:<h>::1/128 on lo (prefix fd00:0:<h>::/64) and
  198.18.<h/256>.<h%256>/32 on lo.
  Spine-leaf links: fd01:<p>:<s>:<l>::1/64 (spine), ::2 (leaf).
  Host-leaf links: link-local only, fe80::1 (leaf) and fe80::2 (host), so a
  host's only global addresses are its data addresses (source selection).

Routing: hosts send fc00:0:<(p+1)00>::/40 (plane p's spines) out of eth<p>,
everything else of fc00::/16, fd00::/16 and 198.18.0.0/15 out of eth0 (plane
0).  Leaves route spine SIDs to their spine (static), their own hosts'
SIDs/prefixes to the host, and remote hosts' SIDs/prefixes by kernel ECMP
over all spines of the plane, hashed on the 5-tuple (fib_multipath_hash_policy
3, fields 0x37: what policy 1 means on a switch; see sysctls()).
Spines route every host SID/prefix to the host's leaf in their plane.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import ecn_marks, faults
from .errors import MrcError

STATE_DIR = Path(os.environ.get("MRC_FABRIC_STATE", "/run/mrc-fabric"))
DEFAULT_NAME = "mrc"
DEFAULT_RATE = "100mbit"
ENCODINGS = ("srh", "usid")
QUEUE_LATENCY = "20ms"
DEFAULT_MTU = 1500
# Jumbo frames as datacenter fabrics run them.  Above 3506 (a page less
# XDP headroom and skb_shared_info) a veth takes no native XDP program
# without multi-buffer support, and `mrcctl attach` falls back to generic
# (skb) XDP; `status` says which.
MIN_MTU, MAX_MTU = 1280, 9000
SYSCTL_RE = re.compile(r"^net\.[A-Za-z0-9_.]+=\S+$")
ROOT = Path(__file__).resolve().parent.parent

MAX_PLANES, MAX_SPINES, MAX_LEAVES, MAX_HOSTS = 8, 255, 255, 4000
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,15}$")
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(|k|m|g|t)(bit|bps)$", re.I)
MODES = ("down", "blackhole", "loss")


def _run(cmd: list[str], input: str | None = None, check: bool = True,
         timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        what = " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else "")
        err = " ".join(r.stderr.split())[:300]
        raise MrcError(f"{what}: {err or f'exit {r.returncode}'}")
    return r


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


# --------------------------------------------------------------------------- shape

class Fabric:
    """The plan of a fabric: every name, address, link and route, computed
    from its spec alone (so `down` and `heal` need nothing else)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.name = spec["name"]
        self.P, self.K, self.L, self.H = spec["planes"], spec["spines"], spec["leaves"], spec["hosts_per_leaf"]
        self.N = self.L * self.H
        self.encoding = spec["encoding"]
        self.rate, self.host_rate = spec["rate"], spec["host_rate"]
        self.mtu = spec.get("mtu", DEFAULT_MTU)
        self.host_sysctls = spec.get("host_sysctls", [])

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
        return (h - 1) // self.H + 1

    def hosts(self) -> list[int]:
        return list(range(1, self.N + 1))

    def nodes(self) -> dict[str, dict]:
        """node -> {kind, plane, index, ns}; hosts have plane None."""
        out = {}
        for p in range(self.P):
            for s in range(1, self.K + 1):
                out[self.spine(p, s)] = {"kind": "spine", "plane": p, "index": s}
            for l in range(1, self.L + 1):
                out[self.leaf(p, l)] = {"kind": "leaf", "plane": p, "index": l}
        for h in self.hosts():
            out[self.host(h)] = {"kind": "host", "plane": None, "index": h}
        for node, d in out.items():
            d["ns"] = self.ns(node)
        return out

    def namespaces(self) -> list[str]:
        return [d["ns"] for d in self.nodes().values()]

    # -- addresses
    @staticmethod
    def spine_id(p: int, s: int) -> int:
        return 0x100 * (p + 1) + s

    @staticmethod
    def host_id(h: int) -> int:
        return 0xE000 + h

    @staticmethod
    def sid(ident: int) -> str:
        return f"fc00:0:{ident:x}::"

    def host_sid(self, h: int) -> str:
        return self.sid(self.host_id(h))

    def spine_sid(self, p: int, s: int) -> str:
        return self.sid(self.spine_id(p, s))

    @staticmethod
    def addr6(h: int) -> str:
        return f"fd00:0:{h:x}::1"

    @staticmethod
    def prefix6(h: int) -> str:
        return f"fd00:0:{h:x}::/64"

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
        for p in range(self.P):
            for s in range(1, self.K + 1):
                for l in range(1, self.L + 1):
                    net = self.link_net(p, s, l)
                    sp, lf = self.spine(p, s), self.leaf(p, l)
                    out.append({"name": f"{sp}-{lf}", "kind": "fabric", "plane": p, "rate": self.rate,
                                "a": {"node": sp, "ns": self.ns(sp), "dev": f"l{l}", "addr": f"{net}1"},
                                "b": {"node": lf, "ns": self.ns(lf), "dev": f"s{s}", "addr": f"{net}2"}})
        for h in self.hosts():
            for p in range(self.P):
                hn, lf = self.host(h), self.leaf(p, self.leaf_of(h))
                out.append({"name": f"{hn}-{lf}", "kind": "host", "plane": p, "rate": self.host_rate,
                            "a": {"node": hn, "ns": self.ns(hn), "dev": f"eth{p}", "addr": "fe80::2"},
                            "b": {"node": lf, "ns": self.ns(lf), "dev": f"h{h}", "addr": "fe80::1"}})
        return out

    def link_index(self) -> dict[frozenset, dict]:
        return {frozenset((lk["a"]["node"], lk["b"]["node"])): lk for lk in self.links()}

    # -- paths
    def paths(self, a: int, b: int) -> list[dict]:
        """Host a -> host b: one path per (plane, spine)."""
        out = []
        dst = self.host_id(b)
        for p in range(self.P):
            for s in range(1, self.K + 1):
                sid = self.spine_id(p, s)
                path = {"plane": p, "spine": self.spine(p, s)}
                if self.encoding == "usid":
                    path["usid"] = f"fc00:0:{sid:x}:{dst:x}::"
                    path["args"] = ["--usid", path["usid"]]
                else:
                    path["via"] = f"{self.sid(sid)},{self.sid(dst)}"
                    path["args"] = ["--via", path["via"]]
                out.append(path)
        return out

    def path_add_args(self, a: int, b: int, prefix: str | None = None) -> list[str]:
        args = ["path", "add", prefix or self.prefix6(b)]
        for path in self.paths(a, b):
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
        else:
            # ECMP on the 5-tuple as a switch computes it from the headers:
            # policy 3 with fields src,dst,proto,sport,dport (0x37).  Policy 1
            # would reuse skb->hash when the skb has an L4 hash, and a veth
            # carries the sending socket's random txhash across namespaces.
            keys += ["net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1",
                     "net.ipv6.fib_multipath_hash_policy=3", "net.ipv6.fib_multipath_hash_fields=0x37",
                     "net.ipv4.fib_multipath_hash_policy=3", "net.ipv4.fib_multipath_hash_fields=0x37"]
        return keys

    def dev_sysctls(self, node: str) -> list[str]:
        keys = []
        for dev in ["lo", *self.devices(node)]:
            keys += [f"net.ipv6.conf.{dev}.seg6_enabled=1", f"net.ipv6.conf.{dev}.accept_dad=0",
                     f"net.ipv6.conf.{dev}.keep_addr_on_down=1", f"net.ipv4.conf.{dev}.rp_filter=0"]
        return keys

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
            for q in range(self.P):
                cmds.append(f"route replace fc00:0:{0x100 * (q + 1):x}::/40 via fe80::1 dev eth{q}")
            cmds += ["route replace fc00::/16 via fe80::1 dev eth0",
                     "route replace fd00::/16 via fe80::1 dev eth0",
                     f"route replace 198.18.0.0/15 via inet6 fe80::1 dev eth0 src {self.addr4(h)}"]
            return cmds
        if kind == "leaf":
            l = info["index"]
            ups = [(f"s{s}", f"{self.link_net(p, s, l)}1") for s in range(1, self.K + 1)]
            for s, (dev, gw) in enumerate(ups, start=1):
                cmds.append(f"route replace {self.spine_sid(p, s)}/48 via {gw} dev {dev}")
            ecmp6 = " ".join(f"nexthop via {gw} dev {dev}" for dev, gw in ups)
            ecmp4 = " ".join(f"nexthop via inet6 {gw} dev {dev}" for dev, gw in ups)
            # remote hosts: kernel ECMP over the plane's spines (the baseline)
            cmds += [f"route replace fc00:0:e000::/35 {ecmp6}",
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


# --------------------------------------------------------------------------- state

def state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise MrcError(f"bad fabric name {name!r}: a lowercase letter, then up to 15 of a-z, 0-9, _")


def list_names() -> list[str]:
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json"))


@contextlib.contextmanager
def locked(name: str, create: dict | None = None):
    """The fabric's state, locked; changes to the yielded dict are saved.
    With create, make the file (it must not exist) from that dict."""
    check_name(name)
    path = state_path(name)
    if create is not None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise MrcError(f"fabric {name} already exists (mrcctl fabric down {name} first)")
    else:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            have = list_names()
            raise MrcError(f"no fabric {name}" + (f" (have: {', '.join(have)})" if have else
                                                  " (mrcctl fabric up first)"))
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if create is not None:
            state = create
        else:
            text = f.read()
            try:
                state = json.loads(text)
            except ValueError:
                raise MrcError(f"state of fabric {name} ({path}) is damaged")
        saved = json.dumps(state, indent=1, sort_keys=True)
        if create is not None:
            f.write(saved)
            f.flush()
            saved = None
        try:
            yield state
        finally:
            if path.exists() and not state.get("_removed"):
                new = json.dumps(state, indent=1, sort_keys=True)
                if new != saved:
                    f.seek(0)
                    f.truncate()
                    f.write(new)
                    f.flush()


def load(name: str) -> dict:
    with locked(name) as state:
        return json.loads(json.dumps(state))


def existing_namespaces() -> set[str]:
    r = _run(["ip", "-j", "netns", "list"], check=False)
    try:
        return {n["name"] for n in json.loads(r.stdout or "[]")}
    except ValueError:
        return set()


# --------------------------------------------------------------------------- up / down

def _batch(cmd: list[str], lines: list[str], what: str) -> None:
    if not lines:
        return
    r = subprocess.run([*cmd, "-batch", "-"], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        err = " ".join(r.stderr.split())[:300]
        raise MrcError(f"{what}: {err or f'exit {r.returncode}'}")


def _ns_sysctl(ns: str, keys: list[str]) -> None:
    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", *keys])


def _parallel(jobs: list[list[str]], limit: int = 8) -> list[subprocess.CompletedProcess]:
    """Run commands a few at a time; results in order."""
    results: list = [None] * len(jobs)
    running: list[tuple[int, subprocess.Popen]] = []
    pending = list(enumerate(jobs))
    while pending or running:
        while pending and len(running) < limit:
            i, cmd = pending.pop(0)
            running.append((i, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                text=True, cwd=ROOT)))
        i, proc = running.pop(0)
        out, err = proc.communicate(timeout=300)
        results[i] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def up(name: str, spines: int, leaves: int, hosts_per_leaf: int, planes: int = 1,
       rate: str | None = DEFAULT_RATE, host_rate: str | None = None, encoding: str = "srh",
       mtu: int = DEFAULT_MTU, host_sysctls: list[str] = (), ecn_threshold: str | None = None) -> dict:
    check_name(name)
    for what, v, hi in (("--spines", spines, MAX_SPINES), ("--leaves", leaves, MAX_LEAVES),
                        ("--hosts-per-leaf", hosts_per_leaf, MAX_HOSTS), ("--planes", planes, MAX_PLANES)):
        if not isinstance(v, int) or not 1 <= v <= hi:
            raise MrcError(f"{what} {v}: must be 1..{hi}")
    if leaves * hosts_per_leaf > MAX_HOSTS:
        raise MrcError(f"{leaves * hosts_per_leaf} hosts: at most {MAX_HOSTS}")
    if encoding not in ENCODINGS:
        raise MrcError(f"bad encoding {encoding!r}: srh or usid")
    if not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise MrcError(f"--mtu {mtu}: must be {MIN_MTU}..{MAX_MTU}")
    for kv in host_sysctls:
        if not SYSCTL_RE.match(kv):
            raise MrcError(f"bad --host-sysctl {kv!r}: net.KEY=VALUE")
    rate_bits, host_bits = parse_rate(rate), parse_rate(host_rate)
    if ecn_threshold is not None:
        ecn_marks.parse_threshold(ecn_threshold)
        if not rate_bits:
            raise MrcError("--ecn-threshold needs a --rate: only rate-limited links have queues to mark")
    spec = {"name": name, "planes": planes, "spines": spines, "leaves": leaves,
            "hosts_per_leaf": hosts_per_leaf, "encoding": encoding,
            "rate": rate if rate_bits else None, "host_rate": host_rate if host_bits else None,
            "mtu": mtu, "host_sysctls": list(host_sysctls), "ecn_threshold": ecn_threshold}
    fab = Fabric(spec)
    planned = fab.namespaces()
    if state_path(name).exists():
        raise MrcError(f"fabric {name} already exists (mrcctl fabric down {name} first)")
    clash = sorted(set(planned) & existing_namespaces())
    if clash:
        raise MrcError(f"namespace {clash[0]} already exists (not made by fabric {name}); "
                       f"pick another NAME")
    if os.geteuid() != 0:
        raise MrcError("fabric up needs root")
    started = time.monotonic()
    state = {"spec": spec, "status": "building", "namespaces": planned, "faults": [],
             "attached": {}, "created": time.time()}
    with locked(name, create=state) as state:
        try:
            _build(fab)
            if ecn_threshold is not None:
                state["ecn_marking"] = ecn_marks.install(name, fab.marking_devices(),
                                                         ecn_marks.parse_threshold(ecn_threshold))
        except BaseException as e:
            state["_removed"] = True
            _teardown(fab, state, quiet=True)
            state_path(name).unlink(missing_ok=True)
            if isinstance(e, MrcError):
                raise MrcError(f"fabric up {name} failed, removed what it made: {e}")
            if isinstance(e, (subprocess.TimeoutExpired, OSError)):
                raise MrcError(f"fabric up {name} failed, removed what it made: {e}")
            raise
        state["status"] = "up"
        state["build_s"] = round(time.monotonic() - started, 2)
    return {"name": name, "namespaces": len(planned), "hosts": fab.N, "links": len(fab.links()),
            "build_s": state["build_s"], "state": str(state_path(name)), **spec}


def _build(fab: Fabric) -> None:
    nodes = fab.nodes()
    _batch(["ip"], [f"netns add {d['ns']}" for d in nodes.values()], "creating namespaces")
    # defaults first, so devices made afterwards inherit them
    for node, d in nodes.items():
        _ns_sysctl(d["ns"], fab.sysctls(node))
    _batch(["ip"], [f"link add {lk['a']['dev']} netns {lk['a']['ns']} type veth peer name "
                    f"{lk['b']['dev']} netns {lk['b']['ns']}" for lk in fab.links()], "creating links")
    for node, d in nodes.items():
        _ns_sysctl(d["ns"], fab.sysctls(node) + fab.dev_sysctls(node))
        _batch(["ip", "-n", d["ns"]], fab.addr_cmds(node), f"addresses of {node}")
        _batch(["tc", "-n", d["ns"]], fab.tc_cmds(node), f"qdiscs of {node}")
    for node, d in nodes.items():
        _batch(["ip", "-n", d["ns"]], fab.route_cmds(node), f"routes of {node}")


_CLONE_NEWNET = 0x40000000


def _has_pins(ns: str) -> bool:
    """Does the datapath have pinned state in namespace ns?  (Its pin
    directory is named by the namespace's cookie: look from inside.)"""
    import ctypes

    from . import pins
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    except OSError:
        return False
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            return True          # cannot tell: let detach --all decide
        try:
            d = pins.netns_dir()
            return d.is_dir() and any(d.iterdir())
        finally:
            if libc.setns(home, _CLONE_NEWNET) != 0:
                raise MrcError("cannot return to the original network namespace")
    except OSError:
        return True
    finally:
        os.close(target)
        os.close(home)


def _teardown(fab: Fabric, state: dict, quiet: bool = False) -> list[str]:
    """Remove everything of fab that exists; return what could not be removed."""
    problems = []
    present = existing_namespaces()
    hosts = [fab.ns(fab.host(h)) for h in fab.hosts() if fab.ns(fab.host(h)) in present]
    hosts = [ns for ns in hosts if _has_pins(ns)]
    # pins outlive a namespace: take the datapath's state down first (as Topology.destroy)
    for ns, r in zip(hosts, _parallel([[sys.executable, "-m", "cli.mrcctl", "--netns", ns, "detach",
                                        "--all"] for ns in hosts], limit=4)):
        if r.returncode != 0:
            problems.append(f"detach in {ns}: {r.stderr.strip()}")
    for f in state.get("faults", []):
        if f.get("kind") == "gray" and f["ns"] in present:
            with contextlib.suppress(Exception):
                faults.heal(f["ns"], f["dev"])
    mine = [ns for ns in state.get("namespaces", fab.namespaces()) if ns in present]
    if mine:
        r = subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {ns}\n" for ns in mine),
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0 and not quiet:
            problems.append(" ".join(r.stderr.split())[:300])
    ecn_marks.remove(fab.name)
    for ns in state.get("namespaces", fab.namespaces()):
        try:
            faults.forget(ns)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            problems.append(f"fault pins of {ns}: {e}")
    left = sorted(set(mine) & existing_namespaces())
    if left:
        problems.append(f"namespaces left: {', '.join(left)}")
    return problems


def down(name: str) -> dict:
    with locked(name) as state:
        fab = Fabric(state["spec"])
        problems = _teardown(fab, state)
        if any(p.startswith("namespaces left") for p in problems):
            raise MrcError(f"fabric down {name}: {'; '.join(problems)}")
        state["_removed"] = True
        state_path(name).unlink(missing_ok=True)
    return {"name": name, "removed": len(state.get("namespaces", [])), "problems": problems}


# --------------------------------------------------------------------------- show

def describe(name: str) -> dict:
    state = load(name)
    fab = Fabric(state["spec"])
    nodes = fab.nodes()
    live = state["status"] == "up"
    hosts = []
    for h in fab.hosts():
        hn = fab.host(h)
        hosts.append({"name": hn, "ns": fab.ns(hn), "id": f"0x{fab.host_id(h):x}", "sid": fab.host_sid(h),
                      "addr6": fab.addr6(h), "prefix6": fab.prefix6(h), "addr4": fab.addr4(h),
                      "prefix4": fab.prefix4(h),
                      "nics": [{"plane": p, "dev": f"eth{p}", "leaf": fab.leaf(p, fab.leaf_of(h)),
                                "leaf_dev": f"h{h}"} for p in range(fab.P)],
                      "attached": state.get("attached", {}).get(hn)})
    switches = []
    for node, d in nodes.items():
        if d["kind"] == "host":
            continue
        sw = {"name": node, "kind": d["kind"], "plane": d["plane"], "index": d["index"], "ns": d["ns"]}
        if d["kind"] == "spine":
            sw["id"] = f"0x{fab.spine_id(d['plane'], d['index']):x}"
            sw["sid"] = fab.spine_sid(d["plane"], d["index"])
            sw["behavior"] = "End" + (" next-csid lblen 32 nflen 16" if fab.encoding == "usid" else "")
        switches.append(sw)
    queues = (ecn_marks.read(name) or {}) if live and state.get("ecn_marking") else {}
    by_end = {(d["ns"], d["dev"]): queues.get(mac) for mac, d in state.get("ecn_marking", {}).items()}

    def with_marks(end: dict, other: dict) -> dict:
        """The end, with the marks its device's queue gave, sending towards other."""
        q = by_end.get((end["ns"], end["dev"]))
        return end if q is None else dict(end, ecn={"packets": q.packets, "ect": q.ect, "marked": q.marked,
                                                    "direction": f"{end['node']}>{other['node']}"})
    links = []
    for lk in fab.links():
        entry = {k: lk[k] for k in ("name", "kind", "plane", "rate")}
        entry["ends"] = [with_marks(lk["a"], lk["b"]), with_marks(lk["b"], lk["a"])]
        entry["faults"] = []
        for f in state.get("faults", []):
            for me, other in ((lk["a"], lk["b"]), (lk["b"], lk["a"])):
                if f["ns"] == me["ns"] and f["dev"] == me["dev"]:
                    fd = {"mode": f["mode"], "target": f["target"]}
                    if f["kind"] == "gray":
                        fd["direction"] = f"{other['node']}>{me['node']}"
                        fd["loss"] = f["loss"]
                        if live:
                            with contextlib.suppress(Exception):
                                st = faults.status(f["ns"], f["dev"])
                                if st:
                                    fd["dropped"], fd["passed"] = st.get("dropped"), st.get("passed")
                                    fd["first_drop_ns"] = st.get("first_drop_ns")
                    else:
                        fd["down_end"] = me["node"]
                    entry["faults"].append(fd)
        links.append(entry)
    pairs = []
    for a in fab.hosts():
        for b in fab.hosts():
            if a == b:
                continue
            pairs.append({"src": fab.host(a), "dst": fab.host(b), "dst_sid": fab.host_sid(b),
                          "prefix6": fab.prefix6(b), "prefix4": fab.prefix4(b),
                          "paths": [{k: v for k, v in p.items() if k != "args"} for p in fab.paths(a, b)],
                          "path_add": fab.path_add_args(a, b)})
    return {"name": name, "status": state["status"], **{k: v for k, v in state["spec"].items() if k != "name"},
            "namespaces": state["namespaces"], "hosts": hosts, "switches": switches, "links": links,
            "paths": pairs,
            "naming": {"links": "<spine>-<leaf> (s1-l2; plane p>0: p1s1-p1l2), <host>-<leaf> (h1-l1, "
                                "h1-p1l1); a>b is one direction (fault on b's ingress); a node name "
                                "means all its links",
                       "devices": "host eth<plane>; leaf s<spine>, h<host>; spine l<leaf>",
                       "sids": "spine fc00:0:<0x100*(plane+1)+s>::, host fc00:0:<0xe000+h>::",
                       "data": "host h: fd00:0:<h>::1 (fd00:0:<h>::/64), 198.18.<h/256>.<h%256>"}}


# --------------------------------------------------------------------------- nodes, exec

def node_ns(name: str, node: str) -> str:
    state = load(name)
    fab = Fabric(state["spec"])
    nodes = fab.nodes()
    if node in nodes:
        return nodes[node]["ns"]
    if node in state["namespaces"]:
        return node
    raise MrcError(f"no host or switch {node!r} in fabric {name} (hosts h1..h{fab.N}, "
                   f"spines s1..s{fab.K}, leaves l1..l{fab.L}"
                   + (", plane p>0: p<p>s<k>, p<p>l<k>" if fab.P > 1 else "") + ")")


# --------------------------------------------------------------------------- faults

def fail(name: str, targets: list[str], mode_text: str) -> dict:
    mode, loss = parse_mode(mode_text)
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        plan = []          # (kind, ns, dev, target)
        for t in targets:
            node_target = t if t in fab.nodes() else None
            for lk, ends, whole in fab.resolve_target(t):
                if mode == "down":
                    if not whole:
                        raise MrcError(f"{t}: mode down takes a whole link or node, not one direction "
                                       f"(use blackhole or loss=P for one direction)")
                    end = Fabric.down_end(lk, node_target)
                    plan.append(("down", end["ns"], end["dev"], t, lk["name"]))
                else:
                    for end in ends:
                        plan.append(("gray", end["ns"], end["dev"], t, lk["name"]))
        done = []
        seen = set()
        for kind, ns, dev, t, link in plan:
            if (kind, ns, dev) in seen:
                continue
            seen.add((kind, ns, dev))
            existing = [f for f in state["faults"] if f["ns"] == ns and f["dev"] == dev and f["kind"] == kind]
            if kind == "down":
                _run(["ip", "-n", ns, "link", "set", dev, "down"])
            elif existing:      # switched in place: instant, no compile
                faults.rearm(ns, dev, mode, loss=loss)
            else:
                faults.inject(ns, dev, mode, loss=loss)
            state["faults"] = [f for f in state["faults"] if f not in existing]
            entry = {"kind": kind, "mode": mode, "loss": loss if kind == "gray" else None,
                     "ns": ns, "dev": dev, "target": t, "link": link}
            state["faults"].append(entry)
            done.append(entry)
    return {"name": name, "mode": mode, "loss": loss if mode != "down" else None, "installed": done}


def heal(name: str, targets: list[str] | None) -> dict:
    """Undo faults on TARGETs (any fault on their ends), or all of them."""
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if targets:
            ends = set()
            for t in targets:
                for lk, _, _ in fab.resolve_target(t):
                    ends |= {(lk["a"]["ns"], lk["a"]["dev"]), (lk["b"]["ns"], lk["b"]["dev"])}
                # a directed heal only heals that direction's gray fault
                m = re.fullmatch(r"([a-z0-9]+)>([a-z0-9]+)", t.strip())
                if m:
                    (lk, [end], _), = fab.resolve_target(t)
                    ends -= {(lk["a"]["ns"], lk["a"]["dev"]), (lk["b"]["ns"], lk["b"]["dev"])}
                    ends.add((end["ns"], end["dev"]))
            chosen = [f for f in state["faults"] if (f["ns"], f["dev"]) in ends]
        else:
            chosen = list(state["faults"])
        reapply = set()
        healed = []
        for f in chosen:
            if f["kind"] == "gray":
                faults.heal(f["ns"], f["dev"])
            else:
                _run(["ip", "-n", f["ns"], "link", "set", f["dev"], "up"])
                reapply.add(f["ns"])
            state["faults"].remove(f)
            healed.append(f)
        # the kernel drops IPv6 routes through a device set down: put them back
        by_ns = {d["ns"]: node for node, d in fab.nodes().items()}
        for ns in sorted(reapply):
            node = by_ns[ns]
            _batch(["ip", "-n", ns], fab.addr_cmds(node), f"addresses of {node}")
            _batch(["ip", "-n", ns], fab.route_cmds(node), f"routes of {node}")
    return {"name": name, "healed": healed}


# --------------------------------------------------------------------------- attach

def _mrcctl(ns: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "cli.mrcctl", "--netns", ns, *args]


def _pick_hosts(fab: Fabric, hosts: str | None) -> list[int]:
    if not hosts:
        return fab.hosts()
    out = []
    for item in hosts.split(","):
        item = item.strip()
        m = re.fullmatch(r"h?(\d+)", item)
        if not m or not 1 <= int(m.group(1)) <= fab.N:
            raise MrcError(f"no host {item!r} in fabric {fab.name} (h1..h{fab.N})")
        if int(m.group(1)) not in out:
            out.append(int(m.group(1)))
    return out


def _check(r: subprocess.CompletedProcess, what: str) -> None:
    if r.returncode != 0:
        msg = r.stderr.strip().splitlines()
        msg = msg[-1] if msg else f"exit {r.returncode}"
        raise MrcError(f"{what}: {msg.removeprefix('mrcctl: error: ')}")


def attach(name: str, hosts: str | None, policy: str | None, extra: list[str],
           ipv4: bool = False) -> dict:
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        chosen = _pick_hosts(fab, hosts)
        if len(chosen) < 2:
            raise MrcError("attach needs at least two hosts")
        already = [fab.host(h) for h in chosen if fab.host(h) in state["attached"]]
        if already:
            raise MrcError(f"already attached: {', '.join(already)} (mrcctl fabric detach first)")
        devs = [f"eth{p}" for p in range(fab.P)]
        done = []
        try:
            # attach in parallel (each loads the programs: a bcc compile)
            results = _parallel([_mrcctl(fab.ns(fab.host(h)), "attach", *devs, "--sid", fab.host_sid(h),
                                         *extra) for h in chosen], limit=2)
            for h, r in zip(chosen, results):
                if r.returncode == 0:
                    done.append(h)
            for h, r in zip(chosen, results):
                _check(r, f"attach on {fab.host(h)}")
            jobs = []
            for a in chosen:
                ns = fab.ns(fab.host(a))
                cmds = []
                for b in chosen:
                    if a == b:
                        continue
                    prefixes = [fab.prefix6(b)] + ([fab.prefix4(b)] if ipv4 else [])
                    for prefix in prefixes:
                        cmds.append(_mrcctl(ns, *fab.path_add_args(a, b, prefix)))
                        if policy:
                            cmds.append(_mrcctl(ns, "path", "policy", prefix, policy))
                jobs.append(cmds)
            _run_sequences(jobs, f"fabric {name}")
        except BaseException:
            _parallel([_mrcctl(fab.ns(fab.host(h)), "detach", "--all") for h in done], limit=4)
            raise
        for h in chosen:
            state["attached"][fab.host(h)] = {"devices": devs, "sid": fab.host_sid(h), "ipv4": ipv4,
                                              "peers": [fab.host(b) for b in chosen if b != h],
                                              "policy": policy or "rr", "extra": list(extra)}
    return {"name": name, "hosts": [fab.host(h) for h in chosen], "devices": devs,
            "policy": policy or "rr", "paths_per_peer": fab.P * fab.K}


def _run_sequences(jobs: list[list[list[str]]], what: str, limit: int = 2) -> None:
    """Each job is a list of commands run in order; jobs run side by side."""
    cursors = [0] * len(jobs)
    running: dict[int, subprocess.Popen] = {}
    try:
        while any(c < len(j) for c, j in zip(cursors, jobs)) or running:
            for i, job in enumerate(jobs):
                if i not in running and cursors[i] < len(job) and len(running) < limit:
                    running[i] = subprocess.Popen(job[cursors[i]], stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True, cwd=ROOT)
            i = next(iter(running))
            proc = running.pop(i)
            out, err = proc.communicate(timeout=300)
            cmd = jobs[i][cursors[i]]
            cursors[i] += 1
            _check(subprocess.CompletedProcess(cmd, proc.returncode, out, err),
                   f"{' '.join(cmd[5:8])} in {cmd[4]}")
    finally:
        for proc in running.values():
            proc.kill()
            proc.wait()


def detach(name: str, hosts: str | None) -> dict:
    with locked(name) as state:
        fab = Fabric(state["spec"])
        chosen = [fab.host(h) for h in _pick_hosts(fab, hosts)] if hosts else list(state["attached"])
        present = existing_namespaces()
        targets = [h for h in chosen if fab.ns(h) in present]
        results = _parallel([_mrcctl(fab.ns(h), "detach", "--all") for h in targets], limit=4)
        for h, r in zip(targets, results):
            _check(r, f"detach on {h}")
        for h in chosen:
            state["attached"].pop(h, None)
    return {"name": name, "detached": chosen}
