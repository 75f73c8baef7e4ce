"""A host's whole mrc-ebpf config as one YAML document (docs/ops.md).

`load` parses and validates a file (every error `FILE:LINE: reason`),
giving the canonical form: every attach option explicit, addresses and
prefixes in their canonical text, defaults of peers and paths left out,
neighbouring entropy entries alike in all but their count merged.
`dump` writes that form with a stable key order.  `running` reads the
same form back from an attachment's maps, routes and pins, and `plan`
matches the two: paths by what they are (segments, uSID container, the
k-th entropy path to a SID), never by position, so an unchanged path
keeps its id, sequence numbers and counters.  `execute` carries a plan
out on an attachment opened for a change (the caller's transaction rolls
it back on failure).
"""
from __future__ import annotations

import ctypes
import dataclasses
import ipaddress
import json
import os
from pathlib import Path

import yaml

from mrc_ebpf.control import classes, paths
from mrc_ebpf.datapath import auth, bpfsys, layout, offload, routes
from mrc_ebpf.datapath.loader import CFG_XDP_SKB, MAX_DEVICES, Attachment, parse_sid
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

VERSION = 1
MODES = ("auto", "native", "skb")
GRANULARITIES = offload.GRANULARITIES
LINK_RATE_RANGE = (0, 10_000_000)       # Mbit/s; 0: the device's own speed
# the ranges of `mrcctl attach`'s options (tests/test_config.py checks they agree)
TIMER_RANGES = {"loss_hold_us": (0, 10_000_000), "ack_timeout_us": (50, 10_000_000),
                "probe_us": (10, 10_000_000), "fb_interval_us": (10, 10_000_000),
                "reorder_max_us": (0, 10_000_000), "probe_max_us": (0, 10_000_000)}
MIN_ACTIVE_RANGE = (0, 256)
# congestion skip and the probe budget (struct mrc_config; defaults layout.SETTING_DEFAULTS)
SETTING_RANGES = {"skip_rotations": (0, 1_000_000), "probe_budget": (0, 1_000_000)}
ATTACH_KEYS = ("devices", "sid", "mode", "granularity", "link_rate_mbps", *TIMER_RANGES, "retrans_steer",
               "shared_fate", "min_active", *SETTING_RANGES, "key_file")
DEFAULT_POLICY = "rr"           # what `path add` gives a new peer
MAX_CLASS_NAME = 15
# What the maps cannot tell (the mode asked for, the key file's name):
# kept in a small array map pinned beside the datapath's, so it lives and
# dies with the attachment.  The programs never read it.
APPLIED_PIN = "mrc_applied"
APPLIED_BYTES = 1024
DEFAULT_DIR = "/etc/mrc-ebpf"


class ConfigError(MrcError):
    pass


@dataclasses.dataclass
class Config:
    data: dict                      # the canonical form
    source: str                     # the file's name, for messages
    lines: dict                     # (prefix,) and (prefix, entry index) -> line


# ---- parsing ---------------------------------------------------------------

class _Reader:
    def __init__(self, source: str, base: Path):
        self.source, self.base = source, base
        self.construct = yaml.constructor.SafeConstructor()

    def fail(self, node, reason: str):
        line = node.start_mark.line + 1 if node is not None else 1
        raise ConfigError(f"{self.source}:{line}: {reason}")

    def mapping(self, node, what: str, required: tuple = (), optional: tuple = ()) -> dict:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, f"{what} must be a mapping (key: value)")
        out = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node, str, f"a key of {what}")
            if key in out:
                self.fail(key_node, f"{key!r} given twice in {what}")
            if key not in required and key not in optional:
                known = ", ".join((*required, *optional))
                self.fail(key_node, f"unknown key {key!r} in {what} (known: {known})")
            out[key] = (key_node, value_node)
        for key in required:
            if key not in out:
                self.fail(node, f"{what} needs {key!r}")
        return out

    def sequence(self, node, what: str) -> list:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, f"{what} must be a list")
        return node.value

    def scalar(self, node, kind, what: str):
        if not isinstance(node, yaml.ScalarNode):
            self.fail(node, f"{what} must be a single value, not a {'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
        value = self.construct.construct_object(node)
        names = {str: "a string", int: "an integer", bool: "true or false"}
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)) or \
                kind is bool and not isinstance(value, bool) or \
                kind is str and not isinstance(value, str):
            self.fail(node, f"{what} must be {names[kind]}, not {value!r}")
        return value

    def integer(self, node, what: str, lo: int, hi: int) -> int:
        value = self.scalar(node, int, what)
        if not lo <= value <= hi:
            self.fail(node, f"{what} {value} is out of range {lo}..{hi}")
        return value

    def choice(self, node, what: str, choices) -> str:
        value = self.scalar(node, str, what)
        if value not in choices:
            self.fail(node, f"{what} {value!r} is not one of {', '.join(choices)}")
        return value

    def address(self, node, what: str) -> str:
        text = self.scalar(node, str, what)
        try:
            addr = ipaddress.IPv6Address(text.strip())
        except ValueError:
            self.fail(node, f"bad {what} {text!r}: expected an IPv6 address")
        if addr.is_multicast or addr.is_unspecified or addr.is_link_local or addr.is_loopback:
            self.fail(node, f"bad {what} {text!r}: must be a unicast address")
        return str(addr)

    def checked(self, node, fn, *args):
        """fn(*args), its MrcError turned into this node's line."""
        try:
            return fn(*args)
        except MrcError as e:
            self.fail(node, str(e))


def compose(text: str, source: str, error=None):
    """The YAML node tree of TEXT (marks give every node's line), or
    ERROR (ConfigError by default) naming the line YAML stopped at."""
    error = error or ConfigError
    try:
        return yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise error(f"{source}:{line}: not valid YAML: {e.problem or e.context}")
    except yaml.YAMLError as e:
        raise error(f"{source}:1: not valid YAML: {e}")


def load(text: str, source: str = "<stdin>", base: Path | None = None) -> Config:
    """Parse and validate a config; ConfigError names the line of the first problem."""
    r = _Reader(source, base or Path.cwd())
    root = compose(text, source)
    if root is None:
        raise ConfigError(f"{source}:1: empty: expected a mapping with version: {VERSION} and attach:")
    top = r.mapping(root, "the config", required=("version", "attach"),
                    optional=("classes", "peers", "templates", "peer_blocks"))
    version = r.scalar(top["version"][1], int, "version")
    if version != VERSION:
        r.fail(top["version"][1], f"unsupported version {version}: this mrcctl reads version {VERSION}")
    data = {"version": VERSION, "attach": _attach(r, top["attach"][1])}
    lines: dict = {}
    names = {classes.DEFAULT}
    if "classes" in top:
        data["classes"] = _classes(r, top["classes"][1])
        names |= {c["name"] for c in data["classes"]}
    if "peers" in top:
        data["peers"] = _peers(r, top["peers"][1], names, lines)
    if "templates" in top:
        data["templates"] = _templates(r, top["templates"][1], names)
    if "peer_blocks" in top:
        own = {p["prefix"] for p in data.get("peers", [])}
        data["peer_blocks"] = _peer_blocks(r, top["peer_blocks"][1],
                                           {t["name"] for t in data.get("templates", [])}, own, lines)
    for key in ("classes", "peers", "templates", "peer_blocks"):
        if not data.get(key):
            data.pop(key, None)
    return Config(data, source, lines)


