"""Nothing stranded: `--netns` never creates a namespace, and the state of
a namespace deleted without `detach` is listed by `status` on the host
and freed by `mrcctl gc` (programs, maps, pins)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import bpfsys, pins

pytestmark = pytest.mark.root


def test_netns_never_creates_a_namespace():
    name = f"mrct{os.getpid()}-typo"
    for args in (["status"], ["detach", "--all"], ["path", "add", "fd00:2::/64", "--via", "fc00::1"]):
        result = mrcctl(*args, netns=name, check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip() == f"mrcctl: error: no network namespace {name!r} " \
                                        f"(see `ip netns list`)"
        assert not Path(f"/run/netns/{name}").exists()
        assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                          text=True).stdout


def _objects(directory: Path) -> tuple[set[int], set[int]]:
    """(program ids, map ids) pinned under DIRECTORY, from each pin's fdinfo."""
    progs, maps = set(), set()
    for path in directory.rglob("*"):
        if path.is_dir():
            continue
        fd = bpfsys.obj_get(str(path))
        try:
            info = dict(line.split(":\t", 1) for line in open(f"/proc/self/fdinfo/{fd}")
                        if ":\t" in line)
        finally:
            os.close(fd)
        if "prog_id" in info:
            progs.add(int(info["prog_id"]))
        elif "map_id" in info:
            maps.add(int(info["map_id"]))
    return progs, maps


def _loaded(kind: str) -> set[int]:
    out = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True, check=True)
    return {o["id"] for o in json.loads(out.stdout)}


def test_gc_frees_a_deleted_namespaces_state(interop):
    t, A = interop.t, interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    directory = Path(json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["pins"]).parent
    cookie = int(directory.name[2:])
    progs, maps = _objects(directory)
    assert len(progs) == 3 and len(maps) >= 15
    try:
        # the namespace goes, its state stays: loaded, pinned, invisible
        subprocess.run(["ip", "netns", "del", A], check=True)
        t.namespaces.remove(A)
        assert progs <= _loaded("prog") and maps <= _loaded("map") and directory.exists()
        assert subprocess.run([*["ip", "netns", "list"]], capture_output=True,
                              text=True).stdout.find(A) < 0

        # status on the host lists it, and exits 1 (not healthy)
        shown = mrcctl("status", "-j", check=False)
        assert shown.returncode == 1, shown.stderr
        rows = json.loads(shown.stdout)
        row = next(r for r in rows if r.get("stale") and r["netns_cookie"] == cookie)
        assert row["devices"] == ["a0"] and set(row["prog_ids"]) == progs
        assert set(row["map_ids"]) == maps and row["memlock_bytes"] > 1 << 20
        assert f"stranded: {directory}" in mrcctl("status", check=False).stdout

        # a dry run changes nothing; gc of another (live) namespace's
        # cookie removes nothing; gc of this one frees it all
        assert json.loads(mrcctl("gc", "--dry-run", "-j", str(cookie)).stdout)["removed"][0]["pins"] \
            == str(directory) and directory.exists()
        live = pins.netns_cookie()
        assert json.loads(mrcctl("gc", "-j", str(live)).stdout)["removed"] == []
        out = mrcctl("gc", f"ns{cookie}").stdout
        assert out.startswith(f"removed {directory} ") and not directory.exists()
        deadline = time.monotonic() + 10    # freed after an RCU grace period
        while (progs & _loaded("prog") or maps & _loaded("map")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not progs & _loaded("prog") and not maps & _loaded("map")
        assert not any(r.get("netns_cookie") == cookie for r in json.loads(mrcctl("status", "-j", check=False).stdout))
    finally:
        if directory.exists():
            pins.remove_tree(directory)


def test_gc_leaves_live_namespaces_alone(interop):
    """A namespace with no name (`ip netns del` while a process still runs
    in it) is live: gc keeps its state."""
    t, A = interop.t, interop.A
    interop.attach()
    directory = Path(json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["pins"]).parent
    holder = subprocess.Popen(["ip", "netns", "exec", A, "sleep", "60"])
    try:
        time.sleep(0.5)
        subprocess.run(["ip", "netns", "del", A], check=True)
        t.namespaces.remove(A)
        cookie = directory.name[2:]
        assert json.loads(mrcctl("gc", "-j", cookie).stdout)["removed"] == []
        assert directory.exists()
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            removed = json.loads(mrcctl("gc", "-j", cookie).stdout)["removed"]
            if removed:
                break
            time.sleep(0.5)
        assert removed and not directory.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if directory.exists():
            pins.remove_tree(directory)
