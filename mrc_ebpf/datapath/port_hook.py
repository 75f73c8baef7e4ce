"""Port status found in the kernel (bpf/mrc_ports.c): the fentry hooks on
netif_carrier_off, netif_carrier_on and __dev_notify_flags that set an
attachment's config.ports_down the instant one of its devices changes.

`attach` loads them on the attachment's maps and pins each hook's link
beside the maps (`port_hook_<function>`): the pin keeps the hook on after
mrcctl exits; detach removes the pins, and the hooks come off with them.
They need the kernel's BTF and fentry (6.1 and 6.18 here); where a hook
cannot attach, `hooked` says which did, and `mrcctl ports watch` finds
the changes from netlink instead (control/ports.py).

struct net_device is the kernel's own, its layout differs between
kernels, and bcc compiles against Debian's 6.1 headers whatever the
running kernel: the hooks read its fields at offsets taken here from the
running kernel's BTF (/sys/kernel/btf/vmlinux, through libbpf), written
to the port_hook map, so one build serves every kernel.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, build, hooks, layout, pins
from mrc_ebpf.datapath.source import C

BPF_TRACE_FENTRY = 24
# function in bpf/mrc_ports.c -> (the kernel function it hooks, its bit in port_hook.hooked)
HOOKS = {"mrc_port_off": ("netif_carrier_off", C["MRC_PORT_HOOK_CARRIER_OFF"]),
         "mrc_port_on": ("netif_carrier_on", C["MRC_PORT_HOOK_CARRIER_ON"]),
         "mrc_port_flags": ("__dev_notify_flags", C["MRC_PORT_HOOK_FLAGS"])}
# where the kernel refuses tracing programs: raw tracepoints on the
# link-watch work (function -> (tracepoint, its bit))
LW_HOOKS = {"mrc_port_lwq": ("workqueue_queue_work", C["MRC_PORT_HOOK_LW_QUEUE"]),
            "mrc_port_lwt": ("timer_start", C["MRC_PORT_HOOK_LW_TIMER"]),
            "mrc_port_lwx": ("workqueue_execute_start", C["MRC_PORT_HOOK_LW_RUN"])}
LEARN = ("mrc_port_learn", "net_dev_start_xmit")
PROGRAM_TYPES = {**{f: "TRACING" for f in HOOKS},
                 **{f: "RAW_TRACEPOINT" for f in (*LW_HOOKS, LEARN[0])}}
ALL_HOOKS = {**HOOKS, **LW_HOOKS}
PIN_PREFIX = "port_hook_"
ETH_P_LEARN = 0x88B5        # IEEE 802 local experimental: the learning frames'


_KIND_STRUCT, _KIND_UNION, _KIND_ENUM, _KIND_TYPEDEF, _KIND_FUNC = 4, 5, 6, 8, 12
_KIND_VOLATILE, _KIND_CONST, _KIND_RESTRICT, _KIND_TYPE_TAG, _KIND_ENUM64 = 9, 10, 11, 18, 19


class Btf:
    """The running kernel's BTF, through libbpf: type ids, member offsets
    (bytes) and enumerator values, by name."""

    def __init__(self):
        lib = bpfsys.libbpf()
        self._lib = lib
        self._btf = lib.btf__load_vmlinux_btf()
        if not self._btf:
            raise bpfsys.BpfError(ctypes.get_errno() or 2, "no kernel BTF (/sys/kernel/btf/vmlinux)")

    def close(self):
        if self._btf:
            self._lib.btf__free(self._btf)
            self._btf = None

    def _type(self, type_id: int) -> tuple[int, int, int, int]:
        """(name_off, kind, vlen, size_or_type, address, kind_flag) of TYPE_ID."""
        addr = self._lib.btf__type_by_id(self._btf, type_id)
        if not addr:
            raise KeyError(type_id)
        name_off, info, size = (ctypes.c_uint32 * 3).from_address(addr)
        return name_off, (info >> 24) & 0x1f, info & 0xffff, size, addr, info >> 31

    def _name(self, off: int) -> str:
        return (self._lib.btf__name_by_offset(self._btf, off) or b"").decode()

    def find(self, name: str, kind: int) -> int:
        found = self._lib.btf__find_by_name_kind(self._btf, name.encode(), kind)
        if found <= 0:
            raise KeyError(name)
        return found

    def _resolve(self, type_id: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        while True:
            _, kind, _, ref, _, _ = self._type(type_id)
            if kind not in (_KIND_TYPEDEF, _KIND_VOLATILE, _KIND_CONST, _KIND_RESTRICT, _KIND_TYPE_TAG):
                return type_id
            type_id = ref

    def offset(self, struct: str, *path: str) -> int:
        """The byte offset of STRUCT.PATH[0].PATH[1]... (anonymous
        structs and unions looked into)."""
        type_id, total = self.find(struct, _KIND_STRUCT), 0
        for member in path:
            found = self._member(type_id, member)
            if found is None:
                raise KeyError(f"{struct}.{'.'.join(path)}")
            type_id, bits = found
            total += bits
            type_id = self._resolve(type_id)
        if total % 8:
            raise KeyError(f"{struct}.{'.'.join(path)} is a bitfield")
        return total // 8

    def _member(self, type_id: int, name: str):
        _, kind, vlen, _, addr, kflag = self._type(self._resolve(type_id))
        if kind not in (_KIND_STRUCT, _KIND_UNION):
            return None
        members = (ctypes.c_uint32 * (3 * vlen)).from_address(addr + 12)
        for i in range(vlen):
            name_off, mtype, moff = members[3 * i:3 * i + 3]
            bits = moff & 0xffffff if kflag else moff
            if name_off and self._name(name_off) == name:
                return mtype, bits
            if not name_off:        # anonymous struct or union: look inside
                inner = self._member(mtype, name)
                if inner is not None:
                    return inner[0], bits + inner[1]
        return None

    def enumerator(self, enum: str, name: str) -> int:
        type_id = self.find(enum, _KIND_ENUM)
        _, _, vlen, _, addr, _ = self._type(type_id)
        values = (ctypes.c_uint32 * (2 * vlen)).from_address(addr + 12)
        for i in range(vlen):
            if self._name(values[2 * i]) == name:
                return ctypes.c_int32(values[2 * i + 1]).value
        raise KeyError(f"{enum}.{name}")


def kallsyms(*names: str) -> dict[str, int]:
    """Addresses of kernel functions (0 where hidden or absent)."""
    found = dict.fromkeys(names, 0)
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                addr, _, name = line.split()[:3]
                if name in found and not found[name]:
                    found[name] = int(addr, 16)
    except OSError:
        pass
    return found


def settings(btf: Btf) -> layout.PortHook:
    """What the hooks need to know of this kernel and namespace."""
    syms = kallsyms("linkwatch_event", "delayed_work_timer_fn")
    return layout.PortHook(
        lw_func=syms["linkwatch_event"], dwork_timer_fn=syms["delayed_work_timer_fn"],
        off_work_func=btf.offset("work_struct", "func"), off_timer_fn=btf.offset("timer_list", "function"),
        off_dwork_timer=btf.offset("delayed_work", "timer"), off_dwork_work=btf.offset("delayed_work", "work"),
        netns_cookie=pins.netns_cookie(),
        off_ifindex=btf.offset("net_device", "ifindex"), off_flags=btf.offset("net_device", "flags"),
        off_state=btf.offset("net_device", "state"),
        off_nd_net=btf.offset("net_device", "nd_net", "net"),
        off_net_cookie=btf.offset("net", "net_cookie"),
        nocarrier_bit=btf.enumerator("netdev_state_t", "__LINK_STATE_NOCARRIER"))


def attach(made: build.Build, maps: dict[str, int], directory: Path, link_watch: bool = False) -> dict:
    """The hooks of MADE loaded on MAPS (symbol -> fd: the attachment's)
    and attached, each link pinned in DIRECTORY; port_hook written.
    Returns {"hooked": [kernel functions], "errors": {function: why}};
    a hook that cannot load or attach is left out (the watcher's netlink
    then stands in), never an error of attach.  LINK_WATCH: where fentry
    is refused, the raw tracepoints on the link-watch work instead; off
    unless asked (`mrcctl ports hook on`), as they run on every work item
    and every timer started on the machine, not on link changes alone."""
    errors: dict[str, str] = {}
    hooked, names = 0, []
    try:
        btf = Btf()
    except (bpfsys.BpfError, OSError) as e:
        return {"hooked": [], "errors": {"btf": str(e)}}
    try:
        value = settings(btf)
        ids = {}
        for function, (kernel_fn, _) in HOOKS.items():
            try:
                ids[function] = btf.find(kernel_fn, _KIND_FUNC)
            except KeyError:
                errors[function] = f"{kernel_fn} is not in the kernel's BTF"
    except KeyError as e:
        return {"hooked": [], "errors": {"btf": f"not in the kernel's BTF: {e}"}}
    finally:
        btf.close()
    hook_map = bpfsys.PinnedMap(str(directory / "port_hook"), *layout.MAPS["port_hook"])
    try:
        # settings first: a hook that runs finds them
        hook_map.update(layout.Index(0), value)
        for function, btf_id in ids.items():
            bit, name = _hook(made, maps, directory, function, btf_id, HOOKS[function][0], errors)
            hooked |= bit
            names += [name] if bit else []
        if detector(names) != "kernel" and not link_watch:
            errors["link watch"] = "not asked for (`mrcctl ports hook on`: it runs on every timer started)"
        elif detector(names) != "kernel" and value.lw_func and value.dwork_timer_fn:
            if _learn(made, maps, directory, hook_map, errors):
                for function, (tracepoint, _) in LW_HOOKS.items():
                    bit, name = _hook(made, maps, directory, function, 0, tracepoint, errors)
                    hooked |= bit
                    names += [name] if bit else []
        elif detector(names) != "kernel":
            errors["link watch"] = "linkwatch_event or delayed_work_timer_fn not in /proc/kallsyms"
        value = hook_map.lookup(layout.Index(0))
        value.hooked = hooked
        hook_map.update(layout.Index(0), value)
    finally:
        hook_map.close()
    return {"hooked": names, "errors": errors}


def _hook(made, maps, directory: Path, function: str, btf_id: int, target: str, errors: dict) -> tuple[int, str]:
    """FUNCTION loaded and attached (a fentry on TARGET with BTF_ID, or a
    raw tracepoint TARGET), its link pinned: (its bit, TARGET), or (0, why)."""
    bit = ALL_HOOKS[function][1]
    try:
        inst = build.instantiate(made, maps, {function: BPF_TRACE_FENTRY if btf_id else 0}, [function],
                                 {function: btf_id})
    except (bpfsys.BpfError, build.ShapeError, build.RelocationError) as e:
        errors[function] = f"load: {e}"
        return 0, ""
    try:
        link = _open(inst.programs[function].fd, None if btf_id else target)
        try:
            bpfsys.obj_pin(link, str(directory / (PIN_PREFIX + function)))
        finally:
            os.close(link)
    except bpfsys.BpfError as e:
        errors[function] = f"attach to {target}: {e}"
        return 0, ""
    finally:
        inst.close()
    return bit, target


def _open(prog_fd: int, tracepoint: str | None) -> int:
    if tracepoint is None:
        return bpfsys.tracing_attach(prog_fd)
    return bpfsys.raw_tracepoint_attach(prog_fd, tracepoint)


def _learn(made, maps, directory: Path, hook_map, errors: dict) -> bool:
    """The link-watch hooks read our devices through their struct
    net_device: learnt here from one frame sent on each (the learning
    hook on net_dev_start_xmit attached only meanwhile).  True when every
    device was learnt."""
    import socket
    function, tracepoint = LEARN
    try:
        inst = build.instantiate(made, maps, {function: 0}, [function], {function: 0})
    except (bpfsys.BpfError, build.ShapeError, build.RelocationError) as e:
        errors[function] = f"load: {e}"
        return False
    cfg = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
    try:
        link = bpfsys.raw_tracepoint_attach(inst.programs[function].fd, tracepoint)
        try:
            c = cfg.lookup(layout.Index(0))
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
                for i in range(c.n_devices):
                    name = hooks.ifname_of(c.devices[i].ifindex)
                    if name:
                        frame = b"\xff" * 6 + bytes(6) + ETH_P_LEARN.to_bytes(2, "big") + bytes(46)
                        try:
                            sock.sendto(frame, (name, ETH_P_LEARN))
                        except OSError as e:
                            errors[function] = f"a frame on {name}: {e}"
            learnt = hook_map.lookup(layout.Index(0)).devs
            missing = [i for i in range(c.n_devices) if not learnt[i]]
        finally:
            os.close(link)
    except bpfsys.BpfError as e:
        errors[function] = f"attach to {tracepoint}: {e}"
        return False
    finally:
        cfg.close()
        inst.close()
    if missing:
        errors[function] = f"devices of planes {missing} not learnt (down? their frame did not leave)"
    return not missing


def detach(directory: Path) -> int:
    """The hooks' pins removed (they come off): how many there were."""
    n = 0
    for function in ALL_HOOKS:
        pin = directory / (PIN_PREFIX + function)
        if pin.exists():
            pin.unlink()
            n += 1
    return n


def state(att) -> dict:
    """Which detects the port status: the kernel's hooks (and on which
    functions) or, without them, `mrcctl ports watch` from netlink."""
    m = att.maps.get("port_hook")
    value = m.lookup(layout.Index(0)) if m is not None else None
    pinned = [f for f in ALL_HOOKS if (att.dir / (PIN_PREFIX + f)).exists()]
    hooked = [ALL_HOOKS[f][0] for f in pinned if value is not None and value.hooked & ALL_HOOKS[f][1]]
    return {"detector": detector(hooked), "hooks": hooked,
            "calls": value.calls if value is not None else 0,
            "changes": value.changes if value is not None else 0,
            "last_ns": value.last_ns if value is not None else 0}


def detector(hooked: list[str]) -> str:
    """"kernel" when both carrier hooks are on (a lost carrier, the case
    that matters, is seen), or the link-watch hooks on its queueing and
    its run; else "watcher" (netlink, control/ports.py)."""
    got = set(hooked)
    if {"netif_carrier_off", "netif_carrier_on"} <= got or \
            {"workqueue_queue_work", "workqueue_execute_start"} <= got:
        return "kernel"
    return "watcher"


def in_kernel(att) -> bool:
    return state(att)["detector"] == "kernel"


def set_hooks(att, on: bool, made: build.Build | None = None, event_ring: str = "") -> dict:
    """`mrcctl ports hook on|off`: the hooks attached (from MADE, the
    installed build, on the pinned maps and EVENT_RING, the event ring's
    pin name: the loader's, which imports this module) or taken off, on a
    running attachment.  The caller then publishes the ports' state they
    start from (control/ports.py)."""
    detach(att.dir)
    m = att.maps["port_hook"]
    value = m.lookup(layout.Index(0))
    value.hooked = 0
    m.update(layout.Index(0), value)
    if not on:
        return {"hooked": [], "errors": {}}
    fds = {layout.symbol(name): pm.fd for name, pm in att.maps.items()}
    ring = bpfsys.obj_get(str(att.dir / event_ring))
    try:
        out = attach(made, {**fds, event_ring: ring}, att.dir, link_watch=True)
    finally:
        os.close(ring)
    return out
