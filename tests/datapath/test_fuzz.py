"""RX under fuzzing: valid MRC frames mutated at random, and garbage,
through the real XDP program (BPF_PROG_TEST_RUN), judged by oracle.py,
which is written from the RFCs, not from mrc_rx.c:

  never decapsulate what is malformed; never drop what is valid and ours
  (unless a documented stricter rule says so, docs/design/rx-validation.md);
  never touch what is not ours; every frame counted exactly once.

`make test` runs a short seeded run; `make fuzz` runs 1,000,000 cases
(MRC_FUZZ_CASES, MRC_FUZZ_SEED).  A case judged wrong is saved as a row
of cases/fuzz-found.json, which test_tables.py runs too.
"""
from __future__ import annotations

import ipaddress
import json
import os
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from . import oracle
from .fuzz_frames import cases
from mrc_ebpf.datapath.source import C

from .harness import PEER_SIDS, SID, outcomes

pytestmark = pytest.mark.root

N_CASES = int(os.environ.get("MRC_FUZZ_CASES", "3000"))
SEED = int(os.environ.get("MRC_FUZZ_SEED", "1"))
FOUND = Path(__file__).parent / "cases" / "fuzz-found.json"
SAVE_AT_MOST = 50

# the documented stricter rules (docs/design/rx-validation.md) and the
# drop reason each is counted under
STRICTER = {"trailing-bytes": "rx_drop_payload_len", "srh-only": "rx_drop_routing_type",
            "inner-ip-only": "rx_drop_inner_proto", "tlv-count": "rx_drop_tlv",
            "dstopts-exact": "rx_drop_option"}
RX_OUTCOMES = set(outcomes("rx_"))


def wrong(j: oracle.Judgement, res, frame: bytes) -> str | None:
    """Why the datapath's result disagrees with the judgement, or None."""
    outs = {k: v for k, v in res.delta.items() if k in RX_OUTCOMES}
    if res.delta.get("rx_seen") != 1 or sum(outs.values()) != 1 or any(v != 1 for v in outs.values()):
        return f"not counted exactly once: {res.delta}"
    (outcome,) = outs
    extra = {k: v for k, v in res.delta.items() if k != "rx_seen" and k not in RX_OUTCOMES}
    if j.verdict == oracle.NOT_OURS:
        if res.verdict != "XDP_PASS" or outcome != "rx_pass" or res.out != frame or extra:
            return f"not ours, but {res.verdict} {outcome} (changed: {res.out != frame})"
    elif j.verdict == oracle.MALFORMED:
        if res.verdict != "XDP_DROP" or not outcome.startswith("rx_drop_"):
            return f"malformed ({j.why}), but {res.verdict} {outcome}"
    elif j.verdict == oracle.STRICTER:
        if res.verdict != "XDP_DROP" or outcome != STRICTER[j.why]:
            return f"stricter rule {j.why} expects {STRICTER[j.why]}, got {res.verdict} {outcome}"
    elif j.verdict == oracle.ECN_DROP:
        if res.verdict != "XDP_DROP" or outcome != "rx_drop_ecn" or extra != j.counters:
            return f"RFC 6040 drop expected, got {res.verdict} {outcome} {extra} vs {j.counters}"
    elif j.verdict == oracle.CONSUMED:
        if res.verdict != "XDP_DROP" or outcome != "rx_control" or extra != j.counters:
            return f"consumed expected, got {res.verdict} {outcome} {extra} vs {j.counters}"
    elif j.verdict == oracle.TRIMMED:
        if res.verdict != "XDP_PASS" or outcome != "rx_trimmed" or extra != j.counters:
            return f"trimmed expected, got {res.verdict} {outcome} {extra} vs {j.counters}"
        if res.out[4:] != j.out:
            return "the trimmed frame handed on differs"
    else:
        if res.verdict != "XDP_PASS" or outcome != "rx_decap":
            return f"valid, but {res.verdict} {outcome}"
        if res.out != j.out:
            return "decapsulated frame differs"
        if extra != j.counters:
            return f"counters {extra} vs {j.counters}"
    return None


def expected_row(name: str, frame: bytes, j: oracle.Judgement) -> dict:
    """The row the packet table should hold for this frame."""
    seen = {"rx_seen": 1}
    if j.verdict == oracle.NOT_OURS:
        return {"name": name, "frame": frame.hex(), "verdict": "XDP_PASS", "out": "same",
                "counters": {**seen, "rx_pass": 1}, "why": j.why}
    if j.verdict == oracle.DECAP:
        return {"name": name, "frame": frame.hex(), "verdict": "XDP_PASS", "out": j.out.hex(),
                "counters": {**seen, "rx_decap": 1, **j.counters}, "why": j.why}
    if j.verdict == oracle.TRIMMED:
        meta = struct.pack("=I", C["MRC_TRIM_META"])
        return {"name": name, "frame": frame.hex(), "verdict": "XDP_PASS", "out": (meta + j.out).hex(),
                "counters": {**seen, "rx_trimmed": 1, **j.counters}, "why": j.why}
    reason = {oracle.STRICTER: STRICTER.get(j.why), oracle.ECN_DROP: "rx_drop_ecn",
              oracle.CONSUMED: "rx_control"}.get(j.verdict) or "rx_drop_*"
    return {"name": name, "frame": frame.hex(), "verdict": "XDP_DROP", "out": None,
            "counters": {**seen, reason: 1, **j.counters}, "why": j.why}


def save(rows: list[dict]) -> None:
    old = json.loads(FOUND.read_text()) if FOUND.exists() else []
    known = {r["frame"] for r in old}
    FOUND.parent.mkdir(exist_ok=True)
    FOUND.write_text(json.dumps(old + [r for r in rows if r["frame"] not in known], indent=1) + "\n")


def test_fuzz_rx(fresh):
    dp = fresh
    sid = ipaddress.IPv6Address(SID).packed
    peers = {ipaddress.IPv6Address(s).packed for s in PEER_SIDS.values()}
    tally, failures, newest = Counter(), [], oracle.Newest()
    start = time.monotonic()
    step = max(1000, N_CASES // 20)
    for i, (name, frame) in enumerate(cases(SEED, N_CASES)):
        j = oracle.judge(frame, sid, peers, newest)
        res = dp.run_rx(frame)
        tally[j.verdict if j.verdict != oracle.STRICTER else f"stricter:{j.why}"] += 1
        why = wrong(j, res, frame)
        if why:
            failures.append((name, frame, j, why))
        if (i + 1) % step == 0 and N_CASES >= 100000:
            print(f"fuzz: {i + 1}/{N_CASES} cases, {len(failures)} wrong, "
                  f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - start
    print(f"fuzz: seed {SEED}, {N_CASES} cases in {elapsed:.1f} s, {len(failures)} wrong; "
          f"oracle verdicts {dict(sorted(tally.items()))}", file=sys.stderr)
    if failures:
        save([expected_row(f"seed {SEED} {name}: {why}", frame, j)
              for name, frame, j, why in failures[:SAVE_AT_MOST]])
    assert not failures, f"{len(failures)} wrong verdicts, e.g. {failures[0][0]}: {failures[0][3]} " \
                         f"(saved to {FOUND})"
    # the run exercised every kind of verdict
    assert {oracle.NOT_OURS, oracle.MALFORMED, oracle.DECAP, oracle.CONSUMED} <= set(tally)
