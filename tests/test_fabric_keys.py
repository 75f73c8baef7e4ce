"""Keys by default where the project makes the config (issue 31, item 8):
`fabric up` makes the fabric a key and `fabric attach` gives it to every
host; `--no-key` makes none; `attach` without a key says so, and `status`
too.  Witnesses: the key file itself (mode, contents), each host's
installed key id against the file's, and the receivers' auth counters
(every TLV of real traffic verified, none refused)."""
from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import auth

pytestmark = pytest.mark.root

_counter = itertools.count()


@pytest.fixture
def make_fabric():
    names = []

    def make(*opts) -> tuple[str, dict]:
        name = f"fk{os.getpid() % 1000}{next(_counter)}{int(time.time() * 1000) % 100}"
        names.append(name)
        r = json.loads(mrcctl("fabric", "up", name, "-k", "2", "-l", "2", "--rate", "none", *opts,
                              "-j").stdout)
        return name, r

    try:
        yield make
    finally:
        for name in names:
            mrcctl("fabric", "down", name, check=False)


def feedback_line(ns) -> str:
    """`status`'s feedback line, what follows the word."""
    lines = [ln for ln in mrcctl("status", netns=ns).stdout.splitlines() if ln.startswith("feedback ")]
    assert len(lines) == 1, lines
    return lines[0][len("feedback "):].strip()


def status(ns) -> dict:
    rows = json.loads(mrcctl("status", "-j", netns=ns).stdout)
    assert len(rows) == 1, rows
    return rows[0]


def test_fabric_up_makes_a_key_that_attach_gives_every_host(make_fabric):
    name, r = make_fabric()
    key_file = Path(r["key_file"])
    assert key_file.is_file() and oct(key_file.stat().st_mode & 0o777) == "0o600"
    key = auth.read_key(key_file)
    show = json.loads(mrcctl("fabric", "show", name, "-j").stdout)
    assert show["key_file"] == str(key_file)
    assert "key " + str(key_file) in mrcctl("fabric", "show", name).stdout
    att = json.loads(mrcctl("fabric", "attach", name, "-j").stdout)
    assert att["hosts"] == ["h1", "h2"]
    ns = {h["name"]: h["ns"] for h in show["hosts"]}
    addr = {h["name"]: h["addr6"] for h in show["hosts"]}
    for h in ("h1", "h2"):
        a = status(ns[h])["auth"]
        assert a["authenticated"] and a["keys"] == [{"slot": 0, "key_id": auth.key_id(key), "signs": True}], a
        assert feedback_line(ns[h]) == f"authenticated, key id {auth.key_id(key)} signs"
    # traffic both ways: every TLV verified at each end, none refused
    ping = mrcctl("fabric", "exec", "-n", name, "h1", "--", "ping", "-c", "20", "-i", "0.05", "-W", "2",
                  addr["h2"], check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    for h in ("h1", "h2"):
        c = json.loads(mrcctl("stats", "-j", netns=ns[h]).stdout)["counters"]
        refused = {k: v for k, v in c.items() if k.startswith("rx_auth_") and v}
        assert not refused, (h, refused)
        assert c["rx_mrc_tlv"] >= 20 and c["rx_feedback"] > 0, (h, c)
    mrcctl("fabric", "down", name)
    assert not key_file.exists()


def test_fabric_up_no_key_makes_none(make_fabric):
    name, r = make_fabric("--no-key")
    assert r["key_file"] is None
    show = json.loads(mrcctl("fabric", "show", name, "-j").stdout)
    assert show["key_file"] is None and "no key" in mrcctl("fabric", "show", name).stdout
    from mrc_ebpf.lab.fabric.build import key_path
    assert not key_path(name).exists()


def test_attach_without_a_key_says_so(interop, tmp_path):
    out = mrcctl("attach", "a0", "--sid", interop.A_SID, netns=interop.A).stdout
    assert "feedback unauthenticated (no --key-file)" in out, out
    row = status(interop.A)
    assert row["auth"]["authenticated"] is False and row["auth"]["keys"] == []
    assert row["healthy"], row["problems"]           # a choice, not a fault
    assert feedback_line(interop.A).startswith("unauthenticated: no key")
    key = tmp_path / "k"
    key.write_text("8f14e45fceea167a5a36dedd4bea2543\n")
    mrcctl("key", "add", "--key-file", str(key), netns=interop.A)
    row = status(interop.A)
    assert row["auth"]["authenticated"] and row["auth"]["keys"][0]["key_id"] == auth.key_id(auth.read_key(key))
    assert feedback_line(interop.A).startswith("authenticated, key id")


def test_apply_without_a_key_warns_unless_told(interop, tmp_path):
    from test_config import host_config
    cfg = tmp_path / "a.yaml"
    cfg.write_text(host_config(interop))
    r = mrcctl("-j", "apply", str(cfg), netns=interop.A)
    doc = json.loads(r.stdout)
    assert doc["authenticated"] is False and doc["changed"]
    assert r.stderr.count("\n") == 1 and "warning" in r.stderr and "unauthenticated" in r.stderr, r.stderr
    r = mrcctl("apply", "--no-key", str(cfg), netns=interop.A)
    assert "no change" in r.stdout and r.stderr == "", r.stderr
    # the same config with a key: carried (re-keyed in place), no warning; --no-key contradicts it
    key = tmp_path / "k"
    key.write_text("8f14e45fceea167a5a36dedd4bea2543\n")
    keyed = tmp_path / "b.yaml"
    keyed.write_text(cfg.read_text().replace("attach:\n", f"attach:\n  key_file: {key}\n", 1))
    r = mrcctl("-j", "apply", str(keyed), netns=interop.A)
    assert json.loads(r.stdout)["authenticated"] is True and r.stderr == "", r.stderr
    assert status(interop.A)["auth"]["authenticated"]
    bad = mrcctl("apply", "--no-key", str(keyed), netns=interop.A, check=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--no-key" in bad.stderr, bad.stderr
