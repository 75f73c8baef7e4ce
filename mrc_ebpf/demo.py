"""`make demo`: the README's tour, on an emulated leaf-spine fabric.

Builds a fabric of namespaces (4 spines, 2 leaves, a host under each),
attaches mrc-ebpf on both hosts with one path per spine, sprays a TCP
transfer (mrc-perf) over every spine, black-holes one spine under it and
heals it, then shows the per-path counters and the datapath's own events
(with kernel timestamps: the failover time is read off, not guessed).
Every step is a command a user would type; everything is removed at the
end, also after a failure or Ctrl-C.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time

NAME = "demo"
MRCCTL = [sys.executable, "-m", "mrc_ebpf.cli.mrcctl"]


def step(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


MRC_PERF = [sys.executable, "-m", "mrc_ebpf.cli.mrc_perf"]


def show(args: list[str]) -> str:
    """How the user would type it (the installed scripts, not our paths)."""
    text = shlex.join(["mrcctl", *args])
    return "$ " + text.replace(shlex.join(MRCCTL), "mrcctl").replace(shlex.join(MRC_PERF), "mrc-perf")


def on(host: str, *cmd: str) -> list[str]:
    return ["fabric", "exec", "-n", NAME, host, "--", *cmd]


def mrcctl(*args: str, quiet: bool = False) -> str:
    print(show(list(args)), flush=True)
    result = subprocess.run([*MRCCTL, *args], capture_output=True, text=True, timeout=300)
    if not quiet:
        sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stdout.write(result.stderr)
        raise SystemExit(f"demo: `mrcctl {' '.join(args)}` failed")
    return result.stdout


def in_background(*steps) -> threading.Thread:
    """Run ("sleep", seconds) and mrcctl-argument steps in order, beside
    the transfer; each command's output is printed when the transfer ends."""
    def run():
        start = time.monotonic()
        for item in steps:
            if item[0] == "sleep":
                time.sleep(item[1])
                continue
            result = subprocess.run([*MRCCTL, *item], capture_output=True, text=True, timeout=300)
            done = time.monotonic() - start
            print(f"   (done at +{done:.1f} s) {show(list(item))}\n"
                  f"   {(result.stdout + result.stderr).strip()}", flush=True)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def main() -> None:
    try:
        step("a two-tier fabric: 4 spines x 50 Mbit/s, 2 leaves, one host under each")
        mrcctl("fabric", "up", NAME, "--spines", "4", "--leaves", "2", "--hosts-per-leaf", "1",
               "--rate", "50mbit")
        mrcctl("fabric", "show", NAME)

        step("attach mrc-ebpf on both hosts: one SRv6 path per spine towards the other")
        mrcctl("fabric", "attach", NAME)
        mrcctl(*on("h1", *MRCCTL, "status"))
        mrcctl(*on("h1", *MRCCTL, "path", "list"))

        step("one TCP transfer h1 -> h2, sprayed per packet over all 4 spines; spine s2 "
             "black-holed under it (a gray failure: its links stay up), healed 3 s later")
        # the fault program is loaded now, dropping (almost) nothing, so that
        # switching it to a black hole under traffic is one map write
        mrcctl("fabric", "fail", "-n", NAME, "s2", "--mode", "loss=1e-9")
        server = subprocess.Popen([*MRCCTL, *on("h2", *MRC_PERF, "-s", "-1")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            failure = in_background(("sleep", 3), ("fabric", "fail", "-n", NAME, "s2", "--mode", "blackhole"),
                                    ("sleep", 3), ("fabric", "heal", "-n", NAME, "s2"))
            mrcctl(*on("h1", *MRC_PERF, "-c", "fd00:0:2::1", "-t", "10", "-i", "1"))
            failure.join()
        finally:
            if server.poll() is None:
                server.wait(timeout=20)

        step("what the datapath did: per-path counters, and its events (kernel time)")
        mrcctl(*on("h1", *MRCCTL, "path", "list"))
        mrcctl(*on("h1", *MRCCTL, "stats", "--events"))
        mrcctl(*on("h2", *MRCCTL, "stats", "--paths"))
    finally:
        step("remove the fabric: namespaces, links, pins")
        subprocess.run([*MRCCTL, "fabric", "down", NAME], timeout=300)
    print("\ndemo done: nothing left behind")


if __name__ == "__main__":
    main()
