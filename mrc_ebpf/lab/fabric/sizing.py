"""`mrcctl fabric plan`: a two-tier fabric's shape from its NIC count, planes
and switch radix, and per host what its datapath would hold: config size,
kernel memory for a CPU count, and the time to apply the config.

Kernel memory here is a model of TODAY's maps (bpf/lib/maps.h: arrays sized
MRC_MAX_PEERS x MRC_MAX_PATHS whatever is used), computed from the map
declarations and the kernel's own accounting (map_mem_usage in 6.x:
the memlock `bpftool map show` and /proc/PID/fdinfo report);
tests/test_fabric_plan.py checks it against a real attachment's memlock.
When the datapath's maps follow use (issue 19; mrc_ebpf/datapath/memory.py),
its memory model replaces `todays_memory`.
"""
from __future__ import annotations

import ctypes
import math
import os
import re

from mrc_ebpf.errors import MrcError

PAGE = 4096
# Fixed parts of the kernel's accounting (6.x, 64-bit): struct bpf_array,
# struct bpf_htab, struct htab_elem, struct lpm_trie_node, a hash bucket,
# and the ring buffer's own structs; per element the kernel rounds values
# (and hash keys) up to 8 bytes.
ARRAY_BASE, HTAB_BASE, HTAB_ELEM, HTAB_BUCKET, LPM_NODE, RINGBUF_BASE = 312, 896, 48, 16, 24, 4392
MAP_TYPES = {"array": 2, "percpu_array": 6, "prog_array": 3, "hash": 1, "lru_hash": 9, "lpm_trie": 11,
             "ringbuf": 27}


def _round8(n: int) -> int:
    return (n + 7) & ~7


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def map_specs() -> list[dict]:
    """Every map of bpf/lib/maps.h: name, type, key and value size, max
    entries and whether it preallocates (the sizes from the C header via
    datapath.layout, whose mirrors tests/test_layout.py checks)."""
    from mrc_ebpf.datapath import layout, source
    text = (source.BPF_DIR / "lib" / "maps.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    consts = dict(source.C)
    consts["MRC_COUNTER_MAX"] = len(source.counter_names())

    def value(expr: str) -> int:
        e = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(consts[m.group(0)]), expr)
        if not re.fullmatch(r"[0-9 *+()]+", e):
            raise ValueError(f"cannot evaluate {expr!r}")
        return int(eval(e, {"__builtins__": {}}))  # noqa: S307 - digits and operators only

    specs = []
    for m in re.finditer(r"^(BPF_\w+)\((.*)\);", text, flags=re.M):
        macro, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if macro in ("BPF_ARRAY", "BPF_PERCPU_ARRAY"):
            name, entries, kind, flags = args[0], value(args[2]), macro[4:].lower(), 0
        elif macro == "BPF_LPM_TRIE":
            name, entries, kind, flags = args[0], value(args[3]), "lpm_trie", 1
        elif macro in ("BPF_TABLE", "BPF_F_TABLE"):
            kind, name, entries = args[0].strip('"'), args[3], value(args[4])
            flags = 1 if macro == "BPF_F_TABLE" and "NO_PREALLOC" in args[5] else 0
        elif macro == "BPF_PROG_ARRAY":      # program fds: a u32 key and value
            specs.append({"name": args[0], "type": "prog_array", "key_size": 4, "value_size": 4,
                          "max_entries": value(args[1]), "flags": 0})
            continue
        elif macro == "BPF_RINGBUF_OUTPUT":
            specs.append({"name": args[0], "type": "ringbuf", "key_size": 0, "value_size": 0,
                          "max_entries": value(args[1]) * PAGE, "flags": 0})
            continue
        else:
            raise ValueError(f"maps.h: unknown map macro {macro}")
        key, val, _ = layout.MAPS[name]
        specs.append({"name": name, "type": kind, "key_size": ctypes.sizeof(key),
                      "value_size": ctypes.sizeof(val), "max_entries": entries, "flags": flags})
    return specs


def map_memlock(spec: dict, cpus: int, used: int = 0) -> int:
    """The kernel's memlock of one map with CPUS possible CPUs; USED is
    the entries in use (what an LPM trie and a hash without preallocation
    account; arrays and preallocated hashes account max_entries)."""
    n, val = spec["max_entries"], _round8(spec["value_size"])
    kind = spec["type"]
    if kind in ("array", "prog_array"):
        return ARRAY_BASE + n * val
    if kind == "percpu_array":
        return ARRAY_BASE + n * 8 + n * val * cpus
    if kind in ("hash", "lru_hash"):
        elem = HTAB_ELEM + _round8(spec["key_size"]) + val
        usage = HTAB_BASE + HTAB_BUCKET * _pow2(n)
        if spec["flags"] & 1:            # BPF_F_NO_PREALLOC: what is in it, and a list node each
            return usage + (elem + 8) * used
        return usage + elem * n
    if kind == "lpm_trie":
        return used * (LPM_NODE + spec["key_size"] - 4 + spec["value_size"])
    if kind == "ringbuf":
        pages = n // PAGE
        return RINGBUF_BASE + (pages + 2) * PAGE + (pages + 2) * 2 * 8
    raise ValueError(f"no memory model for map type {kind}")


