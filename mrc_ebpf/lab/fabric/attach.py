"""mrc-ebpf on a fabric's hosts (`fabric attach` / `fabric detach`)."""
from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path
from mrc_ebpf.control.config.schema import DEFAULT_POLICY
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.procs import mrcctl_cmd as _mrcctl, mrcctl_result, run_parallel, run_sequences

from .plan import DEFAULT_ENTROPY, Fabric
from .state import existing_namespaces, locked


def _pick_hosts(fab: Fabric, hosts: str | None) -> list[int]:
    if not hosts:
        return fab.hosts()
    out = []
    for item in hosts.split(","):
        item = item.strip()
        m = re.fullmatch(r"h?(\d+)", item)
        if not m or not 1 <= int(m.group(1)) <= fab.host_count:
            raise MrcError(f"no host {item!r} in fabric {fab.name} (h1..h{fab.host_count})")
        if int(m.group(1)) not in out:
            out.append(int(m.group(1)))
    return out


ATTACH_WEIGHT = 20      # an attach (a bcc compile) against a path add, for the time left


def link_rate_args(fab: Fabric, extra: list[str]) -> list[str]:
    """A shaped fabric's spine links are slower than the hosts' veths:
    granularity auto sizes bursts for them (--link-rate), unless told."""
    if not fab.rate or any(a.startswith(("--link-rate", "--granularity")) for a in extra):
        return []
    return ["--link-rate", str(fab.rate)]


def attach(name: str, hosts: str | None, policy: str | None, extra: list[str],
           ipv4: bool = False, entropy: int | None = None, progress=None, ev_order: bool = True) -> dict:
    """PROGRESS: called as progress(done, total, text) as hosts attach and paths go in.
    EV_ORDER (--encoding ev): each host then traces which spine each of its
    EVs crosses and orders its spray over the spines (`path trace --order`)."""
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        chosen = _pick_hosts(fab, hosts)
        if len(chosen) < 2:
            raise MrcError("attach needs at least two hosts")
        if entropy is not None and fab.encoding != "ev":
            raise MrcError(f"--entropy is for an --encoding ev fabric; {name} is {fab.encoding}")
        entropy = DEFAULT_ENTROPY if entropy is None else entropy
        if not 1 <= entropy <= 256:
            raise MrcError(f"bad --entropy {entropy}: 1..256 paths per peer")
        already = [fab.host(h) for h in chosen if fab.host(h) in state["attached"]]
        if already:
            raise MrcError(f"already attached: {', '.join(already)} (mrcctl fabric detach first)")
        devs = [f"eth{p}" for p in range(fab.planes)]
        extra = [*extra, *link_rate_args(fab, extra)]
        # the fabric's key (fabric up makes one unless --no-key), unless one is given after --
        if state.get("key_file") and "--key-file" not in extra:
            extra = [*extra, "--key-file", state["key_file"]]
        done = []
        n = len(chosen)
        per_peer = 1 + ipv4
        ev_order = ev_order and fab.encoding == "ev"
        n_cmds = n * (n - 1) * per_peer * (2 if policy else 1) + (n if ev_order else 0)
        total = n * ATTACH_WEIGHT + n_cmds
        count = {"attached": 0, "commands": 0}

        def attached_one(_r):
            count["attached"] += 1
            if progress:
                progress(count["attached"] * ATTACH_WEIGHT, total,
                         f"{count['attached']}/{n} hosts attached")

        def command_done(_r):
            count["commands"] += 1
            if progress:
                progress(n * ATTACH_WEIGHT + count["commands"], total,
                         f"{n}/{n} hosts attached, paths {count['commands']}/{n_cmds} commands")
        try:
            if progress:
                progress(0, total, f"0/{n} hosts attached")
            # attach in parallel (each loads the programs: a bcc compile)
            results = run_parallel([_mrcctl(fab.ns(fab.host(h)), "attach", *devs, "--sid", fab.host_sid(h),
                                         *extra) for h in chosen], limit=2, finished=attached_one)
            for h, r in zip(chosen, results):
                if r.returncode == 0:
                    done.append(h)
            for h, r in zip(chosen, results):
                mrcctl_result(r, f"attach on {fab.host(h)}")
            jobs = []
            for a in chosen:
                ns = fab.ns(fab.host(a))
                cmds = []
                for b in chosen:
                    if a == b:
                        continue
                    prefixes = [fab.prefix6(b)] + ([fab.prefix4(b)] if ipv4 else [])
                    for prefix in prefixes:
                        cmds.append(_mrcctl(ns, *fab.path_add_args(a, b, prefix, entropy)))
                        if policy:
                            cmds.append(_mrcctl(ns, "path", "policy", prefix, policy))
                if ev_order:
                    cmds.append(_mrcctl(ns, "path", "trace", "--order"))
                jobs.append(cmds)
            for results in run_sequences(jobs, finished=command_done):
                for r in results:    # the failed one, if any, is the last
                    mrcctl_result(r, f"{' '.join(r.args[6:9])} in {r.args[5]}")
        except BaseException:
            run_parallel([_mrcctl(fab.ns(fab.host(h)), "detach", "--all") for h in done], limit=4)
            raise
        for h in chosen:
            state["attached"][fab.host(h)] = {"devices": devs, "sid": fab.host_sid(h), "ipv4": ipv4,
                                              "peers": [fab.host(b) for b in chosen if b != h],
                                              "policy": policy or DEFAULT_POLICY, "extra": list(extra)}
            if fab.encoding == "ev":
                state["attached"][fab.host(h)]["entropy"] = entropy
                state["attached"][fab.host(h)]["ev_order"] = ev_order
    return {"name": name, "hosts": [fab.host(h) for h in chosen], "devices": devs,
            "policy": policy or DEFAULT_POLICY, **({"ev_order": ev_order} if fab.encoding == "ev" else {}),
            "paths_per_peer": entropy if fab.encoding == "ev" else fab.planes * fab.spines}


