"""One host's config (the host config format, docs: HOST_CONFIG /
mrc_ebpf/control/config/) from a fabric description: its attach section
(its plane NICs, its SID, the description's attach options) and every
other host as a peer with all its paths from the address plan.

`host_config` builds the dict (the one place that does); `dump` writes it.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from mrc_ebpf.errors import MrcError

from .description import Description
from .plan import parse_rate, Fabric

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


FORMS = ("auto", "peers", "blocks")
TEMPLATE = "spines"
# rows of paths one attachment holds (bpf: MRC_MAX_PEERS); an own-path
# peer takes one, so beyond this many peers only the blocks form applies
OWN_ROWS = 256


def blocks_possible(desc: Description, host: str) -> str | None:
    """Why HOST's config cannot be in the blocks form, or None."""
    fab = desc.fabric
    opts = desc.options(fab.host(host_index(fab, host)))
    if fab.encoding != "srh":
        return f"encoding {fab.encoding}: a template's paths are SRH paths (--via)"
    if opts["ipv4"]:
        return "ipv4: an IPv4 peer would share its host's SID, and a template's peers each have their own"
    return None


def host_config(desc: Description, host: str, peers: list[int] | None = None, form: str = "auto",
                key_file: str | None = None) -> dict:
    """HOST's config: attach section, classes, and each peer (every other
    host, or those in `peers`) with its paths in the plan's order.
    KEY_FILE: the fabric's key, named in the attach section unless the
    description names one for HOST.

    FORM "peers" lists every peer with its paths; "blocks" gives path
    templates (a path per plane and spine, the peer's SID as the last hop:
    the spines route on it; one template per spine group where a peer
    cannot use every spine, Fabric.spine_groups) and the peers as blocks
    of the address plan (control/blocks.py); "auto" is blocks where there
    are more peers than an attachment has rows for peers with paths of
    their own."""
    fab = desc.fabric
    a = host_index(fab, host)
    opts = desc.options(fab.host(a))
    attach = {"devices": [f"eth{p}" for p in range(fab.planes)], "sid": fab.host_sid(a),
              **opts["attach"]}
    if fab.rate and "link_rate_mbps" not in attach and attach.get("granularity", "auto") == "auto":
        # the spines' links, slower than the hosts' own: bursts are sized for them
        attach["link_rate_mbps"] = -(-parse_rate(fab.rate) // 1_000_000)
    if key_file and "key_file" not in attach:
        attach["key_file"] = str(key_file)
    cfg: dict = {"version": CONFIG_VERSION, "attach": attach}
    if opts["classes"]:
        cfg["classes"] = [dict(c) for c in opts["classes"]]
    if form not in FORMS:
        raise MrcError(f"bad form {form!r}: {', '.join(FORMS)}")
    others = [b for b in (peers if peers is not None else fab.hosts()) if b != a]
    if form == "auto":
        form = "blocks" if len(others) >= OWN_ROWS and blocks_possible(desc, host) is None else "peers"
    if form == "blocks":
        why = blocks_possible(desc, host)
        if why:
            raise MrcError(f"{fab.host(a)}'s config cannot be in blocks: {why}")
        return {**cfg, **_blocks(fab, a, opts, others)}
    if len(others) >= OWN_ROWS:
        raise MrcError(f"{len(others)} peers with paths of their own: an attachment has {OWN_ROWS} rows "
                       f"(render the blocks form: --form blocks)")
    out = []
    for b in others:
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


def template_name(fab: Fabric, group: int) -> str:
    """The template of spine group GROUP (Fabric.spine_groups): "spines"
    while one group holds every spine."""
    return TEMPLATE if fab.spine_groups() == 1 else f"{TEMPLATE}{group}"


def _blocks(fab: Fabric, a: int, opts: dict, others: list[int]) -> dict:
    """The templates and the peer blocks of the blocks form, canonical (as
    show-config prints what they applied): a template per spine group (a
    path per plane and spine of the group), each peer on its group's
    (Fabric.spine_group)."""
    from mrc_ebpf.control import blocks, config
    k = fab.spine_groups()
    tpls = [{"name": template_name(fab, g), "policy": opts["policy"] or config.DEFAULT_POLICY,
             "paths": [{"via": [fab.spine_sid(p, s)]} for p in range(fab.planes) for s in fab.group_spines(g)]}
            for g in range(k)]
    step = fab.sid_step()
    inc = 1 << (128 - step)
    first_prefix = blocks.prefix_value(fab.prefix6(1))[1] - inc
    first_sid = blocks.sid_value(fab.host_sid(1)) - inc
    names = [t["name"] for t in tpls]
    peers = [(names[fab.spine_group(a, b)], 64, first_prefix + b * inc, first_sid + b * inc) for b in others]
    used = {p[0] for p in peers}
    return {"templates": [t for t in tpls if t["name"] in used],
            "peer_blocks": [b.dict() for b in blocks.compress(peers)]}


def key_beside(description_file: str) -> Path:
    """The fabric key `mrcctl render` gives every host of a description
    that names none: FILE's name with .key, beside it."""
    return Path(description_file).resolve().with_suffix(".key")


def counts(cfg: dict) -> tuple[int, int]:
    """(peers, paths to them) of a rendered config, in either form."""
    peers = cfg.get("peers", [])
    n_peers = len(peers) + sum(b.get("count", 1) for b in cfg.get("peer_blocks", []))
    n_paths = sum(len(p["paths"]) for p in peers)
    per = {t["name"]: len(t["paths"]) for t in cfg.get("templates", [])}
    n_paths += sum(b.get("count", 1) * per[b["template"]] for b in cfg.get("peer_blocks", []))
    return n_peers, n_paths


def dump(cfg: dict) -> str:
    """The config as YAML in the host config format's key order: the
    format's own dump (mrc_ebpf/control/config/) where it exists, else
    the same keys through libyaml's (or PyYAML's) safe dumper."""
    try:
        from mrc_ebpf.control import config
    except ImportError:
        config = None
    if config is not None and hasattr(config, "dump"):
        return config.dump(cfg)
    return yaml.dump(cfg, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                     default_flow_style=None, width=200)
