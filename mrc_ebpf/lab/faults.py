"""Gray failures on a link: black-holing or random loss on its receiving end.

The kernel has no netem, so a fault is our own program (bpf/lab/fault.c) on
the TC ingress hook (clsact, direct-action cls_bpf) of the device that
receives the traffic: the sending side's link stays up and its counters
show nothing wrong, as with a real gray failure.

What is dropped: every IPv4 and IPv6 packet, except IPv6 neighbour
discovery (ICMPv6 133-137); ARP and other non-IP frames pass too.  The
link layer therefore stays "up" from the sender's view: neighbour entries
stay reachable and it keeps sending into the hole, which is what makes a
gray failure hard to see.  MLD and everything else IP is dropped.

Why TC ingress and not XDP: both drop what reaches them (generic XDP sees
GSO super-packets whole, as TC does), but
  * a device has one XDP program, and hosts run the datapath's (mrc_rx)
    there; TC filters stack, and ours (prio FAULT_PRIO) runs before the
    datapath's own ingress filter;
  * native XDP on a veth changes the sending peer (GSO off, NAPI rings that
    drop when full: see ENVIRONMENT.md), which would perturb the very
    baseline a fault is meant to test.
Plain ECMP TCP flows that "survived" an XDP black hole in an earlier
attempt were not missed by the hook: after a retransmission timeout TCP
picks a new random txhash (net.core.txrehash), the veth carries it across
namespaces as skb->hash with l4_hash set, and fib_multipath_hash_policy 1
uses that hash as is, so the flow moved to a healthy path.  Policy 3 with
explicit fields hashes the headers and keeps the flow in the hole.

The tests black-hole a path (or drop a share of its packets) with this
too: one mechanism for the fabric, the bench and the tests.

Limits: a loss decision is per skb, so a GSO super-packet (a sender's TSO
burst crossing veths and routers unsegmented) is lost or kept whole;
counters count the wire packets it stands for (gso_segs).  Per-packet loss
for TCP needs GSO off on the link's sending device.  On a device that also
has an XDP program, that program sees a packet before the fault drops it.

State: pins under /run/mrc-ebpf/faults/<netns>/<dev>/ (prog, config,
counters), so any later process reads the counters; the filter keeps the
program loaded after the injecting process exits.  The config records the
namespace's cookie and the device's ifindex, so pins left by a deleted
namespace (or device) are recognised as stale rather than as a live fault.
`rearm` changes a live fault's mode and loss with one write to that config
(no compile), so a failure can be armed early and triggered at a known
instant under traffic.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import re
import socket
import sys
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, build_cache, hooks, mirrors, pins, source
from mrc_ebpf.lab.enter import NetnsGone, inside
from mrc_ebpf.errors import MrcError
from mrc_ebpf.datapath.source import LAB_BPF_DIR

SOURCE = LAB_BPF_DIR / "fault.c"
PROG, CONFIG, COUNTERS = "prog", "config", "counters"
FAULT_PRIO = 0xFA   # before the datapath's ingress filter (hooks.TC_PRIO)
# FAULT_MODE_* of fault.c: {"blackhole": 1, "loss": 2}
MODES = {n[len("FAULT_MODE_"):].lower(): v for n, v in source.constants(SOURCE, "FAULT_MODE_").items()}
CFG_CLSACT_OURS = source.C["MRC_DEV_F_CLSACT_OURS"]   # fault_config.flags
ARPHRD_ETHER = 1
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")


@mirrors.mirror("struct fault_config", SOURCE)
class Config(ctypes.Structure):
    _fields_ = [("threshold", ctypes.c_uint64), ("mode", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("loss", ctypes.c_double),
                ("netns_cookie", ctypes.c_uint64), ("ifindex", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)]


# enum fault_counter: the counters, then FAULT_FIRST_DROP_NS (a time, no counter)
_ENUM = source.enum_names("fault_counter", SOURCE)
FIRST_DROP_NS = _ENUM.index("FAULT_FIRST_DROP_NS")
COUNTER_NAMES = tuple(n[len("FAULT_"):].lower() for n in _ENUM[:FIRST_DROP_NS])
_ZERO = ctypes.c_uint32(0)


def _check_netns(netns: str) -> None:
    if not isinstance(netns, str) or not _NAME.fullmatch(netns):
        raise MrcError(f"bad namespace name {netns!r}")


def _check_names(netns: str, dev: str) -> None:
    _check_netns(netns)
    if not isinstance(dev, str) or not _NAME.fullmatch(dev) or len(dev) > 15:
        raise MrcError(f"bad device name {dev!r}")


def _check_mode(mode: str, loss) -> float:
    """The loss to install for MODE (blackhole: 1)."""
    if mode not in MODES:
        raise MrcError(f"bad fault mode {mode!r}: blackhole or loss")
    if mode == "blackhole":
        return 1.0
    try:
        loss = float(loss)
    except (TypeError, ValueError):
        raise MrcError(f"bad loss {loss!r}: a probability in (0, 1]")
    if not (0.0 < loss <= 1.0):
        raise MrcError(f"bad loss {loss}: a probability in (0, 1]")
    return loss


def _index(ipr: IPRoute, dev: str) -> int | None:
    found = ipr.link_lookup(ifname=dev)
    return found[0] if found else None


def _netns_dir(netns: str) -> Path:
    return pins.BASE / "faults" / netns


def _dir(netns: str, dev: str) -> Path:
    return _netns_dir(netns) / dev


def _read_config(directory: Path) -> Config | None:
    try:
        m = bpfsys.PinnedMap(str(directory / CONFIG), ctypes.c_uint32, Config)
    except (bpfsys.BpfError, FileNotFoundError):
        return None
    try:
        return m.lookup(_ZERO)
    finally:
        m.close()


def _read_counters(directory: Path) -> dict[str, int]:
    m = bpfsys.PinnedMap(str(directory / COUNTERS), ctypes.c_uint32, ctypes.c_uint64, percpu=True)
    try:
        out = {name: sum(m.lookup(ctypes.c_uint32(i)) or [0]) for i, name in enumerate(COUNTER_NAMES)}
        firsts = [t for t in m.lookup(ctypes.c_uint32(FIRST_DROP_NS)) or [] if t]
        out["first_drop_ns"] = min(firsts) if firsts else 0    # CLOCK_MONOTONIC
        return out
    finally:
        m.close()


def _live(cfg: Config | None, dev: str) -> bool:
    """Inside the namespace: do these pins describe a fault on this device now?"""
    if cfg is None or cfg.netns_cookie != pins.netns_cookie():
        return False
    try:
        return socket.if_nametoindex(dev) == cfg.ifindex
    except OSError:
        return False


def _describe(netns: str, dev: str, cfg: Config, directory: Path) -> dict:
    mode = {v: k for k, v in MODES.items()}.get(cfg.mode, "unknown")
    return {"netns": netns, "dev": dev, "mode": mode, "loss": cfg.loss, **_read_counters(directory)}


def _compile():
    # a kept build (datapath/build_cache.py): a fault is injected in a
    # second, not after a 4 s compile
    return build_cache.one_program(SOURCE, "fault_ingress")


def _remove_filter(ipr: IPRoute, index: int, flags: int) -> dict:
    """Our filter off the device, and clsact too if we added it and it is empty."""
    from pyroute2.netlink.exceptions import NetlinkError
    removed = {"filter": False, "clsact": False}
    if FAULT_PRIO in hooks.tc_egress_prog_ids(index, "ingress"):
        with contextlib.suppress(NetlinkError):
            ipr.tc("del-filter", "bpf", index, hooks.TC_HANDLE, parent=hooks.TC_INGRESS_PARENT,
                   prio=FAULT_PRIO)
            removed["filter"] = True
    if flags & CFG_CLSACT_OURS and not hooks.tc_egress_prog_ids(index, "ingress") \
            and not hooks.tc_egress_prog_ids(index, "egress"):
        hooks.del_clsact(ipr, index)
        removed["clsact"] = True
    return removed


def _drop_pins(directory: Path) -> None:
    pins.remove_tree(directory)
    _drop_empty(directory.parent)


def _drop_empty(netns_dir: Path) -> None:
    """The namespace's directory, then the faults root, once empty."""
    for d in (netns_dir, netns_dir.parent):
        with contextlib.suppress(OSError):
            d.rmdir()


