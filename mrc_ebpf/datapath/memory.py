"""Kernel memory of the datapath's maps: the model, and what the kernel says.

`model(cpus=..., entries=..., sizes=...)` computes, for every map declared
in bpf/lib/maps.h, the memlock the kernel charges for it: the map's
declaration (type, key, value, max entries: read from maps.h and
mrc_common.h, never restated here) and the kernel's own accounting (each
map type's map_mem_usage, Linux 6.4 and later: what `bpftool map show`
and /proc/PID/fdinfo report as memlock).  Per-CPU maps scale with `cpus`;
maps allocated as used (BPF_F_NO_PREALLOC hash and LPM trie) scale with
`entries` (name -> entries in use; 0 when not given).  `measured(directory)`
reads the same figures of an attachment's pinned maps from the kernel;
tests/test_memory.py checks the one against the other.

The struct sizes of the kernel's own bookkeeping (KERNEL below) are those
of Linux 6.4+ on x86_64; they are a few hundred bytes per map, noise next
to the entries.
"""
from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, layout, source

MAPS_HEADER = source.BPF_DIR / "lib" / "maps.h"
PAGE = 4096

# The kernel's per-map and per-element bookkeeping (kernel/bpf/arraymap.c,
# hashtab.c, lpm_trie.c, ringbuf.c: *_map_mem_usage).
KERNEL = {
    "array": 312,            # sizeof(struct bpf_array)
    "htab": 832,             # sizeof(struct bpf_htab)
    "htab_bucket": 16,       # sizeof(struct bucket)
    "htab_locks": 8 * 4,     # HASHTAB_MAP_LOCK_COUNT ints per possible CPU
    "htab_elem": 48,         # sizeof(struct htab_elem), before key and value
    "llist_node": 8,         # per element allocated as used (no prealloc)
    "lpm_node": 24,          # sizeof(struct lpm_trie_node), before key data and value
    "ringbuf": 304,          # sizeof(struct bpf_ringbuf_map)
    "ringbuf_meta_pages": 3,  # RINGBUF_NR_META_PAGES
}

# bcc's map macros of maps.h -> (map type, per-CPU)
_KINDS = {"BPF_ARRAY": ("array", False), "BPF_PERCPU_ARRAY": ("array", True)}
_TABLE_TYPES = {"hash": "hash", "lru_hash": "lru_hash", "array": "array",
                "percpu_array": "percpu_array"}


@dataclass(frozen=True)
class MapSpec:
    name: str
    kind: str            # array | hash | lru_hash | lpm_trie | ringbuf
    key_size: int
    value_size: int
    max_entries: int
    percpu: bool = False
    no_prealloc: bool = False


