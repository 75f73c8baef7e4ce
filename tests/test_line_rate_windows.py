"""The line-rate bench's window verdict (bench/window_shares.py) and the
byte turn's ceiling (control/spray.py), on made-up numbers: pure
functions, so each case says what the answer must be."""
from __future__ import annotations

from mrc_ebpf.bench import window_shares


def _samples(per_window: list[list[int]], ms: float = 10.0) -> dict:
    """Counters that moved PER_WINDOW[i] in window i."""
    t, b, now, total = [0], [[0] * len(per_window[0])], 0, [0] * len(per_window[0])
    for moved in per_window:
        now += int(ms * 1e6)
        total = [x + y for x, y in zip(total, moved)]
        t.append(now)
        b.append(list(total))
    return {"ifaces": [f"s{k + 1}" for k in range(len(per_window[0]))], "t_ns": t, "bytes": b}


def test_even_windows_within_and_an_uneven_one_not():
    s = _samples([[100, 100, 100, 100], [109, 91, 100, 100], [120, 80, 100, 100], [100, 100, 100, 100]])
    w = window_shares.summarize(s)
    assert (w["windows"], w["within"]) == (4, 3)
    assert w["fraction_within"] == 0.75 and w["deviation_max"] == 0.2 and w["window_ms_median"] == 10.0


def test_idle_windows_do_not_count_and_one_path_is_all_off():
    # the flow's start and end (idle, or a trickle) are not judged
    s = _samples([[0, 0, 0, 0], [1, 0, 0, 0], [400, 0, 0, 0], [400, 0, 0, 0], [0, 0, 0, 0]])
    w = window_shares.summarize(s)
    assert (w["windows"], w["within"]) == (2, 0) and w["deviation_max"] == 3.0
    assert window_shares.summarize(_samples([[0, 0], [0, 0]])) is None

