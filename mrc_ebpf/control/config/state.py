"""The running state: an attachment's config read back, in the canonical
form, from its maps, routes and pins (what `show-config` prints and `plan`
compares with), and the record of what the maps cannot tell.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
from pathlib import Path

from mrc_ebpf.control import blocks, classes, paths, templates
from mrc_ebpf.control.config.schema import (GRANULARITIES, SETTING_RANGES, TIMER_RANGES, VERSION,
                                            canonical_metrics, merge_entropy)
from mrc_ebpf.datapath import auth, bpfsys, layout
from mrc_ebpf.datapath.loader import CFG_XDP_SKB, Attachment
from mrc_ebpf.errors import MrcError

# What the maps cannot tell (the mode asked for, the key file's name):
# kept in a small array map pinned beside the datapath's, so it lives and
# dies with the attachment.  The programs never read it.
APPLIED_PIN = "mrc_applied"
APPLIED_BYTES = 1024


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
    peer_blocks = blocks.running(att, templates.names(att))
    if peer_blocks:
        data["peer_blocks"] = peer_blocks
    return data, ids


def running_templates(att: Attachment) -> list[dict]:
    """The templates in the canonical form: by name, paths by path id."""
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
        # a spare: merged into its EVs' entry as spare: M (merge_entropy)
        entry = {"entropy": 0, "spare": 1, "sid": row["peer_sid"]} if row.get("spare") else \
            {"entropy": 1, "sid": row["peer_sid"]}
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
