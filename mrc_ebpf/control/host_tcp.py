"""Host-wide TCP settings that a route cannot carry (docs/design/tcp.md).

mrcctl puts what it can on its own peer routes (routes.DEFAULT_TCP_METRICS)
and changes nothing host-wide unless asked: `mrcctl tune-host --apply`
sets these in the current network namespace, `--restore` puts the
kernel's defaults back.
"""
from __future__ import annotations

from pathlib import Path

from mrc_ebpf.errors import MrcError

# sysctl -> (value for sprayed TCP, the kernel's default, why)
SETTINGS = {
    "net.ipv4.tcp_min_rtt_wlen": (
        "0", "300",
        "RACK waits min_rtt/4 (times its DSACK steps) before it takes a reordered segment "
        "for lost; min_rtt is kept for this many seconds, so on an idle fabric it is "
        "microseconds while sprayed paths' queues differ by milliseconds. 0: the latest "
        "RTT, queues included. No route metric reaches it."),
}


def _proc(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def read() -> list[dict]:
    rows = []
    for key, (tuned, default, why) in SETTINGS.items():
        try:
            current = _proc(key).read_text().strip()
        except OSError:
            current = None
        rows.append({"sysctl": key, "current": current, "tuned": tuned, "kernel_default": default,
                     "why": why})
    return rows


def write(which: str) -> list[dict]:
    """Set every setting to its `tuned` or `kernel_default` value."""
    for row in read():
        if row["current"] is None:
            raise MrcError(f"{row['sysctl']} does not exist on this kernel")
    for key, (tuned, default, _) in SETTINGS.items():
        try:
            _proc(key).write_text(tuned if which == "tuned" else default)
        except OSError as e:
            raise MrcError(f"cannot set {key}: {e.strerror}")
    return read()
