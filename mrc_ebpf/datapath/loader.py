"""Loading the datapath, attaching it to a device, and finding it again.

`attach` compiles bpf/mrc.c once, pins its maps and programs (pins.py),
hooks the programs to the device and returns: the datapath outlives the
process.  Every later command opens the pins (`Attachment.open`) and works
on the maps without compiling.
"""
from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, build, build_cache, hooks, layout, lock, offload, pins, source
from mrc_ebpf.datapath import journal, port_hook, routes, xdp_chain
from mrc_ebpf.datapath.swap import PROG_FB, PROG_RX, PROG_TX  # the pins' names
from mrc_ebpf.errors import MrcError

EVENT_RING = "mrc_event_ring"    # the ring buffer of path events (monitor); not in layout.MAPS
CFG_CLSACT_OURS = source.C["MRC_DEV_F_CLSACT_OURS"]   # mrc_device.flags: detach removes clsact too
CFG_XDP_SKB = source.C["MRC_DEV_F_XDP_SKB"]           # mrc_device.flags: XDP attached in skb mode


def require_root() -> None:
    if os.geteuid() != 0:
        raise MrcError("needs root (CAP_BPF and CAP_NET_ADMIN): the datapath's pins and maps "
                       "are root's")


def parse_sid(text: str) -> ipaddress.IPv6Address:
    try:
        sid = ipaddress.IPv6Address(text)
    except ValueError:
        raise MrcError(f"bad SID {text!r}: expected an IPv6 address such as fc00:0:1::")
    if sid.is_multicast or sid.is_link_local or sid.is_unspecified or sid.is_loopback:
        raise MrcError(f"bad SID {text!r}: must be a global or unique-local unicast address")
    return sid


CFLAGS = ["-Wno-unused-function", "-Wno-compare-distinct-pointer-types"]
# function in bpf/mrc.c -> its bcc program type
PROGRAM_TYPES = {"mrc_tx": "SCHED_CLS", "mrc_rx": "XDP", "mrc_fb": "SCHED_CLS", **port_hook.PROGRAM_TYPES}


def compile_datapath(rx_attach_type: int = 0, text: bytes | None = None):
    """Compile bpf/mrc.c (or TEXT) and load the programs on bcc's maps;
    returns (bcc module, tx, rx, fb): the module for its typed tables
    (benches, tests), the programs loaded by build.instantiate as every
    other load.  RX_ATTACH_TYPE: mrc_rx's expected_attach_type, which must
    be that of the XDP program it tail-calls (xdp_chain.tail_call_profile)."""
    module = build_datapath(text)
    try:
        made = build.capture(module, PROGRAM_TYPES)
        inst = build.instantiate(made, build.module_maps(module), {"mrc_rx": rx_attach_type})
    except (bpfsys.BpfError, build.RelocationError, build.ShapeError, KeyError) as e:
        module.cleanup()
        raise build_cache.load_error("the datapath", e)
    return module, inst.programs["mrc_tx"], inst.programs["mrc_rx"], inst.programs["mrc_fb"]


# Active peers (attach --active-peers): the LRUs of learnt state (peer_state)
# and of receive state (rx_peers: senders; rx_paths: 4 (sender, path)
# pairs each) are sized for that many at once, with an eighth more for
# the kernel's LRU (it evicts in batches and parks free entries per CPU);
# the header's sizes are the default's (16,384).
ACTIVE_PEERS_DEFAULT = 16384
ACTIVE_PEERS_RANGE = (256, 65536)