def _install(ipr: IPRoute, netns: str, dev: str, directory: Path, mode: str, loss: float) -> int:
    """inject's work inside the namespace: all of it or (undone) nothing."""
    from pyroute2.netlink.exceptions import NetlinkError
    index = _index(ipr, dev)
    if index is None:
        raise MrcError(f"no device {dev!r} in network namespace {netns!r}")
    if ipr.get_links(index)[0]["ifi_type"] != ARPHRD_ETHER:
        raise MrcError(f"{dev} in {netns} is not an Ethernet device (the fault reads "
                       f"IP headers after an Ethernet header)")
    if directory.exists():
        if _live(_read_config(directory), dev):
            raise MrcError(f"{dev} in {netns} already has a fault: heal it first")
        pins.remove_tree(directory)   # left by a namespace or device that is gone
    if FAULT_PRIO in hooks.tc_egress_prog_ids(index, "ingress"):
        raise MrcError(f"{dev} in {netns} already has a BPF filter at ingress prio "
                       f"{FAULT_PRIO} with no fault pinned for it: heal it first")
    module, fn = _compile()
    undo: list = []
    try:
        try:
            directory.mkdir(parents=True)
        except FileExistsError:   # a concurrent inject got here first
            raise MrcError(f"{dev} in {netns} already has a fault: heal it first")
        undo.append(lambda: _drop_pins(directory))
        for name in (CONFIG, COUNTERS):
            bpfsys.obj_pin(module[name.encode()].map_fd, str(directory / name))
        bpfsys.obj_pin(fn.fd, str(directory / PROG))
        flags = 0
        if not hooks.has_clsact(ipr, index):
            hooks.add_clsact(ipr, index)
            flags |= CFG_CLSACT_OURS
            undo.append(lambda: hooks.del_clsact(ipr, index))
        cfg = Config(threshold=round(loss * (1 << 32)), mode=MODES[mode], flags=flags, loss=loss,
                     netns_cookie=pins.netns_cookie(), ifindex=index)
        m = bpfsys.PinnedMap(str(directory / CONFIG), ctypes.c_uint32, Config)
        try:
            m.update(_ZERO, cfg)
        finally:
            m.close()
        prog_id = bpfsys.prog_info(fn.fd).id
        try:
            ipr.tc("add-filter", "bpf", index, hooks.TC_HANDLE, fd=fn.fd, name="mrc_fault",
                   parent=hooks.TC_INGRESS_PARENT, classid=1, direct_action=True, prio=FAULT_PRIO)
        except NetlinkError as e:
            raise MrcError(f"cannot add the TC ingress filter on {dev} in {netns}: {e}")
    except BaseException:
        for step in reversed(undo):
            with contextlib.suppress(Exception):
                step()
        raise
    finally:
        module.cleanup()   # the pins and the filter hold what must stay
    return prog_id


