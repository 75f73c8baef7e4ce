"""The bench's log lines, and the progress steps they move on.

Its own module so that runner and contenders (which runner imports) can
both log without importing each other.
"""
from __future__ import annotations

import sys

# The CLI's progress line (cli/progress.py) while a scenario runs, or None:
# log lines then go through it (above the line), and each measurement a
# scenario logs with step=True moves it on, out of the scenario's steps(p).
PROGRESS = None
STEPS = {"done": 0, "total": 0}


def log(msg: str, step: bool = False) -> None:
    line = f"[bench] {msg}"
    if PROGRESS is not None:
        PROGRESS.log(line)
    else:
        print(line, file=sys.stderr, flush=True)
    if step:
        STEPS["done"] += 1
        if PROGRESS is not None:
            total = max(STEPS["total"], STEPS["done"])
            # measurements finished so far: this one has just begun
            PROGRESS(STEPS["done"] - 1, total, f"{msg} [{STEPS['done']}/{total}]")
