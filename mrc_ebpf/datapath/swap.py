"""Swapping an attachment's programs on their hooks, and putting a swap
cut short (kill -9 of `attach --replace`) right: the program pins'
names, XDP and TC swaps that leave no packet without a program, and the
journal's undo of a replace (journal.py runs it; replace.py swaps).

Kept below loader and replace (it imports neither) so that journal.py,
which every changing command recovers a log with, can undo a replace."""
from __future__ import annotations

import os
from pathlib import Path

# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.datapath import bpfsys, hooks, layout, pins, xdp_chain

PROG_TX, PROG_RX, PROG_FB = "prog_tx", "prog_rx", "prog_fb"
XDP_FLAGS_REPLACE = 1 << 4
# program pin -> (function, TC parent, direction) of the TC programs
TC_PROGRAMS = {PROG_TX: ("mrc_tx", hooks.TC_EGRESS_PARENT, "egress"),
               PROG_FB: ("mrc_fb", hooks.TC_INGRESS_PARENT, "ingress")}


def swap_xdp(ipr: IPRoute, index: int, mode: str, new_fd: int, old_fd: int) -> None:
    """Put program NEW_FD on INDEX's XDP hook in place of OLD_FD, in one
    netlink request: the kernel refuses if OLD_FD is not the program
    there, and packets see one program or the other, never none."""
    flags = XDP_FLAGS_REPLACE | (hooks.XDP_FLAGS_SKB_MODE if mode == "skb" else hooks.XDP_FLAGS_DRV_MODE)
    ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", new_fd),
                                                ("IFLA_XDP_EXPECTED_FD", old_fd),
                                                ("IFLA_XDP_FLAGS", flags)]})


def swap_tc(ipr: IPRoute, index: int, prog_fd: int, name: str, parent: int) -> None:
    """Change our filter (same parent, priority and handle) to run PROG_FD:
    cls_bpf swaps the program under RCU, so no packet misses the filter.
    `change` (not `replace`) fails if the filter is gone, never adds one."""
    ipr.tc("change-filter", "bpf", index, hooks.TC_HANDLE, fd=prog_fd, name=name,
           parent=parent, classid=1, direct_action=True, prio=hooks.TC_PRIO)


def staged(directory: Path) -> dict[str, Path]:
    """Where replace pins the new programs before it swaps them in."""
    return {p: directory / f"{p}_next" for p in (PROG_TX, PROG_RX, PROG_FB)}


def undo(step: dict) -> None:
    """A journal step of a replace cut short (kill -9): before any pin
    moved, every hook that runs a new program gets the old one back and
    the staged pins go (before); once one moved, every hook runs the new
    ones already, and the rest of the pins move (after).  Either way each
    hook runs the program its pin names, and a repeat does nothing more."""
    from pyroute2 import IPRoute
    directory = pins.device_dir(step["device"])
    if not directory.is_dir():
        return
    pinned = {p: _pinned_id(directory / p) for p in step["new"]}
    if any(pinned[p] == step["new"][p] for p in step["new"]):
        for pin, path in staged(directory).items():
            if path.exists():
                os.replace(path, directory / pin)
        return
    old = {p: bpfsys.obj_get(str(directory / p)) for p in step["old"]}
    try:
        with IPRoute() as ipr:
            for ifindex in _members(directory):
                info = hooks.device_info(ipr, ifindex)
                if info["xdp_prog_id"] == step["new"][PROG_RX]:
                    new_fd = xdp_chain.prog_fd_by_id(info["xdp_prog_id"])
                    try:
                        swap_xdp(ipr, ifindex, info["xdp_mode"], old[PROG_RX], new_fd)
                    finally:
                        os.close(new_fd)
                for pin, (function, parent, direction) in TC_PROGRAMS.items():
                    running = hooks.tc_egress_prog_ids(ifindex, direction).get(hooks.TC_PRIO, 0)
                    if running == step["new"][pin]:
                        swap_tc(ipr, ifindex, old[pin], function, parent)
    finally:
        for fd in old.values():
            os.close(fd)
    for path in staged(directory).values():
        if path.exists():
            path.unlink()


def _pinned_id(path: Path) -> int:
    return bpfsys.pinned_prog_id(str(path))


def _members(directory: Path) -> list[int]:
    """The ifindexes of the attachment's devices, from its pinned config."""
    try:
        config = bpfsys.PinnedMap(str(directory / "config"), *layout.MAPS["config"])
    except bpfsys.BpfError:
        return []
    try:
        cfg = config.lookup(layout.Index(0))
    finally:
        config.close()
    if cfg is None:
        return []
    return [cfg.devices[i].ifindex for i in range(min(cfg.n_devices, len(cfg.devices)))]
