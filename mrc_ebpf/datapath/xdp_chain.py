"""Sharing a device's XDP hook with the program that was there first.

A device runs one XDP program per mode.  The libxdp dispatcher protocol
(xdp-loader) loads each component as a BPF_PROG_TYPE_EXT (freplace)
program aimed at one of the dispatcher's slots, which needs
attach_prog_fd and attach_btf_id at load time; bcc's load_func (0.26)
sets attach_btf_id only for tracing/LSM programs and never
attach_prog_fd, so mrc_rx cannot be such a component.  Instead mrc_rx
chains: attach puts the device's program in the pinned prog array
mrc_xdp_chain (slot i for config.devices[i]), marks the device
MRC_DEV_F_XDP_CHAINED and swaps mrc_rx in with XDP_FLAGS_REPLACE
(the kernel checks the program it replaces is still that one); mrc_rx
tail-calls it with every packet it passes (bpf/lib/xdp_chain.h).
Detach swaps it back the same way, so neither swap leaves a moment
without it.
"""
from __future__ import annotations

import ctypes
import errno
import os

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, hooks, source
from mrc_ebpf.datapath.bpfsys import BpfError
from mrc_ebpf.errors import MrcError

CHAIN_MAP = "mrc_xdp_chain"     # the pin of the prog array (bpf/lib/maps.h)
CFG_XDP_CHAINED = source.C["MRC_DEV_F_XDP_CHAINED"]

XDP_FLAGS_REPLACE = 1 << 4
MODE_FLAGS = {"native": hooks.XDP_FLAGS_DRV_MODE, "skb": hooks.XDP_FLAGS_SKB_MODE}
BPF_PROG_TYPE_XDP = 6
DISPATCHER_NAME = "xdp_dispatcher"   # libxdp's dispatcher program
MRC_RX_NAME = "mrc_rx"


def prog_fd_by_id(prog_id: int) -> int:
    return bpfsys.prog_fd_by_id(prog_id)


BPF_MAP_TYPE_PROG_ARRAY = 3
BPF_XDP = 37                        # enum bpf_attach_type: what libbpf loads SEC("xdp") with
BPF_F_XDP_HAS_FRAGS = 1 << 5


def _insn(code: int, dst: int = 0, src: int = 0, imm: int = 0) -> int:
    return code | (dst << 8) | (src << 12) | ((imm & 0xFFFFFFFF) << 32)


def tail_call_profile(prog_id: int) -> tuple[int, bool]:
    """What a caller must be loaded with to tail-call program PROG_ID:
    (expected_attach_type, xdp.frags).  The kernel lets a program tail-call
    only programs alike in both (6.18 checks the attach type: libbpf loads
    SEC("xdp") with BPF_XDP, bcc with none), and prog_info tells neither;
    so a scratch prog array takes PROG_ID first (making it the array's
    model) and a two-instruction caller is loaded each way until one fits."""
    fd = prog_fd_by_id(prog_id)
    array = bpfsys.map_create(BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 1, "mrc_chain_probe")
    try:
        _slot_update(array, 0, fd)
        insns = bytes((ctypes.c_uint64 * 6)(
            _insn(0x18, dst=2, src=1, imm=array), 0,     # r2 = the prog array
            _insn(0xb7, dst=3, imm=0),                   # r3 = 0
            _insn(0x85, imm=12),                         # bpf_tail_call(ctx, r2, r3)
            _insn(0xb7, dst=0, imm=2),                   # return XDP_PASS
            _insn(0x95)))
        for frags in (False, True):
            for attach_type in (0, BPF_XDP):
                try:
                    os.close(bpfsys.prog_load(BPF_PROG_TYPE_XDP, insns, "GPL", "mrc_chain_probe",
                                              attach_type, BPF_F_XDP_HAS_FRAGS if frags else 0,
                                              log=False))
                    return attach_type, frags
                except BpfError:
                    continue
        raise BpfError(errno.EINVAL, "no tail call to it loads")
    finally:
        os.close(array)
        os.close(fd)


def prog_name(prog_id: int) -> str:
    try:
        fd = prog_fd_by_id(prog_id)
    except BpfError:
        return ""
    try:
        return bpfsys.prog_info(fd).name.decode(errors="replace")
    finally:
        os.close(fd)


