"""Parsing and writing the config file: `load` parses and validates a
file (every error `FILE:LINE: reason`), giving the canonical form (every
attach option explicit, addresses and prefixes in their canonical text,
defaults of peers and paths left out, neighbouring entropy entries alike in
all but their count merged); `dump` writes that form with a stable key
order; `save_path` and `write_atomically` are where and how `mrcctl save`
writes it.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import yaml

from mrc_ebpf.control import blocks, classes, paths, templates
from mrc_ebpf.control.config.schema import (ATTACH_KEYS, DEFAULT_POLICY, GRANULARITIES, LINK_RATE_RANGE,
                                            MAX_CLASS_NAME, MIN_ACTIVE_RANGE, MODES, SETTING_RANGES,
                                            TIMER_RANGES, VERSION, Config, ConfigError, canonical_metrics,
                                            merge_entropy)
from mrc_ebpf.datapath import auth, layout, routes
from mrc_ebpf.datapath.loader import MAX_DEVICES, parse_sid
from mrc_ebpf.datapath.source import C
from mrc_ebpf.errors import MrcError

DEFAULT_DIR = "/etc/mrc-ebpf"


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
        m = r.mapping(item, "a path", optional=("via", "usid", "entropy", "sid", "spare", "weight", "class",
                                                "denied"))
        kinds = [k for k in ("via", "usid", "entropy") if k in m]
        if len(kinds) != 1:
            r.fail(item, "a path is one of via: [SEG, ...], usid: CONTAINER or entropy: N with sid: PEER_SID")
        kind = kinds[0]
        if "sid" in m and kind != "entropy":
            r.fail(m["sid"][0], "sid: is the peer SID of entropy paths (entropy: N)")
        if "spare" in m and kind != "entropy":
            r.fail(m["spare"][0], "spare: M is for entropy paths (entropy: N, spare: M, sid: PEER_SID)")
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
            # spares: M more EVs held back, each standing in for an EV of its plane while that one is out
            spare = r.integer(m["spare"][1], "spare", 0, paths.MAX_PATHS) if "spare" in m else 0
            if spare:
                entry["spare"] = spare
                count += spare
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


# ---- where `mrcctl save` writes ----------------------------------------------

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
