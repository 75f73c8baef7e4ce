"""The datapath's log of path state changes (the `events` map)."""
from __future__ import annotations

import time

from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C

TYPES = {value: name[len("MRC_EV_"):].lower().replace("_", "-")
         for name, value in C.items() if name.startswith("MRC_EV_")}


# the state a path is in after each kind of event (MRC's names, control/paths.py)
STATE_AFTER = {"down": "assumed-bad", "up": "up", "late": "up", "kept": "up", "fail-open": "assumed-bad",
               "shared-down": "assumed-bad", "skip": "skip"}


def read(att, peer_prefixes: dict[int, str] | None = None) -> list[dict]:
    """Events in the order they happened, oldest first (at most MRC_EVENTS)."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    rows = []
    for _, ev in att.maps["events"].items():
        if not ev.seq:
            continue
        rows.append({"seq": ev.seq, "ns": ev.ns, "ago_ms": round((now - ev.ns) / 1e6, 3),
                     "type": TYPES.get(ev.type, str(ev.type)),
                     "state": STATE_AFTER.get(TYPES.get(ev.type)), "peer_id": ev.peer_id,
                     "prefix": (peer_prefixes or {}).get(ev.peer_id), "path_id": ev.path_id,
                     "since_ns": ev.since_ns,
                     "after_us": round((ev.ns - ev.since_ns) / 1e3, 1) if ev.since_ns else None})
    rows.sort(key=lambda r: r["seq"])
    return rows
