"""Each path's share of the bytes, window by window, from the kernel's
own interface counters (an independent witness of the spray).

`python -m mrc_ebpf.bench.window_shares SECONDS IFACE...`, run inside a
namespace (`ip netns exec` mounts its /sys), reads each interface's
statistics/tx_bytes every 10 ms for SECONDS and prints one JSON document:
the samples' times (ns, CLOCK_MONOTONIC) and byte counts.  A leaf's
uplinks are a fabric's paths: a 10 ms window in which each carried its
equal share is one in which the spray was even at that time scale, not
only on average (issue 27's target: within +-10% of equal in every 10
ms window of the flow).

summarize() turns the samples into that verdict; it is a pure function,
so tests/test_line_rate_windows.py checks it on made-up samples.
"""
from __future__ import annotations

import json
import sys
import time

WINDOW_S = 0.010
TOLERANCE = 0.10        # of the equal share
BUSY = 0.5              # a window counts when it moved >= BUSY x the median window


def sample(seconds: float, ifaces: list[str]) -> dict:
    files = [open(f"/sys/class/net/{i}/statistics/tx_bytes") for i in ifaces]
    times, counts = [], []
    start = time.monotonic()
    due = start
    try:
        while True:
            now = time.monotonic()
            if now - start > seconds:
                break
            row = []
            for f in files:
                f.seek(0)
                row.append(int(f.read()))
            times.append(time.monotonic_ns())
            counts.append(row)
            due += WINDOW_S
            time.sleep(max(0.0, due - time.monotonic()))
    finally:
        for f in files:
            f.close()
    return {"ifaces": ifaces, "t_ns": times, "bytes": counts}


def summarize(samples: dict) -> dict | None:
    """Windows between consecutive samples: how many were busy, how many
    had every path within TOLERANCE of its equal share, the worst path's
    deviation (relative to the equal share) in the median and the worst
    window, and the windows' actual lengths (the sampler's clock)."""
    t, b = samples["t_ns"], samples["bytes"]
    n = len(samples["ifaces"])
    windows = []
    for i in range(1, len(t)):
        moved = [y - x for x, y in zip(b[i - 1], b[i])]
        windows.append(((t[i] - t[i - 1]) / 1e6, moved))
    totals = sorted(sum(m) for _, m in windows if sum(m) > 0)
    if not totals or n == 0:
        return None
    floor = BUSY * totals[len(totals) // 2]
    busy = [(ms, m) for ms, m in windows if sum(m) >= floor and sum(m) > 0]
    worst = sorted(max(abs(x / sum(m) * n - 1) for x in m) for _, m in busy)
    lengths = sorted(ms for ms, _ in busy)
    return {"windows": len(busy), "within": sum(1 for w in worst if w <= TOLERANCE),
            "fraction_within": round(sum(1 for w in worst if w <= TOLERANCE) / len(busy), 4),
            "deviation_median": round(worst[len(worst) // 2], 4), "deviation_max": round(worst[-1], 4),
            "window_ms_median": round(lengths[len(lengths) // 2], 2), "window_ms_max": round(lengths[-1], 2)}


def main(argv: list[str]) -> int:
    seconds, ifaces = float(argv[0]), argv[1:]
    json.dump(sample(seconds, ifaces), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