def load_file(path: str) -> Config:
    """PATH, or "-" for standard input."""
    if path == "-":
        import sys
        return load(sys.stdin.read(), "<stdin>")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {getattr(e, 'strerror', None) or e}")
    return load(text, path, Path(path).resolve().parent)


def _attach(r: _Reader, node) -> dict:
    m = r.mapping(node, "attach", required=("devices", "sid"),
                  optional=tuple(k for k in ATTACH_KEYS if k not in ("devices", "sid")))
    devices_node = m["devices"][1]
    devices = []
    for item in r.sequence(devices_node, "attach.devices"):
        name = r.scalar(item, str, "a device name")
        if not name or len(name) > 15 or "/" in name or name.strip() != name:
            r.fail(item, f"bad device name {name!r}")
        if name in devices:
            r.fail(item, f"device {name} is named twice")
        devices.append(name)
    if not devices:
        r.fail(devices_node, "attach.devices needs at least one device")
    if len(devices) > MAX_DEVICES:
        r.fail(devices_node, f"{len(devices)} devices: one attachment spans at most {MAX_DEVICES}")
    sid_node = m["sid"][1]
    out = {"devices": devices,
           "sid": str(r.checked(sid_node, parse_sid, r.scalar(sid_node, str, "sid"))),
           "mode": r.choice(m["mode"][1], "mode", MODES) if "mode" in m else "auto",
           "granularity": (r.choice(m["granularity"][1], "granularity", GRANULARITIES)
                           if "granularity" in m else "auto"),
           # auto sizes bursts for this rate (Mbit/s), 0: the device's own speed
           "link_rate_mbps": (r.integer(m["link_rate_mbps"][1], "link_rate_mbps", *LINK_RATE_RANGE)
                              if "link_rate_mbps" in m else 0)}
    for name, (lo, hi) in TIMER_RANGES.items():
        out[name] = r.integer(m[name][1], name, lo, hi) if name in m else layout.TIMER_DEFAULTS[name]
    out["retrans_steer"] = r.scalar(m["retrans_steer"][1], bool, "retrans_steer") \
        if "retrans_steer" in m else True
    out["shared_fate"] = r.scalar(m["shared_fate"][1], bool, "shared_fate") \
        if "shared_fate" in m else False
    out["min_active"] = r.integer(m["min_active"][1], "min_active", *MIN_ACTIVE_RANGE) \
        if "min_active" in m else 0
    for name, (lo, hi) in SETTING_RANGES.items():
        out[name] = r.integer(m[name][1], name, lo, hi) if name in m else layout.SETTING_DEFAULTS[name]
    if "key_file" in m:
        node = m["key_file"][1]
        path = r.base / r.scalar(node, str, "key_file")
        r.checked(node, auth.read_key, path)
        out["key_file"] = str(path.resolve())
    return out


def _classes(r: _Reader, node) -> list[dict]:
    out, owner = [], {}
    items = r.sequence(node, "classes")
    if len(items) > C["MRC_MAX_CLASSES"] - 1:
        r.fail(node, f"{len(items)} classes: at most {C['MRC_MAX_CLASSES'] - 1} besides default")
    for item in items:
        m = r.mapping(item, "a class", required=("name", "dscp"))
        name = r.scalar(m["name"][1], str, "class name")
        if not name or len(name.encode()) > MAX_CLASS_NAME or name == classes.DEFAULT:
            r.fail(m["name"][1], f"bad class name {name!r}: 1..{MAX_CLASS_NAME} bytes, not {classes.DEFAULT!r}")
        if any(c["name"] == name for c in out):
            r.fail(m["name"][1], f"class {name} is defined twice")
        dscp_node = m["dscp"][1]
        values = [r.integer(v, "a DSCP value", 0, 63) for v in r.sequence(dscp_node, "dscp")]
        if not values:
            r.fail(dscp_node, f"class {name} needs at least one DSCP value")
        for v, v_node in zip(values, dscp_node.value):
            if owner.get(v, name) != name:
                r.fail(v_node, f"DSCP {v} is in class {owner[v]} already")
            owner[v] = name
        out.append({"name": name, "dscp": sorted(set(values))})
    return out


def canonical_metrics(effective: dict[str, str]) -> dict[str, str]:
    """What differs from mrcctl's default TCP metrics: the values that
    differ, and "none" for a default the route does not have."""
    out = {}
    for key in routes.RTAX:
        want = effective.get(key)
        if want != routes.DEFAULT_TCP_METRICS.get(key):
            out[key] = "none" if want is None else want
    return out


def effective_metrics(canonical: dict[str, str]) -> dict[str, str]:
    out = dict(routes.DEFAULT_TCP_METRICS)
    for key, value in canonical.items():
        if value == "none":
            out.pop(key, None)
        else:
            out[key] = value
    return out


def _route_metrics(r: _Reader, node) -> dict:
    m = r.mapping(node, "route_metrics", optional=tuple(routes.RTAX))
    given = {}
    for key, (_, value_node) in m.items():
        raw = r.construct.construct_object(value_node) if isinstance(value_node, yaml.ScalarNode) else None
        if raw is None or isinstance(raw, (bool, float)):
            r.fail(value_node, f"route_metrics.{key} must be a value such as 5ms, 127 or none")
        try:
            k, v = routes.parse_metric(f"{key}={raw}")
        except MrcError as e:
            r.fail(value_node, str(e).replace("bad --route-metric", "bad route metric"))
        given[k] = v
    effective = dict(routes.DEFAULT_TCP_METRICS)
    for k, v in given.items():
        if v is None:
            effective.pop(k, None)
        else:
            effective[k] = v
    return canonical_metrics(effective)


