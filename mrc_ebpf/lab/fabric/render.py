"""One host's config (the host config format, docs: HOST_CONFIG /
mrc_ebpf/control/config.py) from a fabric description: its attach section
(its plane NICs, its SID, the description's attach options) and every
other host as a peer with all its paths from the address plan.

`host_config` builds the dict (the one place that does); `dump` writes it.
"""
from __future__ import annotations

import re

import yaml

from mrc_ebpf.errors import MrcError

from .description import Description
from .plan import Fabric

CONFIG_VERSION = 1


def host_index(fab: Fabric, name: str) -> int:
    m = re.fullmatch(r"h?(\d+)", name.strip())
    if not m or not 1 <= int(m.group(1)) <= fab.host_count:
        raise MrcError(f"no host {name!r} in fabric {fab.name} (h1..h{fab.host_count})")
    return int(m.group(1))


def _path_entry(path: dict) -> dict:
    if "via" in path:
        return {"via": path["via"].split(",")}
    if "usid" in path:
        return {"usid": path["usid"]}
    return {"entropy": path["entropy"], "sid": path["sid"]}


def host_config(desc: Description, host: str, peers: list[int] | None = None) -> dict:
    """HOST's config: attach section, classes, and each peer (every other
    host, or those in `peers`) with its paths in the plan's order."""
    fab = desc.fabric
    a = host_index(fab, host)
    opts = desc.options(fab.host(a))
    attach = {"devices": [f"eth{p}" for p in range(fab.planes)], "sid": fab.host_sid(a),
              **opts["attach"]}
    cfg: dict = {"version": CONFIG_VERSION, "attach": attach}
    if opts["classes"]:
        cfg["classes"] = [dict(c) for c in opts["classes"]]
    out = []
    for b in (peers if peers is not None else fab.hosts()):
        if b == a:
            continue
        paths = [_path_entry(p) for p in fab.paths(a, b, opts["entropy"])]
        prefixes = [fab.prefix6(b)] + ([fab.prefix4(b)] if opts["ipv4"] else [])
        for prefix in prefixes:
            peer = {"prefix": prefix}
            if opts["policy"]:
                peer["policy"] = opts["policy"]
            peer["paths"] = [dict(p) for p in paths]
            out.append(peer)
    cfg["peers"] = out
    return cfg


def dump(cfg: dict) -> str:
    """The config as YAML in the host config format's key order: the
    format's own dump (mrc_ebpf/control/config.py) where it exists, else
    the same keys through libyaml's (or PyYAML's) safe dumper."""
    try:
        from mrc_ebpf.control import config
    except ImportError:
        config = None
    if config is not None and hasattr(config, "dump"):
        return config.dump(cfg)
    return yaml.dump(cfg, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                     default_flow_style=None, width=200)
