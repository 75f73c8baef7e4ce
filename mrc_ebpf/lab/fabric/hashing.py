"""How the leaves hash flows onto spines (`fabric up --hash`): set on a
live fabric and read back from the leaves themselves, so a benchmark
records what the kernel did, not what was asked."""
from __future__ import annotations

from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.procs import run

from .plan import HASHES, Fabric, check_hash, hash_sysctls
from .state import locked

_KEYS = ("net.ipv6.fib_multipath_hash_policy", "net.ipv6.fib_multipath_hash_fields",
         "net.ipv4.fib_multipath_hash_policy", "net.ipv4.fib_multipath_hash_fields")


def _name_of(v6_policy: int, v6_fields: int, v4_policy: int) -> str | None:
    """The HASHES entry these values are, or None (someone changed them)."""
    for name, h in HASHES.items():
        if v6_policy == h["policy"] == v4_policy and (h["fields"] is None or v6_fields == h["fields"]):
            return name
    return None


def read_leaf(ns: str) -> dict:
    r = run(["ip", "netns", "exec", ns, "sysctl", "-n", *_KEYS])
    vals = [int(x, 0) for x in r.stdout.split()]
    if len(vals) != len(_KEYS):
        raise MrcError(f"cannot read the ECMP hash sysctls in {ns}")
    v6p, v6f, v4p, v4f = vals
    return {"hash": _name_of(v6p, v6f, v4p), "ipv6_policy": v6p, "ipv6_fields": f"0x{v6f:x}",
            "ipv4_policy": v4p, "ipv4_fields": f"0x{v4f:x}"}


def read(fab: Fabric) -> dict:
    """{"hash": NAME if every leaf agrees else None, "leaves": {leaf: read_leaf}}."""
    leaves = {leaf: read_leaf(fab.ns(leaf)) for leaf in fab.leaf_nodes()}
    names = {v["hash"] for v in leaves.values()}
    return {"hash": names.pop() if len(names) == 1 else None, "leaves": leaves}


def set_hash(name: str, hash_name: str) -> dict:
    """Switch every leaf of fabric NAME to hash_name (flows already in
    progress are hashed anew from their next packet); returns read()."""
    check_hash(hash_name)
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        for leaf in fab.leaf_nodes():
            run(["ip", "netns", "exec", fab.ns(leaf), "sysctl", "-qw", *hash_sysctls(hash_name)])
        state["spec"]["hash"] = hash_name
        got = read(Fabric(state["spec"]))
    if got["hash"] != hash_name:
        raise MrcError(f"fabric {name}: leaves hash {got['hash']} after setting {hash_name}")
    return got
