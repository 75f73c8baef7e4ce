"""Putting back the hooks another tool took off a running attachment.

`xdp-loader unload --all`, `ip link set DEV xdp off` or `tc filter del`
remove mrc's programs from a device while the pins (maps, programs,
config) stay.  `mrcctl status` names what is gone (hook_changes), and
`mrcctl attach DEV --repair` or `mrcctl apply` puts the pinned programs
back: mrc_rx alone on an empty XDP hook, or chained (xdp_chain.py) in
front of a program another tool loaded there since.  A program mrc_rx
chained to, taken off with mrc_rx, is not put back (the operator removed
it); neither does detach put it back (xdp_chain.restore)."""
from __future__ import annotations

import os

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, hooks, layout, lock, pins, xdp_chain
from mrc_ebpf.datapath.loader import (CFG_CLSACT_OURS, CFG_XDP_SKB, PROG_FB, PROG_RX, PROG_TX,
                                      datapath_build, device_members, owner)
from mrc_ebpf.errors import MrcError

TC_PINS = ((PROG_TX, "egress", hooks.TC_EGRESS_PARENT), (PROG_FB, "ingress", hooks.TC_INGRESS_PARENT))


def _prog_id(directory, pin: str) -> int:
    return bpfsys.pinned_prog_id(str(directory / pin))


def hook_changes(ipr: IPRoute, directory) -> list[dict]:
    """What is not as attach left it on the attachment's devices:
    {"device", "hook": xdp|tc egress|tc ingress, "expected", "found",
    "found_name", "why"}, WHY a sentence an operator can act on."""
    members = device_members(directory)
    ids = {pin: _prog_id(directory, pin) for pin in (PROG_RX, PROG_TX, PROG_FB)}
    out = []
    for slot, member in enumerate(members):
        device = hooks.ifname_of(member.ifindex)
        if device is None:
            continue        # status says the device is gone
        on = hooks.device_info(ipr, member.ifindex)["xdp_prog_id"]
        if on != ids[PROG_RX]:
            out.append(_change(device, "xdp", ids[PROG_RX], on, member, slot, directory))
        for pin, direction, _ in TC_PINS:
            running = hooks.tc_egress_prog_ids(member.ifindex, direction).get(hooks.TC_PRIO, 0)
            if ids[pin] and running != ids[pin]:
                out.append(_change(device, f"tc {direction}", ids[pin], running, member, slot,
                                   directory))
    return out


def _change(device, hook, expected, found, member, slot, directory) -> dict:
    name = xdp_chain.prog_name(found) if found else ""
    ours = {"xdp": "mrc_rx", "tc egress": "mrc_tx", "tc ingress": "mrc_fb"}[hook]
    if not found:
        how = (f"`xdp-loader unload {device} --all` or `ip link set dev {device} xdp off`"
               if hook == "xdp" else f"`tc filter del dev {device} {hook.split()[-1]}`")
        why = f"{ours} (prog {expected}) was taken off {device}'s {hook} hook by another tool (e.g. {how})"
        if hook == "xdp" and member.flags & xdp_chain.CFG_XDP_CHAINED:
            chained = xdp_chain.chained(directory, slot)
            if chained:
                why += f", with the program it chained to ({chained['id']} {chained['name']})"
    else:
        why = (f"{device}'s {hook} hook runs prog {found} {name or '?'} in place of {ours} "
               f"(prog {expected}): put there by another tool")
    return {"device": device, "hook": hook, "expected": expected, "found": found,
            "found_name": name, "why": why + f"; `mrcctl attach {device} --repair` puts {ours} back"}


