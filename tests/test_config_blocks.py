"""A host config's path templates and peer blocks (control/blocks.py,
control/bulk.py): the form `mrcctl render` gives a large fabric's hosts.

On the KernelPeerLine (A --- R --- B, B the kernel's own SRv6 host): one
template through R, B a peer of it, and a few thousand generated peers
beside it.  The config applies and carries ping to B through the
template; show-config gives the file back; applying it again changes
nothing; a changed file changes only the peers that differ (B's learnt
state and counters stay); a failure forced inside a batch write leaves
every map as it was; a bad file names its line and changes nothing."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import MRCCTL, ROOT, mrcctl
from mrc_ebpf.control import blocks, config

pytestmark = pytest.mark.root

N = 3000


def text(i, count=N, extra="", b_sid=None) -> str:
    return f"""\
version: 1
attach:
  devices: [a0]
  sid: "{i.A_SID}"
  probe_us: 4000
templates:
  - name: via_r
    paths:
      - via: ["{i.R_SID}"]
peer_blocks:
  - template: via_r
    prefix: "fd00:2::/64"
    sid: "{b_sid or i.B_DT6}"
  - template: via_r
    prefix: "fd00:3::/64"
    sid: "fc00:c::6"
    count: {count}
    step: 64
{extra}"""


def apply(i, tmp_path, body, env=None, check=True):
    path = tmp_path / "host.yaml"
    path.write_text(body)
    r = subprocess.run([*MRCCTL, "--netns", i.A, "apply", str(path), "-j"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def b_row(i) -> dict:
    rows = json.loads(mrcctl("path", "list", "-j", netns=i.A).stdout)
    return next(r for r in rows if r["prefix"] == "fd00:2::/64")


def test_blocks_apply_round_trip_change_and_roll_back(interop, tmp_path):
    from test_all_or_nothing import one_line_error, state
    i, t, A = interop, interop.t, interop.A
    body = text(i)
    first = json.loads(apply(i, tmp_path, body).stdout)
    assert first["attached"]
    status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
    assert (status["peers"], status["templated_peers"]) == (N + 1, N + 1)
    # B is a template's peer: ping goes A -> R's End -> B's End.DT6, and
    # back by B's own encap to A's SID
    assert i.ping(A, i.B6, count=3).returncode == 0
    row = b_row(i)
    assert row["template"] and row["segments"] == [i.R_SID, i.B_DT6] and row["tx_packets"] >= 3
    # shown: the canonical form of the file (blocks as compress makes them)
    shown = mrcctl("show-config", netns=A).stdout
    assert shown == config.dump(config.load(body).data)
    assert config.load(shown).data == config.load(body).data

    before = state(t, A)
    again = json.loads(apply(i, tmp_path, body).stdout)
    assert again["changed"] is False and again["changes"] == []
    assert state(t, A) == before

    # a failure forced inside each batch (deletes of the peers and SIDs
    # removed, writes of the SIDs and peers added) leaves every map as it was
    changed = text(i, count=N - 1000, extra="""\
  - template: via_r
    prefix: "fd00:4::/64"
    sid: "fc00:d::6"
    count: 500
""")
    for n in (1, 600, 1000, 1700, 2300, 2501):
        r = apply(i, tmp_path, changed, env={**os.environ, "MRC_FAIL_WRITE": str(n)}, check=False)
        one_line_error(r, f"failure injected at write {n}")
        assert state(t, A) == before, f"failing write {n} left a change behind"

    # the changed file: only the peers that differ; B keeps its learnt
    # state and counters (it did not change)
    sent = b_row(i)["tx_packets"]
    result = json.loads(apply(i, tmp_path, changed).stdout)
    blocks_change = [c for c in result["changes"] if c["what"] == "peer_blocks"]
    assert blocks_change == [{"what": "peer_blocks", "added": 500, "updated": 0, "removed": 1000,
                              "blocks": len(config.load(changed).data["peer_blocks"])}]
    assert [c["what"] for c in result["changes"]] == ["peer_blocks"]
    assert b_row(i)["tx_packets"] == sent
    assert i.ping(A, i.B6, count=2).returncode == 0
    assert mrcctl("show-config", netns=A).stdout == config.dump(config.load(changed).data)
    status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
    assert status["templated_peers"] == N + 1 - 1000 + 500

    # a bad file: its line, and nothing changed
    now = state(t, A)
    clash = text(i, count=N - 1000, extra="""\
  - template: via_r
    prefix: "fd00:3:0:5::/64"
    sid: "fc00:e::6"
""")
    r = apply(i, tmp_path, clash, check=False)
    one_line_error(r, "host.yaml:19: peer fd00:3:0:5::/64 is in two blocks")
    r = apply(i, tmp_path, changed.replace("template: via_r\n    prefix: \"fd00:4", "template: nope\n    prefix: \"fd00:4"),
              check=False)
    one_line_error(r, "host.yaml:19: no template 'nope' in templates:")
    assert state(t, A) == now


def test_compress_is_canonical_however_the_file_splits_blocks():
    """Blocks split, merged or reordered give the same canonical form,
    which is the peers' maximal runs (no kernel)."""
    one = [blocks.Block("t", 64, 0xFD00 << 112, 0xFC00 << 112 | 1, 1000, 64)]
    split = [blocks.Block("t", 64, (0xFD00 << 112) + k * (1 << 64), (0xFC00 << 112 | 1) + k * (1 << 64), 1, 64)
             for k in reversed(range(1000))]
    halves = [blocks.Block("t", 64, (0xFD00 << 112) + 400 * (1 << 64), (0xFC00 << 112 | 1) + 400 * (1 << 64), 600),
              blocks.Block("t", 64, 0xFD00 << 112, 0xFC00 << 112 | 1, 400)]
    want = [{"template": "t", "prefix": "fd00::/64", "sid": "fc00::1", "count": 1000}]
    for given in (one, split, halves):
        assert blocks.canonical(given, set(), {}) == want
        assert [b.dict() for b in blocks.compress([p[:4] for p in blocks.expand(given)])] == want
