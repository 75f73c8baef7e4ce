"""One writer at a time: concurrent commands on one namespace's
attachments, from separate processes, lose nothing and corrupt nothing;
a writer that cannot get the lock in time says so in one line."""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import subprocess
import time

import pytest

from conftest import MRCCTL, ROOT, mrcctl
from mrc_ebpf.datapath import bpfsys, layout, pins
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root

CONCURRENT = 8


def run_all(commands: list[list[str]], netns: str, via_ip_netns: bool = False) -> list:
    """Start every command at once (each its own mrcctl process); wait for all."""
    procs = []
    for args in commands:
        cmd = ["ip", "netns", "exec", netns, *MRCCTL, *args] if via_ip_netns else \
            [*MRCCTL, "--netns", netns, *args]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def assert_one_line(result, *allowed: str) -> None:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert any(a in result.stderr for a in allowed), result.stderr


def spray_ids(ns: str, peer_id: int) -> list[int]:
    """The class-0 spray list of a peer, read from the pinned map."""
    directory = json.loads(mrcctl("status", "-j", netns=ns).stdout)[0]["pins"]
    m = bpfsys.PinnedMap(f"{directory}/spray", *layout.MAPS["spray"][:2])
    try:
        spray = m.lookup(layout.Index(peer_id * C["MRC_MAX_CLASSES"]))
        return list(spray.ids[:spray.n])
    finally:
        m.close()


def test_concurrent_path_adds_lose_nothing(interop):
    """8 `path add` at once, 20 rounds: every path is there exactly once,
    in `path list` and in the spray list (unlocked: 52 of 160 went missing)."""
    A = interop.A
    interop.attach()
    wanted = []
    for r in range(20):
        vias = [f"fc00:b::{r + 1:x}:{k + 1:x}" for k in range(CONCURRENT)]
        wanted += vias
        # half through --netns, half through `ip netns exec`: two mount namespaces
        results = run_all([["path", "add", "fd00:2::/64", "--via", v] for v in vias[:4]], A) + \
            run_all([["path", "add", "fd00:2::/64", "--via", v] for v in vias[4:]], A, True)
        assert all(res.returncode == 0 for res in results), [res.stderr for res in results]
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    got = sorted(r["segments"][0] for r in rows)
    assert got == sorted(str(ipaddress.IPv6Address(v)) for v in wanted)
    assert len({r["path_id"] for r in rows}) == len(rows) == 20 * CONCURRENT
    assert sorted(spray_ids(A, peer_id=0)) == sorted(r["path_id"] for r in rows)
    # the same path from 8 writers at once: added once, the others say it exists
    results = run_all([["path", "add", "fd00:2::/64", "--via", interop.B_DT6, "-j"]] * CONCURRENT, A)
    assert all(res.returncode == 0 for res in results), [res.stderr for res in results]
    existed = sorted(json.loads(res.stdout)[0]["existed"] for res in results)
    assert existed == [False] + [True] * (CONCURRENT - 1)
    assert len(json.loads(mrcctl("path", "list", "-j", netns=A).stdout)) == 20 * CONCURRENT + 1


@pytest.fixture
def eight_devices(topo):
    """Namespace X with devices e0..e7, each a veth to namespace P."""
    x, p = topo.ns("X"), topo.ns("P", forwarding=True)
    for k in range(CONCURRENT):
        topo.link(x, f"e{k}", p, f"p{k}")
        topo.addr(x, f"e{k}", f"fd00:{k + 10:x}::2/64")
        topo.addr(p, f"p{k}", f"fd00:{k + 10:x}::1/64")
    return topo, x


def bpftool_ids(kind: str) -> set[int]:
    out = subprocess.run(["bpftool", "-j", kind, "show"], capture_output=True, text=True, check=True)
    return {o["id"] for o in json.loads(out.stdout)}


