"""Loading the datapath, attaching it to a device, and finding it again.

`attach` compiles bpf/mrc.c once, pins its maps and programs (pins.py),
hooks the programs to the device and returns: the datapath outlives the
process.  Every later command opens the pins (`Attachment.open`) and works
on the maps without compiling.
"""
from __future__ import annotations

import ctypes
import ipaddress
import os
from pathlib import Path

from pyroute2 import IPRoute

from . import bpfsys, hooks, layout, offload, pins, routes, source
from .errors import MrcError

PROG_TX, PROG_RX, PROG_FB = "prog_tx", "prog_rx", "prog_fb"
CFG_CLSACT_OURS = 0x1       # config.flags: detach removes clsact too
CFG_XDP_SKB = 0x2           # config.flags: XDP attached in skb mode


def require_root() -> None:
    if os.geteuid() != 0:
        raise MrcError("must run as root (needs CAP_BPF and CAP_NET_ADMIN)")


def parse_sid(text: str) -> ipaddress.IPv6Address:
    try:
        sid = ipaddress.IPv6Address(text)
    except ValueError:
        raise MrcError(f"bad SID {text!r}: expected an IPv6 address such as fc00:0:1::")
    if sid.is_multicast or sid.is_link_local or sid.is_unspecified or sid.is_loopback:
        raise MrcError(f"bad SID {text!r}: must be a global or unique-local unicast address")
    return sid


def compile_datapath():
    """Compile and load the programs; returns (bcc module, tx, rx, fb)."""
    try:
        from bcc import BPF
    except ImportError:
        raise MrcError("bcc is not installed: apt-get install python3-bpfcc, and use a venv "
                       "made with --system-site-packages (`make setup` does both)")
    build = Path(f"/lib/modules/{os.uname().release}/build")
    if not (build / "include").exists() and not (build / "Makefile").exists():
        raise MrcError(f"kernel headers missing at {build}: apt-get install linux-headers-amd64 "
                       f"and link them there (`make setup` does this)")
    try:
        module = BPF(text=source.expand().encode(), cflags=["-Wno-unused-function", "-Wno-compare-distinct-pointer-types"])
        tx = module.load_func("mrc_tx", BPF.SCHED_CLS)
        rx = module.load_func("mrc_rx", BPF.XDP)
        fb = module.load_func("mrc_fb", BPF.SCHED_CLS)
    except Exception as e:  # bcc raises bare Exception; the verifier log went to stderr
        raise MrcError(f"cannot load the datapath: {e}")
    return module, tx, rx, fb


class Attachment:
    """The pinned state of mrc-ebpf on one device of this netns."""

    def __init__(self, device: str, directory: Path):
        self.device = device
        self.dir = directory
        self.maps: dict[str, bpfsys.PinnedMap] = {}

    @classmethod
    def open(cls, device: str) -> "Attachment":
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
        return att

    def close(self):
        for m in self.maps.values():
            m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def config(self) -> layout.Config:
        return self.maps["config"].lookup(layout.Index(0))

    def prog_id(self, name: str) -> int:
        try:
            fd = bpfsys.obj_get(str(self.dir / name))
        except bpfsys.BpfError:
            return 0
        try:
            return bpfsys.prog_info(fd).id
        finally:
            os.close(fd)

    def counters(self) -> dict[str, int]:
        m = self.maps["counters"]
        names = source.counter_names()
        return {name: sum(m.lookup(layout.Index(i)) or [0]) for i, name in enumerate(names)}


def resolve_device(device: str | None) -> str:
    """The device a command is about: given, or the only one attached here."""
    if device:
        return device
    attached = pins.attached_devices()
    if len(attached) == 1:
        return attached[0]
    if not attached:
        raise MrcError("no device is attached in this network namespace (mrcctl attach DEV --sid SID)")
    raise MrcError(f"several devices are attached ({', '.join(attached)}): say which with --dev")


# Defaults for a datacenter: round trips of tens of microseconds.
TIMERS = {"loss_hold_us": 20000, "ack_timeout_us": 1000, "probe_us": 5000, "fb_interval_us": 100}


