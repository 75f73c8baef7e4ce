"""The test fabric's trimming switch queues (`mrcctl fabric up
--trim-threshold TIME`).

Ultra Ethernet's switches (and NDP's) trim instead of dropping: a packet
that finds a queue past its threshold is cut to its headers and sent on,
so the receiver learns at once that a packet was congested on that path,
and not lost.  bpf/lab/trim.c does it at TC egress of every rate-limited
leaf-spine device, with the virtual queue of ecn_marks.py: it keeps an
MRC packet's outer IPv6 header, SRH or Destination Options (MRC TLV)
and inner IP header, and sets the outer DSCP to MRC_TRIM_DSCP; the
receiver's datapath counts it per path, drops it and answers it with
feedback at once (bpf/lib/trim.h).  Test equipment like faults.py.

State: one program and one map for the whole fabric, keyed by device
MAC, pinned at /run/mrc-ebpf/fabric-trim/<fabric>; the filters go with
the namespaces on `fabric down`, which removes the pin.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from mrc_ebpf.datapath import mirrors, pins
from mrc_ebpf.datapath.source import LAB_BPF_DIR
from mrc_ebpf.lab import ecn_marks

SOURCE = LAB_BPF_DIR / "trim.c"
TRIM_PRIO = 0xED          # its own filter priority on clsact egress (after the ECN marker's)


def parse_threshold(text: str) -> int:
    """'1ms', '500us' -> ns, as ecn_marks.parse_threshold."""
    from mrc_ebpf.errors import MrcError
    try:
        return ecn_marks.parse_threshold(text)
    except MrcError as e:
        raise MrcError(str(e).replace("ECN threshold", "trim threshold"))


@mirrors.mirror("struct trim_queue_key", SOURCE)
class QueueKey(ctypes.Structure):
    _fields_ = [("mac", ctypes.c_uint8 * 6), ("pad", ctypes.c_uint16)]


@mirrors.mirror("struct trim_queue", SOURCE)
class Queue(ctypes.Structure):
    """struct trim_queue in bpf/lab/trim.c (tests/test_layout.py checks the two agree)."""
    _fields_ = [("ns_per_kbyte", ctypes.c_uint64), ("threshold_ns", ctypes.c_uint64),
                ("busy_until", ctypes.c_uint64), ("packets", ctypes.c_uint64),
                ("mrc", ctypes.c_uint64), ("trimmed", ctypes.c_uint64),
                ("trimmed_bytes", ctypes.c_uint64), ("untrimmable", ctypes.c_uint64)]


def pin_path(fabric: str) -> Path:
    return pins.BASE / "fabric-trim" / fabric


def install(fabric: str, devices: list[tuple[str, str, int]], threshold_ns: int) -> dict[str, dict]:
    """Trim on every (namespace, device, rate in bit/s); returns
    {mac: {"ns", "dev"}} for the fabric's state."""
    return ecn_marks.install_queues(pin_path(fabric), SOURCE, "trim_queue", "mrc_trim", TRIM_PRIO, QueueKey,
                                    lambda rate: Queue(ns_per_kbyte=round(8e12 / rate), threshold_ns=threshold_ns),
                                    devices, "trimming queue")


def read(fabric: str) -> dict[str, Queue] | None:
    """mac -> the queue's counters, or None without a trimmer pinned."""
    return ecn_marks.read_queues(pin_path(fabric), QueueKey, Queue)


def tune(fabric: str, mac: str, threshold_ns: int | None = None, ns_per_kbyte: int | None = None) -> Queue:
    """One device's queue in a running fabric (as ecn_marks.tune): a test
    makes one path trim alone with ns_per_kbyte 10**9 and threshold 1."""
    return ecn_marks.tune_queue(pin_path(fabric), QueueKey, Queue, mac, threshold_ns, ns_per_kbyte,
                                f"fabric {fabric} has no trimming (fabric up --trim-threshold)",
                                "trimming queue")


def remove(fabric: str) -> None:
    ecn_marks.remove_pin(pin_path(fabric))
