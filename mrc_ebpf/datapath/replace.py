"""Hitless upgrade: `mrcctl attach DEV --replace`.

Swaps the programs of a running attachment for ones newly built from the
sources installed now, keeping every map (paths, sequences, learnt state,
counters, the event ring): the new programs are loaded against the
running maps, so nothing is copied and nothing starts again from zero.

Order, so traffic never waits on the compiler or the verifier:
1. compile (bcc creates a throwaway set of maps, used only to compare);
2. under the writer lock: compare every map's layout with the pinned
   one (type, key and value size, max entries, flags) and refuse when any
   differs; load the programs with each map reference pointed at the
   pinned map instead of the throwaway one (the verifier runs here, while
   the old programs still carry the traffic);
3. swap each hook in place, each one atomic for the packets crossing it:
   XDP by netlink with XDP_FLAGS_REPLACE and the expected old program,
   the TC filters (egress: mrc_tx, ingress: mrc_fb) by changing the
   filter of the same parent, priority and handle; then re-pin.

A failure before the swap changes nothing; a failure during it puts the
old programs back on every hook already swapped.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import time
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, build_cache, hooks, journal, layout, lock, loader, pins, swap, xdp_chain
from mrc_ebpf.datapath.swap import swap_tc, swap_xdp  # noqa: F401  (re-exported: attach --replace's API)
from mrc_ebpf.errors import MrcError

# program pin -> (function in bpf/mrc.c, bcc program type name)
PROGRAMS = {pin: (function, loader.PROGRAM_TYPES[function]) for pin, function in
            ((loader.PROG_TX, "mrc_tx"), (loader.PROG_RX, "mrc_rx"), (loader.PROG_FB, "mrc_fb"))}
LAYOUT_CHANGED = "layout changed: detach and attach"


def map_names() -> list[str]:
    """Every map the datapath has, all of them pinned by attach.  The
    chain map is one of them: the new mrc_rx tail-calls through the
    running one, so a chained XDP program stays chained."""
    return [*layout.MAPS, loader.EVENT_RING, xdp_chain.CHAIN_MAP]


def _shape(info: bpfsys.MapInfo) -> tuple:
    return (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags)


def _describe(shape: tuple) -> str:
    kind, key, value, entries, flags = shape
    return f"type {kind}, key {key} B, value {value} B, {entries} entries, flags {flags:#x}"


def check_layout(module, directory: Path, old_fds: dict[str, int]) -> dict[int, int]:
    """The new build's map fds -> the running (pinned) maps' fds, after
    checking each pair has the same layout; MrcError when one differs."""
    relocation = {}
    for name in map_names():
        try:
            new_fd = module[layout.symbol(name)].map_fd
        except KeyError:
            raise MrcError(f"{LAYOUT_CHANGED} (the new build has no map {name})")
        if name not in old_fds:
            raise MrcError(f"{LAYOUT_CHANGED} (the running datapath has no map {name} pinned "
                           f"in {directory})")
        new, old = _shape(bpfsys.map_info(new_fd)), _shape(bpfsys.map_info(old_fds[name]))
        if new != old:
            raise MrcError(f"{LAYOUT_CHANGED} (map {name}: running {_describe(old)}, "
                           f"new {_describe(new)})")
        relocation[new_fd] = old_fds[name]
    return relocation


def relocate(insns: bytes, relocation: dict[int, int]) -> bytes:
    """INSNS with every map reference turned from the new build's map to
    the running one; MrcError for a reference to a map the relocation
    does not know."""
    try:
        return build_cache.relocate(insns, relocation)
    except build_cache.RelocationError as e:
        if e.fd is None:
            raise MrcError(f"cannot relocate the new build: a 64-bit load of kind {e.kind}")
        name = _map_name(e.fd)
        raise MrcError(f"{LAYOUT_CHANGED} (the new build uses a map that is not "
                       f"pinned{': ' + name if name else ''})")


def _map_name(fd: int) -> str:
    try:
        return bpfsys.map_info(fd).name.decode(errors="replace")
    except (bpfsys.BpfError, UnicodeError):
        return ""


def load_programs(module, relocation: dict[int, int], rx_attach_type: int = 0) -> dict[str, int]:
    """Load the new build's programs on the running maps: pin name -> fd.
    RX_ATTACH_TYPE: as compile_datapath's (a chained program's)."""
    from bcc import BPF, libbcc
    lib = libbcc.lib
    fds: dict[str, int] = {}
    try:
        for pin, (function, kind) in PROGRAMS.items():
            name = function.encode()
            start = lib.bpf_function_start(module.module, name)
            if not start:
                raise MrcError(f"{LAYOUT_CHANGED} (the new build has no program {function})")
            size = lib.bpf_function_size(module.module, name)
            insns = relocate(ctypes.string_at(start, size), relocation)
            buf = ctypes.create_string_buffer(insns, len(insns))
            fd = lib.bcc_func_load(module.module, getattr(BPF, kind), name, buf, size,
                                   lib.bpf_module_license(module.module),
                                   lib.bpf_module_kern_version(module.module), 0, None, 0, None,
                                   (rx_attach_type or -1) if pin == loader.PROG_RX else -1)
            if fd < 0:   # the verifier's log went to stderr
                raise MrcError(f"cannot load the new {function}: {os.strerror(ctypes.get_errno())}; "
                               f"nothing was changed")
            fds[pin] = fd
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def programs(directory: Path) -> dict[str, dict]:
    """The pinned programs: short name -> id and load time (UTC, ISO 8601)."""
    out = {}
    for pin in PROGRAMS:
        short = pin.removeprefix("prog_")
        try:
            fd = bpfsys.obj_get(str(directory / pin))
        except bpfsys.BpfError:
            out[short] = {"id": 0, "loaded": None}
            continue
        try:
            info = bpfsys.prog_info(fd)
        finally:
            os.close(fd)
        out[short] = {"id": info.id, "loaded": _wall_time(info.load_time)}
    return out


def _wall_time(boot_ns: int) -> str:
    """A load_time (ns since boot) as a UTC time."""
    ago = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - boot_ns
    when = datetime.datetime.fromtimestamp(time.time() - ago / 1e9, datetime.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def open_pins(directory: Path, names) -> dict[str, int]:
    fds = {}
    for name in names:
        try:
            fds[name] = bpfsys.obj_get(str(directory / name))
        except bpfsys.BpfError:
            pass
    return fds


def _hooked(ipr: IPRoute, directory: Path, old_ids: dict[str, int]) -> list[tuple[str, int, str]]:
    """(device, ifindex, XDP mode) of each member device, after checking
    every hook still runs the pinned program: a hook changed behind our
    back is not ours to replace."""
    members = loader.device_members(directory)
    if not members:
        raise MrcError(f"{LAYOUT_CHANGED} (the pinned config is unreadable)")
    found = []
    for member in members:
        device = loader.ifname_of(member.ifindex)
        if device is None:
            raise MrcError(f"device ifindex {member.ifindex} of this attachment is gone: "
                           f"`mrcctl status`")
        info = hooks.device_info(ipr, member.ifindex)
        if info["xdp_prog_id"] != old_ids[loader.PROG_RX] or info["xdp_mode"] not in ("native", "skb"):
            raise MrcError(f"XDP on {device} is not our program (prog {info['xdp_prog_id'] or '-'}, "
                           f"expected {old_ids[loader.PROG_RX]}): `mrcctl attach {device} --repair` first")
        for pin, direction in ((loader.PROG_TX, "egress"), (loader.PROG_FB, "ingress")):
            running = hooks.tc_egress_prog_ids(member.ifindex, direction).get(hooks.TC_PRIO, 0)
            if running != old_ids[pin]:
                raise MrcError(f"TC {direction} filter on {device} is not our program (prog "
                               f"{running or '-'}, expected {old_ids[pin]}): `mrcctl attach {device} --repair` first")
        found.append((device, member.ifindex, info["xdp_mode"]))
    return found


def replace(devices: list[str]) -> dict:
    """Build the datapath from the installed sources and swap it in for
    the running one of the attachment DEVICES belong to, keeping its maps."""
    start = time.monotonic_ns()
    loader.require_root()
    pins.ensure_bpffs()
    first = _attachment(devices)
    module = loader.build_datapath()     # seconds: the old programs carry the traffic meanwhile
    compiled = time.monotonic_ns()
    try:
        with lock.writer(), loader.terminate_as_error():
            if _attachment(devices) != first:
                raise MrcError(f"{devices[0]} was detached or attached again meanwhile; nothing was changed")
            result = _replace_locked(module, first)
    finally:
        module.cleanup()    # its throwaway maps
    result.update(compile_s=round((compiled - start) / 1e9, 3),
                  to_swap_s=round((result["swap_start_ns"] - start) / 1e9, 3))
    return result


def _attachment(devices: list[str]) -> str:
    owners = {d: loader.owner(d) for d in devices}
    missing = [d for d, o in owners.items() if o is None]
    if missing:
        raise MrcError(f"{missing[0]} is not attached: --replace upgrades a running datapath "
                       f"(mrcctl attach {missing[0]} --sid SID attaches one)")
    if len(set(owners.values())) > 1:
        raise MrcError(f"{' '.join(devices)} belong to different attachments: replace one at a time")
    return next(iter(owners.values()))


def _replace_locked(module, first: str) -> dict:
    from pyroute2 import IPRoute
    directory = pins.device_dir(first)
    load_start = time.monotonic_ns()
    old_maps = open_pins(directory, map_names())
    try:
        relocation = check_layout(module, directory, old_maps)
        n_devices = len(loader.device_members(directory))
        new_progs = load_programs(module, relocation, xdp_chain.rx_attach_type(directory, n_devices))
    finally:
        for fd in old_maps.values():
            os.close(fd)
    loaded = time.monotonic_ns()
    old_progs = open_pins(directory, PROGRAMS)
    try:
        missing = [p for p in PROGRAMS if p not in old_progs]
        if missing:
            raise MrcError(f"{LAYOUT_CHANGED} (no {missing[0]} pinned in {directory})")
        old_ids = {p: bpfsys.prog_info(fd).id for p, fd in old_progs.items()}
        new_ids = {p: bpfsys.prog_info(fd).id for p, fd in new_progs.items()}
        with IPRoute() as ipr:
            members = _hooked(ipr, directory, old_ids)
            # killed anywhere from here, the next command finds the log
            # and rolls the swap back, or forward once pins moved (undo)
            with journal.logged() as log:
                log.append({"op": "replace", "device": first, "old": old_ids, "new": new_ids})
                swap_start, swap_end = _swap(ipr, directory, members, old_progs, new_progs, log)
    finally:
        for fd in (*old_progs.values(), *new_progs.values()):
            os.close(fd)
    return {"device": first, "devices": [m[0] for m in members], "replaced": True,
            "programs": {p.removeprefix("prog_"): {"old_id": old_ids[p], "new_id": new_ids[p]}
                         for p in PROGRAMS},
            "load_s": round((loaded - load_start) / 1e9, 3),
            "swap_ms": round((swap_end - swap_start) / 1e6, 3),
            "swap_start_ns": swap_start, "swap_end_ns": swap_end, "maps_kept": len(map_names())}


def _swap(ipr: IPRoute, directory: Path, members, old: dict[str, int], new: dict[str, int],
          log=None) -> tuple[int, int]:
    """Every hook of every member to the new programs, then the pins;
    on any failure the hooks and pins already changed go back.  LOG (the
    journal's) marks each phase, which kills are aimed at."""
    staged = swap.staged(directory)
    undo: list = []
    mark = (lambda phase: log.append({"op": "replace_phase", "phase": phase})) if log else (lambda _: None)
    try:
        for pin, path in staged.items():     # pinning can fail (bpffs full?): before any swap
            if path.exists():
                path.unlink()
            bpfsys.obj_pin(new[pin], str(path))
        mark("staged")
        start = time.monotonic_ns()
        for device, index, mode in members:
            swap_xdp(ipr, index, mode, new[loader.PROG_RX], old[loader.PROG_RX])
            undo.append(lambda i=index, m=mode: swap_xdp(ipr, i, m, old[loader.PROG_RX], new[loader.PROG_RX]))
            for pin, function, parent in ((loader.PROG_TX, "mrc_tx", hooks.TC_EGRESS_PARENT),
                                          (loader.PROG_FB, "mrc_fb", hooks.TC_INGRESS_PARENT)):
                swap_tc(ipr, index, new[pin], function, parent)
                undo.append(lambda i=index, p=pin, f=function, q=parent: swap_tc(ipr, i, old[p], f, q))
        end = time.monotonic_ns()
        mark("pins")
        for pin, path in staged.items():
            os.replace(path, directory / pin)
            undo.append(lambda p=pin: repin(old[p], directory / p))
        return start, end
    except BaseException as e:
        problems = []
        for step in reversed(undo):
            try:
                step()
            except Exception as failed:  # keep undoing the rest
                problems.append(_reason(failed))
        for path in staged.values():
            if path.exists():
                path.unlink()
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, MrcError) and not undo and not problems):
            raise
        if problems:
            raise MrcError(f"replace failed ({_reason(e)}), and putting the old programs back failed "
                           f"too ({'; '.join(problems)}): `mrcctl status`, or detach and attach")
        raise MrcError(f"replace failed ({_reason(e)}); the old programs run as before")


def repin(fd: int, path: Path) -> None:
    staged = path.with_name(path.name + "_prev")
    bpfsys.obj_pin(fd, str(staged))
    os.replace(staged, path)


def _reason(e: BaseException) -> str:
    from pyroute2.netlink.exceptions import NetlinkError
    if isinstance(e, NetlinkError):
        return f"netlink: {e.args[1] if len(e.args) > 1 else e}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
