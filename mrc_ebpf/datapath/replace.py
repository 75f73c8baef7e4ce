"""Hitless upgrade: `mrcctl attach DEV --replace`.

Swaps the programs of a running attachment for ones newly built from the
sources installed now, keeping every map (paths, sequences, learnt state,
counters, the event ring): the new programs are loaded against the
running maps, so nothing is copied and nothing starts again from zero.

Order, so traffic never waits on the compiler or the verifier:
1. the build of the installed sources: from the build cache, or compiled
   (build_cache.py);
2. under the writer lock: build.instantiate on the pinned maps compares
   each one's layout with the build's spec (type, key and value size, max
   entries, flags), refusing when any differs, and loads the programs with
   each map reference pointed at the pinned map (the verifier runs here,
   while the old programs still carry the traffic);
3. swap each hook in place, each one atomic for the packets crossing it:
   XDP by netlink with XDP_FLAGS_REPLACE and the expected old program,
   the TC filters (egress: mrc_tx, ingress: mrc_fb) by changing the
   filter of the same parent, priority and handle; then re-pin.

A failure before the swap changes nothing; a failure during it puts the
old programs back on every hook already swapped.
"""
from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, build, build_cache, hooks, journal, layout, lock, loader, pins, swap, xdp_chain
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


def load_programs(made: build.Build, directory: Path, old_fds: dict[str, int],
                  rx_attach_type: int = 0) -> dict[str, int]:
    """MADE's programs loaded on the running maps OLD_FDS (pin name -> fd),
    after checking each has the new build's layout: pin name -> program fd.
    MrcError, with nothing loaded, when a layout differs or a load fails.
    RX_ATTACH_TYPE: as compile_datapath's (a chained program's)."""
    symbols = {m.symbol for m in made.maps}
    maps = {}
    for name in map_names():
        if layout.symbol(name) not in symbols:
            raise MrcError(f"{LAYOUT_CHANGED} (the new build has no map {name})")
        if name not in old_fds:
            raise MrcError(f"{LAYOUT_CHANGED} (the running datapath has no map {name} pinned "
                           f"in {directory})")
        maps[layout.symbol(name)] = old_fds[name]
    for function, _ in PROGRAMS.values():
        if function not in made.programs:
            raise MrcError(f"{LAYOUT_CHANGED} (the new build has no program {function})")
    try:
        inst = build.instantiate(made, maps, {"mrc_rx": rx_attach_type},
                                 [function for function, _ in PROGRAMS.values()])
    except build.ShapeError as e:
        name = layout.logical(e.symbol)
        if e.running is None:
            raise MrcError(f"{LAYOUT_CHANGED} (the new build uses a map that is not pinned: {name})")
        raise MrcError(f"{LAYOUT_CHANGED} (map {name}: running {build.describe_shape(e.running)}, "
                       f"new {build.describe_shape(e.new)})")
    except build.RelocationError as e:
        raise MrcError(f"cannot relocate the new build: a 64-bit load of kind {e.kind}")
    except bpfsys.BpfError as e:
        what = f"the new {getattr(e, 'function', 'programs')}"
        raise MrcError(f"{build_cache.load_error(what, e)}; nothing was changed")
    try:
        return {pin: os.dup(inst.programs[function].fd) for pin, (function, _) in PROGRAMS.items()}
    finally:
        inst.close()


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
        device = hooks.ifname_of(member.ifindex)
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
    made = loader.datapath_build()     # seconds to compile: the old programs carry the traffic meanwhile
    compiled = time.monotonic_ns()
    with lock.writer(), loader.terminate_as_error():
        if _attachment(devices) != first:
            raise MrcError(f"{devices[0]} was detached or attached again meanwhile; nothing was changed")
        result = _replace_locked(made, first)
    result.update(compile_s=round((compiled - start) / 1e9, 3), build=made.origin,
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


def _replace_locked(made: build.Build, first: str) -> dict:
    from pyroute2 import IPRoute
    directory = pins.device_dir(first)
    load_start = time.monotonic_ns()
    old_maps = open_pins(directory, map_names())
    try:
        n_devices = len(loader.device_members(directory))
        new_progs = load_programs(made, directory, old_maps,
                                  xdp_chain.rx_attach_type(directory, n_devices))
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