def active_sizes(active_peers: int | None) -> dict[str, int]:
    """symbol -> max entries of the LRUs sized by the active peers."""
    n = ACTIVE_PEERS_DEFAULT if active_peers is None else active_peers
    low, high = ACTIVE_PEERS_RANGE
    if not low <= n <= high:
        raise MrcError(f"--active-peers {n}: must be {low} to {high}")
    return {"mrc_peer_state": n + n // 8, "mrc_rx_peers": n + n // 8, "mrc_rx_paths": 4 * n}


def load_datapath(rx_attach_type: int = 0, sizes: dict[str, int] | None = None
                  ) -> tuple[build.Instance, build.Program, build.Program, build.Program]:
    """The datapath on fresh maps, from the build cache when it holds this
    build (build_cache.py), else compiled: (instance, tx, rx, fb).  SIZES:
    its LRUs' entries (active_sizes), the header's if None."""
    inst = build_cache.live(source.expand().encode(), CFLAGS, PROGRAM_TYPES, "the datapath",
                            {"mrc_rx": rx_attach_type}, sizes=sizes)
    return inst, inst.programs["mrc_tx"], inst.programs["mrc_rx"], inst.programs["mrc_fb"]


def build_datapath(text: bytes | None = None):
    """Compile bpf/mrc.c: a bcc module whose maps exist, nothing loaded."""
    build_cache.require_bcc()
    from bcc import BPF
    build_cache.require_headers()
    try:
        return BPF(text=text or source.expand().encode(), cflags=CFLAGS)
    except Exception as e:  # bcc raises bare Exception; the compiler's messages went to stderr
        raise MrcError(f"cannot load the datapath: {e}")


def datapath_build() -> build.Build:
    """The build of the installed sources: kept, or compiled now (replace)."""
    return build_cache.obtain(source.expand().encode(), CFLAGS, PROGRAM_TYPES, "the datapath")


def watch_peers(maps: dict) -> None:
    """Every write to `peers` bumps `peers_gen`: the datapath's cache of
    the trie's answers (lib/peer_cache.h) then looks again."""
    peers, gen = maps.get("peers"), maps.get("peers_gen")
    if peers is None or gen is None:
        return

    def bump():
        value = gen.lookup(layout.Index(0))
        gen.update(layout.Index(0), layout.u32((value.value if value is not None else 0) + 1))
    peers.after_write = bump


class Attachment:
    """The pinned state of mrc-ebpf on a host's device(s) in this netns.

    The pins are named after the first device given to attach; a host
    with planes has one datapath over all its plane devices (one set of
    maps), and config.devices lists them."""

    def __init__(self, device: str, directory: Path):
        self.device = device
        self.dir = directory
        self.maps: dict[str, bpfsys.PinnedMap] = {}
        self.journal: journal.Journal | None = None

    @classmethod
    def open(cls, device: str) -> "Attachment":
        require_root()      # else every pin reads as EPERM, which is not damage
        pins.ensure_bpffs()
        directory = pins.device_dir(device)
        if not directory.is_dir():
            raise MrcError(f"{device} is not attached (mrcctl attach {device} --sid SID)")
        att = cls(device, directory)
        for name, (key, value, percpu) in layout.MAPS.items():
            try:
                att.maps[name] = bpfsys.PinnedMap(str(directory / name), key, value, percpu)
            except bpfsys.BpfError as e:
                raise MrcError(f"{device}: pinned state is damaged or from another version ({e}); "
                               f"`mrcctl detach {device}` clears it")
        watch_peers(att.maps)
        return att

    def close(self):
        for m in self.maps.values():
            m.close()

    @contextlib.contextmanager
    def transaction(self):
        """All or nothing: the maps and routes changed inside are put back
        as they were if anything fails, also if this process is killed
        (journal.py: the next command rolls it back)."""
        with journal.logged() as log:
            changes = journal.Journal(log)
            self.journal = changes
            for m in self.maps.values():
                m.journal = changes
            try:
                yield changes
            except BaseException as e:
                self._end_journal()
                problems = changes.rollback()
                if problems:
                    raise MrcError(f"{_reason(e)}; rolling back failed too, state may be half-changed "
                                   f"(`mrcctl detach {self.device}` clears it): {'; '.join(problems)}")
                if isinstance(e, bpfsys.BpfError):
                    raise MrcError(f"{_reason(e)}; nothing was changed")
                raise
            finally:
                self._end_journal()

    def _end_journal(self):
        self.journal = None
        for m in self.maps.values():
            m.journal = None

    def route_change(self, ipr, prefix) -> None:
        """Call before changing PREFIX's routes inside a transaction: the
        journal can then put them back."""
        if self.journal is None:
            return
        self.journal.before_write(f"route {prefix}")
        self.journal.record_routes([(str(prefix), routes.snapshot(ipr, prefix))])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def config(self) -> layout.Config:
        return self.maps["config"].lookup(layout.Index(0))

    @property
    def ifindexes(self) -> list[int]:
        cfg = self.config
        return [cfg.devices[i].ifindex for i in range(min(cfg.n_devices, MAX_DEVICES))]

    def device_names(self) -> list[str]:
        return [hooks.ifname_of(i) or f"ifindex {i}" for i in self.ifindexes]

    def prog_id(self, name: str) -> int:
        return bpfsys.pinned_prog_id(str(self.dir / name))

    def counters(self) -> dict[str, int]:
        m = self.maps["counters"]
        names = source.counter_names()
        return {name: sum(m.lookup(layout.Index(i)) or [0]) for i, name in enumerate(names)}


MAX_DEVICES = source.C["MRC_MAX_DEVICES"]


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


@contextlib.contextmanager
def changing(device: str | None):
    """The attachment DEVICE belongs to (or the only one here), opened for
    a change: one writer at a time (lock.py), all or nothing."""
    require_root()
    with lock.writer(), terminate_as_error():
        with Attachment.open(resolve_device(device)) as att:
            with att.transaction():
                yield att


class Terminated(MrcError):
    pass


@contextlib.contextmanager
def terminate_as_error():
    """SIGTERM and SIGHUP (a script's timeout, a closed terminal) during a
    change raise, so the change is rolled back instead of cut short."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise Terminated(f"stopped by {signal.Signals(signum).name}")
    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def device_members(directory: Path) -> list[layout.Device]:
    """The devices an attachment spans, from its pinned config."""
    cfg = _read_config(directory)
    if cfg is None:
        return []
    return [cfg.devices[i] for i in range(min(cfg.n_devices, MAX_DEVICES))]


def owner(device: str) -> str | None:
    """The attachment (its first device's name) that DEVICE belongs to."""
    if pins.device_dir(device).is_dir():
        return device
    for first in pins.attached_devices():
        if any(hooks.ifname_of(d.ifindex) == device for d in device_members(pins.device_dir(first))):
            return first
    return None


def resolve_device(device: str | None) -> str:
    """The attachment a command is about: the one DEVICE belongs to, or
    the only one here."""
    require_root()
    if device:
        return owner(device) or device
    attached = pins.attached_devices()
    if len(attached) == 1:
        return attached[0]
    if not attached:
        raise MrcError("no device is attached in this network namespace (mrcctl attach DEV --sid SID)")
    raise MrcError(f"several devices are attached ({', '.join(attached)}): say which with --dev")


# Defaults for a datacenter (MRC_DEFAULT_*_US of mrc_common.h)
TIMERS = layout.TIMER_DEFAULTS


def _check_free(ipr: IPRoute, devices: list[str], mode: str = "auto") -> list[tuple[int, dict | None]]:
    """Every device exists and is not ours yet; (ifindex, the XDP program
    already there that mrc_rx will chain to, or None) for each."""
    if len(set(devices)) != len(devices):
        raise MrcError(f"a device is named twice: {' '.join(devices)}")
    if len(devices) > MAX_DEVICES:
        raise MrcError(f"{len(devices)} devices: one attachment spans at most {MAX_DEVICES}")
    indexes = []
    for device in devices:
        index = hooks.ifindex(ipr, device)
        first = owner(device)
        if first:
            raise MrcError(f"{device} is already attached (mrcctl detach {first} first)")
        indexes.append((index, xdp_chain.other_program(ipr, device, index, mode)))
    return indexes


def _check_sid_free(sid: ipaddress.IPv6Address) -> None:
    """Decapsulation and feedback go by SID: two attachments in one
    namespace must not share one."""
    for first in pins.attached_devices():
        cfg = _read_config(pins.device_dir(first))
        if cfg is not None and bytes(cfg.sid) == sid.packed:
            raise MrcError(f"SID {sid} is already the SID of {first} in this network namespace")


def _hook(ipr: IPRoute, device: str, index: int, tx, rx, fb, mode: str, granularity: str,
          undo: list, other: dict | None = None, chain_fd: int = -1,
          slot: int = 0, link_rate_mbps: int = 0) -> tuple[layout.Device, str]:
    """Hook the programs to one device; what it changed goes on `undo`.
    OTHER: the XDP program already there, which mrc_rx takes the place
    of and hands on to (xdp_chain.py)."""
    info = hooks.device_info(ipr, index)
    flags = 0
    used_mode = _xdp_hook(device, index, rx.fd, xdp_mode(device, mode)[0], undo, other, chain_fd, slot)
    if other:
        flags |= xdp_chain.CFG_XDP_CHAINED
    if used_mode == "skb":
        flags |= CFG_XDP_SKB
    if not hooks.has_clsact(ipr, index):
        hooks.add_clsact(ipr, index)
        undo.append(lambda: hooks.del_clsact(ipr, index))
        flags |= CFG_CLSACT_OURS
    hooks.tc_attach(ipr, index, tx.fd, "mrc_tx")
    undo.append(lambda: hooks.tc_detach(ipr, index))
    hooks.tc_attach(ipr, index, fb.fd, "mrc_fb", hooks.TC_INGRESS_PARENT)
    undo.append(lambda: hooks.tc_detach(ipr, index, hooks.TC_INGRESS_PARENT))
    saved_segs = offload.gso_max_segs(device)
    segs = offload.choose(granularity, device, info["mtu"], link_rate_mbps)
    if segs != saved_segs:
        offload.set_gso_max_segs(device, segs)
        undo.append(lambda: offload.set_gso_max_segs(device, saved_segs))
    return layout.Device(ifindex=index, flags=flags, saved_gso_max_segs=saved_segs,
                         mtu=info["mtu"], granularity=offload.GRANULARITIES.index(granularity),
                         link_mbps=link_rate_mbps), used_mode


def _granularity_fields(granularity: str, device: str, member: layout.Device) -> dict:
    told = offload.describe(granularity, offload.gso_max_segs(device),
                            member.link_mbps or offload.wire_mbps(device), member.mtu)
    return {"granularity": told["what"], "granularity_why": told["why"]}


def xdp_mode(device: str, mode: str) -> tuple[str, str]:
    """The XDP mode to ask for on DEVICE, and why.  auto: native, but
    generic on a veth, whose native XDP takes segmentation offload off
    its peer (the sender) and bounds the peer's MTU: one TCP flow ran at
    4.1 Gbit/s native against 10.8 generic (docs/performance/line-rate.md)."""
    if mode != "auto":
        return mode, "asked for (--mode)"
    if offload.kind(device) == "veth":
        return "skb", "auto: generic on veth (native XDP turns the peer's GSO/TSO off)"
    return "auto", "auto: native where the driver has it"


def _xdp_hook(device: str, index: int, rx_fd: int, mode: str, undo: list,
              other: dict | None = None, chain_fd: int = -1, slot: int = 0) -> str:
    """Put mrc_rx (RX_FD) on DEVICE's XDP hook; returns the mode used.
    With OTHER there, mrc_rx takes its place atomically and chains to it
    through slot SLOT of the chain map (CHAIN_FD)."""
    if other is None:
        used_mode = hooks.xdp_attach(device, rx_fd, mode)
        undo.append(lambda: hooks.xdp_detach(device, used_mode))
        return used_mode
    xdp_chain.chain_and_replace(device, index, chain_fd, slot, other, rx_fd)
    rx_id = bpfsys.prog_info(rx_fd).id
    undo.append(lambda: xdp_chain.put_back(index, other["id"], other["mode"], rx_id))
    return other["mode"]


def attach(devices: str | list[str], sid_text: str, mode: str = "auto",
           granularity: str = "auto", retrans_steer: bool = True, min_active: int = 0,
           key_file: str | None = None, shared_fate: bool = False,
           link_rate_mbps: int = 0, skip_rotations: int | None = None,
           probe_budget: int | None = None, active_peers: int | None = None, **timers: int) -> dict:
    """Attach one datapath to DEVICES (one, or a host's plane devices).
    With KEY_FILE, the TLVs it sends are signed and only authentic ones
    from peers are filed (datapath/auth.py).  ACTIVE_PEERS sizes the
    LRUs of learnt and receive state (active_sizes).  Upgrading a running
    one in place is replace.replace (it builds on this module)."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath import auth
    require_root()
    sizes = active_sizes(active_peers)
    key = auth.read_key(key_file) if key_file else None
    devices = [devices] if isinstance(devices, str) else list(devices)
    if not devices:
        raise MrcError("attach needs a device")
    sid = parse_sid(sid_text)
    pins.ensure_bpffs()
    routes.name_protocol()
    directory = pins.device_dir(devices[0])
    unknown = set(timers) - set(TIMERS)
    if unknown:
        raise MrcError(f"unknown timer(s): {', '.join(sorted(unknown))}")
    timers = {**TIMERS, **{k: v for k, v in timers.items() if v is not None}}
    with IPRoute() as ipr:
        found = _check_free(ipr, devices, mode)     # fail fast, before compiling
    attach_types = {other["attach_type"] for _, other in found if other}
    if len(attach_types) > 1:
        raise MrcError("the devices' XDP programs were loaded with different attach types "
                       "(bcc's and libbpf's): mrc_rx can chain to one kind only; attach them apart")
    module, tx, rx, fb = load_datapath(attach_types.pop() if attach_types else 0, sizes)
    undo: list = []
    with lock.writer(), IPRoute() as ipr:
        found = _check_free(ipr, devices, mode)     # again: another writer may have been first
        indexes = [index for index, _ in found]
        _check_sid_free(sid)
        try:
            directory.mkdir()
            undo.append(lambda: pins.remove_tree(directory))
            for name in layout.MAPS:
                bpfsys.obj_pin(module[layout.symbol(name)].map_fd, str(directory / name))
            bpfsys.obj_pin(module[EVENT_RING].map_fd, str(directory / EVENT_RING))
            chain_fd = module[xdp_chain.CHAIN_MAP].map_fd
            bpfsys.obj_pin(chain_fd, str(directory / xdp_chain.CHAIN_MAP))
            bpfsys.obj_pin(tx.fd, str(directory / PROG_TX))
            bpfsys.obj_pin(rx.fd, str(directory / PROG_RX))
            bpfsys.obj_pin(fb.fd, str(directory / PROG_FB))

            # mrc_rx finds a device's chain slot in the config: written
            # before the hooks, so a chained program gets every packet
            # from the swap on (the rest of the config follows them)
            early = layout.Config(n_devices=len(devices))
            for i, (index, other) in enumerate(found):
                early.devices[i].ifindex = index
                early.devices[i].flags = xdp_chain.CFG_XDP_CHAINED if other else 0
            config = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
            config.update(layout.Index(0), early)
            config.close()

            # min_active is MRC's ev_min_active: the floor of usable paths per peer
            cfg = layout.Config(n_devices=len(devices), retrans_steer=int(retrans_steer),
                                min_active=min_active, shared_fate=int(shared_fate),
                                skip_rotations=layout.SETTING_DEFAULTS["skip_rotations"]
                                if skip_rotations is None else skip_rotations,
                                probe_budget=layout.SETTING_DEFAULTS["probe_budget"]
                                if probe_budget is None else probe_budget, **timers)
            ctypes.memmove(cfg.sid, sid.packed, 16)
            modes = []
            for i, (device, (index, other)) in enumerate(zip(devices, found)):
                cfg.devices[i], used_mode = _hook(ipr, device, index, tx, rx, fb, mode,
                                                  granularity, undo, other, chain_fd, i,
                                                  link_rate_mbps)
                modes.append(used_mode)
            cfg.mtu = min(cfg.devices[i].mtu for i in range(len(devices)))
            auth_value = auth.initial(key)
            auth_map = bpfsys.PinnedMap(str(directory / "auth"), *layout.MAPS["auth"])
            auth_map.update(layout.Index(0), auth_value)
            auth_map.close()
            config = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
            config.update(layout.Index(0), cfg)
            config.close()
            # port status found in the kernel (bpf/mrc_ports.c), where it can be
            hooks = port_hook.attach(module.build, {sym.decode(): t.map_fd for sym, t in module.tables.items()},
                                     directory)
        except BaseException as e:
            for step in reversed(undo):
                step()
            if isinstance(e, (MrcError, KeyboardInterrupt)):
                raise
            raise MrcError(f"attach {' '.join(devices)} failed: {e}")
    return {"device": devices[0], "devices": devices, "ifindex": indexes[0], "sid": str(sid),
            "xdp_mode": modes[0], "xdp_why": xdp_mode(devices[0], mode)[1],
            **_granularity_fields(granularity, devices[0], cfg.devices[0]),
            "timers": timers, "pins": str(directory), "auth": auth.describe(auth_value),
            "xdp_chained": [{"device": d, "id": o["id"], "name": o["name"]}
                            for d, (_, o) in zip(devices, found) if o],
            "shared_fate": bool(shared_fate), "skip_rotations": cfg.skip_rotations,
            "probe_budget": cfg.probe_budget,
            "active_peers": ACTIVE_PEERS_DEFAULT if active_peers is None else active_peers,
            "port_status": {"detector": port_hook.detector(hooks["hooked"]), **hooks},
            "build": module.build.origin}


def _unhook(ipr: IPRoute, member: layout.Device | None, device: str, ids: tuple[int, int, int],
            removed: dict, directory: Path | None = None, slot: int = 0) -> None:
    """Take our programs off one device; leave anything that is not ours,
    and put back the XDP program mrc_rx chained to (atomically)."""
    rx_id, tx_id, fb_id = ids
    found = ipr.link_lookup(ifname=device)
    if not found:
        return
    index = found[0]
    flags = member.flags if member else 0
    info = hooks.device_info(ipr, index)
    restored = 0
    if flags & xdp_chain.CFG_XDP_CHAINED and directory is not None:
        mode = "skb" if flags & CFG_XDP_SKB else "native"
        restored = xdp_chain.restore(directory, device, index, slot, mode, rx_id)
        if restored:
            removed["xdp"] = True
            removed["xdp_restored"].append({"device": device, "id": restored})
    if not restored and info["xdp_prog_id"] and info["xdp_prog_id"] == rx_id:
        hooks.xdp_detach(device, info["xdp_mode"])
        removed["xdp"] = True
    if hooks.tc_egress_prog_ids(index).get(hooks.TC_PRIO) == tx_id:
        hooks.tc_detach(ipr, index)
        removed["tc"] = True
    if fb_id and hooks.tc_egress_prog_ids(index, "ingress").get(hooks.TC_PRIO) == fb_id:
        hooks.tc_detach(ipr, index, hooks.TC_INGRESS_PARENT)
    if flags & CFG_CLSACT_OURS and not hooks.tc_egress_prog_ids(index) \
            and not hooks.tc_egress_prog_ids(index, "ingress"):
        hooks.del_clsact(ipr, index)
        removed["clsact"] = True
    removed["routes"] += routes.remove_all(ipr, index)
    saved = member.saved_gso_max_segs if member else 0
    if saved and offload.gso_max_segs(device) != saved:
        offload.set_gso_max_segs(device, saved)


def detach(device: str) -> dict:
    """Undo attach, on every device of the attachment DEVICE belongs to.
    Works from the program pins and the config alone, so state left by
    another version (or damaged) can still be cleared."""
    require_root()
    with lock.writer(create=False, recover="lenient") as locked:
        first = owner(device) if locked else None
        if first is None:
            raise MrcError(f"{device} is not attached")
        return _detach(first)


def _detach(first: str) -> dict:
    from pyroute2 import IPRoute
    directory = pins.device_dir(first)
    probe = Attachment(first, directory)
    ids = probe.prog_id(PROG_RX), probe.prog_id(PROG_TX), probe.prog_id(PROG_FB)
    members = device_members(directory)
    names = [hooks.ifname_of(m.ifindex) for m in members] or [first]
    removed = {"device": first, "devices": [n for n in names if n], "xdp": False, "tc": False,
               "clsact": False, "routes": 0, "xdp_restored": []}
    with IPRoute() as ipr:
        if not members:     # unreadable config: at least the device it is named after
            _unhook(ipr, None, first, ids, removed)
        for slot, (member, name) in enumerate(zip(members, names)):
            if name:
                _unhook(ipr, member, name, ids, removed, directory, slot)
    pins.remove_tree(directory)
    return removed


def _undo_attach(step: dict) -> None:
    """A journal step: the attachment a cut-short `apply` was making goes
    (detached as by `detach`, whatever of it was made)."""
    if pins.device_dir(step["device"]).is_dir():
        _detach(step["device"])


journal.HANDLERS["detach"] = _undo_attach



def _read_config(directory: Path) -> layout.Config | None:
    """The pinned config, or None when it is missing or of another layout."""
    try:
        fd = bpfsys.obj_get(str(directory / "config"))
    except bpfsys.BpfError:
        return None
    try:
        if bpfsys.map_info(fd).value_size != ctypes.sizeof(layout.Config):
            return None
        cfg = layout.Config()
        return cfg if bpfsys.map_lookup(fd, layout.Index(0), cfg) else None
    except bpfsys.BpfError:
        return None
    finally:
        os.close(fd)
