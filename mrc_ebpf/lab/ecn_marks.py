"""The test fabric's ECN-marking switch queues (`mrcctl fabric up
--ecn-threshold TIME`).

Datacenter switches mark ECN-capable packets CE once a queue passes a
threshold, so that ECN/DCTCP senders slow down before anything is lost
(and MRC's congestion signal, trimming, plays the same role).  This
kernel has no qdisc that marks (no RED, fq_codel or pie), so the fabric
runs its own: bpf/lab/ecn_mark.c at TC egress of every rate-limited
leaf-spine device, both directions, modelling the tbf's backlog as a
virtual queue at the link's rate and marking when more than the
threshold is queued in front of a packet.  Test equipment like faults.py.

The mark lands on whatever header the switch sees: the outer IPv6 header
of a packet mrc-ebpf encapsulated (which its RX carries to the inner
packet, bpf/lib/ecn.h) or the packet itself on plain ECMP.

State: one program and one map for the whole fabric, the map keyed by
each device's MAC address (ifindexes repeat across namespaces), pinned
at /run/mrc-ebpf/fabric-ecn/<fabric> so `fabric show` reads the marks
later; the TC filters keep the program loaded after `fabric up` exits
and go with the namespaces on `fabric down`, which removes the pin.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, build_cache, hooks, mirrors, pins
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.netns import inside
from mrc_ebpf.datapath.source import LAB_BPF_DIR

SOURCE = LAB_BPF_DIR / "ecn_mark.c"
MARK_PRIO = 0xEC          # its own filter priority on clsact egress
MAP = "queues"
_TIME = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s)")
_UNIT = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_THRESHOLD_NS = 1_000_000_000


@mirrors.mirror("struct ecn_queue_key", SOURCE)
class QueueKey(ctypes.Structure):
    _fields_ = [("mac", ctypes.c_uint8 * 6), ("pad", ctypes.c_uint16)]


@mirrors.mirror("struct ecn_queue", SOURCE)
class Queue(ctypes.Structure):
    """struct ecn_queue in bpf/lab/ecn_mark.c (tests/test_layout.py checks the two agree)."""
    _fields_ = [("ns_per_kbyte", ctypes.c_uint64), ("threshold_ns", ctypes.c_uint64),
                ("busy_until", ctypes.c_uint64), ("packets", ctypes.c_uint64),
                ("ect", ctypes.c_uint64), ("marked", ctypes.c_uint64)]


def parse_threshold(text: str) -> int:
    """'1ms', '500us', '0.5ms' -> ns (more than 0, at most 1 s)."""
    m = _TIME.fullmatch(str(text).strip())
    if not m:
        raise MrcError(f"bad ECN threshold {text!r}: a time such as 1ms or 500us")
    ns = round(float(m.group(1)) * _UNIT[m.group(2)])
    if not 0 < ns <= MAX_THRESHOLD_NS:
        raise MrcError(f"bad ECN threshold {text!r}: more than 0, at most 1s")
    return ns


def pin_path(fabric: str) -> Path:
    return pins.BASE / "fabric-ecn" / fabric


def key_of(mac: str, key_type=None):
    """The map key of the device with address MAC (QueueKey's layout)."""
    k = (key_type or QueueKey)()
    for i, b in enumerate(bytes.fromhex(mac.replace(":", ""))):
        k.mac[i] = b
    return k


def install(fabric: str, devices: list[tuple[str, str, int]], threshold_ns: int) -> dict[str, dict]:
    """Mark on every (namespace, device, rate in bit/s); returns
    {mac: {"ns", "dev"}} for the fabric's state.  Undone on failure
    (the caller deletes the namespaces, which takes the filters)."""
    return install_queues(pin_path(fabric), SOURCE, "ecn_mark", "mrc_ecn_mark", MARK_PRIO, QueueKey,
                          lambda rate: Queue(ns_per_kbyte=round(8e12 / rate), threshold_ns=threshold_ns),
                          devices, "ECN marker")


def install_queues(path: Path, source, function: str, filter_name: str, prio: int, key_type, make_queue,
                   devices: list[tuple[str, str, int]], what: str) -> dict[str, dict]:
    """A switch-queue program of the lab (this one, or trims.py's) on every
    (namespace, device, rate): its map pinned at PATH, one entry per device
    keyed by its MAC (make_queue(rate) the value), its filter on clsact
    egress at PRIO.  Returns {mac: {"ns", "dev"}}."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    pins.ensure_bpffs()
    module, fn = build_cache.one_program(source, function)
    table = module[MAP.encode()]
    undo = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()             # a fabric of that name that is gone
        bpfsys.obj_pin(table.map_fd, str(path))
        queues = bpfsys.PinnedMap(str(path), key_type, type(make_queue(1)))
        undo.append(queues.close)
        found = {}
        for ns, dev, rate in devices:
            with inside(ns), IPRoute() as ipr:
                index = ipr.link_lookup(ifname=dev)
                if not index:
                    raise MrcError(f"no device {dev} in {ns}")
                index = index[0]
                mac = ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")
                queues.update(key_of(mac, key_type), make_queue(rate))
                if not hooks.has_clsact(ipr, index):
                    hooks.add_clsact(ipr, index)
                try:
                    ipr.tc("add-filter", "bpf", index, hooks.TC_HANDLE, fd=fn.fd, name=filter_name,
                           parent=hooks.TC_EGRESS_PARENT, classid=1, direct_action=True, prio=prio)
                except NetlinkError as e:
                    raise MrcError(f"cannot add the {what} on {dev} in {ns}: {e}")
            found[mac] = {"ns": ns, "dev": dev}
        return found
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    finally:
        for step in undo:
            step()
        module.cleanup()          # the pin and the filters hold what must stay


def read(fabric: str) -> dict[str, Queue] | None:
    """mac -> the queue's counters, or None without a marker pinned."""
    return read_queues(pin_path(fabric), QueueKey, Queue)


def read_queues(path: Path, key_type, value_type) -> dict | None:
    """mac -> the queue pinned at PATH (a map keyed by MAC: this module's,
    trims.py's), or None without one."""
    try:
        m = bpfsys.PinnedMap(str(path), key_type, value_type)
    except (bpfsys.BpfError, FileNotFoundError):
        return None
    try:
        return {":".join(f"{b:02x}" for b in k.mac): v for k, v in m.items()}
    finally:
        m.close()


def tune(fabric: str, mac: str, threshold_ns: int | None = None, ns_per_kbyte: int | None = None) -> Queue:
    """Change one device's queue (keyed by its MAC) in a running fabric: its
    threshold, or the rate its virtual queue drains at.  A test marks one
    path alone this way: ns_per_kbyte 10**9 keeps that queue backlogged,
    so every ECN-capable packet it sends is marked, and nothing else
    changes (the tbf, the real queue, still runs at the link's rate)."""
    return tune_queue(pin_path(fabric), QueueKey, Queue, mac, threshold_ns, ns_per_kbyte,
                      f"fabric {fabric} has no ECN marking (fabric up --ecn-threshold)", "marking queue")


def tune_queue(path: Path, key_type, value_type, mac: str, threshold_ns: int | None,
               ns_per_kbyte: int | None, no_map: str, what: str):
    """One MAC's queue in the map pinned at PATH, changed (tune's work,
    for trims.py too); NO_MAP is the error when nothing is pinned."""
    try:
        m = bpfsys.PinnedMap(str(path), key_type, value_type)
    except (bpfsys.BpfError, FileNotFoundError):
        raise MrcError(no_map)
    try:
        key = key_of(mac, key_type)
        q = m.lookup(key)
        if q is None:
            raise MrcError(f"no {what} on the device with address {mac}")
        if threshold_ns is not None:
            q.threshold_ns = threshold_ns
        if ns_per_kbyte is not None:
            q.ns_per_kbyte = ns_per_kbyte
        m.update(key, q)
        return q
    finally:
        m.close()


def remove(fabric: str) -> None:
    remove_pin(pin_path(fabric))


def remove_pin(path: Path) -> None:
    """The pinned map and its folder, if empty (fabric down)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()
