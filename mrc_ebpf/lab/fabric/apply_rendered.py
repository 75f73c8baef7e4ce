"""Apply a rendered host config on a fresh namespace with today's verbs:
`attach` then, per peer, `path add` and `path policy`, in one process (so
a host with hundreds of peers is not hundreds of mrcctl runs).

This is the fabric's own way to attach from rendered configs until
`mrcctl apply` (mrc_ebpf/control/config.py) takes over; it reads the same
keys and only handles a fresh attachment (no diff).

    ip netns exec NS python -m mrc_ebpf.lab.fabric.apply_rendered CONFIG [--no-attach]
prints one JSON line: {"peers": N, "paths": M, "attach_s": .., "paths_s": ..}.
"""
from __future__ import annotations

import json
import sys
import time

import yaml

from mrc_ebpf.errors import MrcError

TIMERS = ("loss_hold_us", "ack_timeout_us", "probe_us", "fb_interval_us", "reorder_max_us")


def path_add_calls(peer: dict) -> list[dict]:
    """A peer's paths as paths.add keyword arguments, one call per (weight,
    class) group in file order (paths.add gives one weight and class to all)."""
    calls: list[dict] = []
    for p in peer["paths"]:
        key = (p.get("weight", 1), p.get("class"))
        if not calls or (calls[-1]["weight"], calls[-1]["tclass_name"]) != key:
            calls.append({"weight": key[0], "tclass_name": key[1], "vias": [], "usids": [],
                          "entropy": 0, "entropy_sid": None})
        c = calls[-1]
        if "via" in p:
            c["vias"].append(",".join(p["via"]))
        elif "usid" in p:
            c["usids"].append(p["usid"])
        else:
            if c["entropy"]:
                calls.append({**c, "vias": [], "usids": [], "entropy": 0})
                c = calls[-1]
            c["entropy"], c["entropy_sid"] = int(p["entropy"]), p["sid"]
    return calls


def apply(cfg: dict, attach: bool = True) -> dict:
    from mrc_ebpf.control import classes, paths
    from mrc_ebpf.datapath import loader
    a = cfg["attach"]
    t0 = time.monotonic()
    if attach:
        loader.attach(list(a["devices"]), a["sid"], a.get("mode", "auto"), a.get("granularity", "packet"),
                      retrans_steer=a.get("retrans_steer", True), min_active=a.get("min_active", 0),
                      key_file=a.get("key_file"), **{k: a[k] for k in TIMERS if k in a})
    t1 = time.monotonic()
    n_paths = 0
    with loader.changing(a["devices"][0]) as att:
        for c in cfg.get("classes", []):
            classes.set_class(att, c["name"], ",".join(map(str, c["dscp"])))
        for peer in cfg.get("peers", []):
            for call in path_add_calls(peer):
                n_paths += len(paths.add(att, peer["prefix"], **call))
            if peer.get("policy"):
                paths.set_policy(att, peer["prefix"], peer["policy"])
    t2 = time.monotonic()
    return {"peers": len(cfg.get("peers", [])), "paths": n_paths, "attach_s": round(t1 - t0, 3),
            "paths_s": round(t2 - t1, 3)}


def main() -> None:
    try:
        with open(sys.argv[1]) as f:
            # libyaml's loader when there is one: a large config parses ~10x faster
            cfg = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        result = apply(cfg, attach="--no-attach" not in sys.argv[2:])
    except MrcError as e:
        print(json.dumps({"error": str(e)}))
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