def todays_memory(cpus: int, peers: int = 0, peer_sids: int = 0) -> dict:
    """Kernel memory of one attachment with today's maps: per map and in
    total, split into what is fixed and what grows with the CPU count.
    peers / peer_sids: entries in the peer trie and the SID hash."""
    used = {"peers": peers, "peer_by_sid": peer_sids}
    maps = {s["name"]: map_memlock(s, cpus, used.get(s["name"], 0)) for s in map_specs()}
    one = {s["name"]: map_memlock(s, 1, used.get(s["name"], 0)) for s in map_specs()}
    zero = {s["name"]: map_memlock(s, 0, used.get(s["name"], 0)) for s in map_specs()}
    per_cpu = sum(one.values()) - sum(zero.values())
    return {"cpus": cpus, "total_bytes": sum(maps.values()), "fixed_bytes": sum(zero.values()),
            "per_cpu_bytes": per_cpu, "maps": maps}


def measured_memlock(directory) -> dict[str, dict]:
    """What the kernel accounts for each map pinned under DIRECTORY (an
    attachment's pins): name -> {type, key_size, value_size, max_entries,
    flags, memlock}, from /proc/self/fdinfo."""
    from pathlib import Path
    from mrc_ebpf.datapath import bpfsys
    types = {v: k for k, v in MAP_TYPES.items()}
    out = {}
    for path in sorted(Path(directory).rglob("*")):
        if path.is_dir():
            continue
        try:
            fd = bpfsys.obj_get(str(path))
        except OSError:
            continue
        try:
            info = dict(line.split(":", 1) for line in open(f"/proc/self/fdinfo/{fd}").read().splitlines()
                        if ":" in line)
        finally:
            os.close(fd)
        if "map_id" not in info:
            continue
        info = {k: v.strip() for k, v in info.items()}
        out[path.name] = {"type": types.get(int(info["map_type"]), info["map_type"]),
                          "key_size": int(info["key_size"]), "value_size": int(info["value_size"]),
                          "max_entries": int(info["max_entries"]), "flags": int(info["map_flags"], 16),
                          "memlock": int(info["memlock"])}
    return out


def possible_cpus() -> int:
    """CPUs the kernel sizes per-CPU maps for (num_possible_cpus)."""
    try:
        text = open("/sys/devices/system/cpu/possible").read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


# ---- the plan ----------------------------------------------------------------

def shape(nics: int, planes: int, radix: int) -> dict:
    """Two tiers of radix-R switches per plane, full bisection: a leaf has
    R/2 ports down (hosts) and R/2 up (one to each of R/2 spines); a spine's
    R ports take up to R leaves, so a plane holds at most R*R/2 NICs."""
    if nics < 2:
        raise MrcError(f"--nics {nics}: at least 2")
    if not 1 <= planes <= 64:
        raise MrcError(f"--planes {planes}: 1..64")
    if radix < 4 or radix % 2:
        raise MrcError(f"--radix {radix}: an even port count, at least 4")
    down = radix // 2
    leaves = math.ceil(nics / down)
    if leaves > radix:
        raise MrcError(f"{nics} NICs need {leaves} leaves per plane, but a radix-{radix} spine reaches "
                       f"{radix}: two tiers of radix {radix} hold at most {radix * down} NICs per plane")
    spines = down
    return {"nics": nics, "planes": planes, "radix": radix, "leaves_per_plane": leaves,
            "spines_per_plane": spines, "hosts_per_leaf": down, "switches": planes * (leaves + spines),
            "paths_available": planes * spines}


def _entry_bytes(encoding: str, planes: int, spines: int, paths: int) -> tuple[int, int]:
    """Bytes of the rendered config: its head and one peer, rendered for a two-leaf fabric of this encoding with today's
    address plan (ids of the widths a large fabric has), PATHS paths each."""
    from .description import Description
    from .render import dump, host_config
    spec = {"name": "plan", "planes": planes, "spines": min(spines, 255), "leaves": 2, "hosts_per_leaf": 2,
            "encoding": encoding, "rate": None, "host_rate": None}
    desc = Description.from_spec(spec)
    # host ids 0xe001..: four hex digits, as a large plan's are
    cfg = host_config(desc, "h1", peers=[1, 3])
    for peer in cfg["peers"]:
        peer["paths"] = (peer["paths"] * math.ceil(paths / len(peer["paths"])))[:paths]
    head = len(dump({k: v for k, v in cfg.items() if k != "peers"}).encode()) + len("peers:\n")
    one = len(dump({"peers": [cfg["peers"][0]]}).encode()) - len("peers:\n")
    return head, one


