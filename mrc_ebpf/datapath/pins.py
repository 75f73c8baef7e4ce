"""Where an attachment's state lives: pinned maps and programs on a bpffs.

Layout: BASE/ns<cookie>/<device>/{<map name>, prog_tx, prog_rx}.

* BASE is /run/mrc-ebpf, not /sys/fs/bpf: `ip netns exec` mounts a fresh
  sysfs over /sys, hiding /sys/fs/bpf, but leaves /run as it was, so a
  bpffs mounted there from the host is seen from every namespace.
* <cookie> is the network namespace's cookie (SO_NETNS_COOKIE): unique
  for the life of the boot and never reused, so two namespaces that each
  have an `eth0` never share state, whether mrcctl entered the namespace
  itself (--netns) or was started by `ip netns exec`.
"""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from mrc_ebpf.errors import MrcError

BASE = Path(os.environ.get("MRC_BPFFS", "/run/mrc-ebpf"))
SO_NETNS_COOKIE = 71


def _fs_type(path: Path) -> str | None:
    best, kind = "", None
    target = str(path.resolve())
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, mnt, fstype, *_ = line.split()
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, fstype
    return kind


def _inside_ip_netns_exec() -> bool:
    """`ip netns exec NAME` mounts a sysfs named NAME on /sys; the host's is 'sysfs'."""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            source, mnt, fstype, *_ = line.split()
            if mnt == "/sys" and fstype == "sysfs":
                return source != "sysfs"
    return False


def ensure_bpffs() -> Path:
    """Make sure BASE is a bpffs, mounting it when that can last."""
    if _fs_type(BASE) == "bpf":
        return BASE
    if _inside_ip_netns_exec():
        # A mount made here would vanish with this command's private
        # mount namespace, and the datapath's state with it.
        raise MrcError(f"no bpffs at {BASE}, and one mounted inside `ip netns exec` would vanish "
                       f"when this command exits: run `mount -t bpf bpf {BASE}` (or any mrcctl "
                       f"command, or `make setup`) on the host first, or use `mrcctl --netns NS`")
    BASE.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "bpf", "bpf", str(BASE)], capture_output=True, text=True)
    if result.returncode != 0:
        raise MrcError(f"cannot mount bpffs at {BASE}: {result.stderr.strip()}")
    return BASE


def netns_cookie() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")


def netns_dir() -> Path:
    return BASE / f"ns{netns_cookie()}"


def device_dir(device: str) -> Path:
    return netns_dir() / device


def attached_devices() -> list[str]:
    """Devices with pinned state in the current network namespace."""
    d = netns_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir())


def remove_tree(path: Path) -> None:
    """Unlink pins bottom-up (bpffs has no recursive remove)."""
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir():
            remove_tree(child)
        else:
            child.unlink()
    path.rmdir()
