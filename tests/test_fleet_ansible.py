"""A fleet configured by Ansible (issue 31 item 7): packaging/ansible/
mrc-fabric.yml renders each host's config from a fabric description and
applies it with `mrcctl apply`, here on a lab fabric of 16 hosts (each a
namespace of this machine, reached by a local connection and
`mrcctl --netns`).  Applied twice: the second run changes nothing.

Witnesses: ansible-playbook's own PLAY RECAP (changed= per host) and each
host's `mrcctl show-config`, which must be what its rendered config says."""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import mrcctl
from mrc_ebpf.control import config

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "packaging" / "ansible" / "mrc-fabric.yml"
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
HOSTS = 16

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not PLAYBOOK_BIN.exists(),
                                 reason="needs ansible-core in the venv (make setup)")]

DESCRIPTION = """\
version: 1
fabric:
  name: {name}
  planes: 1
  spines: 2
  leaves: 2
  hosts_per_leaf: 8
  rate: none
hosts:
  defaults:
    policy: rr
  h5:
    policy: adaptive
"""

_counter = itertools.count()


@pytest.fixture
def fabric16(tmp_path):
    name = f"fa{os.getpid() % 1000}{next(_counter)}{int(time.time() * 1000) % 100}"
    f = tmp_path / "fabric.yaml"
    f.write_text(DESCRIPTION.format(name=name))
    try:
        up = json.loads(mrcctl("fabric", "up", "--from", str(f), "-j").stdout)
        assert up["hosts"] == HOSTS
        yield name, f
    finally:
        mrcctl("fabric", "down", name, check=False)


def _inventory(tmp_path: Path, name: str, fabric_file: Path) -> Path:
    mrcctl_bin = str(Path(sys.executable).parent / "mrcctl")
    hosts = {f"h{h}": {"mrc_netns": f"{name}-h{h}", "mrc_config_dir": str(tmp_path / "etc" / f"h{h}")}
             for h in range(1, HOSTS + 1)}
    inv = {"all": {"hosts": hosts, "vars": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "mrc_mrcctl": mrcctl_bin, "mrc_controller_mrcctl": mrcctl_bin,
        "mrc_apply_via": "mrcctl", "mrc_fabric_file": str(fabric_file)}}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _play(tmp_path: Path, inventory: Path) -> dict[str, dict[str, int]]:
    """Run the playbook; its PLAY RECAP as {host: {ok, changed, failed, ...}}."""
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORKS": "8",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_HOME": str(tmp_path / "ansible-home"), "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    r = subprocess.run([str(PLAYBOOK_BIN), "-i", str(inventory), str(PLAYBOOK)], capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    recap = r.stdout.split("PLAY RECAP")[-1]
    out = {}
    for line in recap.splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if m:
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def test_playbook_applies_every_host_and_again_changes_nothing(fabric16, tmp_path):
    name, fabric_file = fabric16
    inventory = _inventory(tmp_path, name, fabric_file)

    first = _play(tmp_path, inventory)
    hosts = [f"h{h}" for h in range(1, HOSTS + 1)]
    assert sorted(first) == sorted(hosts) + ["localhost"] or sorted(first) == sorted(hosts), first
    for h in hosts:
        # its config directory made, the config written, the datapath attached by apply
        assert first[h]["failed"] == 0 and first[h]["changed"] == 3, (h, first[h])

    # each host runs what its rendered config says: show-config (the
    # running state read back from the maps, routes and pins) parses to
    # the same config as the file the playbook wrote
    for h in hosts:
        written = tmp_path / "etc" / h / "eth0.yaml"
        running = mrcctl("show-config", netns=f"{name}-{h}").stdout
        assert config.load(running, "show-config").data == config.load_file(str(written)).data, h
    five = yaml.safe_load(mrcctl("show-config", netns=f"{name}-h5").stdout)
    assert len(five["peers"]) == HOSTS - 1 and {p["policy"] for p in five["peers"]} == {"adaptive"}
    assert five["attach"]["key_file"] == str(fabric_file.with_suffix(".key"))

    second = _play(tmp_path, inventory)
    for h in hosts:
        assert second[h]["failed"] == 0 and second[h]["changed"] == 0, (h, second[h])
    for h in hosts:
        assert "no change" in mrcctl("apply", str(tmp_path / "etc" / h / "eth0.yaml"),
                                     netns=f"{name}-{h}").stdout
