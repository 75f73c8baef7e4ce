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


BLOCKS_FROM = 256      # render's auto form: peers as blocks from this many (render.OWN_ROWS)


def _fabric(planes: int, spines: int, leaves: int = 2, hosts_per_leaf: int = 2):
    from .plan import Fabric
    return Fabric({"name": "plan", "planes": planes, "spines": spines, "leaves": leaves,
                   "hosts_per_leaf": hosts_per_leaf, "encoding": "srh", "rate": None, "host_rate": None})


def _blocks_bytes(planes: int, spines: int, leaves: int, hosts_per_leaf: int, paths: int | None) -> int:
    """Bytes of the blocks form, rendered for this shape: the templates
    render makes (one per spine group: Fabric.spine_groups) and the peers
    in blocks; with PATHS, one template of PATHS paths (spines per plane
    to make them)."""
    from .description import Description
    from .render import dump, host_config
    per_plane = spines if paths is None else max(1, min(255, paths // planes))
    spec = {"name": "plan", "planes": planes, "spines": per_plane, "leaves": leaves,
            "hosts_per_leaf": hosts_per_leaf, "encoding": "srh", "rate": None, "host_rate": None}
    return len(dump(host_config(Description.from_spec(spec), "h1", form="blocks")).encode())


def plan(nics: int, planes: int, radix: int, cpus: int, paths: int | None = None,
         encoding: str = "srh", apply_rate: dict | None = None) -> dict:
    """The shape, and per host: config size (the form render gives it),
    kernel memory of the maps for CPUS, and (given a measured apply_rate)
    apply time."""
    from mrc_ebpf.datapath.source import C
    s = shape(nics, planes, radix)
    fab = _fabric(planes, s["spines_per_plane"])
    # what render gives a peer: a path per plane and spine of its spine group
    natural = len(fab.paths(1, 2))
    per_peer = min(paths or natural, natural, C["MRC_MAX_PATHS"])
    if per_peer < 1:
        raise MrcError(f"--paths {paths}: at least 1")
    choice = fab.path_choice() if per_peer == natural else None
    peers = nics - 1
    form = "blocks" if encoding == "srh" and peers >= BLOCKS_FROM else "peers"
    head, one = _entry_bytes(encoding, planes, s["spines_per_plane"], per_peer)
    if form == "blocks":
        size = _blocks_bytes(planes, s["spines_per_plane"], s["leaves_per_plane"], s["hosts_per_leaf"],
                             None if per_peer == natural else per_peer)
        templates = fab.spine_groups() if per_peer == natural else 1
        how = (f"rendered (mrcctl render): {templates} path template(s) of {per_peer} paths and the peers "
               f"in blocks of the address plan; listing every peer instead would be {head + peers * one} bytes")
    else:
        size = head + peers * one
        how = f"rendered bytes of one peer entry ({per_peer} {encoding} paths) x {peers} peers + the attach section"
    config = {"peers": peers, "paths": peers * per_peer, "bytes": size, "form": form,
              "bytes_per_peer": one, "how": how}
    held = min(peers, C["MRC_MAX_PEER_PREFIXES"])
    total = memory.host_bytes(held, cpus)
    memory_row = {"cpus": cpus, "bytes": total, "per_cpu_bytes": memory.per_cpu_bytes(),
                  "fixed_bytes": total - cpus * memory.per_cpu_bytes(), "peers_held": held,
                  # as the kernel counts it (memory.kernel_bytes): the slab
                  # objects of the maps allocated as used, the LPM trie's
                  # intermediate nodes (about one per peer)
                  "kernel_bytes": memory.host_kernel_bytes(held, cpus),
                  "how": "the datapath's maps (datapath/memory.py) with every other NIC a template's "
                         f"peer (prefix and SID); learnt state for {C['MRC_MAX_ACTIVE_PEERS']} "
                         f"peers in use at once, receive state for {C['MRC_RX_MAX_SENDERS']} senders"}
    out = {**s, "paths_per_peer": per_peer, "path_choice": choice, "encoding": encoding,
           "path_lists": fab.spine_groups() if form == "blocks" and per_peer == natural else
           (1 if form == "blocks" else peers),
           "config": config, "memory": memory_row}
    if apply_rate:
        out["apply"] = apply_estimate(apply_rate, form, peers, per_peer)
    return out


def apply_estimate(rate: dict, form: str, peers: int, paths: int) -> dict:
    """`mrcctl apply` time of a host config from measure_apply's runs."""
    if form == "blocks":
        t = rate["blocks_s"] + (peers - rate["block_peers"]) * rate["per_block_peer_s"]
        how = (f"`mrcctl apply` of the blocks form onto an attachment, measured here with "
               f"{rate['block_peers']} and {rate['block_peers_more']} peers on a template of "
               f"{rate['template_paths']} paths, linear in the peers")
    else:
        t = rate["base_s"] + peers * rate["per_peer_s"] + peers * (paths - 1) * rate["per_path_s"]
        how = (f"`mrcctl apply` of the peers form onto an attachment, extrapolated linearly from "
               f"{rate['peers']} peers x 1 and x {rate['paths_per_peer']} paths measured here")
    return {"seconds": round(t, 1), "form": form, "measured": rate, "how": how,
            "attach_s": rate["attach_s"]}


def measure_apply(peers: int = 64, paths: int = 64, block_peers: int = 2048) -> dict:
    """Time `mrcctl apply` (the command a host runs) in a namespace of its
    own: an attach section alone (the compile: attach_s; then again, a
    no-op: base_s); the peers form with PEERS peers of one path, then of
    PATHS paths; the blocks form with BLOCK_PEERS and 8 x BLOCK_PEERS peers
    on a template of PATHS paths.  Each config is applied onto the bare
    attachment (the attach section alone applied in between)."""
    import tempfile
    import time
    from pathlib import Path
    from mrc_ebpf.control import config as host_config_format
    from mrc_ebpf.lab import netns
    from mrc_ebpf.lab.procs import mrcctl_cmd, mrcctl_result, run
    from .description import Description
    from .render import dump, host_config
    if os.geteuid() != 0:
        raise MrcError("measuring apply time needs root (it attaches the datapath in a namespace)")
    if not 1 <= peers <= 255 or not 2 <= paths <= 255:
        raise MrcError("measure with 1..255 peers of 2..255 paths")
    ns = f"mrcplan{os.getpid()}"
    spec = {"name": "plan", "planes": 1, "spines": min(paths, 255), "leaves": 1, "hosts_per_leaf": peers + 1,
            "encoding": "srh", "rate": None, "host_rate": None}
    desc = Description.from_spec(spec)
    many = host_config(desc, "h1", form="peers")
    one = {**many, "peers": [{**p, "paths": p["paths"][:1]} for p in many["peers"]]}
    bare = {k: v for k, v in many.items() if k == "version" or k == "attach"}
    more = 8 * block_peers
    big = Description.from_spec({**spec, "hosts_per_leaf": more + 1})
    blocks_small = host_config(big, "h1", peers=list(range(1, block_peers + 2)), form="blocks")
    blocks_big = host_config(big, "h1", form="blocks")
    for cfg in (blocks_small, blocks_big):      # onto the same attachment (its SID)
        cfg["attach"] = dict(bare["attach"])
    netns.create(ns, ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"])
    try:
        run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "up0"], ns=ns)
        for cmd in (["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "up0", "up"],
                    ["ip", "-6", "route", "replace", "fc00::/16", "via", "fe80::1", "dev", "eth0"],
                    ["ip", "-6", "route", "replace", "fd00::/16", "via", "fe80::1", "dev", "eth0"]):
            run(cmd, ns=ns)
        with tempfile.TemporaryDirectory(prefix="mrc-plan-") as tmp:
            def apply(cfg) -> float:
                f = Path(tmp) / "config.yaml"
                f.write_text(dump(cfg))
                host_config_format.load(f.read_text(), str(f))      # a config apply takes
                t0 = time.monotonic()
                r = run(mrcctl_cmd(ns, "apply", str(f)), check=False, timeout=1800)
                took = time.monotonic() - t0
                mrcctl_result(r, "measuring apply time")
                return took
            attach_s = apply(bare)
            base_s = apply(bare)
            t_one = apply(one)
            apply(bare)
            t_many = apply(many)
            apply(bare)
            t_blocks = apply(blocks_small)
            apply(bare)
            t_blocks_more = apply(blocks_big)
    finally:
        netns.delete([ns])
    per_path = max(0.0, (t_many - t_one) / (peers * (paths - 1)))
    per_peer = max(0.0, (t_one - base_s) / peers)
    return {"peers": peers, "paths_per_peer": paths, "attach_s": round(attach_s, 2), "base_s": round(base_s, 3),
            "one_path_peers_s": round(t_one, 3), "many_path_peers_s": round(t_many, 3),
            "per_peer_s": round(per_peer, 6), "per_path_s": round(per_path, 7),
            "template_paths": len(blocks_small["templates"][0]["paths"]), "block_peers": block_peers,
            "block_peers_more": more, "blocks_s": round(t_blocks, 3), "blocks_more_s": round(t_blocks_more, 3),
            "per_block_peer_s": round(max(0.0, (t_blocks_more - t_blocks) / (more - block_peers)), 8),
            "by": "mrcctl apply"}