def _peers(r: _Reader, node, class_names: set, lines: dict) -> list[dict]:
    out, seen = [], {}
    items = r.sequence(node, "peers")
    if len(items) > paths.MAX_PEERS:
        r.fail(node, f"{len(items)} peers: at most {paths.MAX_PEERS}")
    for item in items:
        m = r.mapping(item, "a peer", required=("prefix", "paths"), optional=("policy", "route_metrics"))
        prefix_node = m["prefix"][1]
        prefix = str(r.checked(prefix_node, paths.parse_prefix, r.scalar(prefix_node, str, "prefix")))
        if prefix in seen:
            r.fail(prefix_node, f"peer {prefix} is given twice (first at line {seen[prefix]})")
        seen[prefix] = prefix_node.start_mark.line + 1
        lines[(prefix,)] = seen[prefix]
        peer = {"prefix": prefix,
                "policy": r.choice(m["policy"][1], "policy", tuple(paths.POLICIES))
                if "policy" in m else DEFAULT_POLICY}
        metrics = _route_metrics(r, m["route_metrics"][1]) if "route_metrics" in m else {}
        if metrics:
            peer["route_metrics"] = metrics
        peer["paths"] = _paths(r, m["paths"][1], prefix, class_names, lines)
        out.append(peer)
    return out


def _paths(r: _Reader, node, prefix: str, class_names: set, lines: dict) -> list[dict]:
    entries, seen, total = [], {}, 0
    items = r.sequence(node, f"paths of {prefix}")
    if not items:
        r.fail(node, f"peer {prefix} needs at least one path")
    for item in items:
        m = r.mapping(item, "a path", optional=("via", "usid", "entropy", "sid", "weight", "class", "denied"))
        kinds = [k for k in ("via", "usid", "entropy") if k in m]
        if len(kinds) != 1:
            r.fail(item, "a path is one of via: [SEG, ...], usid: CONTAINER or entropy: N with sid: PEER_SID")
        kind = kinds[0]
        if "sid" in m and kind != "entropy":
            r.fail(m["sid"][0], "sid: is the peer SID of entropy paths (entropy: N)")
        value_node = m[kind][1]
        if kind == "via":
            segs = [r.address(s, "segment") for s in r.sequence(value_node, "via")]
            if not segs:
                r.fail(value_node, "via needs at least one segment")
            if len(segs) > paths.MAX_SEGMENTS:
                r.fail(value_node, f"via has {len(segs)} segments; at most {paths.MAX_SEGMENTS}")
            entry, ident, count = {"via": segs}, ("via", tuple(segs)), 1
        elif kind == "usid":
            text = r.scalar(value_node, str, "usid")
            container, _ = r.checked(value_node, paths.parse_usid, text)
            entry, ident, count = {"usid": str(container)}, ("usid", str(container)), 1
        else:
            count = r.integer(value_node, "entropy", 1, paths.MAX_PATHS)
            if "sid" not in m:
                r.fail(item, "entropy: N needs sid: PEER_SID (where the entropy paths end)")
            entry, ident = {"entropy": count, "sid": r.address(m["sid"][1], "sid")}, None
        if ident is not None:
            line = value_node.start_mark.line + 1
            if ident in seen:
                shown = " > ".join(ident[1]) if kind == "via" else ident[1]
                r.fail(value_node, f"duplicate path {kind} {shown} to {prefix} (first at line {seen[ident]})")
            seen[ident] = line
        _weight_and_class(r, m, entry, class_names)
        if "denied" in m and r.scalar(m["denied"][1], bool, "denied"):
            entry["denied"] = True
        total += count
        if total > paths.MAX_PATHS:
            r.fail(item, f"peer {prefix} has more than {paths.MAX_PATHS} paths")
        lines[(prefix, len(entries))] = item.start_mark.line + 1
        entries.append(entry)
    return merge_entropy(entries)


def _weight_and_class(r: _Reader, m: dict, entry: dict, class_names: set) -> None:
    """A path's optional weight and class, written into entry only where
    they differ from the defaults (so show-config prints them back alike)."""
    if "weight" in m:
        weight = r.integer(m["weight"][1], "weight", 1, paths.MAX_WEIGHT)
        if weight != 1:
            entry["weight"] = weight
    if "class" in m:
        name = r.scalar(m["class"][1], str, "class")
        if name not in class_names:
            r.fail(m["class"][1], f"no class {name!r} in classes:")
        if name != classes.DEFAULT:
            entry["class"] = name


def _templates(r: _Reader, node, class_names: set) -> list[dict]:
    """Path templates: the hops before each peer's own SID (its last hop),
    shared by every peer of the template (control/templates.py)."""
    from mrc_ebpf.control import templates
    out = {}
    for item in r.sequence(node, "templates"):
        m = r.mapping(item, "a template", required=("name", "paths"), optional=("policy",))
        name_node = m["name"][1]
        name = r.scalar(name_node, str, "template name")
        r.checked(name_node, templates.name_key, name)
        if name in out:
            r.fail(name_node, f"template {name} is defined twice")
        paths_node = m["paths"][1]
        entries, seen = [], {}
        for p in r.sequence(paths_node, f"paths of template {name}"):
            pm = r.mapping(p, "a template path", required=("via",), optional=("weight", "class"))
            segs = [r.address(x, "segment") for x in r.sequence(pm["via"][1], "via")]
            if not segs:
                r.fail(pm["via"][1], "via needs at least one segment (the hops before the peer's SID)")
            if len(segs) >= paths.MAX_SEGMENTS:
                r.fail(pm["via"][1], f"via has {len(segs)} segments; a template's path has at most "
                                     f"{paths.MAX_SEGMENTS - 1} before the peer's own SID")
            ident = tuple(segs)
            line = pm["via"][1].start_mark.line + 1
            if ident in seen:
                r.fail(pm["via"][1], f"duplicate path via {' > '.join(segs)} in template {name} "
                                     f"(first at line {seen[ident]})")
            seen[ident] = line
            entry = {"via": segs}
            _weight_and_class(r, pm, entry, class_names)
            entries.append(entry)
        if not entries:
            r.fail(paths_node, f"template {name} needs at least one path")
        if len(entries) > paths.MAX_PATHS:
            r.fail(paths_node, f"template {name} has {len(entries)} paths; at most {paths.MAX_PATHS}")
        policy = r.choice(m["policy"][1], "policy", tuple(paths.POLICIES)) if "policy" in m else DEFAULT_POLICY
        out[name] = {"name": name, "policy": policy, "paths": entries}
    return [out[k] for k in sorted(out)]


