"""A fabric description file (YAML): the fabric's shape, links, encoding,
address plan and every host's attach options and policy, in one document.

`mrcctl fabric up --from FILE` builds it; `mrcctl render FILE --host NAME`
turns it into that host's config (the host config format of
mrc_ebpf/control/config/: attach section, peers and their paths).  The
names and addresses all come from plan.Fabric, so a described fabric and one
built from `fabric up` options share one address plan.

    version: 1
    fabric:
      name: big              # optional (fabric up NAME overrides it)
      planes: 2
      spines: 4
      leaves: 8
      hosts_per_leaf: 4
      encoding: srh          # srh | usid | ev
      hash: l4               # l4 | flowlabel
      rate: 100mbit          # leaf-spine links (none: unlimited)
      host_rate: none
      mtu: 1500
      ecn_threshold: 1ms     # optional
      host_sysctls: [net.ipv4.tcp_ecn=1]
    addresses:               # optional: the /32s of the plan (plan.py)
      sid_block: "fc00:0::/32"
      data_block: "fd00:0::/32"
    hosts:
      defaults:              # every host, unless it says otherwise
        policy: rr
        ipv4: false          # also the IPv4 /32s as peers
        entropy: 64          # encoding ev: entropy paths per peer
        attach: {granularity: packet, ack_timeout_us: 1000}
        classes: [{name: bulk, dscp: [8]}]
      h3: {policy: adaptive}

Every key is checked; an error is one line, `FILE:LINE: reason`.
"""
from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import yaml

from mrc_ebpf.errors import MrcError

from .plan import (DEFAULT_ENTROPY, DEFAULT_HASH, DEFAULT_MTU, DEFAULT_NAME, DEFAULT_RATE, ENCODINGS, HASHES,
                   MAX_HOSTS, MAX_LEAVES, MAX_MTU, NARROW_HOSTS, RENDER_MAX_HOSTS, RENDER_MAX_LEAVES, RENDER_MAX_SPINES, MAX_PLANES, MAX_SPINES, MIN_MTU, NAME_RE, SYSCTL_RE,
                   DEFAULT_DATA_BLOCK, DEFAULT_SID_BLOCK, Fabric, parse_rate)

VERSION = 1
POLICY_NAMES = ("rr", "weighted", "random", "hash", "adaptive", "bytes")
# The attach section's options (HOST_CONFIG.md: mrcctl attach's --long-names
# with _), their types and ranges; devices and sid come from the plan.
ATTACH_OPTIONS = {
    "mode": ("auto", "native", "skb"),
    "granularity": ("auto", "packet", "burst"),
    "link_rate_mbps": (0, 10_000_000),
    "loss_hold_us": (0, 10_000_000),
    "ack_timeout_us": (50, 10_000_000),
    "probe_us": (10, 10_000_000),
    "fb_interval_us": (10, 10_000_000),
    "reorder_max_us": (0, 10_000_000),
    "retrans_steer": bool,
    "min_active": (0, 256),
    "key_file": str,
}
# the defaults of `fabric up` (its options), as a description's fabric section
SHAPE_DEFAULTS = {"name": DEFAULT_NAME, "planes": 1, "spines": 4, "leaves": 2, "hosts_per_leaf": 1,
                  "encoding": "srh", "hash": DEFAULT_HASH, "rate": DEFAULT_RATE, "host_rate": None,
                  "mtu": DEFAULT_MTU, "ecn_threshold": None, "host_sysctls": []}
HOST_KEYS = ("policy", "ipv4", "entropy", "attach", "classes")
HOST_DEFAULTS = {"policy": None, "ipv4": False, "entropy": DEFAULT_ENTROPY, "attach": {}, "classes": []}


class DescriptionError(MrcError):
    """FILE:LINE: reason."""


class _Doc:
    """A YAML document as plain Python, with the line of every key and item."""

    def __init__(self, text: str, where: str):
        self.where = where
        self.lines: dict[tuple, int] = {}
        from mrc_ebpf.control.config import compose
        node = compose(text, where, DescriptionError)
        if node is None:
            raise DescriptionError(f"{where}:1: empty file: a fabric description starts with version: 1")
        loader = yaml.SafeLoader("")       # its constructor makes the scalars
        try:
            self.data = self._convert(loader, node, ())
        finally:
            loader.dispose()

    def _convert(self, loader, node, path: tuple):
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    self.fail(path, "a key must be a plain name")
                key = loader.construct_object(knode, deep=True)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    self.lines[path + (key,)] = knode.start_mark.line + 1
                    self.fail(path + (key,), f"{key} given twice")
                self.lines[path + (key,)] = knode.start_mark.line + 1
                out[key] = self._convert(loader, vnode, path + (key,))
                self.lines[path + (key,)] = knode.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(loader, item, path + (i,)) for i, item in enumerate(node.value)]
        try:
            return loader.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            self.fail(path, f"bad value: {e}")

    def line(self, path: tuple) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def fail(self, path: tuple, reason: str):
        raise DescriptionError(f"{self.where}:{self.line(path)}: {reason}")


