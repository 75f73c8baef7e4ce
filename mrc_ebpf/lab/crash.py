"""kill -9 at random points of changing commands, and what it leaves.

For tests/test_crash.py (a few kills per verb) and scripts/crash_kills.py
(many).  Each round runs a command that changes an attachment, SIGKILLs it
at a random moment (mostly while its change log exists, i.e. while it
writes), then lets the next command roll back what it left
(datapath/journal.py), and checks that the namespace's state is byte for
byte what it was before the command or what the command makes when it runs
through: `digest` hashes every pinned map's dump (but the counters the
kernel's own neighbour discovery moves) and the routes of ours.

Run inside a namespace, `python -m mrc_ebpf.lab.crash digest` prints the
digest of that namespace's state.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, journal, pins, routes
from mrc_ebpf.lab import procs

# maps that traffic we do not send still changes (neighbour discovery
# passes the programs), and ones that cannot be dumped as maps
MOVING = {"counters", "rx_paths", "rx_peers", "events", "event_seq", "mrc_event_ring", "mrc_xdp_chain"}


def digest() -> dict:
    """The state of this namespace's attachments: a hash per map, of the
    routes of ours, and of them all."""
    out: dict[str, str] = {}
    base = pins.netns_dir()
    for directory in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        for pin in sorted(directory.iterdir()):
            if pin.name in MOVING or pin.name.startswith("prog_"):
                continue
            out[f"{directory.name}/{pin.name}"] = _map_hash(str(pin))
        out[f"{directory.name}/programs"] = _programs(directory)
    out["routes"] = hashlib.sha256(json.dumps(routes.dump_ours(), sort_keys=True).encode()).hexdigest()
    out["all"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()
    # which programs the pins hold (not part of "all": a replace makes new
    # ones of the same build, so before and after differ only in these):
    # says whether a killed replace was rolled back or forward
    out["prog_ids"] = {f"{d.name}/{p.name}": _prog_id(p) for d in
                       (sorted(q for q in base.iterdir() if q.is_dir()) if base.is_dir() else [])
                       for p in sorted(d.iterdir()) if p.name.startswith("prog_")}
    return out


def _prog_id(pin: Path) -> int:
    fd = bpfsys.obj_get(str(pin))
    try:
        return bpfsys.prog_info(fd).id
    finally:
        os.close(fd)


def _programs(directory: Path) -> str:
    """The programs as a replace leaves them, the same before and after
    one (a new build of the same sources has the same tag): each pin's
    program tag and the hooks that run exactly the pinned program, and
    every prog_ pin there is (a staged one left behind shows)."""
    from pyroute2 import IPRoute
    from mrc_ebpf.datapath import hooks, loader
    ids, out = {}, {"pins": sorted(p.name for p in directory.iterdir() if p.name.startswith("prog_"))}
    for pin in (loader.PROG_RX, loader.PROG_TX, loader.PROG_FB):
        try:
            fd = bpfsys.obj_get(str(directory / pin))
        except bpfsys.BpfError:
            continue
        try:
            info = bpfsys.prog_info(fd)
            ids[pin] = info.id
            out[pin] = {"tag": bytes(info.tag).hex(), "hooked": []}
        finally:
            os.close(fd)
    with IPRoute() as ipr:
        for member in loader.device_members(directory):
            xdp = hooks.device_info(ipr, member.ifindex)["xdp_prog_id"]
            running = {loader.PROG_RX: xdp,
                       loader.PROG_TX: hooks.tc_egress_prog_ids(member.ifindex).get(hooks.TC_PRIO, 0),
                       loader.PROG_FB: hooks.tc_egress_prog_ids(member.ifindex, "ingress").get(hooks.TC_PRIO, 0)}
            for pin, prog_id in running.items():
                if pin in out:
                    out[pin]["hooked"].append(member.ifindex if prog_id == ids[pin] else
                                              f"{member.ifindex}: runs {prog_id or 'nothing'}")
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def _map_hash(pin: str) -> str:
    fd = bpfsys.obj_get(pin)
    try:
        info = bpfsys.map_info(fd)
        m = bpfsys.PinnedMap(pin, ctypes.c_char * info.key_size, ctypes.c_char * info.value_size,
                             info.type in journal.PERCPU_TYPES, fd=os.dup(fd))
    finally:
        os.close(fd)
    try:
        keys, values, n = m.dump()
    finally:
        m.close()
    ks, vs = info.key_size, len(values) // n if n else 0
    pairs = sorted((keys[i * ks:(i + 1) * ks], values[i * vs:(i + 1) * vs]) for i in range(n))
    h = hashlib.sha256()
    for k, v in pairs:
        h.update(k)
        h.update(v)
    return f"{n}:{h.hexdigest()}"


def state(ns: str) -> dict:
    r = subprocess.run(["ip", "netns", "exec", ns, procs.PY, "-m", "mrc_ebpf.lab.crash", "digest"],
                       capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout)


def log_file(ns: str) -> Path:
    r = subprocess.run(["ip", "netns", "exec", ns, procs.PY, "-c",
                        "from mrc_ebpf.datapath import journal; print(journal.log_path())"],
                       capture_output=True, text=True, timeout=60, check=True)
    return Path(r.stdout.strip())


def mrcctl(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*procs.MRCCTL, "--netns", ns, *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"mrcctl {' '.join(args)}: {r.stderr.strip()}")
    return r


def timed(ns: str, args: list[str], log: Path) -> tuple[float, int]:
    """Run ARGS through: (seconds its change log existed, the most undo
    steps it held), to aim the kills."""
    p = subprocess.Popen([*procs.MRCCTL, "--netns", ns, *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    first = last = None
    steps = 0
    while p.poll() is None:
        n = logged_steps(log)
        if n >= 0:
            now = time.monotonic()
            first, last, steps = first or now, now, max(steps, n)
        time.sleep(0.0005)
    assert p.returncode == 0, p.stderr.read()
    return (last - first if first is not None else 0.0), steps


def kill_during(ns: str, args: list[str], log: Path, window: float, rng: random.Random,
                anywhere_p: float = 0.1, steps: int = 0) -> dict:
    """Start ARGS and SIGKILL it, at one of: a random moment of the time its
    change log exists (while it writes); just after its k-th undo step is
    logged, k random up to STEPS (so that every phase is hit, however
    short); sometimes (ANYWHERE_P) early, before it may have begun."""
    p = subprocess.Popen([*procs.MRCCTL, "--netns", ns, *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    start = time.monotonic()
    anywhere = window > 0 and rng.random() < anywhere_p
    # STEPS + 2: a later round may log more than the first did (path
    # bulk's first round writes fresh maps: 2 map steps, later ones 3, and
    # the run that measured STEPS may not have seen its last, the routes')
    target = rng.randint(1, steps + 2) if steps and not anywhere and rng.random() < 0.5 else 0
    if not anywhere:
        while p.poll() is None and logged_steps(log) < (target or 0) and time.monotonic() - start < 120:
            time.sleep(0.0005)
    delay = rng.uniform(0, 0.02) if target else rng.uniform(0, window)
    time.sleep(delay)
    finished = p.poll() is not None
    if not finished:
        p.kill()
    p.wait()
    return {"finished": finished, "delay_s": round(delay, 4), "anywhere": anywhere, "after_step": target,
            "left_log": log.exists(), "logged_steps": logged_steps(log)}


def logged_steps(log: Path) -> int:
    """Undo steps on LOG (complete lines after its header); -1: no log, or
    not even its header (the kill came as it was being opened)."""
    try:
        return log.read_bytes().count(b"\n") - 1
    except FileNotFoundError:
        return -1


def round_(ns: str, args: list[str], log: Path, window: float, rng: random.Random,
           recover_with: list[str] | None = None, anywhere_p: float = 0.1,
           before: dict | None = None, steps: int = 0) -> dict:
    """One kill and its checks; returns what happened, with the state after
    ("state"; raises AssertionError on a state that is neither before nor
    after).  BEFORE: the state now, if known (the last round's after)."""
    before = before or state(ns)
    what = kill_during(ns, args, log, window, rng, anywhere_p, steps)
    status = mrcctl(ns, "status", "-j", check=False)
    if what["logged_steps"] >= 0:
        # a change cut short: status says so, and fails
        assert status.returncode == 1, status.stdout + status.stderr
        rows = json.loads(status.stdout)
        assert rows and rows[0].get("journal"), status.stdout
    else:
        assert status.returncode == 0, status.stdout + status.stderr
    # the next changing command rolls it back first (gc limited to this
    # namespace: a plain gc would also free other namespaces' stranded
    # state, which tests running alongside may be looking at)
    mrcctl(ns, *(recover_with or ["gc", log.stem]))
    assert not log.exists()
    middle = state(ns)
    mrcctl(ns, *args)           # the command works afterwards, and gives "after"
    after = state(ns)
    outcome = "before" if middle["all"] == before["all"] else \
        "after" if middle["all"] == after["all"] else "HALF"
    if outcome == "HALF":
        diff = sorted(k for k in middle if middle[k] != before.get(k) and middle[k] != after.get(k))
        raise AssertionError(f"{' '.join(args)} killed ({what}): state is neither before nor "
                             f"after; differs in {diff}")
    programs = "old" if middle.get("prog_ids") == before.get("prog_ids") else "new"
    return {**what, "outcome": outcome, "programs": programs, "state": after}


# ---- the verbs killed: round K of each changes something new ----------------

def setup(net) -> None:
    """An attachment on NET's (topology.KernelPeerLine) host A with a template."""
    mrcctl(net.A, "attach", "a0", "--sid", net.A_SID)
    mrcctl(net.A, "path", "template", "add", "leaf1", "--via", net.R_SID)


BULK_PEERS = 1000


def bulk_args(net, work: Path, k: int, n: int = BULK_PEERS) -> list[str]:
    """`path bulk` (routes on) of N peers new in round K."""
    f = work / f"bulk{k}.txt"
    f.write_text("".join(f"fd00:7:{k:x}:{i:x}::/64 leaf1 fc00:7:{k:x}:{i:x}::1\n" for i in range(n)))
    return ["path", "bulk", str(f)]


def path_add_args(net, work: Path, k: int, n: int = 8) -> list[str]:
    """`path add` of a new peer with N paths, each to a new peer SID."""
    out = ["path", "add", f"fd00:3:{k:x}::/64"]
    for j in range(1, n + 1):
        out += ["--via", f"{net.R_SID},fc00:b:{k:x}::{j:x}"]
    return out


def apply_args(net, work: Path, k: int) -> list[str]:
    """`apply` of round K's config: the running attach options, the
    template, a block of peers that moves each round (so apply adds some
    and removes others) and an own-path peer of the round's own."""
    import yaml
    data = yaml.safe_load(mrcctl(net.A, "show-config").stdout)
    data["templates"] = [{"name": "leaf1", "paths": [{"via": [net.R_SID]}]}]
    data["peer_blocks"] = [{"template": "leaf1", "prefix": f"fd00:8:{k:x}::/64",
                            "sid": f"fc00:8:{k:x}::1", "count": 1500}]
    data["peers"] = [{"prefix": f"fd00:4:{k:x}::/64",
                      "paths": [{"via": [net.R_SID, f"fc00:b:4:{k:x}::{j}"]} for j in range(1, 5)]}]
    f = work / f"apply{k}.yaml"
    f.write_text(yaml.safe_dump(data))
    return ["apply", str(f)]


def replace_args(net, work: Path, k: int) -> list[str]:
    """`attach --replace`: a new build of the same sources swapped in (the
    state after equals the state before: what a kill must not leave is a
    mix, a hook running a program its pin does not name, or a staged pin)."""
    return ["attach", "a0", "--replace"]


VERBS = {"path bulk": bulk_args, "path add": path_add_args, "apply": apply_args,
         "replace": replace_args}


def run(net, work: Path, verb: str, kills: int, seed: int, anywhere_p: float = 0.1,
        progress=None, most: int = 0) -> list[dict]:
    """KILLS rounds of VERB on NET (set up): one result per kill; with MOST,
    more rounds (up to MOST in all) until a kill landed mid-change (a
    command whose log exists for a few ms, as `attach --replace`'s, can
    finish its writes before all of KILLS random kills)."""
    rng = random.Random(seed)
    log = log_file(net.A)
    make = VERBS[verb]
    # aim: how long the command's change log exists when it runs through
    window, steps = timed(net.A, make(net, work, 0), log)
    out, now = [], None
    k = 0
    while k < kills or (k < most and not any(r["logged_steps"] >= 0 for r in out)):
        k += 1
        result = round_(net.A, make(net, work, k), log, max(window, 0.01), rng, anywhere_p=anywhere_p,
                        before=now, steps=steps)
        now = result.pop("state")
        if progress:
            progress(k, result)
        out.append(result)
    return out


def summary(results: list[dict]) -> dict:
    return {"kills": len(results), "mid_change": sum(r["logged_steps"] >= 0 for r in results),
            "with_writes_logged": sum(r["logged_steps"] > 0 for r in results),
            "finished_first": sum(r["finished"] for r in results),
            "before": sum(r["outcome"] == "before" for r in results),
            "after": sum(r["outcome"] == "after" for r in results),
            # a replace: rolled back (the old programs) or forward (the new)
            "old_programs": sum(r["programs"] == "old" for r in results),
            "new_programs": sum(r["programs"] == "new" for r in results)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["digest"]:
        print(json.dumps(digest()))
        return 0
    print("usage: python -m mrc_ebpf.lab.crash digest", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
