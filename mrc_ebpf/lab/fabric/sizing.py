"""`mrcctl fabric plan`: a two-tier fabric's shape from its NIC count, planes
and switch radix, and per host what its datapath would hold: config size,
kernel memory for a CPU count, and the time to apply the config.

Kernel memory is the datapath's own model of its maps
(mrc_ebpf/datapath/memory.py: every map of bpf/lib/maps.h under the
kernel's accounting, checked against a real attachment by
tests/test_memory.py), with every other NIC of the fabric a peer in the
maps (a template's peer: a prefix and a SID).
"""
from __future__ import annotations

import math
import os

from mrc_ebpf.datapath import bpfsys, memory
from mrc_ebpf.errors import MrcError


def possible_cpus() -> int:
    """CPUs the kernel sizes per-CPU maps for (num_possible_cpus)."""
    return bpfsys.possible_cpus()


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
    the maps for CPUS, and (given a measured apply_rate) apply time."""
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
    held = min(peers, C["MRC_MAX_PEER_PREFIXES"])
    total = memory.host_bytes(held, cpus)
    memory_row = {"cpus": cpus, "bytes": total, "per_cpu_bytes": memory.per_cpu_bytes(),
                  "fixed_bytes": total - cpus * memory.per_cpu_bytes(), "peers_held": held,
                  "how": "the datapath's maps (datapath/memory.py) with every other NIC a template's "
                         f"peer (prefix and SID); learnt state for {C['MRC_MAX_ACTIVE_PEERS']} "
                         "peers in use at once"}
    out = {**s, "paths_per_peer": per_peer, "encoding": encoding, "path_lists": s["leaves_per_plane"],
           "config": config, "memory": memory_row}
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
