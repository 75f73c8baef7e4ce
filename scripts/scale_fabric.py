"""A fabric built from a description file, every host attached from its
rendered config, all-to-all sprayed traffic witnessed per pair; prints
(and with --out writes) build, attach, memory and traffic numbers for
docs/performance/scale-fabric.md.  A measurement script, not a test
(tests/test_fabric_describe.py runs the small one).

usage: scripts/scale_fabric.py FILE [--name NAME] [--count N] [--out JSON] [--keep]
  FILE   a fabric description (docs/performance/scale-fabric.yaml)
  --name a unique fabric name (default: the file's name + this pid)
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrc_ebpf.lab.fabric import Fabric, alltoall, description, load  # noqa: E402
from mrc_ebpf.lab.fabric.sizing import possible_cpus  # noqa: E402
from mrc_ebpf.lab.procs import MRCCTL, PY, in_netns, run_parallel  # noqa: E402

MEMLOCK = ("import json; from mrc_ebpf.datapath import memory, pins; "
           "print(json.dumps(sum(m['memlock'] for m in memory.measured(pins.netns_dir()).values())))")


def mrcctl(*args, timeout=7200):
    r = subprocess.run([*MRCCTL, "-j", *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"mrcctl {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def mem_available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--name")
    ap.add_argument("--count", type=int, default=32, help="datagrams each host sends each other host")
    ap.add_argument("--out")
    ap.add_argument("--keep", action="store_true", help="leave the fabric up")
    a = ap.parse_args()
    desc = description.load(a.file)
    name = a.name or f"{desc.spec['name'][:8]}{os.getpid() % 100000}"
    out = {"file": a.file, "name": name, "cpus": possible_cpus(), "kernel": os.uname().release}
    mem0 = mem_available()
    t = time.monotonic()
    r = mrcctl("fabric", "up", name, "--from", a.file)
    out["build"] = {"seconds": round(time.monotonic() - t, 1), "namespaces": r["namespaces"], "hosts": r["hosts"],
                    "links": r["links"], "planes": r["planes"], "spines": r["spines"], "leaves": r["leaves"],
                    "hosts_per_leaf": r["hosts_per_leaf"]}
    print(json.dumps(out["build"]), flush=True)
    try:
        mem1 = mem_available()
        t = time.monotonic()
        r = mrcctl("fabric", "attach", name, "--render")
        per = r["per_host"].values()
        out["attach"] = {"seconds": round(time.monotonic() - t, 1), "paths_per_peer": r["paths_per_peer"],
                         "peers_per_host": max(h["peers"] for h in per),
                         "paths_per_host": max(h["paths"] for h in per),
                         "applied_by": sorted({h["by"] for h in per}),
                         **({"host_attach_s_max": max(h["attach_s"] for h in per),
                             "host_paths_s_max": max(h["paths_s"] for h in per),
                             "host_paths_s_mean": round(sum(h["paths_s"] for h in per) / len(r["per_host"]), 3)}
                            if all("paths_s" in h for h in per) else {}),
                         "config_bytes": max(r["config_bytes"].values())}
        print(json.dumps(out["attach"]), flush=True)
        fab = Fabric(load(name)["spec"])
        rs = run_parallel([in_netns(fab.ns(fab.host(h)), [PY, "-c", MEMLOCK]) for h in fab.hosts()], limit=4)
        locked = [int(x.stdout) for x in rs]
        mem2 = mem_available()
        out["memory"] = {"memlock_per_host": max(locked), "memlock_total": sum(locked),
                         "mem_available_drop_build": mem0 - mem1, "mem_available_drop_attach": mem1 - mem2,
                         "mem_available_after": mem2}
        print(json.dumps(out["memory"]), flush=True)
        t = time.monotonic()
        res = alltoall.run(fab, fab.hosts(), a.count)
        pairs = res["pairs"]
        bad = [p for p in pairs if not (p["socket"] >= 1 and p["datapath"] >= p["socket"]
                                        and p["paths"] == out["attach"]["paths_per_peer"])]
        out["traffic"] = {"seconds": round(time.monotonic() - t, 1), "send_s": res["send_s"], "pairs": len(pairs),
                          "count": a.count, "sent": sum(p["sent"] for p in pairs),
                          "socket_received": sum(p["socket"] for p in pairs),
                          "pairs_complete": sum(p["socket"] == p["sent"] for p in pairs),
                          "pairs_all_paths": sum(p["paths"] == out["attach"]["paths_per_peer"] for p in pairs),
                          "pairs_witnessed": len(pairs) - len(bad), "not_witnessed": bad[:10]}
        print(json.dumps(out["traffic"]), flush=True)
    finally:
        if not a.keep:
            t = time.monotonic()
            subprocess.run([*MRCCTL, "fabric", "down", name], capture_output=True, timeout=3600)
            out["down_s"] = round(time.monotonic() - t, 1)
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
