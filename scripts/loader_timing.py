"""Attach (compiled, cached) and replace times of two trees, side by side.

    python scripts/loader_timing.py --before DIR [--after DIR] [--rounds N]
                                    [--cached-only | --compiled-only]

Each tree's mrcctl runs as a user runs it (a new process per command,
wall time from start to exit) against one veth device in a network
namespace made here and removed at the end.  Per round and tree, in
alternating order so that load on the machine falls on both alike:
attach with an empty build cache (compiles), replace (the tree's own way:
compiling, or from the cache where it uses it), replace with the cache
off (compiles), detach, attach again (the cache holds the build), detach.
Prints one JSON object: per tree and step, the median and every sample,
in seconds.  Needs root; touches nothing outside its namespace and its
temporary cache directories.  Results: docs/design/loader.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
SID = "fc00:0:99::1"
STEPS = ("attach_compiled", "replace", "replace_compiling", "attach_cached")


def run(tree: Path, ns: str, cache: str, *args: str) -> tuple[float, dict]:
    env = {**os.environ, "MRC_EBPF_CACHE": cache, "PYTHONPATH": str(tree)}
    env.pop("MRC_BPF_DIR", None)
    start = time.monotonic()
    r = subprocess.run([PY, "-m", "mrc_ebpf.cli.mrcctl", "--netns", ns, *args], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    if r.returncode != 0:
        raise SystemExit(f"{tree}: mrcctl {' '.join(args)} failed: {r.stderr.strip()}")
    try:
        return took, json.loads(r.stdout) if r.stdout.strip() else {}
    except ValueError:
        return took, {}


def attach(tree: Path, ns: str, cache: str, out: dict, step: str) -> None:
    """attach, timed as STEP; which build it used noted."""
    took, result = run(tree, ns, cache, "attach", "lt0", "--sid", SID, "-j")
    out[step].append(took)
    out["build"].append(result.get("build"))


def replace(tree: Path, ns: str, cache: str, out: dict, step: str) -> None:
    """attach --replace, timed as STEP; its own load time noted."""
    took, result = run(tree, ns, cache, "attach", "lt0", "--replace", "-j")
    out[step].append(took)
    out["replace_load_s"].append(result.get("load_s"))


def one_round(tree: Path, ns: str, work: Path, out: dict) -> None:
    cache = tempfile.mkdtemp(dir=work)
    os.chmod(cache, 0o700)
    attach(tree, ns, cache, out, "attach_compiled")
    replace(tree, ns, cache, out, "replace")
    took, _ = run(tree, ns, "off", "attach", "lt0", "--replace", "-j")
    out["replace_compiling"].append(took)
    run(tree, ns, cache, "detach", "lt0")
    attach(tree, ns, cache, out, "attach_cached")
    run(tree, ns, cache, "detach", "lt0")


def cached_round(tree: Path, ns: str, cache: str, out: dict) -> None:
    """--cached-only: attach from the primed cache, replace from it, detach."""
    attach(tree, ns, cache, out, "attach_cached")
    replace(tree, ns, cache, out, "replace")
    run(tree, ns, cache, "detach", "lt0")


def compiling_round(tree: Path, ns: str, out: dict) -> None:
    """--compiled-only: attach and replace with the cache off (both compile), detach."""
    attach(tree, ns, "off", out, "attach_compiled")
    replace(tree, ns, "off", out, "replace_compiling")
    run(tree, ns, "off", "detach", "lt0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cached-only", action="store_true",
                        help="prime each tree's cache once (untimed), then per round only the steps "
                             "that read it: attach (cached) and replace")
    parser.add_argument("--compiled-only", action="store_true",
                        help="per round only attach and replace with the cache off (both compile)")
    a = parser.parse_args()
    steps = (("attach_cached", "replace") if a.cached_only else
             ("attach_compiled", "replace_compiling") if a.compiled_only else STEPS)
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    ns = f"lt{os.getpid()}"
    samples = {name: {k: [] for k in (*STEPS, "build", "replace_load_s")} for name in trees}
    load = []  # the 1-minute load average before each tree's round: the conditions, beside the samples
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "lt0", "type", "veth", "peer", "name", "lt1"],
                       check=True)
        for dev in ("lt0", "lt1", "lo"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        with tempfile.TemporaryDirectory(prefix="loader-timing-") as work:
            caches = {}
            if a.cached_only:
                for name, tree in trees.items():
                    caches[name] = tempfile.mkdtemp(dir=work)
                    os.chmod(caches[name], 0o700)
                    run(tree, ns, caches[name], "attach", "lt0", "--sid", SID, "-j")
                    run(tree, ns, caches[name], "detach", "lt0")
            for i in range(a.rounds):
                order = list(trees) if i % 2 == 0 else list(reversed(trees))
                for name in order:
                    load.append(round(os.getloadavg()[0], 2))
                    if a.cached_only:
                        cached_round(trees[name], ns, caches[name], samples[name])
                    elif a.compiled_only:
                        compiling_round(trees[name], ns, samples[name])
                    else:
                        one_round(trees[name], ns, Path(work), samples[name])
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    report = {"rounds": a.rounds, "trees": {k: str(v) for k, v in trees.items()}, "load_1min": load,
              "seconds": {}}
    for name, s in samples.items():
        report["seconds"][name] = {step: {"median": round(statistics.median(s[step]), 3),
                                          "samples": [round(x, 3) for x in s[step]]} for step in steps}
        report["seconds"][name]["builds"] = s["build"]
        report["seconds"][name]["replace_load_s"] = s["replace_load_s"]
    # each round ran the two trees one after the other: the ratio within a
    # round is what load that moves between rounds leaves alone
    report["after_over_before"] = {step: {"median": round(statistics.median(r), 3), "per_round": r}
                                   for step in steps
                                   for r in [[round(a_ / b_, 3) for a_, b_ in
                                              zip(samples["after"][step], samples["before"][step])]]}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
