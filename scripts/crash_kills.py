#!/usr/bin/env python3
"""kill -9 of `path bulk` (routes on), `path add`, `apply` and `attach
--replace` at random points, many times each (tests/test_crash.py does a
few): after each kill
`status` must name the half-done change and exit 1, the next command
(`gc`) rolls it back, and the state (every map's dump and the routes of
ours) must be byte for byte before or after the command; then the command
must run through.  Prints a summary line per verb (JSON; a line per kill
on stderr), and fails on the first state that is neither.

Usage: scripts/crash_kills.py [KILLS] [VERB...]    (root; removes what it made)
       VERB: "path bulk", "path add", "apply", "replace" (default: all four)
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mrc_ebpf.lab import crash  # noqa: E402
from mrc_ebpf.lab.topology import KernelPeerLine, Topology  # noqa: E402


def main() -> int:
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    verbs = sys.argv[2:] or list(crash.VERBS)
    for verb in verbs:
        topo = Topology(prefix=f"mrck{os.getpid() % 100000}")
        try:
            net = KernelPeerLine(topo)
            crash.setup(net)
            with tempfile.TemporaryDirectory() as work:
                start = time.monotonic()
                def progress(k, result):
                    print(json.dumps({"verb": verb, "kill": k, **result}), file=sys.stderr, flush=True)
                results = crash.run(net, Path(work), verb, kills, seed=int(time.time()), progress=progress)
                out = {"verb": verb, **crash.summary(results), "seconds": round(time.monotonic() - start)}
            print(json.dumps(out), flush=True)
        finally:
            topo.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