def detach(name: str, hosts: str | None) -> dict:
    with locked(name) as state:
        fab = Fabric(state["spec"])
        chosen = [fab.host(h) for h in _pick_hosts(fab, hosts)] if hosts else list(state["attached"])
        present = existing_namespaces()
        targets = [h for h in chosen if fab.ns(h) in present]
        results = run_parallel([_mrcctl(fab.ns(h), "detach", "--all") for h in targets], limit=4)
        for h, r in zip(targets, results):
            mrcctl_result(r, f"detach on {h}")
        for h in chosen:
            state["attached"].pop(h, None)
    return {"name": name, "detached": chosen}


def attach_rendered(name: str, hosts: str | None = None) -> dict:
    """Attach the hosts from their rendered configs (render.host_config of
    the fabric's description: the file `fabric up --from` read, or the
    defaults for a fabric built from options), each applied in its
    namespace by `mrcctl apply`, one process per host, two at a time."""
    from .description import Description
    from .render import counts, dump, host_config
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        desc = (Description.from_dict(state["description"]) if state.get("description")
                else Description.from_spec(state["spec"]))
        chosen = _pick_hosts(fab, hosts)
        if len(chosen) < 2:
            raise MrcError("attach needs at least two hosts")
        already = [fab.host(h) for h in chosen if fab.host(h) in state["attached"]]
        if already:
            raise MrcError(f"already attached: {', '.join(already)} (mrcctl fabric detach first)")
        configs = {h: host_config(desc, fab.host(h), peers=chosen, key_file=state.get("key_file"))
                   for h in chosen}
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"mrc-{name}-") as tmp:
            files = {}
            for h, cfg in configs.items():
                files[h] = Path(tmp) / f"{fab.host(h)}.yaml"
                files[h].write_text(dump(cfg))
            results = run_parallel([_mrcctl(fab.ns(fab.host(h)), "apply", str(files[h])) for h in chosen],
                                   limit=2, timeout=1800)
        done = [h for h, r in zip(chosen, results) if r.returncode == 0]
        per_host = {}
        try:
            for h, r in zip(chosen, results):
                per_host[fab.host(h)] = _applied(r, fab.host(h), configs[h])
        except BaseException:
            run_parallel([_mrcctl(fab.ns(fab.host(h)), "detach", "--all") for h in done], limit=4)
            raise
        for h in chosen:
            cfg = configs[h]
            state["attached"][fab.host(h)] = {
                "devices": cfg["attach"]["devices"], "sid": cfg["attach"]["sid"],
                "ipv4": desc.options(fab.host(h))["ipv4"], "peers": [fab.host(b) for b in chosen if b != h],
                "policy": desc.options(fab.host(h))["policy"] or DEFAULT_POLICY, "extra": [], "rendered": True}
    return {"name": name, "hosts": [fab.host(h) for h in chosen], "attach_s": round(time.monotonic() - started, 2),
            "per_host": per_host, "config_bytes": {fab.host(h): len(dump(c).encode()) for h, c in configs.items()},
            "paths_per_peer": counts(configs[chosen[0]])[1] // counts(configs[chosen[0]])[0]}


def _applied(r, host: str, cfg: dict) -> dict:
    try:
        doc = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    except ValueError:
        doc = {}
    if r.returncode != 0 or "error" in doc:
        err = doc.get("error") or " ".join((r.stderr or "").split())[-300:] or f"exit {r.returncode}"
        raise MrcError(f"applying the rendered config of {host}: {err}")
    from .render import counts
    peers, paths = counts(cfg)
    return {"peers": peers, "paths": paths, "changes": len(doc.get("changes", [])), "by": "mrcctl apply"}
