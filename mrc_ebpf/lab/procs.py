"""Running the lab's commands: one at a time with a one-line error, or a few at once.

Commands run from the checkout's root so `python -m mrc_ebpf...` finds the
package whether or not it is installed.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from mrc_ebpf.errors import MrcError

ROOT = Path(__file__).resolve().parent.parent.parent


def run(cmd: list[str], input: str | None = None, check: bool = True,
         timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        what = " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else "")
        err = " ".join(r.stderr.split())[:300]
        raise MrcError(f"{what}: {err or f'exit {r.returncode}'}")
    return r


def run_parallel(jobs: list[list[str]], limit: int = 8) -> list[subprocess.CompletedProcess]:
    """Run commands a few at a time; results in order."""
    results: list = [None] * len(jobs)
    running: list[tuple[int, subprocess.Popen]] = []
    pending = list(enumerate(jobs))
    while pending or running:
        while pending and len(running) < limit:
            i, cmd = pending.pop(0)
            running.append((i, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                text=True, cwd=ROOT)))
        i, proc = running.pop(0)
        out, err = proc.communicate(timeout=300)
        results[i] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results
