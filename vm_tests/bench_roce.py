"""`bench roce` measured in the VM (its kernel has rdma_rxe), on the
fabric of vm_tests/roce_vm.py, whose tests run here first (one attach,
minutes of verifier under emulation, serves both).  Not part of `make
vm-test` (not test_*.py; it takes many minutes); run on demand:

    make vm-test TESTS='vm_tests/bench_roce.py -s'

It prints the results (JSON) and writes bench-results/roce.json in the
snapshot of the tree the VM ran (vm_tests/out/tree/); then the verifier's
processed counts on this kernel.  (`mrcctl bench roce` does the same on a
fabric of its own.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roce_vm import (fab, test_vm_blackhole_under_write_bw_no_qp_errors,  # noqa: E402,F401
                       test_vm_rc_pingpong_across_mrc_paths, test_vm_write_bw_8_qps_on_4_paths)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results"

pytestmark = pytest.mark.root


def test_bench_roce(fab):
    from mrc_ebpf.bench import roce as bench
    from mrc_ebpf.lab import roce as lab
    p = bench.params(short=False)
    p["repeat"] = 1
    results = bench.measure(fab, p)
    doc = {"scenario": "roce", "title": bench.TITLE, "params": p, "method": bench.__doc__.strip(),
           "kernel": lab.procs.run(["uname", "-r"]).stdout.strip(), "results": results}
    OUT.mkdir(exist_ok=True)
    (OUT / "roce.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("ROCE-BENCH-JSON " + json.dumps(doc))
    headers, rows = bench.table(results)
    from tabulate import tabulate
    print(tabulate(rows, headers=headers))
    assert results["runs"] and results["failover"]


def test_verified_insns_on_this_kernel():
    """mrc_tx is near the verifier's 1M: its processed count on 6.1."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "verified_insns.py")], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    print("verified_insns:", r.stdout.strip(), r.stderr[-2000:])
    assert r.returncode == 0
    assert json.loads(r.stdout)["mrc_tx"] < 1_000_000
