"""Fabric description files: parsing (FILE:LINE errors), `mrcctl render`,
`fabric up --from` and a file-built fabric attached from its rendered
configs carrying all-to-all sprayed traffic, every pair witnessed by the
receiver's socket and its datapath's counters per sender."""
from __future__ import annotations

import itertools
import json
import os
import time

import pytest
import yaml

from conftest import mrcctl
from mrc_ebpf.control import config
from mrc_ebpf.datapath import auth
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab import fabric as fab_mod
from mrc_ebpf.lab import procs
from mrc_ebpf.lab.fabric import alltoall, description, render

_counter = itertools.count()

SMALL = """\
version: 1
fabric:
  name: {name}
  planes: 2
  spines: 2
  leaves: 2
  hosts_per_leaf: 2
  encoding: {encoding}
  rate: none
hosts:
  defaults:
    policy: rr
    attach: {{granularity: packet, ack_timeout_us: 2000}}
  h3:
    policy: adaptive
"""


def one_line_error(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrcctl: error: "), r.stderr
    return lines[0]


def write(tmp_path, text: str, name: str = "fabric.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --------------------------------------------------------------------------- parsing

def test_defaults_are_fabric_ups():
    """An empty fabric section is `fabric up`'s defaults, one address plan."""
    d = description.parse("version: 1\n")
    built = fab_mod.Fabric({"name": "mrc", "planes": 1, "spines": 4, "leaves": 2, "hosts_per_leaf": 1,
                            "encoding": "srh", "rate": "100mbit", "host_rate": None})
    assert (d.fabric.planes, d.fabric.spines, d.fabric.leaves, d.fabric.hosts_per_leaf) == (1, 4, 2, 1)
    assert d.fabric.rate == "100mbit" and d.fabric.mtu == 1500 and d.fabric.hash == "l4"
    assert [d.fabric.host_sid(h) for h in d.fabric.hosts()] == [built.host_sid(h) for h in built.hosts()]
    assert d.fabric.paths(1, 2) == built.paths(1, 2)
    # and the dump of a description reads back to the same
    again = description.parse(description.dump(d))
    assert again.spec == d.spec and again.defaults == d.defaults


@pytest.mark.parametrize("text, line, words", [
    ("fabric: {planes: 2}\n", 1, "version missing"),
    ("version: 2\n", 1, "version 2"),
    ("version: 1\nfabric:\n  planes: 2\n  spines: x\n", 4, "fabric.spines 'x'"),
    ("version: 1\nfabric:\n  planes: 9\n", 3, "fabric.planes 9"),
    ("version: 1\nfabric:\n  planes: 2\n  spine: 4\n", 4, "unknown key fabric.spine"),
    ("version: 1\nfabric:\n  planes: 2\n  planes: 3\n", 4, "planes given twice"),
    ("version: 1\nfabric:\n  encoding: ev\n  planes: 2\n", 4, "encoding ev builds one plane"),
    ("version: 1\nfabric:\n  rate: fast\n", 3, "bad rate"),
    ("version: 1\nfabric:\n  leaves: 2\n  hosts_per_leaf: 2\nhosts:\n  h5: {policy: rr}\n", 6,
     "unknown key hosts.h5"),
    ("version: 1\nhosts:\n  defaults:\n    policy: fastest\n", 4, "hosts.defaults.policy 'fastest'"),
    ("version: 1\nhosts:\n  h1:\n    attach:\n      ack_timeout_us: 10\n", 5, "ack_timeout_us 10"),
    ("version: 1\nhosts:\n  h1:\n    attach: {sid: 'fc00::1'}\n", 4, "unknown key hosts.h1.attach.sid"),
    ("version: 1\nhosts:\n  h1: {entropy: 8}\n", 3, "entropy is for an encoding ev"),
    ("version: 1\naddresses:\n  sid_block: 'fd00:1::/32'\n", 3, "inside fc00::/16"),
    ("version: 1\nfabric: [1, 2\n", 3, "not valid YAML"),
    ("version: 1\nfabric:\n  ecn_threshold: 1ms\n  rate: none\n", 3, "ecn_threshold needs a rate"),
])
def test_errors_name_file_line_and_reason(text, line, words):
    with pytest.raises(MrcError) as e:
        description.parse(text, "f.yaml")
    msg = str(e.value)
    assert msg.startswith(f"f.yaml:{line}: "), msg
    assert words in msg and "\n" not in msg


def test_render_gives_every_peer_every_path(tmp_path):
    f = write(tmp_path, SMALL.format(name="x", encoding="srh"))
    desc = description.load(f)
    fab = desc.fabric
    cfg = render.host_config(desc, "h3")
    assert cfg["version"] == 1
    assert cfg["attach"] == {"devices": ["eth0", "eth1"], "sid": fab.host_sid(3), "granularity": "packet",
                             "ack_timeout_us": 2000}
    assert [p["prefix"] for p in cfg["peers"]] == [fab.prefix6(h) for h in (1, 2, 4)]
    for peer, b in zip(cfg["peers"], (1, 2, 4)):
        assert peer["policy"] == "adaptive"          # h3's own, over the defaults' rr
        # one path per plane and spine: that spine's End, then the peer's SID
        assert [p["via"] for p in peer["paths"]] == [[fab.spine_sid(p, s), fab.host_sid(b)]
                                                    for p in range(2) for s in (1, 2)]
    assert render.host_config(desc, "h1")["peers"][0]["policy"] == "rr"
    # the CLI prints the same document (and -j the same dict), naming the
    # fabric's key beside the description (made by the first render)
    key = tmp_path / "fabric.key"
    keyed = {**cfg, "attach": {**cfg["attach"], "key_file": str(key)}}
    r = mrcctl("render", f, "--host", "h3")
    assert yaml.safe_load(r.stdout) == keyed
    assert json.loads(mrcctl("render", f, "--host", "3", "-j").stdout) == keyed
    out = tmp_path / "h3.yaml"
    r = json.loads(mrcctl("render", f, "--host", "h3", "-o", str(out), "-j").stdout)
    assert r["peers"] == 3 and r["paths"] == 12 and r["bytes"] == len(out.read_bytes())
    assert r["key_file"] == str(key)
    assert yaml.safe_load(out.read_text()) == keyed
    assert yaml.safe_load(mrcctl("render", f, "--host", "h3", "--no-key").stdout) == cfg


def test_render_names_one_fabric_key_for_every_host(tmp_path):
    f = write(tmp_path, SMALL.format(name="x", encoding="srh"))
    key = tmp_path / "fabric.key"
    assert not key.exists()
    named = {yaml.safe_load(mrcctl("render", f, "--host", h).stdout)["attach"]["key_file"]
             for h in ("h1", "h2", "h3", "h4")}
    assert named == {str(key)}
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    made = key.read_text()
    assert auth.read_key(key) and mrcctl("render", f, "--host", "h1").returncode == 0
    assert key.read_text() == made                   # kept: one key for the whole fabric
    # a rendered config is a host config whose key apply would load (config.load reads it)
    cfg = config.load(mrcctl("render", f, "--host", "h2").stdout, "h2.yaml").data
    assert cfg["attach"]["key_file"] == str(key)
    # a key the description names is the one carried, and none is made
    own = tmp_path / "own"
    own.mkdir()
    (own / "k").write_text("00112233445566778899aabbccddeeff\n")
    g = write(own, SMALL.format(name="x", encoding="srh").replace(
        "ack_timeout_us: 2000}", f"ack_timeout_us: 2000, key_file: {own / 'k'}}}"))
    assert yaml.safe_load(mrcctl("render", g, "--host", "h1").stdout)["attach"]["key_file"] == str(own / "k")
    assert not (own / "fabric.key").exists()
    # --no-key: none named, none made
    bare = tmp_path / "bare"
    bare.mkdir()
    h = write(bare, SMALL.format(name="x", encoding="srh"))
    assert "key_file" not in yaml.safe_load(mrcctl("render", h, "--host", "h1", "--no-key").stdout)["attach"]
    assert not (bare / "fabric.key").exists()
    # a key that cannot be made: one line naming the ways out
    bad = tmp_path / "fabric2.key"
    bad.write_text("not a key\n")
    err = one_line_error(mrcctl("render", write(tmp_path, SMALL.format(name="x", encoding="srh"),
                                                "fabric2.yaml"), "--host", "h1", check=False))
    assert f"key file {bad}" in err, err


def test_render_usid_and_ev(tmp_path):
    desc = description.parse(SMALL.format(name="x", encoding="usid"))
    peer = render.host_config(desc, "h1")["peers"][0]
    assert [p["usid"] for p in peer["paths"]] == ["fc00:0:101:e002::", "fc00:0:102:e002::",
                                                  "fc00:0:201:e002::", "fc00:0:202:e002::"]
    desc = description.parse("version: 1\nfabric: {encoding: ev, leaves: 3}\n"
                             "addresses: {sid_block: 'fc00:5::/32', data_block: 'fd00:9::/32'}\n"
                             "hosts: {defaults: {entropy: 16, ipv4: true}}\n")
    cfg = render.host_config(desc, "h2")
    assert [p["prefix"] for p in cfg["peers"]] == ["fd00:9:1::/64", "198.18.0.1/32", "fd00:9:3::/64",
                                                   "198.18.0.3/32"]
    assert cfg["peers"][0]["paths"] == [{"entropy": 16, "sid": "fc00:5:e001::"}]
    assert cfg["attach"]["sid"] == "fc00:5:e002::"


@pytest.mark.parametrize("text", [
    "version: 1\nfabric: {planes: 2, spines: 2, leaves: 2, hosts_per_leaf: 2}\nhosts: {defaults: {policy: adaptive, "
    "ipv4: true, attach: {granularity: burst, ack_timeout_us: 2000, retrans_steer: false, mode: skb}, "
    "classes: [{name: bulk, dscp: [8, 10]}]}}\n",
    "version: 1\nfabric: {encoding: usid, planes: 2, spines: 2, leaves: 2}\n",
    "version: 1\nfabric: {encoding: ev, leaves: 3}\nhosts: {defaults: {entropy: 16}}\n"])
def test_rendered_configs_are_host_configs(text):
    """The host config format's own parser (mrc_ebpf/control/config.py)
    reads every rendered config: the same attach options, peers and paths."""
    config = pytest.importorskip("mrc_ebpf.control.config")
    cfg = render.host_config(description.parse(text), "h1")
    parsed = config.load(render.dump(cfg), "rendered.yaml").data
    assert {k: parsed["attach"][k] for k in cfg["attach"]} == cfg["attach"]
    assert parsed.get("classes", []) == cfg.get("classes", [])
    assert [(p["prefix"], p["paths"]) for p in parsed["peers"]] == [(p["prefix"], p["paths"]) for p in cfg["peers"]]
    assert all(p["policy"] == q.get("policy", config.DEFAULT_POLICY) for p, q in zip(parsed["peers"], cfg["peers"]))


def test_render_and_up_from_refuse_bad_input(tmp_path):
    f = write(tmp_path, SMALL.format(name="x", encoding="srh"))
    assert "no host 'h9'" in one_line_error(mrcctl("render", f, "--host", "h9", check=False))
    bad = write(tmp_path, "version: 1\nfabric:\n  spines: 0\n", "bad.yaml")
    assert f"{bad}:3: fabric.spines 0" in one_line_error(mrcctl("render", bad, "--host", "h1", check=False))
    assert "cannot read" in one_line_error(mrcctl("render", str(tmp_path / "none.yaml"), "--host", "h1",
                                                  check=False))
    # a description and shape options together: which wins would be a guess
    err = one_line_error(mrcctl("fabric", "up", "--from", f, "--spines", "3", "--rate", "1gbit", check=False))
    assert "--spines, --rate" in err
    err = one_line_error(mrcctl("fabric", "up", "--from", bad, check=False))
    assert f"{bad}:3:" in err


# --------------------------------------------------------------------------- a file-built fabric

@pytest.fixture
def described(tmp_path):
    names = []

    def make(encoding="srh"):
        name = f"fd{os.getpid() % 1000}{next(_counter)}{int(time.time() * 1000) % 100}"
        names.append(name)
        if encoding == "srh":      # the file's name
            f = write(tmp_path, SMALL.format(name=name, encoding=encoding))
            r = json.loads(mrcctl("fabric", "up", "--from", f, "-j").stdout)
        else:                      # NAME given: it wins over the file's
            f = write(tmp_path, SMALL.format(name="other", encoding=encoding))
            r = json.loads(mrcctl("fabric", "up", name, "--from", f, "-j").stdout)
        assert r["name"] == name and (r["planes"], r["spines"], r["leaves"], r["hosts"]) == (2, 2, 2, 4)
        return name, f

    try:
        yield make
    finally:
        for name in names:
            mrcctl("fabric", "down", name, check=False)


@pytest.mark.root
@pytest.mark.parametrize("encoding", ["srh", "usid"])
def test_file_built_fabric_carries_all_to_all(described, encoding):
    name, f = described(encoding)
    # each host's attach compiles the datapath: minutes on a busy machine
    r = procs.run([*procs.MRCCTL, "fabric", "attach", name, "--render", "-j"], timeout=1200)
    r = json.loads(r.stdout)
    assert r["hosts"] == ["h1", "h2", "h3", "h4"] and r["paths_per_peer"] == 4
    assert all(h["peers"] == 3 and h["paths"] == 12 and h["by"] == "mrcctl apply" for h in r["per_host"].values())
    # what the rendered config asked for is what the datapath has
    desc = description.load(f)
    desc.spec["name"] = name
    fab = fab_mod.Fabric(desc.spec)
    rows = json.loads(mrcctl("path", "list", "-j", netns=fab.ns("h3")).stdout)
    assert {(x["prefix"], x["policy"]) for x in rows} == {(fab.prefix6(b), "adaptive") for b in (1, 2, 4)}
    want = render.host_config(desc, "h3")["peers"]
    got = {}
    for x in rows:
        got.setdefault(x["prefix"], []).append(x["segments"])
    for peer in want:
        assert got[peer["prefix"]] == [p.get("via") or [p["usid"]] for p in peer["paths"]]
    rows = json.loads(mrcctl("path", "list", "-j", netns=fab.ns("h1")).stdout)
    assert {x["policy"] for x in rows} == {"rr"}

    res = alltoall.run(fab, fab.hosts(), count=16)
    assert len(res["pairs"]) == 12
    for p in res["pairs"]:
        # the receiver's socket got every datagram; its datapath saw the
        # sender's packets (data and feedback) arrive over all 4 paths
        assert p["socket"] == p["sent"] == 16, p
        assert p["datapath"] >= p["socket"], p
        assert p["paths"] == 4, p
