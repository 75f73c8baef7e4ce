"""Run in a memory cgroup of its own (tests/test_memory.py makes it): moves
itself there, creates the datapath's peers trie and peer_by_sid hash as
bpf/lib/maps.h declares them (datapath/memory.py's specs), writes N peers
of the fabric's address plan into them with BPF_MAP_UPDATE_BATCH, and
prints what the cgroup was charged meanwhile, with the maps' memlock.

    kmem_peers.py CGROUP_DIR N
"""
from __future__ import annotations

import ipaddress
import json
import os
import struct
import sys
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, layout, memory

MAP_TYPES = {"lpm_trie": bpfsys.BPF_MAP_TYPE_LPM_TRIE, "hash": 1}     # BPF_MAP_TYPE_HASH
BPF_F_NO_PREALLOC = 1


def charged(cgroup: Path) -> int:
    """Kernel memory charged to the cgroup: v1's kmem counter, or v2's
    slab, vmalloc and percpu."""
    v1 = cgroup / "memory.kmem.usage_in_bytes"
    if v1.exists():
        return int(v1.read_text())
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return sum(int(stat[k]) for k in ("slab", "vmalloc", "percpu"))


def main() -> None:
    cgroup, n = Path(sys.argv[1]), int(sys.argv[2])
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    specs = {s.name: s for s in memory.specs()}
    peer = struct.Struct("=IHBBI16s")
    keys, values, sids, ids = [], [], [], []
    for i in range(1, n + 1):
        addr = ipaddress.IPv6Address(f"fd00:1:{i // 256:x}:{i % 256:x}::").packed
        sid = ipaddress.IPv6Address(f"fc00:1:{i // 256:x}:{i % 256:x}::1").packed
        keys.append(struct.pack("=I", 64) + addr)
        values.append(peer.pack(256 + i, 256, 0, 1, 0, sid))
        sids.append(sid)
        ids.append(struct.pack("=I", 256 + i))
    data = {"peers": (b"".join(keys), b"".join(values)), "peer_by_sid": (b"".join(sids), b"".join(ids))}
    before = charged(cgroup)
    maps = {}
    for name in data:
        s = specs[name]
        fd = bpfsys.map_create(MAP_TYPES[s.kind], s.key_size, s.value_size, s.max_entries,
                               layout.symbol(name), BPF_F_NO_PREALLOC if s.no_prealloc else 0)
        key_t, value_t, _ = layout.MAPS[name]
        maps[name] = bpfsys.PinnedMap.from_fd(fd, key_t, value_t, name=name)
        os.close(fd)
    for name, (k, v) in data.items():
        ks, vs = len(k) // n, len(v) // n
        for at in range(0, n, 65536):
            c = min(65536, n - at)
            maps[name].update_batch(k[at * ks:(at + c) * ks], v[at * vs:(at + c) * vs], c)
    after = charged(cgroup)
    print(json.dumps({"charged": after - before, "cpus": bpfsys.possible_cpus(),
                      "memlock": {k: int(memory.fdinfo(m.fd)["memlock"]) for k, m in maps.items()}}))


if __name__ == "__main__":
    main()