def inject(netns: str, dev: str, mode: str, loss: float = 1.0) -> dict:
    """Drop what arrives on DEV in NETNS: all of it (blackhole; `loss` is
    ignored) or each packet with probability `loss`."""
    from pyroute2 import IPRoute
    _check_names(netns, dev)
    loss = _check_mode(mode, loss)
    pins.ensure_bpffs()
    directory = _dir(netns, dev)
    try:
        with inside(netns), IPRoute() as ipr:
            prog_id = _install(ipr, netns, dev, directory, mode, loss)
    except NetnsGone:
        raise MrcError(f"network namespace {netns!r} does not exist")
    except (MrcError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise MrcError(f"inject on {dev} in {netns} failed: {e}")
    return {"netns": netns, "dev": dev, "mode": mode, "loss": loss, "prog_id": prog_id,
            "pins": str(directory)}


def rearm(netns: str, dev: str, mode: str, loss: float = 1.0) -> dict:
    """Change the fault already on DEV in place: one write to its pinned
    config, so a failure can be switched on under traffic at a known
    instant (inject compiles, which takes seconds)."""
    _check_names(netns, dev)
    loss = _check_mode(mode, loss)
    directory = _dir(netns, dev)
    try:
        with inside(netns):
            live = _live(_read_config(directory), dev)
    except NetnsGone:
        live = False
    if not live:
        raise MrcError(f"{dev} in {netns} has no fault to change (inject one first)")
    m = bpfsys.PinnedMap(str(directory / CONFIG), ctypes.c_uint32, Config)
    try:
        cfg = m.lookup(_ZERO)
        cfg.mode, cfg.loss, cfg.threshold = MODES[mode], loss, round(loss * (1 << 32))
        m.update(_ZERO, cfg)
    finally:
        m.close()
    return {"netns": netns, "dev": dev, "mode": mode, "loss": loss, "pins": str(directory)}


def heal(netns: str, dev: str) -> dict:
    """Remove the fault on DEV in NETNS and its pins.  Pins left by a
    namespace or device that is gone are removed too (result "stale")."""
    from pyroute2 import IPRoute
    _check_names(netns, dev)
    pins.ensure_bpffs()
    directory = _dir(netns, dev)
    pinned = directory.is_dir()
    cfg = _read_config(directory) if pinned else None
    result = {"netns": netns, "dev": dev, "stale": True, "filter_removed": False,
              "clsact_removed": False}
    if cfg is not None:
        result.update(_describe(netns, dev, cfg, directory))
    try:
        with inside(netns), IPRoute() as ipr:
            index = _index(ipr, dev)
            if index is not None:
                live = _live(cfg, dev)
                result["stale"] = not live
                # FAULT_PRIO is ours alone: a filter there without live pins
                # is one whose pins were lost, and goes too
                removed = _remove_filter(ipr, index, cfg.flags if live else 0)
                result["filter_removed"], result["clsact_removed"] = removed["filter"], removed["clsact"]
    except NetnsGone:
        pass
    if not pinned and not result["filter_removed"]:
        raise MrcError(f"no fault on {dev} in {netns}")
    _drop_pins(directory)
    return result


def status(netns: str, dev: str) -> dict | None:
    """{"mode", "loss", "dropped", "passed", ...} of the fault on DEV, or None."""
    _check_names(netns, dev)
    directory = _dir(netns, dev)
    if not directory.is_dir():
        return None
    cfg = _read_config(directory)
    try:
        with inside(netns):
            if not _live(cfg, dev):
                return None
    except NetnsGone:
        return None
    return _describe(netns, dev, cfg, directory)


def list_faults(netns: str) -> list[dict]:
    _check_netns(netns)
    d = _netns_dir(netns)
    if not d.is_dir():
        return []
    found = (status(netns, p.name) for p in sorted(d.iterdir()) if p.is_dir())
    return [s for s in found if s is not None]


def forget(netns: str) -> list[str]:
    """Clear every fault pinned for NETNS (healing those still live): what
    a fabric's teardown calls once its namespaces are deleted.  Returns the
    devices cleared; nothing pinned is not an error."""
    _check_netns(netns)
    d = _netns_dir(netns)
    if not d.is_dir():
        return []
    cleared = []
    for p in sorted(d.iterdir()):
        if p.is_dir():
            heal(netns, p.name)
            cleared.append(p.name)
    _drop_empty(d)
    return cleared


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrc_ebpf.lab.faults", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    inj = sub.add_parser("inject", help="blackhole (default) or, with --loss P, random loss")
    inj.add_argument("netns")
    inj.add_argument("dev")
    inj.add_argument("--loss", type=float, help="drop each packet with this probability")
    for name in ("heal", "status"):
        s = sub.add_parser(name)
        s.add_argument("netns")
        s.add_argument("dev")
    for name in ("list", "forget"):
        sub.add_parser(name).add_argument("netns")
    a = p.parse_args(argv)
    try:
        if a.cmd == "inject":
            out = inject(a.netns, a.dev, "loss" if a.loss is not None else "blackhole",
                         1.0 if a.loss is None else a.loss)
        elif a.cmd == "heal":
            out = heal(a.netns, a.dev)
        elif a.cmd == "status":
            out = status(a.netns, a.dev)
            if out is None:
                raise MrcError(f"no fault on {a.dev} in {a.netns}")
        elif a.cmd == "list":
            out = list_faults(a.netns)
        else:
            out = forget(a.netns)
    except MrcError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
