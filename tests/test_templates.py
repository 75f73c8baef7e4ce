"""Path templates and peers at scale, on real namespaces: a template's
peer reaches the kernel's own SRv6 host with its SID as the last hop
(the kernel's End.DT6 decapsulating it is the witness), many peers go in
at once, and what is refused changes nothing."""
from __future__ import annotations

import json

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import memory

pytestmark = pytest.mark.root


def _status(ns):
    return json.loads(mrcctl("status", "-j", netns=ns).stdout)[0]


def test_template_peer_reaches_a_kernel_srv6_host(interop):
    net = interop
    net.attach()
    mrcctl("path", "template", "add", "leafB", "--via", net.R_SID, netns=net.A)
    mrcctl("path", "add", "fd00:2::/64", "--template", "leafB", "--sid", net.B_DT6, netns=net.A)
    # B's End.DT6 at B_DT6 decapsulates only what is addressed to it
    # (the last segment): the replies prove the last hop was B's SID
    assert net.ping(net.A, net.B6, count=3).returncode == 0
    rows = json.loads(mrcctl("path", "list", "-j", netns=net.A).stdout)
    mine = [r for r in rows if r["prefix"] == "fd00:2::/64"]
    assert len(mine) == 1 and mine[0]["segments"] == [net.R_SID, net.B_DT6]
    assert mine[0]["tx_packets"] >= 3
    s = _status(net.A)
    assert (s["peers"], s["templated_peers"], s["active_peers"]) == (1, 1, 1)
    tpl = json.loads(mrcctl("path", "template", "list", "-j", netns=net.A).stdout)
    assert tpl[0]["template"] == "leafB" and tpl[0]["peers"] == 1
    # a template's peer is changed through its template
    r = mrcctl("path", "deny", "fd00:2::/64", "--path", "0", netns=net.A, check=False)
    assert r.returncode != 0 and "template" in r.stderr
    r = mrcctl("path", "template", "del", "leafB", netns=net.A, check=False)
    assert r.returncode != 0 and "still has 1 peers" in r.stderr
    mrcctl("path", "del", "fd00:2::/64", netns=net.A)
    mrcctl("path", "template", "del", "leafB", netns=net.A)
    assert _status(net.A)["peers"] == 0


def test_bulk_adds_many_peers_all_or_nothing(interop, tmp_path):
    net = interop
    net.attach()
    mrcctl("path", "template", "add", "leaf1", "--via", net.R_SID, netns=net.A)
    n = 2000
    lines = [f"fd00:7:{i // 256:x}:{i % 256:x}::/64 leaf1 fc00:7:{i // 256:x}:{i % 256:x}::1"
             for i in range(n)]
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines[:10] + ["fd00:9::/64 leaf1"]) + "\n")
    r = mrcctl("path", "bulk", str(bad), "--no-route", netns=net.A, check=False)
    assert r.returncode != 0 and "line 11" in r.stderr and "Traceback" not in r.stderr
    assert _status(net.A)["peers"] == 0          # nothing half-added
    good = tmp_path / "peers.txt"
    good.write_text("# prefix template sid\n" + "\n".join(lines) + "\n")
    out = json.loads(mrcctl("path", "bulk", str(good), "--no-route", "-j", netns=net.A).stdout)
    assert out == {"added": n, "updated": 0, "unchanged": 0, "peers": n}
    # the same file again changes nothing (batch writes only what differs)
    again = json.loads(mrcctl("path", "bulk", str(good), "--no-route", "-j", netns=net.A).stdout)
    assert again == {"added": 0, "updated": 0, "unchanged": n, "peers": n}
    s = _status(net.A)
    assert (s["peers"], s["templated_peers"], s["active_peers"]) == (n, n, 0)
    # the maps' memory follows the peers: the LPM trie and SID hash grew by
    # what the model says for n entries
    mem = s["memory"]["maps"]
    cpus = s["memory"]["cpus"]
    assert mem["peers"] == memory.model(cpus, {"peers": n})["peers"]
    assert mem["peer_by_sid"] == memory.model(cpus, {"peer_by_sid": n})["peer_by_sid"]
    # and as the kernel counts them: the trie's intermediate nodes as the
    # keys' structure says (`status` reads them back)
    kernel = s["memory"]["kernel_maps"]
    parts = s["memory"]["lpm_intermediates"]["peers"]
    assert kernel["peers"] == memory.kernel_model(cpus, {"peers": n}, {"peers": parts})["peers"]
    assert kernel["peer_by_sid"] == memory.kernel_model(cpus, {"peer_by_sid": n})["peer_by_sid"]
    assert s["memory"]["kernel_bytes"] > s["memory"]["bytes"]
    # a SID already another peer's is refused
    dup = tmp_path / "dup.txt"
    dup.write_text("fd00:8::/64 leaf1 fc00:7:0:0::1\n")
    r = mrcctl("path", "bulk", str(dup), "--no-route", netns=net.A, check=False)
    assert r.returncode != 0 and "another peer's" in r.stderr