class _HostNames:
    """The keys of the hosts section: defaults and the fabric's hosts."""

    def __init__(self, fab: Fabric):
        self.fab = fab

    def __contains__(self, key) -> bool:
        m = re.fullmatch(r"h(\d+)", str(key))
        return key == "defaults" or bool(m and 1 <= int(m.group(1)) <= self.fab.host_count
                                         and str(key) == self.fab.host(int(m.group(1))))

    def __iter__(self):
        return iter(["defaults", f"h1..h{self.fab.host_count}"])


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _mapping(doc: _Doc, value, path: tuple, allowed) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        doc.fail(path, f"{_dotted(path)} must be a mapping")
    for key in value:
        if key not in allowed:
            doc.fail(path + (key,), f"unknown key {_dotted(path + (key,))} (known: {', '.join(allowed)})")
    return value


def _int(doc: _Doc, value, path: tuple, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        doc.fail(path, f"{_dotted(path)} {value!r}: an integer in {lo}..{hi}")
    return value


def _choice(doc: _Doc, value, path: tuple, choices) -> str:
    if value not in choices:
        doc.fail(path, f"{_dotted(path)} {value!r}: one of {', '.join(choices)}")
    return value


def _rate(doc: _Doc, value, path: tuple) -> str | None:
    if value is None or value is False or str(value).lower() in ("none", "unlimited", "0", ""):
        return None
    try:
        parse_rate(str(value))
    except MrcError as e:
        doc.fail(path, str(e))
    return str(value)


def _block(doc: _Doc, value, path: tuple, within: str) -> str:
    try:
        net = ipaddress.IPv6Network(str(value))
    except ValueError:
        doc.fail(path, f"{_dotted(path)} {value!r}: an IPv6 /32 inside {within}")
    if net.prefixlen != 32 or not net.subnet_of(ipaddress.IPv6Network(within)):
        doc.fail(path, f"{_dotted(path)} {value!r}: an IPv6 /32 inside {within}")
    return str(net)


def _fabric_section(doc: _Doc, value) -> dict:
    sec = _mapping(doc, value, ("fabric",), SHAPE_DEFAULTS)
    spec = {k: (list(v) if isinstance(v, list) else v) for k, v in SHAPE_DEFAULTS.items()}
    p = ("fabric",)
    if "name" in sec:
        name = str(sec["name"])
        if not NAME_RE.match(name):
            doc.fail(p + ("name",), f"bad fabric name {name!r}: a lowercase letter, then up to 15 of a-z, 0-9, _")
        spec["name"] = name
    # render-only sizes pass here; `fabric up --from` refuses what it cannot build (build.py)
    # spines beyond a byte (MAX_SPINES) widen the spine IDs, and beyond what
    # a peer's 256 paths take each peer gets a share of them (Fabric.spine_groups)
    for key, hi in (("planes", MAX_PLANES), ("spines", RENDER_MAX_SPINES), ("leaves", RENDER_MAX_LEAVES),
                    ("hosts_per_leaf", RENDER_MAX_HOSTS)):
        if key in sec:
            spec[key] = _int(doc, sec[key], p + (key,), 1, hi)
    hosts = spec["leaves"] * spec["hosts_per_leaf"]
    if hosts > RENDER_MAX_HOSTS:
        doc.fail(p + ("hosts_per_leaf",) if "hosts_per_leaf" in sec else p,
                 f"{hosts} hosts: at most {RENDER_MAX_HOSTS} (rendered), {MAX_HOSTS} (built here)")
    if "encoding" in sec:
        spec["encoding"] = _choice(doc, sec["encoding"], p + ("encoding",), ENCODINGS)
    if "hash" in sec:
        spec["hash"] = _choice(doc, sec["hash"], p + ("hash",), tuple(HASHES))
    if spec["encoding"] == "usid" and hosts > NARROW_HOSTS:
        doc.fail(p + ("encoding",), f"encoding usid names a host by a 16-bit ID: at most {NARROW_HOSTS} hosts")
    if spec["encoding"] == "ev" and spec["planes"] != 1:
        doc.fail(p + ("planes",), "encoding ev builds one plane: a host's entropy paths leave by eth0, "
                                   "and the leaves' hash picks the spine")
    for key in ("rate", "host_rate"):
        if key in sec:
            spec[key] = _rate(doc, sec[key], p + (key,))
    if "mtu" in sec:
        spec["mtu"] = _int(doc, sec["mtu"], p + ("mtu",), MIN_MTU, MAX_MTU)
    if sec.get("ecn_threshold") is not None:
        from mrc_ebpf.lab import ecn_marks
        try:
            ecn_marks.parse_threshold(str(sec["ecn_threshold"]))
        except MrcError as e:
            doc.fail(p + ("ecn_threshold",), str(e))
        if not spec["rate"]:
            doc.fail(p + ("ecn_threshold",), "ecn_threshold needs a rate: only rate-limited links have "
                                              "queues to mark")
        spec["ecn_threshold"] = str(sec["ecn_threshold"])
    if "host_sysctls" in sec:
        kvs = sec["host_sysctls"] or []
        if not isinstance(kvs, list):
            doc.fail(p + ("host_sysctls",), "fabric.host_sysctls must be a list of net.KEY=VALUE")
        for i, kv in enumerate(kvs):
            if not isinstance(kv, str) or not SYSCTL_RE.match(kv):
                doc.fail(p + ("host_sysctls", i), f"bad host sysctl {kv!r}: net.KEY=VALUE")
        spec["host_sysctls"] = list(kvs)
    return spec


def _attach_section(doc: _Doc, value, path: tuple) -> dict:
    sec = _mapping(doc, value, path, ATTACH_OPTIONS)
    out = {}
    for key, v in sec.items():
        kind = ATTACH_OPTIONS[key]
        if kind is bool:
            if not isinstance(v, bool):
                doc.fail(path + (key,), f"{_dotted(path + (key,))} {v!r}: true or false")
        elif kind is str:
            if not isinstance(v, str) or not v:
                doc.fail(path + (key,), f"{_dotted(path + (key,))} {v!r}: a file name")
        elif isinstance(kind[0], int):
            _int(doc, v, path + (key,), *kind)
        else:
            _choice(doc, v, path + (key,), kind)
        out[key] = v
    return out


def _classes(doc: _Doc, value, path: tuple) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        doc.fail(path, f"{_dotted(path)} must be a list of {{name, dscp}}")
    out, names = [], set()
    for i, c in enumerate(value):
        c = _mapping(doc, c, path + (i,), ("name", "dscp"))
        name = c.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,14}", name):
            doc.fail(path + (i, "name"), f"class name {name!r}: a letter, then up to 14 letters, digits, _ or -")
        if name in names:
            doc.fail(path + (i, "name"), f"class {name} given twice")
        names.add(name)
        dscp = c.get("dscp")
        if not isinstance(dscp, list) or not dscp:
            doc.fail(path + (i, "dscp"), f"class {name}: dscp must be a list of 0..63")
        for j, d in enumerate(dscp):
            _int(doc, d, path + (i, "dscp", j), 0, 63)
        out.append({"name": name, "dscp": list(dscp)})
    return out


