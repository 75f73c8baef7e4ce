"""bcc's load against build.instantiate, in one process, side by side.

    python scripts/loader_load_cost.py [--rounds N]

Compiles bpf/mrc.c with bcc once per round, then loads its three
programs with bcc's load_func, captures the build, closes bcc's module
and makes the build live on fresh maps with build.instantiate: the
loader's part of an attach without the compiler's.  Prints seconds per
round.  Needs root.  Results: docs/design/loader.md.
"""
from __future__ import annotations

import argparse
import time

from bcc import BPF

from mrc_ebpf.datapath import build, loader, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    text = source.expand().encode()
    for _ in range(rounds):
        module = BPF(text=text, cflags=loader.CFLAGS)
        t0 = time.monotonic()
        for function, kind in loader.PROGRAM_TYPES.items():
            module.load_func(function.encode(), getattr(BPF, kind))
        t1 = time.monotonic()
        made = build.capture(module, loader.PROGRAM_TYPES)
        t2 = time.monotonic()
        module.cleanup()
        t3 = time.monotonic()
        build.instantiate(made).close()
        t4 = time.monotonic()
        print(f"bcc load_func x3 {t1 - t0:.2f} s | capture {1000 * (t2 - t1):.0f} ms | "
              f"bcc cleanup {1000 * (t3 - t2):.0f} ms | instantiate {t4 - t3:.2f} s", flush=True)


if __name__ == "__main__":
    main()
