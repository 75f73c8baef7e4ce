"""The systemd unit packaging/systemd/mrc-ebpf@.service: its start and
stop commands, read from the unit file `mrcctl install-unit` writes and
expanded as systemd expands them (%i, ${VAR} of Environment=), run inside
a namespace as the unit would run them, bring the datapath up from the
config `mrcctl save` wrote and take it down.  systemd's own
`systemd-analyze verify` accepts the installed unit (its Exec lines name
mrcctl by absolute path; a bare `mrcctl` it rejects)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import shutil
from pathlib import Path

import pytest

from conftest import ROOT, mrcctl

UNIT = ROOT / "packaging" / "systemd" / "mrc-ebpf@.service"
BINDIR = ROOT / ".venv" / "bin" if (ROOT / ".venv" / "bin" / "mrcctl").exists() \
    else Path(sys.executable).parent
VENV_MRCCTL = BINDIR / "mrcctl"


def read_unit(path: Path = UNIT) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (a key may repeat, as Environment= does)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def expand(command: str, instance: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion of an Exec line: specifiers, then ${VAR}/$VAR
    from the unit's environment; the prefixes -@+! are not used here."""
    assert command[0] not in "-@+!:", command
    text = command.replace("%%", "\0").replace("%i", instance).replace("\0", "%")
    assert "%" not in text, f"unexpanded specifier in {command!r}"
    text = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], text)
    return [re.sub(r"^\$(\w+)$", lambda m: env[m.group(1)], w) for w in shlex.split(text)]


def unit_environment(service: dict[str, list[str]]) -> dict[str, str]:
    env = {}
    for value in service.get("Environment", []):
        for item in shlex.split(value):
            k, _, v = item.partition("=")
            env[k] = v
    return env


def installed_unit(directory: Path) -> Path:
    """The unit as `mrcctl install-unit --dir DIRECTORY` writes it, run as
    the venv's mrcctl script (the path the unit must then name)."""
    r = subprocess.run([str(VENV_MRCCTL), "install-unit", "--dir", str(directory), "-j"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["unit"] == str(directory / "mrc-ebpf@.service") and doc["mrcctl"] == str(VENV_MRCCTL)
    return Path(doc["unit"])


def test_unit_is_a_oneshot_that_stays_active(monkeypatch):
    unit = read_unit()
    service = unit["Service"]
    assert service["Type"] == ["oneshot"] and service["RemainAfterExit"] == ["yes"]
    env = unit_environment(service)
    assert env["MRC_CONFIG_DIR"] == "/etc/mrc-ebpf"
    # as shipped, the mrcctl of the venv docs/ops.md installs into
    assert expand(service["ExecStart"][0], "eth0", env) == ["/opt/mrc/bin/mrcctl", "apply",
                                                            "/etc/mrc-ebpf/eth0.yaml"]
    assert expand(service["ExecStop"][0], "eth0", env) == ["/opt/mrc/bin/mrcctl", "detach", "eth0"]
    assert service["ExecReload"] == service["ExecStart"]      # reload applies again
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # the path mrcctl save writes by default is the one the unit applies
    from mrc_ebpf.control import config
    monkeypatch.delenv("MRC_CONFIG_DIR", raising=False)
    assert str(config.save_path("eth0")) == "/etc/mrc-ebpf/eth0.yaml"


def test_install_unit_names_this_mrcctl_and_systemd_accepts_it(tmp_path):
    unit = installed_unit(tmp_path / "system")
    assert oct(unit.stat().st_mode & 0o777) == "0o644"
    service = read_unit(unit)["Service"]
    env = unit_environment(service)
    assert expand(service["ExecStart"][0], "eth0", env) == [str(VENV_MRCCTL), "apply",
                                                            "/etc/mrc-ebpf/eth0.yaml"]
    assert expand(service["ExecStop"][0], "eth0", env) == [str(VENV_MRCCTL), "detach", "eth0"]
    assert service["ExecReload"] == service["ExecStart"]
    # everything but the Exec lines is the shipped unit's
    shipped = [ln for ln in UNIT.read_text().splitlines() if not ln.startswith("Exec")]
    assert [ln for ln in unit.read_text().splitlines() if not ln.startswith("Exec")] == shipped
    if not shutil.which("systemd-analyze"):
        pytest.skip("no systemd-analyze (Debian's systemd package)")
    ok = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "not executable" not in ok.stderr, ok.stderr
    # the witness tells: a bare `mrcctl` (the unit before install-unit existed) fails it
    bare = tmp_path / "bare" / "mrc-ebpf@.service"
    bare.parent.mkdir()
    bare.write_text(re.sub(r"^(Exec\w+=)\S+", r"\1mrcctl", unit.read_text(), flags=re.M))
    bad = subprocess.run(["systemd-analyze", "verify", str(bare)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "Command mrcctl is not executable" in bad.stderr, bad.stderr


@pytest.mark.parametrize("args, says", [
    (["--dir", "/proc/nosuch/dir"], "cannot write /proc/nosuch/dir/mrc-ebpf@.service"),
    (["--mrcctl", str(UNIT)], "not an executable file"),
    (["--mrcctl", "bin/mrcctl"], "not an executable file"),
])
def test_install_unit_bad_input_is_one_line(tmp_path, args, says):
    r = subprocess.run([str(VENV_MRCCTL), "install-unit", *args], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 1, r
    assert r.stderr.count("\n") == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.root
def test_unit_start_and_stop_bring_the_saved_config_up_and_down(interop, tmp_path):
    from mrc_ebpf.datapath import pins
    from test_config import host_config
    pins.ensure_bpffs()     # as at boot: mrcctl on the host mounts it
    A = interop.A
    # configure by hand, then save where the unit looks (a drop-in's MRC_CONFIG_DIR)
    (tmp_path / "first.yaml").write_text(host_config(interop))
    mrcctl("apply", str(tmp_path / "first.yaml"), netns=A)
    confdir = tmp_path / "etc"
    saved = json.loads(mrcctl("save", "-j", "--to", str(confdir / "a0.yaml"), netns=A).stdout)
    assert saved == {"device": "a0", "file": str(confdir / "a0.yaml")}
    text = (confdir / "a0.yaml").read_text()
    assert text == mrcctl("show-config", netns=A).stdout
    mrcctl("detach", "a0", netns=A)
    assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []

    # the unit as install-unit writes it: the Exec lines name the venv's mrcctl,
    # so systemd's own PATH (no venv on it) is what the commands run with
    service = read_unit(installed_unit(tmp_path / "system"))["Service"]
    env = {**unit_environment(service), "MRC_CONFIG_DIR": str(confdir)}
    run_env = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}, **env,
               "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

    def run(command):
        argv = expand(command, "a0", env)
        return subprocess.run(["ip", "netns", "exec", A, *argv], env=run_env, capture_output=True,
                              text=True, timeout=120)

    start = run(service["ExecStart"][0])
    assert start.returncode == 0, start.stderr
    assert mrcctl("show-config", netns=A).stdout == text
    assert interop.ping(A, interop.B6, count=3).returncode == 0
    # started again (a restart of an active datapath): nothing changes
    again = run(service["ExecStart"][0])
    assert again.returncode == 0 and "no change" in again.stdout, again.stdout + again.stderr
    stop = run(service["ExecStop"][0])
    assert stop.returncode == 0, stop.stderr
    assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []
    routes = interop.t.exec(A, ["ip", "-6", "route", "show", "proto", "77"]).stdout
    assert routes.strip() == ""