def netns_cookie(ns: str) -> int:
    r = subprocess.run(["ip", "netns", "exec", ns, "python3", "-c",
                        "import socket;s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM);"
                        "print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET,71,8),'little'))"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout)


def attachments(ns: str, seen_progs: set[int]) -> list[str]:
    """Devices attached in NS (each must be healthy); their program ids go to SEEN_PROGS."""
    rows = [r for r in json.loads(mrcctl("status", "-j", netns=ns).stdout) if not r.get("stale")]
    assert all(r["healthy"] for r in rows), rows
    for r in rows:
        seen_progs.update(h[k] for h in r["hooks"] for k in ("xdp_prog_id", "tc_prog_id"))
    return sorted(r["device"] for r in rows)


def test_concurrent_attach_and_detach(eight_devices):
    topo, X = eight_devices
    devices = [f"e{k}" for k in range(CONCURRENT)]
    progs: set[int] = set()

    # different devices at once: all attach, each with its own SID
    results = run_all([["attach", d, "--sid", f"fc00:{k + 10:x}::1"] for k, d in enumerate(devices)], X)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert attachments(X, progs) == devices
    # a SID another attachment here has already: refused
    mrcctl("detach", "e7", netns=X)
    taken = mrcctl("attach", "e7", "--sid", "fc00:a::1", netns=X, check=False)
    assert_one_line(taken, "SID fc00:a::1 is already the SID of e0")
    results = run_all([["detach", d] for d in devices[:7]], X)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert attachments(X, progs) == []

    # one device, 8 attaches at once: one wins, the others are told
    results = run_all([["attach", "e0", "--sid", "fc00:a::1"]] * CONCURRENT, X)
    assert sorted(r.returncode for r in results) == [0] + [1] * (CONCURRENT - 1)
    for r in results:
        if r.returncode:
            assert_one_line(r, "e0 is already attached", "already has an XDP program")
    assert attachments(X, progs) == ["e0"]

    # attach and detach of one device at once, twice over: whatever the
    # order, the end state is whole (attached and healthy, or nothing)
    for _ in range(2):
        results = run_all([["attach", "e0", "--sid", "fc00:a::1"], ["detach", "e0"]] * 2, X)
        for r in results:
            if r.returncode:
                assert_one_line(r, "already attached", "not attached", "already has an XDP program")
        state = attachments(X, progs)
        assert state in ([], ["e0"])
        xdp = json.loads(topo.exec(X, ["ip", "-j", "link", "show", "e0"]).stdout)[0].get("xdp")
        assert bool(xdp) == (state == ["e0"])

    # one device, 8 detaches at once
    if not attachments(X, progs):
        mrcctl("attach", "e0", "--sid", "fc00:a::1", netns=X)
        attachments(X, progs)
    results = run_all([["detach", "e0"]] * CONCURRENT, X)
    assert sorted(r.returncode for r in results) == [0] + [1] * (CONCURRENT - 1)
    for r in results:
        if r.returncode:
            assert_one_line(r, "e0 is not attached")
    assert attachments(X, progs) == []
    # nothing left: no pin directory for X, none of its programs loaded
    assert not (pins.BASE / f"ns{netns_cookie(X)}").exists()
    progs.discard(0)
    assert len(progs) >= 2 * (CONCURRENT + 1)
    deadline = time.monotonic() + 10        # programs are freed after an RCU grace period
    while progs & bpftool_ids("prog") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not progs & bpftool_ids("prog")


def test_a_writer_waits_a_bounded_time(interop):
    """A lock held by another process (here: this one, from the host's
    namespace: the lock is on the bpffs, seen from every namespace) makes a
    change wait, then fail in one line; once released the change goes through."""
    A = interop.A
    interop.attach()
    directory = os.path.dirname(json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["pins"])
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for via_exec in (False, True):
            cmd = ["--lock-timeout", "0.5", "path", "add", "fd00:2::/64", "--via", interop.B_DT6]
            result = run_all([cmd], A, via_ip_netns=via_exec)[0]
            assert_one_line(result, "gave up waiting for its lock after 0.5 s")
        # reading needs no lock
        assert json.loads(mrcctl("path", "list", "-j", netns=A).stdout) == []
        env_timeout = subprocess.run([*MRCCTL, "--netns", A, "detach", "a0"], cwd=ROOT, text=True,
                                     capture_output=True, env={**os.environ, "MRC_LOCK_TIMEOUT": "0.2"})
        assert_one_line(env_timeout, "after 0.2 s")
    finally:
        os.close(fd)
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    assert len(json.loads(mrcctl("path", "list", "-j", netns=A).stdout)) == 1
