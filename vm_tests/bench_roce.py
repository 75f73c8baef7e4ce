"""`mrcctl bench roce` in the VM (its kernel has rdma_rxe): not a test of
the default run (not test_*.py: `make vm-test` leaves it out, it takes
minutes), run on demand:

    make vm-test TESTS='vm_tests/bench_roce.py -s'

It writes bench-results/roce.json and roce.png in the snapshot of the
tree the VM ran (vm_tests/out/tree/bench-results/)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results"

pytestmark = pytest.mark.root


def test_bench_roce():
    from mrc_ebpf.lab import roce as lab
    why = lab.unavailable()
    if why:
        pytest.skip(why)
    r = subprocess.run([sys.executable, "-m", "mrc_ebpf.cli.mrcctl", "bench", "roce", "--out", str(OUT)],
                       cwd=ROOT, capture_output=True, text=True, timeout=3600)
    print(r.stdout[-6000:])
    print(r.stderr[-3000:], file=sys.stderr)
    assert r.returncode == 0
    doc = json.loads((OUT / "roce.json").read_text())
    assert doc["results"]["runs"] and doc["results"]["failover"]
