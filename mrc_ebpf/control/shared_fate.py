"""Shared fate's hops (bpf/lib/shared_fate.h): the loader gives each
path's first hop a small id, the same for every path of every peer
through it, so that the datapath can tell, in O(1), which paths share
the hop of a path it has just taken out."""
from __future__ import annotations

import ipaddress

from mrc_ebpf.control.path_spec import hops_of
from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C

MAX_HOPS = C["MRC_MAX_HOPS"]


def first_hop(path: layout.Path) -> ipaddress.IPv6Address | None:
    """SRH: the first segment; uSID: the block and its first ID as a SID;
    entropy paths: none (the fabric's hash picks their hops)."""
    crossed = hops_of(path)
    return crossed[0] if crossed else None


def assign(att, index: layout.Index, path: layout.Path) -> int:
    """Write the path's hop id (0: none, or all MAX_HOPS - 1 ids taken)."""
    hop = first_hop(path)
    ident = 0
    if hop is not None:
        table = att.maps["hops"]
        free = None
        for i in range(1, MAX_HOPS):
            sid = bytes(table.lookup(layout.Index(i)).sid.addr)
            if sid == hop.packed:
                ident = i
                break
            if free is None and not any(sid):
                free = i
        else:
            if free is not None:
                entry = layout.Hop()
                entry.sid.addr[:] = hop.packed
                table.update(layout.Index(free), entry)
                ident = free
    att.maps["path_fate"].update(index, layout.PathFate(hop=ident))
    return ident


def assign_many(att, items: list[tuple[layout.Index, layout.Path]]) -> None:
    """assign() of many paths, the hop table read once (a template of 256
    paths: 255 reads instead of up to 65,280)."""
    table = att.maps["hops"]
    sids = {i: bytes(table.lookup(layout.Index(i)).sid.addr) for i in range(1, MAX_HOPS)}
    hops, fates = [], []        # written in two batches, one undo step each
    for index, path in items:
        hop = first_hop(path)
        ident = 0
        if hop is not None:
            packed = hop.packed
            ident = next((i for i, sid in sids.items() if sid == packed), 0)
            free = None if ident else next((i for i, sid in sids.items() if not any(sid)), None)
            if free is not None:
                entry = layout.Hop()
                entry.sid.addr[:] = packed
                hops.append((layout.Index(free), entry))
                sids[free] = packed
                ident = free
        fates.append((index, layout.PathFate(hop=ident)))
    table.update_many(hops)
    att.maps["path_fate"].update_many(fates)


def hops(att) -> list[dict]:
    """The hops in use: SID, times suspect, paths taken out by their probe."""
    out = []
    for i in range(1, MAX_HOPS):
        h = att.maps["hops"].lookup(layout.Index(i))
        if any(bytes(h.sid.addr)):
            out.append({"hop": i, "sid": str(ipaddress.IPv6Address(bytes(h.sid.addr))),
                        "suspect_ns": h.suspect_ns, "until_ns": h.until_ns, "suspects": h.suspects,
                        "shared_downs": h.shared_downs, "watch_suspects": h.watch_suspects})
    return out
