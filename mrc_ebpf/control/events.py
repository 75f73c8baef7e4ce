"""The datapath's log of path state changes (the `events` map)."""
from __future__ import annotations

import time

from mrc_ebpf.datapath import layout
from mrc_ebpf.datapath.source import C

TYPES = {value: name[len("MRC_EV_"):].lower().replace("_", "-")
         for name, value in C.items() if name.startswith("MRC_EV_")}


# the state a path is in after each kind of event (MRC's names, control/paths.py)
STATE_AFTER = {"down": "assumed-bad", "up": "up", "late": "up", "kept": "up", "fail-open": "assumed-bad",
               "shared-down": "assumed-bad", "skip": "skip", "port-down": "assumed-bad"}


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


class Cursor:
    """One reader's own position in the event log (`monitor`).

    The log is an array of MRC_EVENTS slots: event n is in slot n %
    MRC_EVENTS, and `event_seq` counts the events filed.  Each reader keeps
    the next n it wants, so any number of readers each get every event (the
    ring only wakes them, datapath/ringbuf.py).  A reader more than
    MRC_EVENTS behind finds its events overwritten: it skips to the oldest
    still there and says how many it lost.
    """

    def __init__(self, att, start: int | None = None):
        self._events = att.maps["events"]
        self._seq = att.maps["event_seq"]
        self.size = self._events.max_entries
        self.next = self.filed() + 1 if start is None else start

    def filed(self) -> int:
        """How many events the datapath has filed (the newest one's seq)."""
        v = self._seq.lookup(layout.Index(0))
        return v.value if v is not None else 0

    def read(self) -> list[tuple[str, object]]:
        """What is new since the last call, in order: ("event", layout.Event)
        or ("lost", (first_seq, last_seq)) for events overwritten before
        this reader got to them."""
        out = []
        filed = self.filed()
        oldest = filed - self.size + 1
        if self.next < oldest:
            out.append(("lost", (self.next, oldest - 1)))
            self.next = oldest
        got = []
        while self.next + len(got) <= filed:
            n = self.next + len(got)
            ev = self._events.lookup(layout.Index(n % self.size))
            if ev is None or ev.seq < n:        # counted, not yet written: the next wake-up
                break
            if ev.seq > n:                      # written over meanwhile
                break
            got.append(ev)
        # the datapath counts an event before it writes its slot, so a slot
        # read before the count reached n + size cannot have been half
        # written over by event n + size while we read it
        after = self.filed()
        for ev in got:
            if ev.seq + self.size <= after:
                if out and out[-1][0] == "lost" and out[-1][1][1] == ev.seq - 1:
                    out[-1] = ("lost", (out[-1][1][0], ev.seq))
                else:
                    out.append(("lost", (ev.seq, ev.seq)))
            else:
                out.append(("event", ev))
            self.next = ev.seq + 1
        if self.next + self.size <= after:       # fell behind while reading
            return out + self.read()
        return out