def other_program(ipr: IPRoute, device: str, index: int, mode: str) -> dict | None:
    """The XDP program already on DEVICE, if mrc_rx can chain to it:
    {"id", "name", "mode"}; a clear error where it cannot.  MODE is what
    the user asked for (native|skb|auto)."""
    info = hooks.device_info(ipr, index)
    prog_id, on = info["xdp_prog_id"], info["xdp_mode"]
    if not prog_id:
        return None
    if on in ("hw", "multi"):
        raise MrcError(f"{device} has XDP offloaded to the NIC (prog id {prog_id}): mrc_rx "
                       f"cannot chain to a program that runs on the NIC")
    if mode != "auto" and mode != on:
        raise MrcError(f"{device}'s XDP program (id {prog_id}) runs in {on} mode: mrc_rx takes "
                       f"its place in the same mode (--mode {on} or auto)")
    try:
        fd = prog_fd_by_id(prog_id)
    except BpfError as e:
        raise MrcError(f"{device}: cannot open its XDP program id {prog_id}: {e.strerror}")
    try:
        name = bpfsys.prog_info(fd).name.decode(errors="replace")
    finally:
        os.close(fd)
    if name == MRC_RX_NAME:
        raise MrcError(f"{device}'s XDP program (id {prog_id}) is an mrc_rx whose attachment is "
                       f"gone: remove it (ip link set dev {device} xdp off) and attach again")
    if name == DISPATCHER_NAME:
        raise MrcError(f"{device}'s XDP program (id {prog_id}) is libxdp's dispatcher "
                       f"(xdp-loader): the kernel refuses a tail call into a program extended "
                       f"by freplace; unload it (xdp-loader unload {device} --all) first")
    try:
        attach_type, frags = tail_call_profile(prog_id)
    except BpfError as e:
        why = {errno.EBUSY: "it is extended by freplace programs (a dispatcher)"}
        raise MrcError(f"cannot chain to {device}'s XDP program {name or '?'} (id {prog_id}): "
                       f"the kernel refuses a tail call to it "
                       f"({why.get(e.errno, 'device-bound, or not JIT-compiled like mrc_rx')})")
    if frags:
        raise MrcError(f"cannot chain to {device}'s XDP program {name or '?'} (id {prog_id}): it "
                       f"is an xdp.frags (multi-buffer) program and mrc_rx is not one (bcc cannot "
                       f"load it as one); load that program without xdp.frags")
    return {"id": prog_id, "name": name, "mode": on, "attach_type": attach_type}


def xdp_set(index: int, prog_fd: int, mode: str, expected_fd: int | None = None) -> None:
    """Put PROG_FD (-1: nothing) on the device's XDP hook in MODE; with
    EXPECTED_FD, atomically and only if that program is the one there
    (XDP_FLAGS_REPLACE), else it fails with EEXIST."""
    from pyroute2 import IPRoute
    flags = MODE_FLAGS[mode]
    attrs = [("IFLA_XDP_FD", prog_fd)]
    if expected_fd is not None:
        flags |= XDP_FLAGS_REPLACE
        attrs.append(("IFLA_XDP_EXPECTED_FD", expected_fd))
    attrs.append(("IFLA_XDP_FLAGS", flags))
    with IPRoute() as ipr:
        ipr.link("set", index=index, xdp={"attrs": attrs})


def chain_and_replace(device: str, index: int, chain_fd: int, slot: int, other: dict,
                      rx_fd: int) -> None:
    """Put OTHER (other_program's answer) in slot SLOT of the chain map,
    then swap mrc_rx in for it on the device, atomically."""
    from pyroute2.netlink.exceptions import NetlinkError
    other_fd = prog_fd_by_id(other["id"])
    try:
        try:
            _slot_update(chain_fd, slot, other_fd)
        except BpfError as e:
            why = {errno.EINVAL: "the kernel refuses a tail call to it from mrc_rx (it differs "
                                 "in attach type, xdp.frags or JIT)",
                   errno.EBUSY: "it is extended by freplace programs (a dispatcher)"}
            raise MrcError(f"cannot chain to {device}'s XDP program {other['name'] or '?'} "
                           f"(id {other['id']}): "
                           f"{why.get(e.errno, e.strerror)}; remove it or load it without that")
        try:
            xdp_set(index, rx_fd, other["mode"], expected_fd=other_fd)
        except NetlinkError as e:
            clear_slot(chain_fd, slot)
            code = e.code if hasattr(e, "code") else e.args[0]
            if code == errno.EEXIST:
                raise MrcError(f"{device}'s XDP program changed while attaching (it is no longer "
                               f"id {other['id']}): nothing was changed, try again")
            if code == errno.EBUSY:
                raise MrcError(f"{device}'s XDP program (id {other['id']}) is held by a bpf_link: "
                               f"only its owner can replace it")
            raise MrcError(f"cannot put mrc_rx on {device} in place of XDP program id "
                           f"{other['id']}: {os.strerror(code)}")
    finally:
        os.close(other_fd)