def _peer_blocks(r: _Reader, node, template_names: set, own: set, lines: dict) -> list[dict]:
    """Runs of template peers generated from the address plan: COUNT
    peers, the first with PREFIX and SID, each next one's prefix and SID
    one /STEP further.  Checked as a whole (no prefix or SID twice, none
    an own-path peer's), then put in the canonical form (blocks.compress)."""
    from mrc_ebpf.control import blocks
    items = []
    for item in r.sequence(node, "peer_blocks"):
        m = r.mapping(item, "a peer block", required=("template", "prefix", "sid"),
                      optional=("count", "step"))
        tname = r.scalar(m["template"][1], str, "template")
        if tname not in template_names:
            r.fail(m["template"][1], f"no template {tname!r} in templates:")
        prefix_node = m["prefix"][1]
        length, value = r.checked(prefix_node, blocks.prefix_value, r.scalar(prefix_node, str, "prefix"))
        count = r.integer(m["count"][1], "count", 1, blocks.MAX_PEERS) if "count" in m else 1
        step = r.integer(m["step"][1], "step", 1, length) if "step" in m else 0
        sid_node = m["sid"][1]
        sid = r.checked(sid_node, blocks.sid_value, r.scalar(sid_node, str, "sid"))
        try:
            items.append(blocks.Block(tname, length, value, sid, count, step,
                                      item.start_mark.line + 1))
        except MrcError as e:
            r.fail(item, str(e))
    try:
        return blocks.canonical(items, own, lines)
    except blocks.BlockError as e:
        raise ConfigError(f"{r.source}:{e.line}: {e}")


def merge_entropy(entries: list[dict]) -> list[dict]:
    """Neighbouring entropy entries alike in all but their count are one."""
    out = []
    for e in entries:
        prev = out[-1] if out else None
        if prev is not None and "entropy" in e and "entropy" in prev and \
                {k: v for k, v in e.items() if k != "entropy"} == \
                {k: v for k, v in prev.items() if k != "entropy"}:
            prev["entropy"] += e["entropy"]
        else:
            out.append(dict(e))
    return out


