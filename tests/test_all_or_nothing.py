"""Every change to an attachment is all or nothing: a command that fails
at any point leaves `path list`, the spray lists, the routes and every
map exactly as they were; adding a path that exists changes nothing; the
SID table takes a distinct peer SID for every path slot."""
from __future__ import annotations

import ctypes
import ipaddress
import json
import os
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.control import classes, paths
from mrc_ebpf.datapath import bpfsys, layout
from mrc_ebpf.datapath.loader import Attachment
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root

# maps whose contents traffic we do not send may still change (the
# kernel's own neighbour discovery passes the programs): left out
# the datapath's own (traffic), and peers_gen, bumped by every write to
# peers (a rolled-back one too: the cache of the trie must look again)
MOVING = {"counters", "rx_paths", "rx_peers", "events", "event_seq", "peer_cache", "peers_gen",
          "peer_starts"}
ARRAY_ROWS = 4 * C["MRC_MAX_PATHS"]     # the rows of peer ids 0..3: all the tests use


_pin_dirs: dict[str, Path] = {}


def pin_dir(ns: str) -> Path:
    if ns not in _pin_dirs:
        _pin_dirs[ns] = Path(json.loads(mrcctl("status", "-j", netns=ns).stdout)[0]["pins"])
    return _pin_dirs[ns]


def dump_maps(directory: Path) -> dict[str, list]:
    """Raw keys and values of the attachment's maps (array maps: the rows
    the tests' peers use)."""
    out = {}
    for name, (key_type, value_type, percpu) in layout.MAPS.items():
        if name in MOVING:
            continue
        m = bpfsys.PinnedMap(str(directory / name), key_type, value_type, percpu)
        try:
            if m.map_type in (2, 6):        # BPF_MAP_TYPE_ARRAY, PERCPU_ARRAY
                rows = []
                for i in range(min(m.max_entries, ARRAY_ROWS)):
                    rows.append((i, bytes(m.lookup(layout.Index(i)))))
            else:
                rows = sorted((bytes(k), bytes(v)) for k, v in m.items())
            out[name] = rows
        finally:
            m.close()
    return out


def state(t, ns: str) -> dict:
    """What a user and the datapath see: `path list` and `class list` (read
    here from the pins, as mrcctl reads them), the routes and the maps."""
    directory = pin_dir(ns)
    att = Attachment(directory.name, directory)
    try:
        for name, (key_type, value_type, percpu) in layout.MAPS.items():
            att.maps[name] = bpfsys.PinnedMap(str(directory / name), key_type, value_type, percpu)
        listed = {"paths": paths.list_paths(att), "classes": classes.list_classes(att)}
    finally:
        att.close()
    for row in listed["paths"]:
        row.pop("feedback")         # ages with the clock
    routes = {fam: t.exec(ns, ["ip", fam, "route", "show", "table", "all"]).stdout
              for fam in ("-4", "-6")}
    return {**listed, "routes": routes, "maps": dump_maps(directory)}