def repair(device: str | None, dry_run: bool = False) -> dict:
    """Put the pinned programs back on every hook of DEVICE's attachment
    that lost them; {"device", "repaired": [hook_changes rows, with
    "done": what was done]}."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath.loader import require_root, resolve_device
    require_root()
    pins.ensure_bpffs()
    with lock.writer():
        first = owner(resolve_device(device))
        if first is None:
            raise MrcError(f"{device} is not attached: --repair mends a running attachment "
                           f"(mrcctl attach {device} --sid SID)")
        directory = pins.device_dir(first)
        with IPRoute() as ipr:
            changes = hook_changes(ipr, directory)
            if not dry_run:
                for c in changes:
                    c["done"] = restore(ipr, directory, c)
    return {"device": first, "repaired": changes, "dry_run": dry_run}


def restore(ipr: IPRoute, directory, c: dict) -> str:
    """Put back what hook_changes row C says is gone (the caller holds
    the writer lock); what was done, in words."""
    members = device_members(directory)
    index = hooks.ifindex(ipr, c["device"])
    slot = next(i for i, m in enumerate(members) if m.ifindex == index)
    member = members[slot]
    pin = {"xdp": PROG_RX, "tc egress": PROG_TX, "tc ingress": PROG_FB}[c["hook"]]
    fd = bpfsys.obj_get(str(directory / pin))
    try:
        if c["hook"] != "xdp":
            parent = next(p for name, d, p in TC_PINS if name == pin)
            if not hooks.has_clsact(ipr, index):
                hooks.add_clsact(ipr, index)
                _set_flag(directory, slot, CFG_CLSACT_OURS, True)   # detach removes it again
            hooks.tc_detach(ipr, index, parent)    # another filter at our prio: ours replaces it
            hooks.tc_attach(ipr, index, fd, pin, parent)
            return f"{pin} back on {c['device']}'s {c['hook']}"
        return _restore_xdp(ipr, directory, c["device"], index, slot, member, fd)
    finally:
        os.close(fd)


def _restore_xdp(ipr, directory, device: str, index: int, slot: int, member, rx_fd: int) -> str:
    mode = "skb" if member.flags & CFG_XDP_SKB else "native"
    chain_fd = bpfsys.obj_get(str(directory / xdp_chain.CHAIN_MAP))
    try:
        other = xdp_chain.other_program(ipr, device, index, mode)
        if other is None:
            # the hook is empty: what mrc_rx chained to went with it, by the
            # operator's hand, and stays gone
            xdp_chain.clear_slot(chain_fd, slot)
            _set_chained(directory, slot, False)
            hooks.xdp_attach(device, rx_fd, mode)
            return f"mrc_rx back on {device}'s XDP hook ({mode})"
        # another program took the hook: mrc_rx goes in front and hands on to it
        rebuilt = ""
        if xdp_chain.tail_call_profile(bpfsys.prog_info(rx_fd).id)[0] != other["attach_type"]:
            os.close(chain_fd)
            chain_fd = -1
            rx_fd, chain_fd = _rx_loaded_as(ipr, directory, other["attach_type"], slot)
            rebuilt = " (mrc_rx loaded again with its attach type: libbpf's and bcc's differ)"
        try:
            _set_chained(directory, slot, True)
            try:
                xdp_chain.chain_and_replace(device, index, chain_fd, slot, other, rx_fd)
            except MrcError:
                _set_chained(directory, slot, bool(xdp_chain.chained_id(chain_fd, slot)))
                raise
        finally:
            if rebuilt:
                os.close(rx_fd)
        return (f"mrc_rx back on {device}'s XDP hook, chained to prog {other['id']} "
                f"{other['name']}{rebuilt}")
    finally:
        if chain_fd >= 0:
            os.close(chain_fd)


def _rx_loaded_as(ipr, directory, attach_type: int, slot: int) -> tuple[int, int]:
    """A new mrc_rx on the running maps, loaded with ATTACH_TYPE (a tail
    call needs caller and callee alike), pinned in the old one's place,
    with a new chain map (a prog array takes the attach type of the first
    program that uses it: the old one's is the old mrc_rx's); (its fd,
    the chain map's fd).  Only for an attachment with no other device
    chained: the others' chained programs were loaded the old way."""
    from mrc_ebpf.datapath import replace
    members = device_members(directory)
    if any(xdp_chain.chained(directory, i) for i in range(len(members)) if i != slot):
        raise MrcError("another device of this attachment chains to a program loaded the other "
                       "way (bcc's or libbpf's attach type): detach and attach")
    made = datapath_build()
    old_maps = replace.open_pins(directory, replace.map_names())
    try:
        info = bpfsys.map_info(old_maps[xdp_chain.CHAIN_MAP])
        chain_fd = bpfsys.map_create(xdp_chain.BPF_MAP_TYPE_PROG_ARRAY, 4, 4, info.max_entries,
                                     xdp_chain.CHAIN_MAP[:15])
        try:
            progs = replace.load_programs(made, directory, {**old_maps, xdp_chain.CHAIN_MAP: chain_fd},
                                          attach_type)
        except BaseException:
            os.close(chain_fd)
            raise
    finally:
        for fd in old_maps.values():
            os.close(fd)
    rx_fd = progs.pop(PROG_RX)
    for fd in progs.values():
        os.close(fd)
    try:
        # the other devices' hooks, still on the old mrc_rx, take the new one
        old_id = _prog_id(directory, PROG_RX)
        old_fd = xdp_chain.prog_fd_by_id(old_id)
        try:
            for m in members:
                info = hooks.device_info(ipr, m.ifindex)
                if info["xdp_prog_id"] == old_id:
                    replace.swap_xdp(ipr, m.ifindex, info["xdp_mode"], rx_fd, old_fd)
        finally:
            os.close(old_fd)
        replace.repin(rx_fd, directory / PROG_RX)
        replace.repin(chain_fd, directory / xdp_chain.CHAIN_MAP)
    except BaseException:
        os.close(rx_fd)
        os.close(chain_fd)
        raise
    return rx_fd, chain_fd


def _set_chained(directory, slot: int, chained: bool) -> None:
    """The device record's chained flag, which mrc_rx reads per packet."""
    _set_flag(directory, slot, xdp_chain.CFG_XDP_CHAINED, chained)


def _set_flag(directory, slot: int, flag: int, on: bool) -> None:
    config = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
    try:
        cfg = config.lookup(layout.Index(0))
        if on:
            cfg.devices[slot].flags |= flag
        else:
            cfg.devices[slot].flags &= ~flag
        config.update(layout.Index(0), cfg)
    finally:
        config.close()