def _host_entry(doc: _Doc, value, path: tuple, base: dict, encoding: str) -> dict:
    sec = _mapping(doc, value, path, HOST_KEYS)
    out = {"policy": base["policy"], "ipv4": base["ipv4"], "entropy": base["entropy"],
           "attach": dict(base["attach"]), "classes": list(base["classes"])}
    if "policy" in sec:
        out["policy"] = _choice(doc, sec["policy"], path + ("policy",), POLICY_NAMES)
    if "ipv4" in sec:
        if not isinstance(sec["ipv4"], bool):
            doc.fail(path + ("ipv4",), f"{_dotted(path + ('ipv4',))} {sec['ipv4']!r}: true or false")
        out["ipv4"] = sec["ipv4"]
    if "entropy" in sec:
        if encoding != "ev":
            doc.fail(path + ("entropy",), f"entropy is for an encoding ev fabric; this one is {encoding}")
        out["entropy"] = _int(doc, sec["entropy"], path + ("entropy",), 1, 256)
    if "attach" in sec:
        out["attach"].update(_attach_section(doc, sec["attach"], path + ("attach",)))
    if "classes" in sec:
        out["classes"] = _classes(doc, sec["classes"], path + ("classes",))
    return out


def too_big_to_build(spec: dict) -> str | None:
    """Why `fabric up` cannot build SPEC (a description may be larger
    when it is only rendered), or None."""
    for key, hi in (("spines", MAX_SPINES), ("leaves", MAX_LEAVES), ("hosts_per_leaf", MAX_HOSTS)):
        if spec[key] > hi:
            return f"{spec[key]} {key.replace('_', ' ')}: fabric up builds at most {hi} (a larger " \
                   f"description is for mrcctl render)"
    hosts = spec["leaves"] * spec["hosts_per_leaf"]
    if hosts > MAX_HOSTS:
        return f"{hosts} hosts: fabric up builds at most {MAX_HOSTS} (a larger description is for mrcctl render)"
    return None


