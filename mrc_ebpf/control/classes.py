"""Traffic classes: DSCP values map to a class; a path may be reserved
for a class, so critical traffic stays off the paths bulk traffic uses.

Class 0 is "default".  Names live in the class_names map, with the
rest of the attachment's state.
"""
from __future__ import annotations

from mrc_ebpf.datapath import layout
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import C

MAX_CLASSES = C["MRC_MAX_CLASSES"]
DEFAULT = "default"


def names(att) -> dict[int, str]:
    out = {0: DEFAULT}
    for i in range(1, MAX_CLASSES):
        name = att.maps["class_names"].lookup(layout.Index(i)).name.decode()
        if name:
            out[i] = name
    return out


def class_id(att, name: str) -> int:
    for i, n in names(att).items():
        if n == name:
            return i
    raise MrcError(f"no traffic class {name!r} (mrcctl class set {name} --dscp N,...)")


def parse_dscp(text: str) -> list[int]:
    try:
        values = [int(v, 0) for v in text.split(",") if v.strip()]
    except ValueError:
        raise MrcError(f"bad DSCP list {text!r}: numbers 0..63, comma-separated")
    if not values or any(not 0 <= v < 64 for v in values):
        raise MrcError(f"bad DSCP list {text!r}: numbers 0..63, comma-separated")
    return values


def set_class(att, name: str, dscp_text: str) -> dict:
    if not name or len(name.encode()) > 15 or name == DEFAULT:
        raise MrcError(f"bad class name {name!r}: 1..15 bytes, not {DEFAULT!r}")
    dscp = parse_dscp(dscp_text)
    existing = names(att)
    tclass = next((i for i, n in existing.items() if n == name), None)
    if tclass is None:
        tclass = next((i for i in range(1, MAX_CLASSES) if i not in existing), None)
        if tclass is None:
            raise MrcError(f"all {MAX_CLASSES - 1} traffic classes are in use")
    table = att.maps["dscp_class"]
    for d in range(64):   # the class's DSCPs are exactly these now
        if table.lookup(layout.Index(d)).value == tclass and d not in dscp:
            table.update(layout.Index(d), layout.u32(0))
    for d in dscp:
        table.update(layout.Index(d), layout.u32(tclass))
    att.maps["class_names"].update(layout.Index(tclass), layout.ClassName(name=name.encode()))
    return {"class": name, "id": tclass, "dscp": sorted(dscp)}


def list_classes(att) -> list[dict]:
    table = att.maps["dscp_class"]
    by_class: dict[int, list[int]] = {}
    for d in range(64):
        by_class.setdefault(table.lookup(layout.Index(d)).value, []).append(d)
    return [{"class": n, "id": i, "dscp": by_class.get(i, [])} for i, n in names(att).items()]