def plan(nics: int, planes: int, radix: int, cpus: int, paths: int | None = None,
         encoding: str = "srh", apply_rate: dict | None = None) -> dict:
    """The shape, and per host: config size (peers form), kernel memory of
    today's maps for CPUS, and (given a measured apply_rate) apply time."""
    from mrc_ebpf.datapath.source import C
    s = shape(nics, planes, radix)
    per_peer = min(paths or C["MRC_MAX_PATHS"], s["paths_available"])
    if per_peer < 1:
        raise MrcError(f"--paths {paths}: at least 1")
    peers = nics - 1
    head, one = _entry_bytes(encoding, planes, s["spines_per_plane"], per_peer)
    config = {"peers": peers, "paths": peers * per_peer, "bytes": head + peers * one,
              "bytes_per_peer": one, "how": f"rendered bytes of one peer entry ({per_peer} {encoding} paths) "
                                          f"x {peers} peers + the attach section"}
    mem = todays_memory(cpus, min(peers, C["MRC_MAX_PEERS"]), min(peers, C["MRC_MAX_PEERS"]))
    memory = {"cpus": cpus, "bytes": mem["total_bytes"], "fixed_bytes": mem["fixed_bytes"],
              "per_cpu_bytes": mem["per_cpu_bytes"], "peers_held": min(peers, C["MRC_MAX_PEERS"]),
              "how": "today's maps (bpf/lib/maps.h, arrays of MRC_MAX_PEERS x MRC_MAX_PATHS) under the "
                     "kernel's accounting; they hold at most "
                     f"{C['MRC_MAX_PEERS']} peers whatever the fabric"}
    out = {**s, "paths_per_peer": per_peer, "encoding": encoding, "path_lists": s["leaves_per_plane"],
           "config": config, "memory": memory}
    if apply_rate:
        t = apply_rate["fixed_s"] + peers * apply_rate["per_peer_s"] + peers * per_peer * apply_rate["per_path_s"]
        out["apply"] = {"seconds": round(t, 1), "measured": apply_rate,
                        "how": f"extrapolated linearly from applying {apply_rate['peers']} peers x "
                               f"{apply_rate['paths_per_peer']} paths on this machine with today's path add; "
                               f"today's datapath holds {C['MRC_MAX_PEERS']} peers, so beyond that it is "
                               f"an extrapolation of the per-path cost, not a run"}
    return out


def measure_apply(peers: int = 64, paths: int = 64) -> dict:
    """Time applying rendered configs with today's verbs (apply_rendered:
    attach, then path add per peer) in a namespace of its own: PEERS peers
    with one path each, then PEERS more with PATHS paths each, so the cost
    splits into per peer and per path.  Returns the rate `plan` extrapolates."""
    import tempfile
    from pathlib import Path
    from mrc_ebpf.lab import netns
    from mrc_ebpf.lab.procs import PY, run
    from .description import Description
    from .render import dump, host_config
    if os.geteuid() != 0:
        raise MrcError("measuring apply time needs root (it attaches the datapath in a namespace)")
    if not 1 <= peers <= 127 or not 1 <= paths <= 255:
        raise MrcError("measure with 1..127 peers of 1..255 paths (two sets must fit 256 peers)")
    ns = f"mrcplan{os.getpid()}"
    spec = {"name": "plan", "planes": 1, "spines": paths, "leaves": 1, "hosts_per_leaf": 2 * peers + 1,
            "encoding": "srh", "rate": None, "host_rate": None}
    desc = Description.from_spec(spec)
    one = host_config(desc, "h1", peers=list(range(2, peers + 2)))
    for peer in one["peers"]:
        peer["paths"] = peer["paths"][:1]
    many = host_config(desc, "h1", peers=list(range(peers + 2, 2 * peers + 2)))
    netns.create(ns, ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"])
    try:
        run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "up0"], ns=ns)
        for cmd in (["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "up0", "up"],
                    ["ip", "-6", "route", "replace", "fc00::/16", "via", "fe80::1", "dev", "eth0"],
                    ["ip", "-6", "route", "replace", "fd00::/16", "via", "fe80::1", "dev", "eth0"]):
            run(cmd, ns=ns)
        with tempfile.TemporaryDirectory(prefix="mrc-plan-") as tmp:
            results = []
            for cfg, extra in ((one, []), (many, ["--no-attach"])):
                f = Path(tmp) / "config.yaml"
                f.write_text(dump(cfg))
                r = run([PY, "-m", "mrc_ebpf.lab.fabric.apply_rendered", str(f), *extra], ns=ns, check=False,
                        timeout=1800)
                import json
                doc = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
                if r.returncode != 0 or "error" in doc:
                    raise MrcError(f"measuring apply time: {doc.get('error') or r.stderr.strip()[-200:]}")
                results.append(doc)
    finally:
        netns.delete([ns])
    t1, tn = results[0]["paths_s"], results[1]["paths_s"]
    per_path = max(0.0, (tn - t1) / (peers * (paths - 1))) if paths > 1 else 0.0
    per_peer = max(0.0, t1 / peers - per_path)
    return {"peers": peers, "paths_per_peer": paths, "attach_s": results[0]["attach_s"],
            "one_path_peers_s": t1, "many_path_peers_s": tn, "per_peer_s": round(per_peer, 6),
            "per_path_s": round(per_path, 7), "fixed_s": results[0]["attach_s"]}