class Description:
    """A parsed fabric description: spec (plan.Fabric's), fabric, host options."""

    def __init__(self, spec: dict, hosts: dict[str, dict], defaults: dict):
        self.spec = spec
        self.fabric = Fabric(spec)
        self.host_options = hosts          # host name -> its options (defaults applied)
        self.defaults = defaults

    def options(self, host: str) -> dict:
        return self.host_options.get(host, self.defaults)

    def to_dict(self) -> dict:
        """JSON-able form, kept in the fabric's state (from_dict reads it)."""
        return {"spec": self.spec, "hosts": self.host_options, "defaults": self.defaults}

    @classmethod
    def from_dict(cls, d: dict) -> "Description":
        return cls(d["spec"], d["hosts"], d["defaults"])

    @classmethod
    def from_spec(cls, spec: dict) -> "Description":
        """A fabric built from `fabric up` options: every host the defaults."""
        return cls(spec, {}, {**HOST_DEFAULTS, "attach": {}, "classes": []})


def parse(text: str, where: str = "<fabric>") -> Description:
    doc = _Doc(text, where)
    data = doc.data
    if not isinstance(data, dict):
        doc.fail((), "a fabric description is a mapping (version, fabric, addresses, hosts)")
    _mapping(doc, data, (), ("version", "fabric", "addresses", "hosts"))
    if "version" not in data:
        doc.fail((), "version missing (version: 1)")
    if data["version"] != VERSION or isinstance(data["version"], bool):
        doc.fail(("version",), f"version {data['version']!r}: this mrcctl reads version {VERSION}")
    spec = _fabric_section(doc, data.get("fabric"))
    addrs = _mapping(doc, data.get("addresses"), ("addresses",), ("sid_block", "data_block"))
    spec["sid_block"] = _block(doc, addrs.get("sid_block", DEFAULT_SID_BLOCK), ("addresses", "sid_block"),
                               "fc00::/16")
    spec["data_block"] = _block(doc, addrs.get("data_block", DEFAULT_DATA_BLOCK), ("addresses", "data_block"),
                                "fd00::/16")
    fab = Fabric(spec)
    hosts_sec = _mapping(doc, data.get("hosts"), ("hosts",), _HostNames(fab))
    base = {**HOST_DEFAULTS, "attach": {}, "classes": []}
    defaults = _host_entry(doc, hosts_sec.get("defaults"), ("hosts", "defaults"), base, spec["encoding"])
    hosts = {}
    for name, value in hosts_sec.items():
        if name != "defaults":
            hosts[name] = _host_entry(doc, value, ("hosts", name), defaults, spec["encoding"])
    return Description(spec, hosts, defaults)


def load(path: str | Path) -> Description:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise MrcError(f"cannot read fabric description {path}: {e.strerror or e}")
    except UnicodeDecodeError:
        raise DescriptionError(f"{path}:1: not a text file")
    return parse(text, str(path))


def dump(desc: Description) -> str:
    """The description as a file (what `parse` reads back to the same)."""
    spec = desc.spec
    doc = {"version": VERSION,
           "fabric": {k: spec[k] for k in SHAPE_DEFAULTS if k in spec},
           "addresses": {"sid_block": spec.get("sid_block", DEFAULT_SID_BLOCK),
                         "data_block": spec.get("data_block", DEFAULT_DATA_BLOCK)},
           "hosts": {"defaults": _host_doc(desc.defaults, spec["encoding"]),
                     **{h: _host_doc(o, spec["encoding"]) for h, o in desc.host_options.items()}}}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def _host_doc(o: dict, encoding: str) -> dict:
    d = {k: v for k, v in o.items() if v not in (None, [], {})}
    if encoding != "ev":
        d.pop("entropy", None)
    return d
