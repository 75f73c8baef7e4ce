"""The package as a user installs it: a wheel, a fresh venv, another directory.

The wheel is built from this tree, installed into a new venv made by
Debian's interpreter (so it sees Debian's bcc, as `make setup` does), and
its `mrcctl` is run from / against a real namespace: attach compiles the
BPF sources shipped inside the wheel, a path carries ping, detach clears it.
"""
from __future__ import annotations

import json
import os
import shutil
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
                   "mrc_ebpf/bpf/lib/common/wire.h",
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


def test_wheel_ships_the_unit_and_install_unit_verifies(installed, tmp_path):
    bindir, wheel = installed
    assert "mrc_ebpf/systemd/mrc-ebpf@.service" in zipfile.ZipFile(wheel).namelist()
    doc = json.loads(_run(bindir, "mrcctl", "install-unit", "--dir", str(tmp_path), "-j").stdout)
    unit = Path(doc["unit"])
    assert doc["mrcctl"] == str(bindir / "mrcctl") and unit == tmp_path / "mrc-ebpf@.service"
    text = unit.read_text()
    assert f"ExecStart={bindir}/mrcctl apply " in text and f"ExecStop={bindir}/mrcctl detach " in text
    if not shutil.which("systemd-analyze"):
        pytest.skip("no systemd-analyze (Debian's systemd package)")
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                            timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _hidden_headers(bindir: Path, cache: Path, *cmd, empty: Path):
    """CMD (the wheel's) in a private mount namespace where an empty
    directory hides /lib/modules/$(uname -r) (build and source links and
    all); the host's stays as it is.  Fails unless the headers are gone
    in there."""
    modules = f"/lib/modules/{os.uname().release}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MRC_BPF_DIR", "VIRTUAL_ENV")}
    env.update(MRC_EBPF_CACHE=str(cache), PATH=f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}")
    script = 'mount --bind "$1" "$2" && ! test -e "$2/build" && ! test -e "$2/source" && shift 2 && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           str(empty), modules, str(bindir / cmd[0]), *cmd[1:]],
                          capture_output=True, text=True, cwd="/", env=env, timeout=300)


def test_cached_build_attaches_without_kernel_headers(installed, interop, tmp_path):
    bindir, _ = installed
    modules = Path(f"/lib/modules/{os.uname().release}")
    if not (modules / "build").exists():
        pytest.skip(f"no kernel headers at {modules}/build to compile the first build with")
    empty = tmp_path / "empty"
    empty.mkdir()
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    ns = ["--netns", interop.A]
    attach = ["mrcctl", *ns, "-j", "attach", "a0", "--sid", interop.A_SID]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MRC_BPF_DIR", "VIRTUAL_ENV")}
    try:
        # the first attach compiles (headers there) and keeps the build in WARM
        first = subprocess.run([str(bindir / "mrcctl"), *attach[1:]], capture_output=True, text=True,
                               cwd="/", env={**env, "MRC_EBPF_CACHE": str(warm)}, timeout=300)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["build"] == "compiled"
        _run(bindir, "mrcctl", *ns, "detach", "a0")

        # headers hidden, cache warm: attached from the cache, and it carries traffic
        r = _hidden_headers(bindir, warm, *attach, empty=empty)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["build"] == "cached"
        _run(bindir, "mrcctl", *ns, "path", "add", "fd00:2::/64", "--via", interop.B_DT6)
        assert interop.ping(interop.A, interop.B6, count=3).returncode == 0
        _run(bindir, "mrcctl", *ns, "detach", "a0")

        # headers hidden, cache cold: one line that names what to install, nothing attached
        r = _hidden_headers(bindir, cold, *attach, empty=empty)
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        error = json.loads(r.stdout)["error"]
        assert f"kernel headers missing at {modules}/build" in error, error
        assert "linux-headers-" in error and "make setup" not in error, error
        assert f"build for kernel {os.uname().release} and these sources is in {cold}" in error, error
        assert json.loads(_run(bindir, "mrcctl", *ns, "status", "-j").stdout) == []
    finally:
        _run(bindir, "mrcctl", *ns, "detach", "a0", check=False)
    # the host's own links are untouched
    assert (modules / "build").exists() and (modules / "source").exists()
