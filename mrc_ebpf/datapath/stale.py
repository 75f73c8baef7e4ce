"""Stranded state: pins whose network namespace is gone.

Pins are keyed by namespace cookie (pins.py).  `ip netns del` without
`mrcctl detach` destroys the namespace and its devices, which unhooks the
programs, but the pins keep the programs and maps loaded, and no command
run in a namespace can see them any more.  A pin directory is stale when
no live namespace has its cookie.

A namespace is live while something refers to it: a process or thread in
it, an open file descriptor of it, or a bind mount of it (`ip netns add`
makes one under /run/netns) in any mount namespace.  All of those are
found through /proc; the cookie of each is read by entering it from a
short-lived thread (setns(2) moves only the calling thread).  A namespace
kept alive only by a socket that a process carried out of it is not
found: its state would count as stale.
"""
from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, journal, lock, pins

CLONE_NEWNET = 0x40000000
_NS_LINK = re.compile(r"net:\[(\d+)\]")
_libc = ctypes.CDLL(None, use_errno=True)


def _pids() -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit()]


def _net_refs() -> dict[str, str]:
    """One openable path for each network namespace referred to: inode -> path."""
    found: dict[str, str] = {}

    def note(path: str, link: str | None = None) -> None:
        try:
            link = link or os.readlink(path)
        except OSError:
            return
        m = _NS_LINK.fullmatch(link)
        if m and m.group(1) not in found:
            found[m.group(1)] = path

    mount_namespaces = set()
    for pid in _pids():
        note(f"/proc/{pid}/ns/net")
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                if tid != pid:
                    note(f"/proc/{pid}/task/{tid}/ns/net")
            for fd in os.listdir(f"/proc/{pid}/fd"):
                note(f"/proc/{pid}/fd/{fd}")
            mnt = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            continue        # gone meanwhile
        if mnt in mount_namespaces:
            continue
        mount_namespaces.add(mnt)
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    sep = fields.index("-")
                    if fields[sep + 1] == "nsfs" and _NS_LINK.fullmatch(fields[3]):
                        mountpoint = fields[4].replace("\\040", " ")
                        note(f"/proc/{pid}/root{mountpoint}", fields[3])
        except (OSError, ValueError):
            continue
    return found


def _cookies_of(paths: list[str]) -> set[int]:
    cookies: set[int] = set()

    def visit():
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            for path in paths:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    if _libc.setns(fd, CLONE_NEWNET) == 0:
                        cookies.add(pins.netns_cookie())
                finally:
                    os.close(fd)
        finally:
            _libc.setns(home, CLONE_NEWNET)
            os.close(home)

    worker = threading.Thread(target=visit, name="netns-cookies")
    worker.start()
    worker.join()
    return cookies


def live_cookies() -> set[int]:
    return _cookies_of(list(_net_refs().values())) | {pins.netns_cookie()}


def _pin_dirs() -> dict[int, Path]:
    out = {}
    if not pins.BASE.is_dir():
        return out
    for d in pins.BASE.iterdir():
        if d.is_dir() and re.fullmatch(r"ns\d+", d.name):
            out[int(d.name[2:])] = d
    return out


def _objects(directory: Path) -> dict:
    """Pins, programs, maps and locked memory under DIRECTORY."""
    progs, maps, n_pins = {}, {}, 0
    for path in directory.rglob("*"):
        if path.is_dir():
            continue
        n_pins += 1
        try:
            fd = bpfsys.obj_get(str(path))
        except OSError:
            continue
        try:
            info = dict(line.split(":", 1) for line in
                        open(f"/proc/self/fdinfo/{fd}").read().splitlines() if ":" in line)
        finally:
            os.close(fd)
        ident = {k: int(v) for k, v in info.items() if k in ("prog_id", "map_id", "memlock")}
        if "prog_id" in ident:
            progs[ident["prog_id"]] = ident.get("memlock", 0)
        elif "map_id" in ident:
            maps[ident["map_id"]] = ident.get("memlock", 0)
    memlock = sum(progs.values()) + sum(maps.values())
    return {"pin_count": n_pins, "prog_ids": sorted(progs), "map_ids": sorted(maps),
            "memlock_bytes": memlock}


def find(cookies: list[int] | None = None) -> list[dict]:
    """Pin directories whose namespace is gone (only COOKIES', if given)."""
    if not pins.BASE.is_dir():
        return []
    dirs = _pin_dirs()          # listed before the namespaces: a newer one is never stale
    if cookies is not None:
        dirs = {c: d for c, d in dirs.items() if c in cookies}
    if not dirs:
        return []
    live = live_cookies()
    out = []
    for cookie, d in sorted(dirs.items()):
        if cookie in live:
            continue
        out.append({"netns_cookie": cookie, "pins": str(d),
                    "devices": sorted(p.name for p in d.iterdir() if p.is_dir()), **_objects(d)})
    return out


def remove(found: list[dict]) -> list[dict]:
    """Unpin what find() found (under each directory's writer lock)."""
    removed = []
    for entry in found:
        directory = Path(entry["pins"])
        with lock.writer(directory, create=False) as locked:
            if locked:
                pins.remove_tree(directory)
                # a log a change killed there left: its namespace is gone with what it covers
                journal.log_path(entry["netns_cookie"]).unlink(missing_ok=True)
                removed.append(entry)
    return removed


def remove_orphan_logs() -> list[str]:
    """Change logs (journal.py) of namespaces that are gone: what they
    covered went with the namespace (a namespace deleted right after a
    kill leaves one)."""
    logs = sorted(journal.JOURNALS.glob("ns*.log")) if journal.JOURNALS.is_dir() else []
    if not logs:
        return []
    live = live_cookies()
    out = []
    for log in logs:
        cookie = log.stem[2:]
        if cookie.isdigit() and int(cookie) not in live:
            log.unlink(missing_ok=True)
            out.append(str(log))
    return out
