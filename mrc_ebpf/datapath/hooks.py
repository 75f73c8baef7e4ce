"""Attaching programs to a device's XDP and TC egress hooks (netlink)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile


# pyroute2 (~150 ms to import) is imported where it is used, so verbs that
# never touch netlink do not pay for it at start-up (docs/ops.md).

from mrc_ebpf.errors import MrcError

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1
XDP_FLAGS_DRV_MODE = 1 << 2
XDP_ATTACHED_MODES = {"xdp": "native", "xdpgeneric": "skb", "xdpoffload": "hw", "xdpmulti": "multi",
                      1: "native", 2: "skb", 3: "hw", 4: "multi"}

TC_EGRESS_PARENT = 0xFFFFFFF3   # clsact egress: ffff:fff3
TC_INGRESS_PARENT = 0xFFFFFFF2  # clsact ingress: ffff:fff2
TC_PRIO = 0xC0DE >> 4           # a priority of our own, to find our filter again
TC_HANDLE = 1


def ifindex(ipr: IPRoute, device: str) -> int:
    found = ipr.link_lookup(ifname=device)
    if not found:
        raise MrcError(f"device {device!r} not found in this network namespace")
    return found[0]


def device_info(ipr: IPRoute, index: int) -> dict:
    link = ipr.get_links(index)[0]
    xdp = link.get_attr("IFLA_XDP")
    mode, prog_id = None, 0
    if xdp is not None:
        attached = xdp.get_attr("IFLA_XDP_ATTACHED") or 0
        mode = XDP_ATTACHED_MODES.get(attached)
        prog_id = xdp.get_attr("IFLA_XDP_PROG_ID") or 0
    return {"mtu": link.get_attr("IFLA_MTU"), "xdp_mode": mode, "xdp_prog_id": prog_id,
            "ifname": link.get_attr("IFLA_IFNAME")}


def _libbcc():
    from bcc import libbcc  # bcc is imported only where it is needed
    return libbcc.lib


def xdp_attach(device: str, prog_fd: int, mode: str) -> str:
    """Attach in `mode` (native|skb|auto: native, else skb); returns the mode used."""
    lib = _libbcc()
    tries = {"native": [("native", XDP_FLAGS_DRV_MODE)], "skb": [("skb", XDP_FLAGS_SKB_MODE)],
             "auto": [("native", XDP_FLAGS_DRV_MODE), ("skb", XDP_FLAGS_SKB_MODE)]}[mode]
    said = ""
    for used, flags in tries:
        with _stderr_captured() as captured:
            ok = lib.bpf_attach_xdp(device.encode(), prog_fd, flags | XDP_FLAGS_UPDATE_IF_NOEXIST) == 0
        if ok:
            return used
        said = captured.text.strip().splitlines()[-1:] or [""]
        said = said[0].rpartition(": ")[2]
    raise MrcError(f"cannot attach XDP to {device} in {mode} mode{': ' + said if said else ''} "
                   f"(the driver may lack native XDP: try --mode skb)")


class _Captured:
    text = ""


@contextlib.contextmanager
def _stderr_captured():
    """What C code (libbcc) writes to fd 2 meanwhile, kept out of the
    user's terminal: the caller makes its own one-line error of it."""
    captured = _Captured()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode(errors="replace")


def xdp_detach(device: str, mode: str) -> None:
    flags = XDP_FLAGS_SKB_MODE if mode == "skb" else XDP_FLAGS_DRV_MODE
    with _stderr_captured():
        _libbcc().bpf_attach_xdp(device.encode(), -1, flags)


def has_clsact(ipr: IPRoute, index: int) -> bool:
    return any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))


def add_clsact(ipr: IPRoute, index: int) -> None:
    ipr.tc("add", "clsact", index)


def del_clsact(ipr: IPRoute, index: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        ipr.tc("del", "clsact", index)
    except NetlinkError:
        pass


def tc_attach(ipr: IPRoute, index: int, prog_fd: int, name: str,
              parent: int = TC_EGRESS_PARENT) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        ipr.tc("add-filter", "bpf", index, TC_HANDLE, fd=prog_fd, name=name,
               parent=parent, classid=1, direct_action=True, prio=TC_PRIO)
    except NetlinkError as e:
        raise MrcError(f"cannot add the TC egress filter: {e.args[1] if len(e.args) > 1 else e}")


def tc_egress_prog_ids(index: int, direction: str = "egress") -> dict[int, int]:
    """prio -> program id of the bpf filters on clsact egress (or ingress).

    Read with `tc -j`: pyroute2 does not decode TCA_BPF_ID."""
    name = socket.if_indextoname(index)
    result = subprocess.run(["tc", "-j", "filter", "show", "dev", name, direction],
                            capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout.strip():
        return {}
    found = {}
    for f in json.loads(result.stdout):
        prog = f.get("options", {}).get("prog", {})
        if f.get("kind") == "bpf" and prog.get("id"):
            found[f["pref"]] = prog["id"]
    return found


def tc_detach(ipr: IPRoute, index: int, parent: int = TC_EGRESS_PARENT) -> None:
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        ipr.tc("del-filter", "bpf", index, TC_HANDLE, parent=parent, prio=TC_PRIO)
    except NetlinkError:
        pass


def ifname_of(index: int) -> str | None:
    """The device's name in this namespace, or None when it is gone."""
    try:
        return socket.if_indextoname(index)
    except OSError:
        return None