# ---- dumping ---------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper, data):
    flow = all(not isinstance(x, (list, dict)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump(data: dict) -> str:
    """The canonical text: keys in the order of the format, lists of values inline."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


# ---- the running state -----------------------------------------------------

def read_applied(att: Attachment) -> dict:
    try:
        fd = bpfsys.obj_get(str(att.dir / APPLIED_PIN))
    except bpfsys.BpfError:
        return {}
    m = bpfsys.PinnedMap.from_fd(fd, layout.Index, ctypes.c_char * APPLIED_BYTES, name=APPLIED_PIN)
    os.close(fd)
    try:
        raw = m.lookup(layout.Index(0))
        return json.loads(bytes(raw).rstrip(b"\0") or b"{}") if raw is not None else {}
    except (ValueError, bpfsys.BpfError):
        return {}
    finally:
        m.close()


def write_applied(att: Attachment, applied: dict) -> None:
    """Record what the maps cannot tell; a change journal, if open, can put it back."""
    raw = json.dumps(applied, sort_keys=True).encode()
    if len(raw) >= APPLIED_BYTES:
        raise MrcError(f"key_file path too long to record ({len(raw)} bytes)")
    path = str(att.dir / APPLIED_PIN)
    try:
        fd = bpfsys.obj_get(path)
    except bpfsys.BpfError:
        fd = bpfsys.map_create(bpfsys.BPF_MAP_TYPE_ARRAY, 4, APPLIED_BYTES, 1, APPLIED_PIN)
        bpfsys.obj_pin(fd, path)
    m = bpfsys.PinnedMap.from_fd(fd, layout.Index, ctypes.c_char * APPLIED_BYTES, name=APPLIED_PIN)
    os.close(fd)
    try:
        old = m.lookup(layout.Index(0))
        value = (ctypes.c_char * APPLIED_BYTES)()
        ctypes.memmove(value, raw, len(raw))
        if att.journal is not None:
            att.journal.before_write(APPLIED_PIN)
            att.journal.record_map(path, keys=bytes(layout.Index(0)), values=bytes(old))
        m.update(layout.Index(0), value)
    finally:
        m.close()


def used_mode(att: Attachment) -> str:
    return "skb" if att.config.devices[0].flags & CFG_XDP_SKB else "native"


def granularity(att: Attachment) -> str:
    """What attach (or apply) was asked for: the device record keeps it."""
    recorded = att.config.devices[0].granularity
    return GRANULARITIES[recorded] if recorded < len(GRANULARITIES) else "auto"


def signing_key(att: Attachment) -> layout.AuthKey | None:
    value = auth.read(att)
    if value.tx_slot:
        return value.keys[value.tx_slot - 1]
    return None


UNRECORDED_KEY = "(a key whose file was not recorded)"


def running(att: Attachment, key_file: str | None = None, key_hint: bool = False) -> dict:
    """The attachment's config in the canonical form (what show-config
    prints).  KEY_FILE names the key file where none was recorded (an
    attachment made by `mrcctl attach`); with KEY_HINT an unrecorded one
    shows as UNRECORDED_KEY instead of failing (apply then records it)."""
    return running_with_ids(att, key_file, key_hint)[0]


def running_with_ids(att: Attachment, key_file: str | None = None,
                     key_hint: bool = False) -> tuple[dict, dict[str, list[int]]]:
    """running(), and each peer's path ids in path order (for `plan`)."""
    cfg = att.config
    applied = read_applied(att)
    devices = att.device_names()
    attach = {"devices": devices, "sid": str(ipaddress.IPv6Address(bytes(cfg.sid))),
              "mode": applied.get("mode") or used_mode(att), "granularity": granularity(att),
              "link_rate_mbps": cfg.devices[0].link_mbps}
    for name in TIMER_RANGES:
        attach[name] = getattr(cfg, name)
    attach["retrans_steer"] = bool(cfg.retrans_steer)
    attach["shared_fate"] = bool(cfg.shared_fate)
    attach["min_active"] = cfg.min_active
    for name in SETTING_RANGES:
        attach[name] = getattr(cfg, name)
    key = signing_key(att)
    if key is not None:
        path = key_file or applied.get("key_file")
        if not path and key_hint:
            attach["key_file"] = UNRECORDED_KEY
        elif not path:
            raise MrcError(f"{att.device} signs with a key whose file is not known (attached by "
                           f"`mrcctl attach`, not `apply`): name it with --key-file FILE")
        else:
            attach["key_file"] = str(Path(path).resolve())
    data = {"version": VERSION, "attach": attach}
    listed = [c for c in classes.list_classes(att) if c["id"] != 0]
    if listed:
        data["classes"] = [{"name": c["class"], "dscp": sorted(c["dscp"])} for c in listed]
    peers, ids = [], {}
    for p in paths.configured(att):
        peer = {"prefix": p["prefix"], "policy": p["policy"]}
        metrics = canonical_metrics(p["route_metrics"])
        if metrics:
            peer["route_metrics"] = metrics
        peer["paths"] = merge_entropy([_entry(row) for row in p["paths"]])
        peers.append(peer)
        ids[p["prefix"]] = [row["path_id"] for row in p["paths"]]
    if peers:
        data["peers"] = peers
    tpls = running_templates(att)
    if tpls:
        data["templates"] = tpls
    from mrc_ebpf.control import blocks, templates
    peer_blocks = blocks.running(att, templates.names(att))
    if peer_blocks:
        data["peer_blocks"] = peer_blocks
    return data, ids


def running_templates(att: Attachment) -> list[dict]:
    """The templates in the canonical form: by name, paths by path id."""
    from mrc_ebpf.control import templates
    names = classes.names(att)
    out = []
    for row, name in sorted(templates.names(att).items(), key=lambda kv: kv[1]):
        tpl = templates.get(att, name)
        entries = []
        for _, p in paths.used_paths(att, tpl):
            entry = {"via": paths.segments_of(p)[:-1]}
            if p.weight != 1:
                entry["weight"] = p.weight
            cname = names.get(p.tclass, str(p.tclass))
            if cname != classes.DEFAULT:
                entry["class"] = cname
            entries.append(entry)
        out.append({"name": name, "policy": paths.POLICY_NAMES.get(tpl.policy, str(tpl.policy)),
                    "paths": entries})
    return out


def _entry(row: dict) -> dict:
    if row["encoding"] == "entropy":
        entry = {"entropy": 1, "sid": row["peer_sid"]}
    elif row["encoding"] == "usid":
        entry = {"usid": row["segments"][0]}
    else:
        entry = {"via": list(row["segments"])}
    if row["weight"] != 1:
        entry["weight"] = row["weight"]
    if row["class"] != classes.DEFAULT:
        entry["class"] = row["class"]
    if row["denied"]:
        entry["denied"] = True
    return entry


# ---- the plan: what differs -------------------------------------------------

# what a running attachment cannot change in place
REATTACH_KEYS = ("devices", "sid", "mode")


def _ident(entry: dict):
    if "via" in entry:
        return ("via", tuple(entry["via"]))
    if "usid" in entry:
        return ("usid", entry["usid"])
    return ("entropy", entry["sid"])


def _attrs(entry: dict) -> tuple:
    return entry.get("weight", 1), entry.get("class", classes.DEFAULT), bool(entry.get("denied"))


def _expand(entries: list[dict]) -> list[dict]:
    """One item per path (an entropy entry of N is N paths), with the
    index of the entry it came from."""
    out = []
    for index, e in enumerate(entries):
        for _ in range(e.get("entropy", 1)):
            one = dict(e)
            if "entropy" in one:
                one["entropy"] = 1
            out.append({"entry": one, "index": index})
    return out


def reattach_reasons(desired: dict, current: dict, mode_used: str) -> list[str]:
    want, have = desired["attach"], current["attach"]
    reasons = []
    if want["devices"] != have["devices"]:
        reasons.append(f"devices {' '.join(have['devices'])} -> {' '.join(want['devices'])}")
    if want["sid"] != have["sid"]:
        reasons.append(f"sid {have['sid']} -> {want['sid']}")
    if want["mode"] != "auto" and want["mode"] != mode_used:
        reasons.append(f"XDP mode {mode_used} -> {want['mode']}")
    return reasons


def plan(desired: dict, current: dict, att: Attachment | None,
         ids: dict[str, list[int]] | None = None) -> list[dict]:
    """The changes, in the order they are to be made, that turn CURRENT
    (running) into DESIRED; [] when they are the same.  ATT None: nothing
    is attached yet (CURRENT is DESIRED's attach section alone)."""
    changes: list[dict] = []
    want, have = desired["attach"], current["attach"]
    for key in (*TIMER_RANGES, "retrans_steer", "shared_fate", "min_active", *SETTING_RANGES, "granularity",
                "link_rate_mbps"):
        if want.get(key, 0) != have.get(key, 0):
            changes.append({"what": "attach", "key": key, "from": have.get(key, 0),
                            "to": want.get(key, 0)})
    if want.get("key_file") != have.get("key_file") or \
            (att is not None and _key_differs(att, want.get("key_file"))):
        changes.append({"what": "attach", "key": "key_file", "from": have.get("key_file"),
                        "to": want.get("key_file")})
    if want["mode"] != have["mode"]:    # the same XDP mode in effect: only what is recorded
        changes.append({"what": "attach", "key": "mode", "from": have["mode"], "to": want["mode"]})

    have_classes = {c["name"]: c["dscp"] for c in current.get("classes", [])}
    want_classes = {c["name"]: c["dscp"] for c in desired.get("classes", [])}
    for name, dscp in want_classes.items():
        if have_classes.get(name) != dscp:
            changes.append({"what": "class", "action": "set", "name": name, "dscp": dscp,
                            "from": have_classes.get(name)})

    have_peers = {p["prefix"]: p for p in current.get("peers", [])}
    want_peers = {p["prefix"]: p for p in desired.get("peers", [])}
    for prefix in have_peers:
        if prefix not in want_peers:
            changes.append({"what": "peer", "action": "delete", "prefix": prefix})
    if ids is None and att is not None:
        ids = {p["prefix"]: [r["path_id"] for r in p["paths"]] for p in paths.configured(att)}
    have_tpls = {t["name"]: t for t in current.get("templates", [])}
    want_tpls = {t["name"]: t for t in desired.get("templates", [])}
    for name, tpl in want_tpls.items():
        changes += _plan_template(tpl, have_tpls.get(name))
    # template peers after their templates, before own-path peers are
    # added (a prefix moving from a block to peers: leaves the block first)
    blocks_change = _plan_blocks(desired.get("peer_blocks", []), current.get("peer_blocks", []), att)
    if blocks_change:
        changes.append(blocks_change)
    for prefix, peer in want_peers.items():
        if prefix not in have_peers:
            changes.append({"what": "peer", "action": "add", "prefix": prefix, "peer": peer})
            continue
        changes += _plan_peer(peer, have_peers[prefix], ids[prefix])
    for name in have_tpls:
        if name not in want_tpls:
            changes.append({"what": "template", "action": "delete", "name": name})

    for name in have_classes:
        if name not in want_classes:
            changes.append({"what": "class", "action": "delete", "name": name})
    return changes


def _plan_template(want: dict, have: dict | None) -> list[dict]:
    """A template's changes: made, paths added, changed, deleted (by what
    they are, so a kept path keeps its id), its policy."""
    name = want["name"]
    if have is None:
        return [{"what": "template", "action": "add", "name": name, "template": want}]
    changes = []
    have_ids = {tuple(e["via"]): i for i, e in enumerate(have["paths"])}
    # a template's path ids are its running paths' positions only while
    # none was removed: plan by identity, and let execute resolve ids
    adds = [e for e in want["paths"] if tuple(e["via"]) not in have_ids]
    keep = {tuple(e["via"]) for e in want["paths"]}
    deletes = [e for e in have["paths"] if tuple(e["via"]) not in keep]
    for e in want["paths"]:
        i = have_ids.get(tuple(e["via"]))
        if i is not None and _attrs(e)[:2] != _attrs(have["paths"][i])[:2]:
            changes.append({"what": "template_path", "action": "change", "name": name, "entry": e,
                            "from": have["paths"][i]})
    if adds:
        changes.insert(0, {"what": "template_path", "action": "add", "name": name, "entries": adds})
    if deletes:
        changes.append({"what": "template_path", "action": "delete", "name": name, "entries": deletes})
    if want["policy"] != have["policy"]:
        changes.append({"what": "template_policy", "name": name, "from": have["policy"], "to": want["policy"]})
    return changes


def _plan_blocks(want: list[dict], have: list[dict], att: Attachment | None) -> dict | None:
    """One change for all template peers: how many are added, changed
    (template or SID) and removed."""
    from mrc_ebpf.control import blocks
    if want == have:
        return None
    if not have:
        return {"what": "peer_blocks", "added": sum(b.get("count", 1) for b in want), "updated": 0,
                "removed": 0, "blocks": len(want)}
    wanted = blocks.wanted(want)
    have_peers = {}
    for key, sid, tname in blocks.wanted(have):
        have_peers[key] = (sid, tname)
    added = updated = 0
    for key, sid, tname in wanted:
        old = have_peers.pop(key, None)
        if old is None:
            added += 1
        elif old != (sid, tname):
            updated += 1
    change = {"what": "peer_blocks", "added": added, "updated": updated, "removed": len(have_peers),
              "blocks": len(want)}
    return change


def _key_differs(att: Attachment, key_file: str | None) -> bool:
    have = signing_key(att)
    if key_file is None:
        return have is not None
    want = auth.auth_key(auth.read_key(key_file))
    return have is None or (have.k0, have.k1) != (want.k0, want.k1)


def _plan_peer(want: dict, have: dict, ids: list[int]) -> list[dict]:
    prefix = want["prefix"]
    running_items = _expand(have["paths"])
    assert len(running_items) == len(ids)
    for item, path_id in zip(running_items, ids):
        item["id"] = path_id
    by_ident: dict = {}
    for item in running_items:
        by_ident.setdefault(_ident(item["entry"]), []).append(item)
    adds, modifies, matched = [], [], set()
    for item in _expand(want["paths"]):
        candidates = by_ident.get(_ident(item["entry"]))
        if candidates:
            old = candidates.pop(0)     # entropy: the k-th to a SID is the k-th running one
            matched.add(old["id"])
            if _attrs(old["entry"]) != _attrs(item["entry"]):
                modifies.append({"what": "path", "action": "change", "prefix": prefix,
                                 "path_id": old["id"], "entry": item["entry"],
                                 "from": old["entry"], "index": item["index"]})
        else:
            adds.append(item)
    deletes = [{"what": "path", "action": "delete", "prefix": prefix, "path_id": item["id"],
                "entry": item["entry"]} for item in running_items if item["id"] not in matched]
    add = [{"what": "path", "action": "add", "prefix": prefix, "entries": [a["entry"] for a in adds],
            "indexes": [a["index"] for a in adds]}] if adds else []
    # Deleting first lets the new paths take the freed ids (the file's
    # order stays the ids' order); while the peer keeps a path, its
    # packets go on the others meanwhile.  A peer that keeps none gets its
    # new paths first, so it is never without one (nor its route removed).
    changes = deletes + add if matched else add + deletes
    changes += modifies
    if want["policy"] != have["policy"]:
        changes.append({"what": "policy", "prefix": prefix, "from": have["policy"], "to": want["policy"]})
    if want.get("route_metrics", {}) != have.get("route_metrics", {}):
        changes.append({"what": "route_metrics", "prefix": prefix,
                        "from": have.get("route_metrics", {}), "to": want.get("route_metrics", {})})
    return changes


# ---- carrying a plan out -----------------------------------------------------

def execute(att: Attachment, config: Config, changes: list[dict]) -> None:
    """Make CHANGES on ATT (opened for a change: its transaction undoes
    them all if one fails).  Paths are added before any is deleted, so a
    peer is never without the paths it keeps."""
    want = config.data["attach"]
    for c in changes:
        try:
            _execute_one(att, config, want, c)
        except ConfigError:
            raise
        except MrcError as e:
            line = _line_of(config, c)
            raise MrcError(f"{config.source}:{line}: {e}" if line else str(e)) from e


def _line_of(config: Config, change: dict) -> int | None:
    prefix = change.get("prefix")
    if prefix is None:
        return None
    index = change.get("index", (change.get("indexes") or [None])[0])
    return config.lines.get((prefix, index)) or config.lines.get((prefix,))


def _execute_one(att: Attachment, config: Config, want: dict, c: dict) -> None:
    what = c["what"]
    if what == "attach":
        _set_attach(att, want, c["key"])
    elif what == "class" and c["action"] == "set":
        classes.set_class(att, c["name"], ",".join(map(str, c["dscp"])))
    elif what == "class":
        delete_class(att, c["name"])
    elif what == "peer" and c["action"] == "delete":
        paths.delete(att, c["prefix"])
    elif what == "peer":
        peer = c["peer"]
        items = _expand(peer["paths"])
        _add_paths(att, peer["prefix"], [i["entry"] for i in items],
                   metrics=peer.get("route_metrics", {}))
        if peer["policy"] != DEFAULT_POLICY:
            paths.set_policy(att, peer["prefix"], peer["policy"])
    elif what == "path" and c["action"] == "add":
        _add_paths(att, c["prefix"], c["entries"])
    elif what == "path" and c["action"] == "change":
        weight, tclass, denied = _attrs(c["entry"])
        paths.set_attrs(att, c["prefix"], c["path_id"], weight, classes.class_id(att, tclass))
        if denied != bool(c["from"].get("denied")):
            paths.set_denied(att, c["prefix"], [c["path_id"]], denied)
    elif what == "path":
        paths.delete(att, c["prefix"], c["path_id"])
    elif what == "policy":
        paths.set_policy(att, c["prefix"], c["to"])
    elif what == "route_metrics":
        paths.set_route_metrics(att, c["prefix"], effective_metrics(c["to"]))
    elif what in ("template", "template_path", "template_policy", "peer_blocks"):
        _execute_template(att, config, c)


def _template_vias(att: Attachment, name: str, entries: list[dict]) -> None:
    """templates.add per run of one weight and class, in the order given."""
    from mrc_ebpf.control import templates
    start = 0
    while start < len(entries):
        attrs = _attrs(entries[start])[:2]
        end = start
        while end < len(entries) and _attrs(entries[end])[:2] == attrs:
            end += 1
        weight, tclass = attrs
        templates.add(att, name, [",".join(e["via"]) for e in entries[start:end]], weight,
                      None if tclass == classes.DEFAULT else tclass)
        start = end


def _execute_template(att: Attachment, config: Config, c: dict) -> None:
    from mrc_ebpf.control import blocks, bulk, templates
    what = c["what"]
    if what == "template" and c["action"] == "add":
        _template_vias(att, c["name"], c["template"]["paths"])
        if c["template"]["policy"] != DEFAULT_POLICY:
            templates.set_policy(att, c["name"], c["template"]["policy"])
    elif what == "template":
        templates.delete(att, c["name"])
    elif what == "template_path" and c["action"] == "add":
        _template_vias(att, c["name"], c["entries"])
    elif what == "template_path":
        by_via = {tuple(templates.path_vias(p)): i for i, p in templates.paths_of(att, c["name"])}
        if c["action"] == "delete":
            templates.remove_paths(att, c["name"], [by_via[tuple(e["via"])] for e in c["entries"]])
        else:
            weight, tclass, _ = _attrs(c["entry"])
            templates.set_path_attrs(att, c["name"], by_via[tuple(c["entry"]["via"])], weight,
                                     classes.class_id(att, tclass))
    elif what == "template_policy":
        templates.set_policy(att, c["name"], c["to"])
    elif what == "peer_blocks":
        tpls = {}
        wanted = []
        for key, sid, name in blocks.wanted(config.data.get("peer_blocks", [])):
            tpl = tpls.get(name)
            if tpl is None:
                tpl = tpls[name] = templates.get(att, name)
            wanted.append((key, sid, tpl))
        try:
            bulk.sync(att, wanted, remove_missing=True)
        except MrcError as e:
            line = config.lines.get(("peer_blocks",))
            raise ConfigError(f"{config.source}:{line}: {e}" if line else str(e)) from e


def _add_paths(att: Attachment, prefix: str, entries: list[dict], metrics: dict | None = None) -> None:
    """Add paths in the order given (a fresh peer's ids follow it); runs of
    one weight and class go in one `paths.add`."""
    start = 0
    first = True
    while start < len(entries):
        attrs = _attrs(entries[start])[:2]
        end = start
        while end < len(entries) and _attrs(entries[end])[:2] == attrs and \
                _ident(entries[end])[0] == _ident(entries[start])[0] and \
                entries[end].get("sid") == entries[start].get("sid"):
            end += 1
        run = entries[start:end]
        weight, tclass = attrs
        tclass_name = None if tclass == classes.DEFAULT else tclass
        extra = []
        if first and metrics is not None:
            extra = [f"{k}={v}" for k, v in metrics.items()]
        if "entropy" in run[0]:
            results = _add_entropy(att, prefix, run[0]["sid"], len(run), weight, tclass_name, extra)
        else:
            # one kind per run: paths.add numbers its vias before its usids
            results = paths.add(att, prefix, [",".join(e["via"]) for e in run if "via" in e],
                                weight, tclass_name, [e["usid"] for e in run if "usid" in e],
                                route_metrics_=extra)
        denied = [r["path_id"] for r, e in zip(results, run) if e.get("denied")]
        if denied:
            paths.set_denied(att, prefix, denied, True)
        first = False
        start = end


def _add_entropy(att, prefix, sid, count, weight, tclass_name, extra) -> list[dict]:
    """COUNT more entropy paths to SID: paths.add counts the EVs the peer
    has to it already, so ask for those plus COUNT, with their weight and
    class; the new ones then get theirs."""
    existing = [r for r in _rows(att, prefix) if r["encoding"] == "entropy" and r["peer_sid"] == sid]
    have = {(r["weight"], r["class"]) for r in existing}
    if len(have) > 1:
        raise MrcError(f"cannot add entropy paths to {sid} while its {len(existing)} running ones "
                       f"differ in weight or class: change those first")
    base_weight, base_class = have.pop() if have else (weight, tclass_name or classes.DEFAULT)
    results = paths.add(att, prefix, [], base_weight,
                        None if base_class == classes.DEFAULT else base_class, [],
                        len(existing) + count, sid, extra)
    new = [r for r in results if not r["existed"]]
    tclass = classes.class_id(att, tclass_name) if tclass_name else 0
    if (base_weight, base_class) != (weight, tclass_name or classes.DEFAULT):
        for r in new:
            paths.set_attrs(att, prefix, r["path_id"], weight, tclass)
    return new


def _rows(att: Attachment, prefix: str) -> list[dict]:
    return next((p["paths"] for p in paths.configured(att) if p["prefix"] == prefix), [])


def _set_attach(att: Attachment, want: dict, key: str) -> None:
    if key in TIMER_RANGES or key in SETTING_RANGES or key in ("retrans_steer", "shared_fate", "min_active"):
        cfg = att.config
        setattr(cfg, key, int(want[key]))
        att.maps["config"].update(layout.Index(0), cfg)
    elif key in ("granularity", "link_rate_mbps"):
        cfg = att.config
        name = want["granularity"]
        rate = want.get("link_rate_mbps", 0)
        for i, device in enumerate(att.device_names()):
            target = offload.choose(name, device, cfg.devices[i].mtu, rate)
            before = offload.gso_max_segs(device)
            if before == target:
                continue
            if att.journal is not None:
                att.journal.before_write(f"gso_max_segs {device}")
                att.journal.record_gso(device, before)
            offload.set_gso_max_segs(device, target)
        for i in range(cfg.n_devices):
            cfg.devices[i].granularity = GRANULARITIES.index(name)
            cfg.devices[i].link_mbps = rate
        att.maps["config"].update(layout.Index(0), cfg)
    elif key == "key_file":
        value = auth.read(att)
        new = layout.Auth(epoch=value.epoch)
        if want.get("key_file"):
            new = auth.initial(auth.read_key(want["key_file"]))
            new.epoch = value.epoch
        auth.write(att, new)
        write_applied(att, {**read_applied(att), "key_file": want.get("key_file")})
    elif key == "mode":
        write_applied(att, {**read_applied(att), "mode": want["mode"]})


def delete_class(att: Attachment, name: str) -> None:
    """Remove class NAME: its DSCP values go back to the default class;
    refused while a path is reserved for it."""
    tclass = classes.class_id(att, name)
    users = [(p["prefix"], r["path_id"]) for p in paths.configured(att) for r in p["paths"]
             if r["class"] == name]
    if users:
        raise MrcError(f"class {name} is used by {users[0][0]} path {users[0][1]}")
    table = att.maps["dscp_class"]
    for d in range(64):
        if table.lookup(layout.Index(d)).value == tclass:
            table.update(layout.Index(d), layout.u32(0))
    att.maps["class_names"].update(layout.Index(tclass), layout.ClassName())


def describe(change: dict) -> str:
    """One line per change, for people."""
    what = change["what"]
    if what == "hook":
        return f"{change['device']} {change['key']}: {change['done'] or 'would put ' + str(change['to']) + ' back'}"
    if what == "attach":
        return f"attach {change['key']}: {change['from']} -> {change['to']}"
    if what == "class":
        if change["action"] == "delete":
            return f"class {change['name']}: deleted"
        return f"class {change['name']}: DSCP {','.join(map(str, change['dscp']))}"
    if what == "peer":
        if change["action"] == "delete":
            return f"peer {change['prefix']}: deleted"
        n = sum(e.get("entropy", 1) for e in change["peer"]["paths"])
        return f"peer {change['prefix']}: added with {n} paths"
    if what == "path":
        if change["action"] == "add":
            return f"{change['prefix']}: {len(change['entries'])} paths added"
        if change["action"] == "change":
            w, c, d = _attrs(change["entry"])
            return (f"{change['prefix']} path {change['path_id']}: weight {w}, class {c}"
                    f"{', denied' if d else ''}")
        return f"{change['prefix']} path {change['path_id']}: deleted"
    if what == "policy":
        return f"{change['prefix']}: policy {change['from']} -> {change['to']}"
    if what == "template":
        if change["action"] == "delete":
            return f"template {change['name']}: deleted"
        return f"template {change['name']}: added with {len(change['template']['paths'])} paths"
    if what == "template_path":
        if change["action"] == "change":
            w, c, _ = _attrs(change["entry"])
            return f"template {change['name']} path via {','.join(change['entry']['via'])}: weight {w}, class {c}"
        return f"template {change['name']}: {len(change['entries'])} paths {change['action']}d"
    if what == "template_policy":
        return f"template {change['name']}: policy {change['from']} -> {change['to']}"
    if what == "peer_blocks":
        return (f"template peers: {change['added']} added, {change['updated']} changed, "
                f"{change['removed']} removed ({change['blocks']} blocks)")
    return f"{change['prefix']}: route metrics {change['from'] or 'defaults'} -> {change['to'] or 'defaults'}"


def public(change: dict) -> dict:
    """A change as JSON shows it (without the bookkeeping)."""
    return {k: v for k, v in change.items() if k not in ("index", "indexes")}


# ---- apply -------------------------------------------------------------------

def apply(cfg: Config, reattach: bool = False, dry_run: bool = False) -> dict:
    """Make the attachment CFG describes equal to it: attach it if it is
    not, change in place what differs, re-attach (with REATTACH) when the
    devices, SID or XDP mode differ.  All or nothing: a failure undoes
    every change (a fresh attach is detached again)."""
    from mrc_ebpf.datapath import loader, pins
    loader.require_root()
    pins.ensure_bpffs()
    want = cfg.data["attach"]
    first = want["devices"][0]
    result = {"device": first, "file": cfg.source, "attached": False, "reattached": False,
              "dry_run": dry_run}
    owner = loader.owner(first)
    if owner is None:
        changes = [{"what": "attach", "key": "attach", "from": None, "to": " ".join(want["devices"])}]
        changes += plan(cfg.data, {"version": VERSION, "attach": want}, None)
        if not dry_run:
            # one change under one lock: killed anywhere, the next command
            # detaches what it made (journal.py)
            from mrc_ebpf.datapath import journal, lock
            with lock.writer(), journal.logged() as log:
                log.append({"op": "detach", "device": first})
                _fresh(cfg)
        return {**result, "attached": True, "changed": True, "changes": [public(c) for c in changes]}
    with loader.changing(owner) as att:
        current, ids = running_with_ids(att, key_hint=True)
        reasons = reattach_reasons(cfg.data, current, used_mode(att))
        if not reasons:
            changes = plan(cfg.data, current, att, ids)
            if not dry_run:
                execute(att, cfg, changes)
            changes += _hooks_back(att, dry_run)
            return {**result, "device": owner, "changed": bool(changes),
                    "changes": [public(c) for c in changes]}
    if not reattach:
        raise MrcError(f"{owner}: {'; '.join(reasons)}: that needs a re-attach (the programs are "
                       f"reloaded, every path's sequence numbers and counters start over, and "
                       f"traffic stops while they compile): run apply with --reattach")
    changes = [{"what": "attach", "key": "reattach", "from": current["attach"]["devices"],
                "to": want["devices"], "reasons": reasons}]
    changes += plan(cfg.data, {"version": VERSION, "attach": want}, None)
    if dry_run:
        return {**result, "reattached": True, "changed": True, "changes": [public(c) for c in changes]}
    if current["attach"].get("key_file") == UNRECORDED_KEY:
        raise MrcError(f"{owner} signs with a key whose file was not recorded: cannot restore it "
                       f"if the re-attach fails; `mrcctl detach {owner}` first")
    loader.detach(owner)
    try:
        _fresh(cfg)
    except MrcError as e:
        try:
            _fresh(Config(current, "the previous config", {}))
        except MrcError as again:
            raise MrcError(f"{e}; restoring the previous config failed too: {again}")
        raise MrcError(f"{e}; the previous config was attached again")
    return {**result, "reattached": True, "changed": True, "changes": [public(c) for c in changes]}


def _hooks_back(att: Attachment, dry_run: bool) -> list[dict]:
    """The hooks another tool took the programs off (xdp-loader unload,
    tc filter del): put back (datapath/repair.py), as changes."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath import repair
    with IPRoute() as ipr:
        gone = repair.hook_changes(ipr, att.dir)
        for c in gone:
            c["done"] = None if dry_run else repair.restore(ipr, att.dir, c)
    return [{"what": "hook", "key": c["hook"], "device": c["device"], "from": c["found"],
             "to": c["expected"], "why": c["why"], "done": c["done"]} for c in gone]


def _fresh(cfg: Config) -> None:
    """Attach as CFG says and configure everything; detached again on failure."""
    from mrc_ebpf.datapath import loader
    want = cfg.data["attach"]
    loader.attach(want["devices"], want["sid"], want["mode"], want["granularity"],
                  link_rate_mbps=want.get("link_rate_mbps", 0), retrans_steer=want["retrans_steer"],
                  min_active=want["min_active"], shared_fate=want["shared_fate"],
                  key_file=want.get("key_file"), **{k: want[k] for k in (*TIMER_RANGES, *SETTING_RANGES)})
    first = want["devices"][0]
    try:
        with loader.changing(first) as att:
            write_applied(att, {"mode": want["mode"], "key_file": want.get("key_file")})
            current, ids = running_with_ids(att)
            execute(att, cfg, plan(cfg.data, current, att, ids))
    except BaseException:
        loader.detach(first)
        raise


def save_path(device: str) -> Path:
    """Where `mrcctl save` writes and the systemd unit reads DEVICE's config."""
    return Path(os.environ.get("MRC_CONFIG_DIR") or DEFAULT_DIR) / f"{device}.yaml"


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise MrcError(f"cannot write {path}: {e.strerror or e}")
