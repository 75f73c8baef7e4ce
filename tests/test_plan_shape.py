"""The shape `fabric plan` gives 131,072 NICs (8 planes x 256 spines x 512
leaves x 256 hosts) as a fabric description: it renders, a peer's 256
paths are spread evenly over the planes and spines, render and `fabric
plan` say what they chose, and the rendered config applies onto an
attached datapath in a namespace (timed and printed; the target, <= 5 s,
is reported by scripts/apply_config_scale.sh, not asserted)."""
from __future__ import annotations

import collections
import json
import os
import time

import pytest

from conftest import mrcctl
from mrc_ebpf.control import blocks, config
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab import netns, procs
from mrc_ebpf.lab.fabric import description, render

PLAN = """\
version: 1
fabric: {name: plan, planes: 8, spines: 256, leaves: 512, hosts_per_leaf: 256, encoding: srh, rate: none}
"""
HOST = "h1000"


def one_line_error(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrcctl: error: "), r.stderr
    return lines[0]


def test_the_plan_renders_256_paths_a_peer_spread_over_planes_and_spines():
    desc = description.parse(PLAN, "plan.yaml")
    fab = desc.fabric
    assert fab.spine_groups() == 8
    cfg = render.host_config(desc, HOST)
    assert set(cfg) == {"version", "attach", "templates", "peer_blocks"}
    assert render.counts(cfg) == (131071, 131071 * 256)
    tpls = {t["name"]: [e["via"][0] for e in t["paths"]] for t in cfg["templates"]}
    assert sorted(tpls) == [f"spines{g}" for g in range(8)]
    sids = {(p, s): fab.spine_sid(p, s) for p in range(8) for s in range(1, 257)}
    assert len(set(sids.values())) == 8 * 256          # the wide spine IDs: no two alike
    plane_of = {v: p for (p, _), v in sids.items()}
    spine_of = {v: s for (_, s), v in sids.items()}
    for g in range(8):
        vias = tpls[f"spines{g}"]
        # 32 spines of every plane, every 8th: spread over the whole plane
        assert collections.Counter(plane_of[v] for v in vias) == {p: 32 for p in range(8)}
        assert sorted({spine_of[v] for v in vias}) == list(range(g + 1, 257, 8))
    # together the groups are every (plane, spine) once
    assert sorted(v for vs in tpls.values() for v in vs) == sorted(sids.values())
    # each peer on its group's template ((a + b) mod 8): 131,071 peers in
    # 8 nearly equal shares, so every spine carries as many peers as another
    peers = blocks.wanted(cfg["peer_blocks"])
    share = collections.Counter(t for _, _, t in peers)
    assert len(peers) == 131071 and max(share.values()) - min(share.values()) <= 1
    step = 1 << 64
    first = blocks.prefix_value(fab.prefix6(1))[1] - step
    for key, _, t in peers[:: 997]:
        b = (int.from_bytes(key[4:], "big") - first) // step
        assert t == f"spines{fab.spine_group(1000, b)}" and fab.paths(1000, b)[0]["via"].split(",")[0] in tpls[t]
    # the host's plane devices route each plane's spines (a /36 of wide IDs)
    assert fab.plane_spines(3) == "fc00:0:4000::/36" and fab.spine_sid(3, 256) == "fc00:0:4100::"
    assert config.load(render.dump(cfg), "h.yaml").data["templates"][0]["paths"][0] == {"via": [sids[(0, 1)]]}


def test_small_fabrics_keep_every_spine_and_their_ids():
    """While every (plane, spine) fits in 256 paths, a peer has them all
    and the spine IDs are as `fabric up` builds them; beyond, the peers
    form gets the same groups as the blocks form."""
    small = description.parse("version: 1\nfabric: {planes: 2, spines: 4, leaves: 2, hosts_per_leaf: 2}\n").fabric
    assert small.spine_groups() == 1 and small.path_choice() is None
    assert small.spine_sid(1, 4) == "fc00:0:204::" and small.plane_spines(1) == "fc00:0:200::/40"
    assert len(small.paths(1, 2)) == 8
    wide = description.parse("version: 1\nfabric: {planes: 2, spines: 200, leaves: 2, hosts_per_leaf: 2}\n")
    fab = wide.fabric
    assert fab.spine_groups() == 2 and fab.spine_sid(0, 200) == "fc00:0:1c8::"     # 200 < 256: narrow IDs
    cfg = render.host_config(wide, "h1")
    for peer, b in zip(cfg["peers"], (2, 3, 4)):
        spines = sorted({int(p["via"][0].split(":")[2], 16) & 0xFF for p in peer["paths"]})
        assert len(peer["paths"]) == 200 and spines == list(range(1 + (1 + b) % 2, 201, 2))


@pytest.mark.parametrize("text, words", [
    ("version: 1\nfabric:\n  spines: 4096\n", "plan.yaml:3: fabric.spines 4096: an integer in 1..4095"),
    ("version: 1\nfabric:\n  spines: 0\n", "plan.yaml:3: fabric.spines 0: an integer in 1..4095"),
    (PLAN.replace("srh", "usid"), "plan.yaml:2: encoding usid names a host by a 16-bit ID"),
])
def test_what_is_really_invalid_is_one_line(text, words):
    with pytest.raises(MrcError) as e:
        description.parse(text, "plan.yaml")
    assert str(e.value).startswith(words) and "\n" not in str(e.value)


def test_cli_says_what_it_chose(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_text(PLAN)
    out = tmp_path / "h.yaml"
    r = json.loads(mrcctl("render", str(f), "--host", HOST, "--no-key", "-o", str(out), "-j").stdout)
    assert r["peers"] == 131071 and r["paths"] == 131071 * 256
    assert r["path_choice"].startswith("256 paths a peer of 2048: a path id is one byte")
    text = out.read_text()
    assert text.startswith("# mrcctl render: 256 paths a peer of 2048")
    assert config.load(text, str(out)).data["peer_blocks"]
    plan = json.loads(mrcctl("fabric", "plan", "--nics", "131072", "--planes", "8", "--radix", "512", "-j").stdout)
    assert plan["paths_per_peer"] == 256 and plan["path_choice"] == r["path_choice"]
    assert plan["path_lists"] == 8 and plan["config"]["form"] == "blocks"
    assert abs(plan["config"]["bytes"] - len(text.encode())) < 2000     # h1 against h1000, and the comment
    # fabric up builds at most 255 spines: said in one line, nothing made
    err = one_line_error(mrcctl("fabric", "up", "--from", str(f), check=False))
    assert "256 spines: fabric up builds at most 255" in err
    assert not any(n.startswith("plan-") for n in netns.existing())


@pytest.mark.root
def test_the_plan_applies_onto_an_attachment(tmp_path):
    """The rendered config of the full plan, applied by `mrcctl apply` in a
    namespace with the host's 8 plane devices: 8 templates of 256 paths and
    131,071 peers, shown back as rendered."""
    f = tmp_path / "plan.yaml"
    f.write_text(PLAN)
    cfg = render.host_config(description.load(str(f)), HOST)
    whole = tmp_path / "h.yaml"
    whole.write_text(render.dump(cfg))
    bare = tmp_path / "attach.yaml"
    bare.write_text(render.dump({"version": 1, "attach": cfg["attach"]}))
    ns = f"mrcshape{os.getpid() % 100000}"
    netns.create(ns, ["net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"])
    try:
        fab = description.parse(PLAN).fabric
        cmds = ["link set lo up"]
        for p in range(8):
            cmds += [f"link add eth{p} type veth peer name up{p}", f"link set eth{p} up", f"link set up{p} up",
                     f"route add {fab.plane_spines(p)} via fe80::1 dev eth{p}"]
        cmds.append("route add fd00::/16 via fe80::1 dev eth0")
        procs.run(["ip", "-batch", "-"], ns=ns, input="\n".join(cmds) + "\n")
        mrcctl("apply", str(bare), "--no-key", netns=ns)          # the compile, not timed
        load = open("/proc/loadavg").read().split()[:3]
        t0 = time.monotonic()
        r = json.loads(mrcctl("apply", str(whole), "--no-key", "-j", netns=ns).stdout)
        took = time.monotonic() - t0
        print(f"\napply of the plan's config (8 templates x 256 paths, 131,071 peers): {took:.2f} s, "
              f"load {' '.join(load)}")
        assert r["changed"] and r["attached"] is False
        status = json.loads(mrcctl("status", "-j", netns=ns).stdout)[0]
        assert (status["peers"], status["templated_peers"]) == (131071, 131071)
        tpls = json.loads(mrcctl("path", "template", "list", "-j", netns=ns).stdout)
        assert sorted((t["template"], len(t["paths"])) for t in tpls) == [(f"spines{g}", 256) for g in range(8)]
        assert sum(t["peers"] for t in tpls) == 131071
        shown = mrcctl("show-config", netns=ns).stdout
        assert config.load(shown, "shown").data == config.load(whole.read_text(), "h").data
        again = json.loads(mrcctl("apply", str(whole), "--no-key", "-j", netns=ns).stdout)
        assert again["changed"] is False
    finally:
        mrcctl("detach", "--all", netns=ns, check=False)
        netns.delete([ns])
