"""Building a fabric's namespaces, links and routes (`fabric up`) and removing them (`fabric down`)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from mrc_ebpf.lab import ecn_marks, faults, netns, trims
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.procs import batch as _batch, run

from .plan import DEFAULT_DATA_BLOCK, DEFAULT_HASH, DEFAULT_SID_BLOCK, check_hash, DEFAULT_MTU, DEFAULT_RATE, ENCODINGS, Fabric, MAX_HOSTS, MAX_LEAVES, MAX_MTU, MAX_PLANES, MAX_SPINES, MIN_MTU, STATE_DIR, SYSCTL_RE, parse_rate
from .state import check_name, existing_namespaces, locked, state_path


def _ns_sysctl(ns: str, keys: list[str]) -> None:
    run(["sysctl", "-qw", *keys], ns=ns)


def up(name: str, spines: int, leaves: int, hosts_per_leaf: int, planes: int = 1,
       rate: str | None = DEFAULT_RATE, host_rate: str | None = None, encoding: str = "srh",
       mtu: int = DEFAULT_MTU, host_sysctls: list[str] = (), ecn_threshold: str | None = None,
       ecmp_hash: str = DEFAULT_HASH, progress=None, sid_block: str = DEFAULT_SID_BLOCK,
       data_block: str = DEFAULT_DATA_BLOCK, description: dict | None = None, key: bool = False,
       trim_threshold: str | None = None) -> dict:
    """PROGRESS: called as progress(done, total, text) while building.
    DESCRIPTION (description.Description.to_dict of the file the fabric was
    described in) is kept in its state for `fabric attach --render`.
    KEY: make the fabric a key (key_path: `fabric attach` gives it to every
    host, so their feedback is authenticated; `mrcctl fabric up` does
    unless --no-key).
    TRIM_THRESHOLD: the leaf-spine queues trim MRC packets to their
    headers above it (trims.py)."""
    check_name(name)
    check_hash(ecmp_hash)
    for what, v, hi in (("--spines", spines, MAX_SPINES), ("--leaves", leaves, MAX_LEAVES),
                        ("--hosts-per-leaf", hosts_per_leaf, MAX_HOSTS), ("--planes", planes, MAX_PLANES)):
        if not isinstance(v, int) or not 1 <= v <= hi:
            raise MrcError(f"{what} {v}: must be 1..{hi}")
    if leaves * hosts_per_leaf > MAX_HOSTS:
        raise MrcError(f"{leaves * hosts_per_leaf} hosts: at most {MAX_HOSTS}")
    if encoding not in ENCODINGS:
        raise MrcError(f"bad encoding {encoding!r}: srh, usid or ev")
    if encoding == "ev" and planes != 1:
        raise MrcError("--encoding ev builds one plane: a host's entropy paths leave by eth0, "
                       "and the leaves' hash picks the spine")
    if not isinstance(mtu, int) or not MIN_MTU <= mtu <= MAX_MTU:
        raise MrcError(f"--mtu {mtu}: must be {MIN_MTU}..{MAX_MTU}")
    for kv in host_sysctls:
        if not SYSCTL_RE.match(kv):
            raise MrcError(f"bad --host-sysctl {kv!r}: net.KEY=VALUE")
    rate_bits, host_bits = parse_rate(rate), parse_rate(host_rate)
    if ecn_threshold is not None:
        ecn_marks.parse_threshold(ecn_threshold)
        if not rate_bits:
            raise MrcError("--ecn-threshold needs a --rate: only rate-limited links have queues to mark")
    spec = {"name": name, "planes": planes, "spines": spines, "leaves": leaves,
            "hosts_per_leaf": hosts_per_leaf, "encoding": encoding,
            "rate": rate if rate_bits else None, "host_rate": host_rate if host_bits else None,
            "mtu": mtu, "host_sysctls": list(host_sysctls), "ecn_threshold": ecn_threshold,
            "hash": ecmp_hash}
    if trim_threshold is not None:
        trims.parse_threshold(trim_threshold)
        if not rate_bits:
            raise MrcError("--trim-threshold needs a --rate: only rate-limited links have queues to trim")
        spec["trim_threshold"] = trim_threshold
    if (sid_block, data_block) != (DEFAULT_SID_BLOCK, DEFAULT_DATA_BLOCK):
        spec.update(sid_block=sid_block, data_block=data_block)
    fab = Fabric(spec)
    planned = fab.namespaces()
    if state_path(name).exists():
        raise MrcError(f"fabric {name} already exists (mrcctl fabric down {name} first)")
    clash = sorted(set(planned) & existing_namespaces())
    if clash:
        raise MrcError(f"namespace {clash[0]} already exists (not made by fabric {name}); "
                       f"pick another NAME")
    if os.geteuid() != 0:
        raise MrcError("fabric up needs root")
    started = time.monotonic()
    state = {"spec": spec, "status": "building", "namespaces": planned, "faults": [],
             "attached": {}, "created": time.time()}
    if description is not None:
        state["description"] = description
    with locked(name, create=state) as state:
        try:
            _build(fab, progress or (lambda done, total, text: None))
            if ecn_threshold is not None:
                state["ecn_marking"] = ecn_marks.install(name, fab.marking_devices(),
                                                         ecn_marks.parse_threshold(ecn_threshold))
            if trim_threshold is not None:
                state["trimming"] = trims.install(name, fab.marking_devices(),
                                                  trims.parse_threshold(trim_threshold))
            if key:     # a fresh one: a file left by an earlier fabric of this name goes
                from mrc_ebpf.datapath import auth
                key_path(name).unlink(missing_ok=True)
                state["key_file"] = str(auth.new_key_file(key_path(name)))
        except BaseException as e:
            state["_removed"] = True
            _teardown(fab, state, quiet=True)
            state_path(name).unlink(missing_ok=True)
            if state.get("key_file"):
                key_path(name).unlink(missing_ok=True)
            if isinstance(e, MrcError):
                raise MrcError(f"fabric up {name} failed, removed what it made: {e}")
            if isinstance(e, (subprocess.TimeoutExpired, OSError)):
                raise MrcError(f"fabric up {name} failed, removed what it made: {e}")
            raise
        state["status"] = "up"
        state["build_s"] = round(time.monotonic() - started, 2)
    return {"name": name, "namespaces": len(planned), "hosts": fab.host_count, "links": len(fab.links()),
            "build_s": state["build_s"], "state": str(state_path(name)),
            "key_file": state.get("key_file"), **spec}


def key_path(name: str):
    """Where a fabric's key is kept: next to its state, root's, mode 0600."""
    return STATE_DIR / f"{name}.key"


def _build(fab: Fabric, progress) -> None:
    nodes = fab.nodes()
    n = len(nodes)
    # steps: the two batches, then three passes over the namespaces
    # (sysctls; devices, addresses, qdiscs; routes), the second the longest
    total, done = 2 + 4 * n, 0

    def step(weight: int, text: str) -> None:
        nonlocal done
        done += weight
        progress(done, total, text)

    progress(0, total, f"creating {n} namespaces")
    _batch(["ip"], [f"netns add {d['ns']}" for d in nodes.values()], "creating namespaces")
    step(1, f"0/{n} namespaces configured")
    # defaults first, so devices made afterwards inherit them
    for i, (node, d) in enumerate(nodes.items(), 1):
        _ns_sysctl(d["ns"], fab.sysctls(node))
        step(1, f"sysctls {i}/{n} namespaces")
    _batch(["ip"], [f"link add {lk['a']['dev']} netns {lk['a']['ns']} type veth peer name "
                    f"{lk['b']['dev']} netns {lk['b']['ns']}" for lk in fab.links()], "creating links")
    step(1, f"{len(fab.links())} links made")
    for i, (node, d) in enumerate(nodes.items(), 1):
        _ns_sysctl(d["ns"], fab.sysctls(node) + fab.dev_sysctls(node))
        _batch(["ip", "-n", d["ns"]], fab.addr_cmds(node), f"addresses of {node}")
        _batch(["tc", "-n", d["ns"]], fab.tc_cmds(node), f"qdiscs of {node}")
        step(2, f"addresses {i}/{n} namespaces")
    for i, (node, d) in enumerate(nodes.items(), 1):
        _batch(["ip", "-n", d["ns"]], fab.route_cmds(node), f"routes of {node}")
        step(1, f"routes {i}/{n} namespaces")


def _teardown(fab: Fabric, state: dict, quiet: bool = False) -> list[str]:
    """Remove everything of fab that exists; return what could not be removed."""
    present = existing_namespaces()
    for f in state.get("faults", []):
        if f.get("kind") == "gray" and f["ns"] in present:
            with contextlib.suppress(Exception):
                faults.heal(f["ns"], f["dev"])
    mine = [ns for ns in state.get("namespaces", fab.namespaces()) if ns in present]
    # the datapath's pins outlive a namespace: netns.delete detaches first
    problems = netns.delete(mine)
    if quiet:
        problems = []
    ecn_marks.remove(fab.name)
    trims.remove(fab.name)
    for ns in state.get("namespaces", fab.namespaces()):
        try:
            faults.forget(ns)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            problems.append(f"fault pins of {ns}: {e}")
    left = sorted(set(mine) & existing_namespaces())
    if left:
        problems.append(f"namespaces left: {', '.join(left)}")
    return problems


def down(name: str) -> dict:
    with locked(name) as state:
        fab = Fabric(state["spec"])
        problems = _teardown(fab, state)
        if any(p.startswith("namespaces left") for p in problems):
            raise MrcError(f"fabric down {name}: {'; '.join(problems)}")
        state["_removed"] = True
        state_path(name).unlink(missing_ok=True)
        if state.get("key_file"):
            key_path(name).unlink(missing_ok=True)
    return {"name": name, "removed": len(state.get("namespaces", [])), "problems": problems}
