"""The maps' kernel memory: datapath/memory.py's model against what the
kernel charges a real attachment (its fdinfo, and bpftool as a second
witness), and `mrcctl status` reporting it."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import layout, memory


def test_model_reads_every_map_of_maps_h():
    names = [s.name for s in memory.specs()]
    assert len(names) == len(set(names))
    assert "paths" in names and "mrc_event_ring" in names
    # per-CPU maps grow with the CPUs, the others do not
    one, two = memory.model(1), memory.model(2)
    grown = {n for n in one if two[n] != one[n]}
    assert {s.name for s in memory.specs() if s.percpu} <= grown
    assert memory.per_cpu_bytes() == sum(two.values()) - sum(one.values()) > 0
    # maps allocated as used cost more with entries in them
    assert memory.model(2, {"peers": 1000})["peers"] > memory.model(2)["peers"]


def test_131072_peers_fit_256_mb_at_128_cpus_as_the_kernel_counts():
    """Issue 28's target (256 MB at 128 CPUs as the kernel counts it, with
    learnt state for 16,384 active peers and receive state for 16,384
    active senders; the model is checked against a memory cgroup below):
    230.4 MB.  memlock is 209.0 MB: 135 MB of it the learnt state, 18,432
    entries of 7.3 KB (16,384 peers and the LRU's room; issue 19's 64 MB
    held 256 at 35 KB), 7.5 MB the senders, 18,432 entries of 312 B (256
    of 2.4 KB before); the bound catches a change that adds more
    unnoticed."""
    assert memory.host_kernel_bytes(131072, cpus=128) <= 256 * 10**6
    assert memory.host_bytes(131072, cpus=128) <= 209.5 * 10**6
    assert memory.host_bytes(131072, cpus=128) > memory.host_bytes(1000, cpus=128)


def _kernel_reports_usage() -> bool:
    """memlock is the map's real usage from Linux 6.4 (map_mem_usage); before
    it was a rough footprint the model does not follow."""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 4)


@pytest.mark.root
def test_model_matches_kernel_for_an_attachment(interop):
    if not _kernel_reports_usage():
        pytest.skip("kernel before 6.4: memlock is not the maps' usage")
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", f"{interop.R_SID},{interop.B_DT6}", netns=interop.A)
    row = json.loads(mrcctl("status", "-j", netns=interop.A).stdout)[0]
    mem = row["memory"]
    directory = row["pins"]
    entries = interop.t.exec(interop.A, [
        *_py(), "-c", "import json,sys; from mrc_ebpf.datapath import memory; "
        f"print(json.dumps(memory.entries_in_use({directory!r})))"]).stdout
    entries = json.loads(entries)
    assert entries["peers"] == 1 and entries["peer_by_sid"] >= 1
    expected = memory.model(mem["cpus"], entries)
    assert mem["maps"] == expected
    assert mem["bytes"] == sum(expected.values())
    assert mem["scaled_bytes"] == sum(memory.model(mem["scaled_cpus"], entries).values())
    # bpftool, reading the same maps by id, agrees with status map by map
    shown = json.loads(interop.t.exec(interop.A, ["bpftool", "-j", "map", "show"]).stdout)
    by_name = {}
    for m in shown:
        by_name.setdefault(m.get("name", ""), []).append(m["bytes_memlock"])
    for name, nbytes in mem["maps"].items():
        # the kernel keeps 15 characters of the C name (mrc_ + name)
        assert nbytes in by_name.get(layout.symbol(name)[:15], []), name
    human = mrcctl("status", netns=interop.A).stdout
    assert "kernel memory" in human and f"on {mem['scaled_cpus']}" in human


@pytest.mark.root
def test_active_peers_sizes_the_lrus_and_status_says_so(interop):
    """attach --active-peers N sizes the LRUs of learnt state (N + N/8),
    senders (N + N/8) and (sender, path) pairs (4N) without a compile of
    its own (the build is the default's, its maps made at that size);
    status shows the sizes and the memory the kernel reports, which the
    model with those sizes matches map by map."""
    if not _kernel_reports_usage():
        pytest.skip("kernel before 6.4: memlock is not the maps' usage")
    interop.attach("--active-peers", "1024")
    row = json.loads(mrcctl("status", "-j", netns=interop.A).stdout)[0]
    assert row["learnt_state"]["max"] == 1152
    assert row["receive_state"]["senders"]["max"] == 1152
    assert row["receive_state"]["paths"]["max"] == 4096
    mem = row["memory"]
    sizes = {"MRC_MAX_ACTIVE_PEERS": 1152, "MRC_RX_MAX_SENDERS": 1152, "MRC_RX_MAX_PATHS": 4096}
    entries = {"peer_by_sid": 0, "peers": 0}
    assert mem["maps"] == memory.model(mem["cpus"], entries, sizes)
    # the learnt state's 135 MB at 16,384 is 8.5 MB at 1,024
    assert mem["maps"]["peer_state"] < memory.model(mem["cpus"])["peer_state"] / 15
    human = mrcctl("status", netns=interop.A).stdout
    assert "of 1152 peers" in human and "of 1152 senders" in human and "of 4096 (sender, path)" in human
    # attach --replace keeps the maps as they are sized (build.fits)
    mrcctl("attach", "a0", "--replace", netns=interop.A)
    row = json.loads(mrcctl("status", "-j", netns=interop.A).stdout)[0]
    assert row["learnt_state"]["max"] == 1152 and row["receive_state"]["paths"]["max"] == 4096


def _py():
    import sys
    return [sys.executable]


def _memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1's memory controller, or
    v2 with memory), or None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (d / "memory.kmem.usage_in_bytes").exists():
                return d
        if controllers == "":
            for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                d = root / path.lstrip("/")
                if "memory" in (d / "cgroup.controllers").read_text().split() \
                        if (d / "cgroup.controllers").exists() else False:
                    return d
    return None


@pytest.mark.root
def test_kernel_count_of_131071_peers_matches_the_cgroup():
    """What `status` and `fabric plan` now report for the peer maps (the
    LPM trie's intermediate nodes and the slab's rounding included:
    memory.kernel_bytes) against the kernel's own count: the memory
    cgroup's, for a process alone in a cgroup this test makes, filling
    the datapath's peers trie and peer_by_sid hash with the 131,071 peers
    of the issue's configuration.  memlock is far below it (issue 28:
    84 MB by the cgroup against 62.4 MB of memlock for the whole host)."""
    import subprocess
    import sys
    parent = _memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup with kernel memory accounting here")
    n = 131071
    cgroup = parent / f"mrc-test-kmem-{os.getpid()}"
    cgroup.mkdir()
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).parent / "tools" / "kmem_peers.py"),
                              str(cgroup), str(n)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
    finally:
        cgroup.rmdir()
    entries = {"peers": n, "peer_by_sid": n}
    plan = [(64, bytes.fromhex(f"fd000001{i // 256:04x}{i % 256:04x}") + bytes(8)) for i in range(1, n + 1)]
    intermediates = memory.lpm_intermediates(plan)
    assert intermediates == n - 1          # no prefix of the plan covers another
    model = memory.kernel_model(got["cpus"], entries, {"peers": intermediates})
    expected = model["peers"] + model["peer_by_sid"]
    assert abs(got["charged"] - expected) <= 0.03 * expected, (got, expected)
    memlock = sum(got["memlock"].values())
    assert memlock == sum(v for k, v in memory.model(got["cpus"], entries).items() if k in entries)
    assert got["charged"] > 1.5 * memlock, (got, memlock)