def _round8(n: int) -> int:
    return (n + 7) & ~7


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _strip(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


def _eval(expr: str, values: dict[str, int]) -> int:
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(values[m.group(0)]), expr.strip())
    if not re.fullmatch(r"[0-9xXa-fA-F()+\-*/ <>|&]+", expr):
        raise ValueError(f"cannot evaluate {expr!r}")
    return int(eval(expr, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


def _sizes(name: str) -> tuple[int, int]:
    """Key and value size of a map of maps.h, from its ctypes types in
    layout.MAPS (tests/test_layout.py checks those against the C)."""
    if name not in layout.MAPS:
        raise ValueError(f"maps.h: {name} is not in layout.MAPS")
    key, value, _ = layout.MAPS[name]
    return ctypes.sizeof(key), ctypes.sizeof(value)


def specs(sizes: dict[str, int] | None = None) -> list[MapSpec]:
    """Every map of lib/maps.h, with the header's constants (`sizes`
    overrides some, e.g. {"MRC_MAX_PEERS": 1024})."""
    values = {**source.C, "MRC_COUNTER_MAX": len(source.counter_names()), **(sizes or {})}
    text = _strip(MAPS_HEADER.read_text())
    out = []
    for macro, args in re.findall(r"\b(BPF_\w+)\s*\(([^;]*?)\)\s*;", text, flags=re.S):
        parts = [a.strip() for a in args.split(",")]
        at = 3 if macro in ("BPF_TABLE", "BPF_F_TABLE") else 0     # where the name is
        parts[at] = layout.logical(parts[at])
        if macro == "BPF_PROG_ARRAY":     # program fds: the kernel keeps a pointer each
            name, n = parts
            out.append(MapSpec(name, "array", 4, 4, _eval(n, values), False))
        elif macro in ("BPF_ARRAY", "BPF_PERCPU_ARRAY"):
            name, _, n = parts
            kind, percpu = _KINDS[macro]
            out.append(MapSpec(name, kind, *_sizes(name), _eval(n, values), percpu))
        elif macro == "BPF_LPM_TRIE":
            name, _, _, n = parts
            out.append(MapSpec(name, "lpm_trie", *_sizes(name), _eval(n, values), no_prealloc=True))
        elif macro == "BPF_RINGBUF_OUTPUT":
            name, pages = parts
            out.append(MapSpec(name, "ringbuf", 0, 0, _eval(pages, values) * PAGE))
        elif macro in ("BPF_TABLE", "BPF_F_TABLE"):
            kind = _TABLE_TYPES[parts[0].strip('"')]
            name, n = parts[3:5]
            flags = _eval(parts[5], {"BPF_F_NO_PREALLOC": 1}) if len(parts) > 5 else 0
            percpu = kind == "percpu_array"
            kind = "array" if percpu else kind
            out.append(MapSpec(name, kind, *_sizes(name), _eval(n, values), percpu,
                               no_prealloc=bool(flags & 1)))
        else:
            raise ValueError(f"maps.h: {macro} is not a map macro this model knows")
    return out


def memlock(spec: MapSpec, cpus: int, entries: int = 0) -> int:
    """What the kernel charges for one map on a machine with `cpus`
    possible CPUs, with `entries` in use (counts only where allocated as
    used)."""
    k = KERNEL
    if spec.kind == "array":
        if spec.percpu:
            return k["array"] + spec.max_entries * (8 + _round8(spec.value_size) * cpus)
        return k["array"] + spec.max_entries * _round8(spec.value_size)
    if spec.kind in ("hash", "lru_hash"):
        usage = k["htab"] + k["htab_bucket"] * _pow2(spec.max_entries) + k["htab_locks"] * cpus
        elem = k["htab_elem"] + _round8(spec.key_size) + _round8(spec.value_size)
        if spec.no_prealloc:
            return usage + (elem + k["llist_node"]) * min(entries, spec.max_entries)
        extra = cpus if spec.kind == "hash" else 0      # a spare element per CPU for updates
        usage += elem * (spec.max_entries + extra)
        if spec.kind == "hash":
            usage += 8 * cpus                           # the per-CPU spare pointers
        return usage
    if spec.kind == "lpm_trie":
        return (k["lpm_node"] + spec.key_size - 4 + spec.value_size) * min(entries, spec.max_entries)
    if spec.kind == "ringbuf":
        data = spec.max_entries // PAGE
        return (k["ringbuf"] + (k["ringbuf_meta_pages"] + data) * PAGE
                + (k["ringbuf_meta_pages"] + 2 * data) * 8)
    raise ValueError(f"{spec.name}: unknown map kind {spec.kind}")


# ---- what the kernel allocates, as its memory cgroup counts it (issue 28)
#
# memlock (map_mem_usage) leaves out what the maps allocated as used cost
# the slab: each element is a kmalloc object from bpf_mem_alloc
# (kernel/bpf/memalloc.c: the element plus an 8-byte llist_node, rounded
# up to the kmalloc size class), and the memory cgroup charges each
# object with its obj_cgroup pointer (obj_full_size).  The LPM trie has
# more: the intermediate nodes where two prefixes part, about one per
# prefix more (memlock counts only the prefixes themselves).  For
# 131,071 peers that was 84 MB by the cgroup's count against 62.4 MB of
# memlock.  kernel_bytes() models it; tests/test_memory.py checks it
# against memory.kmem.usage_in_bytes of a cgroup the test makes.

SLAB_CLASSES = (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)
LLIST_NODE = 8          # bpf_mem_alloc's header of each object
OBJCG = 8               # the memory cgroup's pointer charged with each slab object


def _slab(n: int) -> int:
    """The kmalloc size class an object of n bytes takes."""
    return next((c for c in SLAB_CLASSES if c >= n), (n + PAGE - 1) // PAGE * PAGE)


def _kernel_at_least(major: int, minor: int) -> bool:
    got = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    return got >= (major, minor)


def lpm_node_bytes(spec: MapSpec, leaf: bool = True) -> int:
    """What one node of an LPM trie costs the memory cgroup.  From Linux
    6.13 every node (prefix or intermediate) is a bpf_mem_alloc object of
    the full size; before, kmalloc'd, an intermediate one without the value."""
    node = KERNEL["lpm_node"] + spec.key_size - 4
    if _kernel_at_least(6, 13):
        return _slab(node + spec.value_size + LLIST_NODE) + OBJCG
    return _slab(node + (spec.value_size if leaf else 0)) + OBJCG


def kernel_bytes(spec: MapSpec, cpus: int, entries: int = 0, intermediates: int | None = None) -> int:
    """What the kernel allocates for one map, as its memory cgroup counts
    it.  `intermediates`: the LPM trie's intermediate nodes
    (lpm_intermediates()); unknown, as many as a trie of `entries`
    prefixes none of which covers another has: entries - 1."""
    k = KERNEL
    n = min(entries, spec.max_entries)
    if spec.kind == "lpm_trie":
        if intermediates is None:
            intermediates = max(0, n - 1)
        return n * lpm_node_bytes(spec) + intermediates * lpm_node_bytes(spec, leaf=False)
    if spec.kind in ("hash", "lru_hash") and spec.no_prealloc:
        fixed = k["htab"] + k["htab_bucket"] * _pow2(spec.max_entries) + k["htab_locks"] * cpus
        elem = k["htab_elem"] + _round8(spec.key_size) + _round8(spec.value_size)
        return fixed + n * (_slab(elem + LLIST_NODE) + OBJCG)
    return memlock(spec, cpus, entries)


def lpm_intermediates(keys) -> int:
    """The intermediate nodes an LPM trie of these prefixes has: the points
    where prefixes part that are not prefixes themselves.  `keys`:
    (prefixlen, address bytes) pairs.  Every such point is where two
    neighbours in the trie's order part, so one pass over them, sorted."""
    width = None
    items = set()
    for plen, addr in keys:
        width = width or 8 * len(addr)
        value = int.from_bytes(addr, "big") >> (width - plen) << (width - plen) if plen else 0
        items.add((value, plen))
    ordered = sorted(items)
    parts = set()
    for (a, la), (b, lb) in zip(ordered, ordered[1:]):
        common = width - (a ^ b).bit_length()
        if common < min(la, lb):
            parts.add((a >> (width - common) << (width - common) if common else 0, common))
    return len(parts - items)


def kernel_model(cpus: int | None = None, entries: dict[str, int] | None = None,
                 intermediates: dict[str, int] | None = None,
                 sizes: dict[str, int] | None = None) -> dict[str, int]:
    """name -> bytes the kernel allocates for each map (kernel_bytes)."""
    cpus = bpfsys.possible_cpus() if cpus is None else cpus
    entries, intermediates = entries or {}, intermediates or {}
    return {s.name: kernel_bytes(s, cpus, entries.get(s.name, 0), intermediates.get(s.name))
            for s in specs(sizes)}


def host_kernel_bytes(peers: int, cpus: int = 128, sizes: dict[str, int] | None = None) -> int:
    """host_bytes() as the kernel counts it (the trie's intermediate nodes
    and the slab's rounding included): what `fabric plan` reports."""
    return sum(kernel_model(cpus, {"peers": peers, "peer_by_sid": peers}, sizes=sizes).values())


def model(cpus: int | None = None, entries: dict[str, int] | None = None,
          sizes: dict[str, int] | None = None) -> dict[str, int]:
    """name -> memlock bytes of every map (cpus: this machine's possible
    CPUs by default)."""
    cpus = bpfsys.possible_cpus() if cpus is None else cpus
    entries = entries or {}
    return {s.name: memlock(s, cpus, entries.get(s.name, 0)) for s in specs(sizes)}


def host_bytes(peers: int, cpus: int = 128, sizes: dict[str, int] | None = None) -> int:
    """One attachment's kernel memory with `peers` peers in the maps (each
    with a prefix and a SID: a template's peer), on `cpus` CPUs: what
    `fabric plan` reports per host.  Learnt state, paths and the receive
    side are preallocated at their sizes, whatever the peers."""
    return sum(model(cpus, {"peers": peers, "peer_by_sid": peers}, sizes).values())


def per_cpu_bytes(sizes: dict[str, int] | None = None) -> int:
    """How much the maps grow with each more CPU."""
    a, b = model(1, sizes=sizes), model(2, sizes=sizes)
    return sum(b.values()) - sum(a.values())


def fdinfo(fd: int) -> dict[str, str]:
    """The kernel's fdinfo of a BPF object fd (map_type, max_entries,
    memlock, ...)."""
    out = {}
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def measured(directory: Path) -> dict[str, int]:
    """name -> memlock the kernel reports for each map pinned in
    `directory` (an attachment's pin directory; programs left out)."""
    out = {}
    for spec in specs():
        path = Path(directory) / spec.name
        if not path.exists():
            continue
        fd = bpfsys.obj_get(str(path))
        try:
            info = fdinfo(fd)
        finally:
            os.close(fd)
        if "memlock" in info and "map_type" in info:
            out[spec.name] = int(info["memlock"])
    return out


# the maps an attachment sizes (attach --active-peers) -> the header's
# constant their size is, for specs(sizes)
SIZED = {"peer_state": "MRC_MAX_ACTIVE_PEERS", "rx_peers": "MRC_RX_MAX_SENDERS", "rx_paths": "MRC_RX_MAX_PATHS"}


def attached_sizes(directory: Path) -> dict[str, int]:
    """The header's constants (SIZED) as the attachment pinned in
    `directory` has its maps sized: the `sizes` of model() for it."""
    out = {}
    for name, const in SIZED.items():
        path = Path(directory) / name
        if not path.exists():
            continue
        fd = bpfsys.obj_get(str(path))
        try:
            out[const] = int(fdinfo(fd)["max_entries"])
        finally:
            os.close(fd)
    return out


def entries_in_use(directory: Path, intermediates: dict | None = None) -> dict[str, int]:
    """name -> entries of the attachment's maps allocated as used (the
    model's `entries` for them); with `intermediates` (a dict), also the
    LPM tries' intermediate nodes, filled in by name."""
    out = {}
    for spec in specs():
        if not spec.no_prealloc or not (Path(directory) / spec.name).exists():
            continue
        key, value, percpu = layout.MAPS[spec.name]
        m = bpfsys.PinnedMap(str(Path(directory) / spec.name), key, value, percpu)
        try:
            if spec.kind == "lpm_trie":
                keys, _, n = m.dump()
                ks = ctypes.sizeof(key)
                out[spec.name] = n
                if intermediates is not None:
                    intermediates[spec.name] = lpm_intermediates(
                        (int.from_bytes(keys[i * ks:i * ks + 4], "little"), keys[i * ks + 4:(i + 1) * ks])
                        for i in range(n))
            else:
                out[spec.name] = sum(1 for _ in m.keys())
        finally:
            m.close()
    return out


def mib(n: int) -> float:
    return round(n / (1 << 20), 2)