def chained_id(chain_fd: int, slot: int) -> int:
    """The program id in SLOT (the kernel answers a prog array lookup with the id), or 0."""
    value = ctypes.c_uint32(0)
    key = ctypes.c_uint32(slot)
    try:
        found = bpfsys.map_lookup(chain_fd, key, value)
    except BpfError:
        return 0
    return value.value if found else 0


def chained(directory, slot: int) -> dict | None:
    """{"id", "name"} of the program mrc_rx hands on to on config.devices[SLOT]."""
    try:
        fd = bpfsys.obj_get(str(directory / CHAIN_MAP))
    except BpfError:
        return None
    try:
        prog_id = chained_id(fd, slot)
    finally:
        os.close(fd)
    return {"id": prog_id, "name": prog_name(prog_id)} if prog_id else None


def restore(directory, device: str, index: int, slot: int, mode: str, rx_id: int) -> int:
    """Put the chained program of SLOT back on the device in mrc_rx's
    place, atomically; returns its id (0: there was none, or mrc_rx is
    no longer on the device and what is there is left alone: also an
    empty hook, which another tool emptied, `xdp-loader unload --all`
    taking both programs off as far as its user knows)."""
    from pyroute2 import IPRoute
    try:
        chain_fd = bpfsys.obj_get(str(directory / CHAIN_MAP))
    except BpfError:
        return 0
    try:
        other_id = chained_id(chain_fd, slot)
        if not other_id:
            return 0
        with IPRoute() as ipr:
            on_device = hooks.device_info(ipr, index)["xdp_prog_id"]
        if on_device != rx_id:
            clear_slot(chain_fd, slot)
            return 0    # emptied or taken since, by another tool: left as it is
        if not put_back(index, other_id, mode, rx_id):
            return 0
        clear_slot(chain_fd, slot)
        return other_id
    finally:
        os.close(chain_fd)


def put_back(index: int, other_id: int, mode: str, rx_id: int) -> bool:
    """Program OTHER_ID on the device's XDP hook in place of RX_ID (0: of
    nothing); False when the hook no longer holds RX_ID."""
    from pyroute2.netlink.exceptions import NetlinkError
    other_fd = prog_fd_by_id(other_id)
    rx_fd = prog_fd_by_id(rx_id) if rx_id else None
    try:
        xdp_set(index, other_fd, mode, expected_fd=rx_fd)
        return True
    except NetlinkError:
        return False
    finally:
        os.close(other_fd)
        if rx_fd is not None:
            os.close(rx_fd)


def _slot_update(chain_fd: int, slot: int, prog_fd: int) -> None:
    key, value = ctypes.c_uint32(slot), ctypes.c_uint32(prog_fd)
    bpfsys.map_update(chain_fd, key, value)


def clear_slot(chain_fd: int, slot: int) -> None:
    key = ctypes.c_uint32(slot)
    try:
        bpfsys.map_delete(chain_fd, key)
    except BpfError:
        pass


def rx_attach_type(directory, n_devices: int) -> int:
    """The expected_attach_type a new mrc_rx for the attachment at
    DIRECTORY must be loaded with to keep tail-calling what it chains to
    (for a program swap: compile_datapath(rx_attach_type=...))."""
    for slot in range(n_devices):
        other = chained(directory, slot)
        if other:
            return tail_call_profile(other["id"])[0]
    return 0


def copy_chain(directory, new_chain_fd: int, n_devices: int) -> None:
    """Put the programs chained to in the pinned chain map at DIRECTORY
    into a new program's chain map (NEW_CHAIN_FD), slot for slot, before
    that program is swapped in."""
    for slot in range(n_devices):
        other = chained(directory, slot)
        if other:
            fd = prog_fd_by_id(other["id"])
            try:
                _slot_update(new_chain_fd, slot, fd)
            finally:
                os.close(fd)
