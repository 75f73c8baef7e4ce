"""Link failures on a running fabric (`fabric fail` / `fabric heal`)."""
from __future__ import annotations

import re
from mrc_ebpf.lab import faults
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab.procs import batch, run

from .plan import Fabric, parse_mode
from .state import locked


def fail(name: str, targets: list[str], mode_text: str) -> dict:
    mode, loss = parse_mode(mode_text)
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if state["status"] != "up":
            raise MrcError(f"fabric {name} is {state['status']}")
        plan = []          # (kind, ns, dev, target)
        for t in targets:
            node_target = t if t in fab.nodes() else None
            for lk, ends, whole in fab.resolve_target(t):
                if mode == "down":
                    if not whole:
                        raise MrcError(f"{t}: mode down takes a whole link or node, not one direction "
                                       f"(use blackhole or loss=P for one direction)")
                    end = Fabric.down_end(lk, node_target)
                    plan.append(("down", end["ns"], end["dev"], t, lk["name"]))
                else:
                    for end in ends:
                        plan.append(("gray", end["ns"], end["dev"], t, lk["name"]))
        done = []
        seen = set()
        for kind, ns, dev, t, link in plan:
            if (kind, ns, dev) in seen:
                continue
            seen.add((kind, ns, dev))
            existing = [f for f in state["faults"] if f["ns"] == ns and f["dev"] == dev and f["kind"] == kind]
            if kind == "down":
                run(["ip", "-n", ns, "link", "set", dev, "down"])
            elif existing:      # switched in place: instant, no compile
                faults.rearm(ns, dev, mode, loss=loss)
            else:
                faults.inject(ns, dev, mode, loss=loss)
            state["faults"] = [f for f in state["faults"] if f not in existing]
            entry = {"kind": kind, "mode": mode, "loss": loss if kind == "gray" else None,
                     "ns": ns, "dev": dev, "target": t, "link": link}
            state["faults"].append(entry)
            done.append(entry)
    return {"name": name, "mode": mode, "loss": loss if mode != "down" else None, "installed": done}


def heal(name: str, targets: list[str] | None) -> dict:
    """Undo faults on TARGETs (any fault on their ends), or all of them."""
    with locked(name) as state:
        fab = Fabric(state["spec"])
        if targets:
            ends = set()
            for t in targets:
                for lk, _, _ in fab.resolve_target(t):
                    ends |= {(lk["a"]["ns"], lk["a"]["dev"]), (lk["b"]["ns"], lk["b"]["dev"])}
                # a directed heal only heals that direction's gray fault
                m = re.fullmatch(r"([a-z0-9]+)>([a-z0-9]+)", t.strip())
                if m:
                    (lk, [end], _), = fab.resolve_target(t)
                    ends -= {(lk["a"]["ns"], lk["a"]["dev"]), (lk["b"]["ns"], lk["b"]["dev"])}
                    ends.add((end["ns"], end["dev"]))
            chosen = [f for f in state["faults"] if (f["ns"], f["dev"]) in ends]
        else:
            chosen = list(state["faults"])
        reapply = set()
        healed = []
        for f in chosen:
            if f["kind"] == "gray":
                faults.heal(f["ns"], f["dev"])
            else:
                run(["ip", "-n", f["ns"], "link", "set", f["dev"], "up"])
                reapply.add(f["ns"])
            state["faults"].remove(f)
            healed.append(f)
        # the kernel drops IPv6 routes through a device set down: put them back
        by_ns = {d["ns"]: node for node, d in fab.nodes().items()}
        for ns in sorted(reapply):
            node = by_ns[ns]
            batch(["ip", "-n", ns], fab.addr_cmds(node), f"addresses of {node}")
            batch(["ip", "-n", ns], fab.route_cmds(node), f"routes of {node}")
    return {"name": name, "healed": healed}
