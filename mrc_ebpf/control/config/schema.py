"""The config format's schema: its keys, the one table of their ranges
(which `mrcctl attach`'s options are built from too), the canonical form's
defaults, and the helpers that read a path entry of that form.

Light on purpose (no YAML, no pyroute2): the CLI imports it at start-up.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.control import classes
from mrc_ebpf.datapath import layout, offload, routes
from mrc_ebpf.errors import MrcError

VERSION = 1
MODES = ("auto", "native", "skb")
GRANULARITIES = offload.GRANULARITIES
# The ranges of the attach section's integers; `mrcctl attach`'s options
# take theirs from here (tests/test_config.py checks they agree).
RANGES = {
    "loss_hold_us": (0, 10_000_000), "ack_timeout_us": (50, 10_000_000),
    "probe_us": (10, 10_000_000), "fb_interval_us": (10, 10_000_000),
    "reorder_max_us": (0, 10_000_000), "probe_max_us": (0, 10_000_000),
    "min_active": (0, 256),
    # congestion skip and the probe budget (struct mrc_config)
    "skip_rotations": (0, 1_000_000), "probe_budget": (0, 1_000_000),
    "link_rate_mbps": (0, 10_000_000),      # Mbit/s; 0: the device's own speed
}
TIMER_RANGES = {name: RANGES[name] for name in layout.TIMER_DEFAULTS}
SETTING_RANGES = {name: RANGES[name] for name in layout.SETTING_DEFAULTS}
MIN_ACTIVE_RANGE = RANGES["min_active"]
LINK_RATE_RANGE = RANGES["link_rate_mbps"]
# each ranged setting's default when the file (or the command line) leaves it out
DEFAULTS = {**layout.TIMER_DEFAULTS, **layout.SETTING_DEFAULTS, "min_active": 0, "link_rate_mbps": 0}
ATTACH_KEYS = ("devices", "sid", "mode", "granularity", "link_rate_mbps", *TIMER_RANGES, "retrans_steer",
               "shared_fate", "min_active", *SETTING_RANGES, "key_file")
# what a running attachment cannot change in place
REATTACH_KEYS = ("devices", "sid", "mode")
DEFAULT_POLICY = "bytes"        # what `path add` gives a new peer (docs/design/spraying.md)
MAX_CLASS_NAME = 15


class ConfigError(MrcError):
    pass


@dataclasses.dataclass
class Config:
    data: dict                      # the canonical form
    source: str                     # the file's name, for messages
    lines: dict                     # (prefix,) and (prefix, entry index) -> line


# ---- a path entry of the canonical form ------------------------------------

def ident(entry: dict):
    """What a path is (segments, uSID container, entropy to a SID): how
    running and wanted paths are matched."""
    if "via" in entry:
        return ("via", tuple(entry["via"]))
    if "usid" in entry:
        return ("usid", entry["usid"])
    return ("entropy", entry["sid"], bool(entry.get("spare")))


def attrs(entry: dict) -> tuple:
    """(weight, class, denied) of a path entry, defaults filled in."""
    return entry.get("weight", 1), entry.get("class", classes.DEFAULT), bool(entry.get("denied"))


def expand(entries: list[dict]) -> list[dict]:
    """One item per path (an entropy entry of N is N paths, and its
    spare: M M more, each {"entropy": 1, "spare": 1}), with the index of
    the entry it came from."""
    out = []
    for index, e in enumerate(entries):
        for k in range(e.get("entropy", 1) + e.get("spare", 0)):
            one = dict(e)
            one.pop("spare", None)
            if "entropy" in one:
                one["entropy"] = 1
                if k >= e["entropy"]:
                    one["spare"] = 1
            out.append({"entry": one, "index": index})
    return out


def count(entry: dict) -> int:
    """The paths an entry stands for (an entropy entry: its EVs and spares)."""
    return entry.get("entropy", 1) + entry.get("spare", 0)


def merge_entropy(entries: list[dict]) -> list[dict]:
    """Neighbouring entropy entries alike in all but their counts (EVs,
    spares) are one."""
    out = []
    for e in entries:
        prev = out[-1] if out else None
        if prev is not None and "entropy" in e and "entropy" in prev and \
                {k: v for k, v in e.items() if k not in ("entropy", "spare")} == \
                {k: v for k, v in prev.items() if k not in ("entropy", "spare")}:
            prev["entropy"] += e["entropy"]
            if e.get("spare"):
                prev["spare"] = prev.get("spare", 0) + e["spare"]
        else:
            out.append(dict(e))
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
