"""The package as a user installs it: a wheel, a fresh venv, another directory.

The wheel is built from this tree, installed into a new venv made by
Debian's interpreter (so it sees Debian's bcc, as `make setup` does), and
its `mrcctl` is run from / against a real namespace: attach compiles the
BPF sources shipped inside the wheel, a path carries ping, detach clears it.
"""
from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin dir, wheel path) of a wheel of this tree in a fresh venv."""
    work = tmp_path_factory.mktemp("pkg")
    wheels = work / "wheels"
    subprocess.run([SYSTEM_PYTHON, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=600, cwd=work)
    wheel = next(wheels.glob("mrc_ebpf-*.whl"))
    venv = work / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                   timeout=300)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True,
                   capture_output=True, text=True, timeout=900, cwd=work)
    return venv / "bin", wheel


def _run(bindir: Path, *cmd, check=True, timeout=180):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MRC_BPF_DIR", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    result = subprocess.run([str(bindir / cmd[0]), *cmd[1:]], capture_output=True, text=True,
                            cwd="/", env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr}")
    return result


def test_wheel_contents(installed):
    _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"mrc_ebpf"}, tops     # no stray top-level package (e.g. `cli`)
    for needed in ("mrc_ebpf/bpf/mrc.c", "mrc_ebpf/bpf/mrc_common.h", "mrc_ebpf/bpf/lib/maps.h",
                   "mrc_ebpf/bpf/lab/fault.c", "mrc_ebpf/perf/schema.json"):
        assert needed in names, needed
    licenses = [n for n in names if ".dist-info/" in n and "LICENSE" in n.upper()]
    assert any(n.endswith("/LICENSE") for n in licenses), licenses
    assert any("GPL-2.0-only" in n for n in licenses) and any("Apache-2.0" in n for n in licenses)


def test_installed_mrcctl_from_root_directory(installed, interop):
    bindir, _ = installed
    # the package that runs is the installed one, not this checkout
    where = _run(bindir, "python", "-c", "import mrc_ebpf.datapath.source as s; print(s.BPF_DIR)")
    assert str(ROOT) not in where.stdout and "site-packages/mrc_ebpf/bpf" in where.stdout, where.stdout
    assert "attach" in _run(bindir, "mrcctl", "--help").stdout
    assert "--client" in _run(bindir, "mrc-perf", "--help").stdout

    ns = ["--netns", interop.A]
    try:
        att = json.loads(_run(bindir, "mrcctl", *ns, "attach", "a0", "--sid", interop.A_SID, "-j",
                              timeout=300).stdout)
        assert att["device"] == "a0"
        _run(bindir, "mrcctl", *ns, "path", "add", "fd00:2::/64", "--via", interop.B_DT6)
        assert interop.ping(interop.A, interop.B6, count=5).returncode == 0
        counters = json.loads(_run(bindir, "mrcctl", *ns, "stats", "-j").stdout)["counters"]
        assert counters["tx_encap"] >= 5 and counters["rx_decap"] >= 5, counters
    finally:
        _run(bindir, "mrcctl", *ns, "detach", "a0", check=False)
    status = json.loads(_run(bindir, "mrcctl", *ns, "status", "-j").stdout)
    assert status == [], status