def one_line_error(result, text: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert text in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def fail_each_write(t, ns: str, *args, every: bool = True) -> int:
    """Run a command failing its 1st, 2nd, ... write (every=False: its 1st,
    2nd, 4th, 8th, ...) until it runs through; after every failure
    everything must be as before.  Returns the number of the write that
    failed last."""
    before = state(t, ns)
    n, failed = 0, 0
    while True:
        n = n + 1 if every or n == 0 else n * 2
        assert n < 200, "the command never finished"
        env = {**os.environ, "MRC_FAIL_WRITE": str(n)}
        result = _mrcctl_env(env, *args, netns=ns)
        if result.returncode == 0:
            break
        one_line_error(result, f"failure injected at write {n}")
        assert state(t, ns) == before, f"{' '.join(args)}: failing write {n} left a change behind"
        failed = n
    assert state(t, ns) != before, f"{' '.join(args)} changed nothing"
    return failed


def _mrcctl_env(env, *args, netns):
    import subprocess
    from conftest import MRCCTL, ROOT
    return subprocess.run([*MRCCTL, "--netns", netns, *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)


def test_every_failure_is_rolled_back(interop):
    """Each write of each changing command fails once, in turn: paths,
    spray lists, peer and SID entries, routes and classes come back as they
    were; then the command runs through."""
    t, A = interop.t, interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    mrcctl("path", "add", "198.18.2.0/24", "--via", interop.B_DX4, netns=A)
    mrcctl("class", "set", "gold", "--dscp", "46", netns=A)
    writes = {}
    for args, every in (
            # two paths to a known prefix, one to a new peer SID, one reserved for a class
            (["path", "add", "fd00:2::/64", "--via", f"{interop.R_SID},{interop.B_DT6}",
              "--via", "fc00:b::77", "--class", "gold"], True),
            (["path", "add", "fd00:3::/64", "--usid", "fc00:0:1:b::"], True),  # a new peer, uSID
            (["path", "policy", "fd00:2::/64", "weighted"], False),
            (["path", "del", "fd00:2::/64", "--id", "0"], False),
            (["path", "del", "198.18.2.0/24"], False),
            (["class", "set", "gold", "--dscp", "10,12"], False)):
        writes[" ".join(args[:3])] = fail_each_write(t, A, *args, every=every)
    # the path changes make many writes, each of which failed once (no
    # learnt state to reset: nothing was sent, peer_state has no entry)
    assert writes["path add fd00:2::/64"] >= 15 and writes["path add fd00:3::/64"] >= 12, writes
    assert writes["path del fd00:2::/64"] >= 8 and min(writes.values()) >= 2, writes


def test_full_sid_table_is_a_clear_error_and_changes_nothing(interop):
    t, A = interop.t, interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    directory = pin_dir(A)
    by_sid = bpfsys.PinnedMap(str(directory / "peer_by_sid"), *layout.MAPS["peer_by_sid"])
    assert by_sid.max_entries == C["MRC_MAX_PEER_SIDS"]
    filler = []
    try:
        # fill the table with SIDs no path uses (fd00:ff::/32, never routed)
        base = int(ipaddress.IPv6Address("fd00:ff::"))
        for i in range(by_sid.max_entries):
            key = layout.Sid()
            ctypes.memmove(key.addr, ipaddress.IPv6Address(base + i).packed, 16)
            try:
                by_sid.update(key, layout.u32(255))
            except bpfsys.BpfError:
                break           # full: the path's own SID is in it already
            filler.append(key)
        assert len(filler) == by_sid.max_entries - 1
        before = state(t, A)
        result = mrcctl("path", "add", "fd00:2::/64", "--via", "fc00:b::99", netns=A, check=False)
        one_line_error(result, "peer SID table is full")
        result = mrcctl("path", "add", "fd00:4::/64", "--via", "fc00:b::98", netns=A, check=False)
        one_line_error(result, "peer SID table is full")
        assert state(t, A) == before
        # a path to a SID the table has needs no room
        mrcctl("path", "add", "fd00:2::/64", "--via", f"{interop.R_SID},{interop.B_DT6}", netns=A)
    finally:
        for key in filler:
            by_sid.delete(key)
        by_sid.close()
    assert interop.ping(A, interop.B6, count=2).returncode == 0


def test_paths_to_hundreds_of_peer_sids(interop):
    """More distinct peer SIDs than peers (256): once `Argument list too
    long` half-way through."""
    A = interop.A
    interop.attach()
    first = [f"fc00:b::1:{i:x}" for i in range(200)]
    second = [f"fc00:b::2:{i:x}" for i in range(150)]
    mrcctl("path", "add", "fd00:2::/64", *[a for s in first for a in ("--via", s)], netns=A)
    mrcctl("path", "add", "fd00:3::/64", *[a for s in second for a in ("--via", s)], netns=A)
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert sorted(r["peer_sid"] for r in rows) == sorted(str(ipaddress.IPv6Address(s))
                                                          for s in first + second)
    assert json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["paths"] == 350
    by_sid = bpfsys.PinnedMap(str(pin_dir(A) / "peer_by_sid"), *layout.MAPS["peer_by_sid"])
    try:
        assert len(list(by_sid.keys())) == 350
    finally:
        by_sid.close()


def test_adding_a_path_that_exists_changes_nothing(interop):
    t, A = interop.t, interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    before = state(t, A)
    again = mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    assert "exists already: unchanged" in again.stdout
    assert json.loads(mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "-j",
                             netns=A).stdout)[0]["existed"] is True
    assert state(t, A) == before
    # the same segments with another weight: refused, not silently kept or doubled
    other = mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "--weight", "5", netns=A,
                   check=False)
    one_line_error(other, "already has path 0")
    twice = mrcctl("path", "add", "fd00:2::/64", "--via", "fc00:b::5", "--via", "fc00:b::5",
                   netns=A, check=False)
    one_line_error(twice, "given twice")
    assert state(t, A) == before
    # an existing path and a new one in one command: only the new one is added
    both = json.loads(mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "--via",
                             "fc00:b::5", "-j", netns=A).stdout)
    assert sorted((r["path_id"], r["existed"]) for r in both) == [(0, True), (1, False)]
    assert len(json.loads(mrcctl("path", "list", "-j", netns=A).stdout)) == 2


def test_a_longer_prefix_is_its_own_peer(interop):
    """path add/del name a prefix exactly: a /80 inside a /64 that has
    paths is a new peer, and deleting it leaves the /64 alone."""
    A = interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    inner = str(ipaddress.ip_network("fd00:2:0:0:1::/80"))
    one_line_error(mrcctl("path", "del", inner, netns=A, check=False), "no paths")
    mrcctl("path", "add", inner, "--via", interop.B_DT6, netns=A)
    rows = json.loads(mrcctl("path", "list", "-j", netns=A).stdout)
    assert sorted(r["prefix"] for r in rows) == sorted(["fd00:2::/64", inner])
    mrcctl("path", "del", inner, netns=A)
    assert [r["prefix"] for r in json.loads(mrcctl("path", "list", "-j", netns=A).stdout)] == \
        ["fd00:2::/64"]


def test_small_errors_are_one_line(interop):
    """`stats --watch nan|inf`, native XDP on lo (libbcc's own line kept
    out), and `status` counting the paths that are there after `del --id`."""
    A = interop.A
    interop.attach()
    for bad in ("nan", "inf"):
        one_line_error(mrcctl("stats", "--watch", bad, netns=A, check=False), "--watch")
    one_line_error(mrcctl("attach", "lo", "--sid", "fc00:a::7", "--mode", "native", netns=A,
                          check=False), "cannot attach XDP to lo in native mode")
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, "--via", "fc00:b::5", netns=A)
    mrcctl("path", "del", "fd00:2::/64", "--id", "1", netns=A)
    assert json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["paths"] == 1
