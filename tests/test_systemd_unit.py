"""The systemd unit packaging/systemd/mrc-ebpf@.service: its start and
stop commands, read from the unit file and expanded as systemd expands
them (%i, ${VAR} of Environment=), run inside a namespace as the unit
would run them, bring the datapath up from the config `mrcctl save`
wrote and take it down."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, mrcctl

UNIT = ROOT / "packaging" / "systemd" / "mrc-ebpf@.service"


def read_unit() -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (a key may repeat, as Environment= does)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in UNIT.read_text().splitlines():
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


def test_unit_is_a_oneshot_that_stays_active(monkeypatch):
    unit = read_unit()
    service = unit["Service"]
    assert service["Type"] == ["oneshot"] and service["RemainAfterExit"] == ["yes"]
    env = unit_environment(service)
    assert env["MRC_CONFIG_DIR"] == "/etc/mrc-ebpf"
    assert expand(service["ExecStart"][0], "eth0", env) == ["mrcctl", "apply", "/etc/mrc-ebpf/eth0.yaml"]
    assert expand(service["ExecStop"][0], "eth0", env) == ["mrcctl", "detach", "eth0"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # the path mrcctl save writes by default is the one the unit applies
    from mrc_ebpf.control import config
    monkeypatch.delenv("MRC_CONFIG_DIR", raising=False)
    assert str(config.save_path("eth0")) == "/etc/mrc-ebpf/eth0.yaml"


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

    service = read_unit()["Service"]
    env = {**unit_environment(service), "MRC_CONFIG_DIR": str(confdir)}
    bindir = str(ROOT / ".venv" / "bin") if (ROOT / ".venv" / "bin" / "mrcctl").exists() \
        else os.path.dirname(sys.executable)
    run_env = {**os.environ, **env, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

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