def attach(device: str, sid_text: str, mode: str = "auto", granularity: str = "packet",
           **timers: int) -> dict:
    require_root()
    sid = parse_sid(sid_text)
    pins.ensure_bpffs()
    directory = pins.device_dir(device)
    undo: list = []
    with IPRoute() as ipr:
        index = hooks.ifindex(ipr, device)
        if directory.exists():
            raise MrcError(f"{device} is already attached (mrcctl detach {device} first)")
        info = hooks.device_info(ipr, index)
        if info["xdp_prog_id"]:
            raise MrcError(f"{device} already has an XDP program (id {info['xdp_prog_id']}); "
                           f"remove it first")
        unknown = set(timers) - set(TIMERS)
        if unknown:
            raise MrcError(f"unknown timer(s): {', '.join(sorted(unknown))}")
        timers = {**TIMERS, **{k: v for k, v in timers.items() if v is not None}}
        module, tx, rx, fb = compile_datapath()
        try:
            directory.mkdir(parents=True)
            undo.append(lambda: pins.remove_tree(directory))
            for name in layout.MAPS:
                bpfsys.obj_pin(module[name].map_fd, str(directory / name))
            bpfsys.obj_pin(tx.fd, str(directory / PROG_TX))
            bpfsys.obj_pin(rx.fd, str(directory / PROG_RX))
            bpfsys.obj_pin(fb.fd, str(directory / PROG_FB))

            flags = 0
            used_mode = hooks.xdp_attach(device, rx.fd, mode)
            undo.append(lambda: hooks.xdp_detach(device, used_mode))
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
            if granularity == "packet" and saved_segs != 1:
                offload.set_gso_max_segs(device, 1)
                undo.append(lambda: offload.set_gso_max_segs(device, saved_segs))

            cfg = layout.Config(mtu=info["mtu"], flags=flags, saved_gso_max_segs=saved_segs,
                                **timers)
            ctypes.memmove(cfg.sid, sid.packed, 16)
            config = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
            config.update(layout.Index(0), cfg)
            config.close()
        except BaseException as e:
            for step in reversed(undo):
                step()
            if isinstance(e, (MrcError, KeyboardInterrupt)):
                raise
            raise MrcError(f"attach {device} failed: {e}")
    return {"device": device, "ifindex": index, "sid": str(sid), "xdp_mode": used_mode,
            "granularity": offload.granularity(device), "timers": timers, "pins": str(directory)}


def detach(device: str) -> dict:
    """Undo attach.  Works from the program pins and the config alone, so
    state left by another version (or damaged) can still be cleared."""
    require_root()
    pins.ensure_bpffs()
    directory = pins.device_dir(device)
    if not directory.is_dir():
        raise MrcError(f"{device} is not attached")
    probe = Attachment(device, directory)
    rx_id, tx_id, fb_id = probe.prog_id(PROG_RX), probe.prog_id(PROG_TX), probe.prog_id(PROG_FB)
    flags, saved_segs = _config_words(directory)
    removed = {"device": device, "xdp": False, "tc": False, "clsact": False, "routes": 0}
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=device)
        if found:
            index = found[0]
            info = hooks.device_info(ipr, index)
            if info["xdp_prog_id"] and info["xdp_prog_id"] == rx_id:
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
            removed["routes"] = routes.remove_all(ipr, index)
            if saved_segs and offload.gso_max_segs(device) != saved_segs:
                offload.set_gso_max_segs(device, saved_segs)
    pins.remove_tree(directory)
    try:
        pins.netns_dir().rmdir()
    except OSError:
        pass
    return removed


def _config_words(directory: Path) -> tuple[int, int]:
    """(config.flags, config.saved_gso_max_segs), read as raw bytes so a
    layout change cannot stop detach."""
    try:
        fd = bpfsys.obj_get(str(directory / "config"))
    except bpfsys.BpfError:
        return 0, 0
    try:
        size = bpfsys.map_info(fd).value_size
        raw = (ctypes.c_uint8 * size)()
        attr = bpfsys._MapElemAttr(map_fd=fd, key=ctypes.addressof(layout.Index(0)),
                                   value=ctypes.addressof(raw))
        bpfsys._bpf(bpfsys.BPF_MAP_LOOKUP_ELEM, attr)
        def word(field):
            offset = field.offset
            return int.from_bytes(bytes(raw)[offset:offset + 4], "little") if size >= offset + 4 else 0
        return word(layout.Config.flags), word(layout.Config.saved_gso_max_segs)
    except bpfsys.BpfError:
        return 0, 0
    finally:
        os.close(fd)
