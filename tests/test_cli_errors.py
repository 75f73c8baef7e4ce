"""Issue 31's smaller items: every bad input is one line on stderr, exit 1,
`{"error": ...}` alone on stdout under -j, and changes nothing.  Click's
usage errors included (they printed usage lines and exit 2)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import MRCCTL, mrcctl


def _run(*args, netns=None):
    return mrcctl(*args, netns=netns, check=False)


def _one_line_error(r, json_too=False, *words) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrcctl: error: "), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if json_too:
        out = r.stdout.splitlines()
        assert len(out) == 1 and list(json.loads(out[0])) == ["error"], r.stdout
        assert json.loads(out[0])["error"] == lines[0].removeprefix("mrcctl: error: ")
    else:
        assert r.stdout == "", r.stdout
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


USAGE = [
    (["attach"], "Missing argument"),
    (["attach", "eth0"], "--sid"),
    (["path", "add", "fd00::/64"], "--via"),
    (["bogus"], "No such command"),
    (["attach", "eth0", "--sid", "fc00::1", "--mode", "fast"], "'fast' is not one of"),
    (["stats", "--bogus"], "No such option"),
    (["monitor", "--count", "0"], "--count"),
    # checked before anything is looked at (a device that is not there)
    (["attach", "mrc-nodev0", "--sid", "fc00::1", "--active-peers", "10"], "--active-peers 10"),
]


@pytest.mark.parametrize("args,words", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_one_line_exit_1_and_json(args, words):
    _one_line_error(subprocess.run([*MRCCTL, *args], capture_output=True, text=True, timeout=60),
                    False, words)
    # -j after the verb (not yet parsed when click fails) and before it
    for j in ([*args, "-j"], ["-j", *args]):
        _one_line_error(subprocess.run([*MRCCTL, *j], capture_output=True, text=True, timeout=60),
                        True, words)


def test_help_still_exits_0():
    r = subprocess.run([*MRCCTL, "path", "add", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Usage:" in r.stdout


@pytest.mark.parametrize("args", [["path", "add", "fd00:c2::1/64", "--via", "fc00::1"],
                                  ["path", "del", "fd00:c2::1/64"],
                                  ["path", "add", "198.18.2.1/24", "--via", "fc00::1"]])
def test_prefix_with_host_bits_refused_like_ip_route(args):
    r = subprocess.run([*MRCCTL, *args, "-j"], capture_output=True, text=True, timeout=60)
    _one_line_error(r, True, "invalid prefix for given prefix length", "host bits set")


def test_bulk_file_binary_and_host_bits(tmp_path):
    binary = tmp_path / "peers.bin"
    binary.write_bytes(bytes(range(128, 256)) * 40)
    _one_line_error(subprocess.run([*MRCCTL, "path", "bulk", str(binary)], capture_output=True,
                                   text=True, timeout=60), False, "not a text file")
    lines = tmp_path / "peers.txt"
    lines.write_text("fd00:1::/64 t fc00::2\nfd00:2::9/64 t fc00::3\n")
    _one_line_error(subprocess.run([*MRCCTL, "path", "bulk", str(lines)], capture_output=True,
                                   text=True, timeout=60), False, "line 2", "host bits set")


@pytest.mark.root
def test_gc_of_a_cookie_with_nothing_stranded_fails():
    _one_line_error(_run("gc", "99999999999", "--dry-run", "-j"), True, "99999999999")
    _one_line_error(_run("gc", "99999999999"), False, "no namespace and no pinned state")
    # the live (host) namespace's cookie is no error: nothing of it is stranded
    from mrc_ebpf.datapath import pins
    assert json.loads(mrcctl("gc", "-j", str(pins.netns_cookie())).stdout)["removed"] == []


@pytest.mark.root
def test_key_retire_show_config_save_errors(interop, tmp_path):
    A = interop.A
    key = tmp_path / "k"
    key.write_text("00112233445566778899aabbccddeeff\n")
    other = tmp_path / "other"
    other.write_text("ffeeddccbbaa99887766554433221100\n")
    mrcctl("attach", "a0", "--sid", interop.A_SID, netns=A)
    # no key at all, then only the signing key: nothing to retire
    _one_line_error(_run("key", "retire", "-j", netns=A), True, "no key is installed")
    mrcctl("key", "add", "--key-file", str(key), netns=A)
    before = mrcctl("key", "show", "-j", netns=A).stdout
    _one_line_error(_run("key", "retire", netns=A), False, "only the signing key")
    assert mrcctl("key", "show", "-j", netns=A).stdout == before        # unchanged
    # show-config / save --key-file: missing, not a key, another key
    for f, words in ((tmp_path / "nonexistent", "No such file"), (other, "signs with key")):
        _one_line_error(_run("show-config", "--key-file", str(f), netns=A), False, words)
        _one_line_error(_run("save", "--to", str(tmp_path / "x.yaml"), "--key-file", str(f), netns=A),
                        False, words)
    assert not (tmp_path / "x.yaml").exists()
    assert "key_file" in mrcctl("show-config", "--key-file", str(key), netns=A).stdout
    # save where no file can be
    _one_line_error(_run("save", "--to", "/proc/nosuch/x.yaml", "--key-file", str(key), "-j", netns=A),
                    True, "cannot write /proc/nosuch/x.yaml")
    mrcctl("save", "--to", str(tmp_path / "ok.yaml"), "--key-file", str(key), netns=A)
    assert (tmp_path / "ok.yaml").read_text().startswith("version: 1")


def test_rx_validation_doc_gives_the_lengths_rx_accepts():
    """docs/design/rx-validation.md rules 9 and 10 against bpf/mrc_common.h
    (the lengths RX checks: mrc_rx.c compares with MRC_TLV_LEN, and the
    uSID header's Hdr Ext Len is MRC_DOH_LEN / 8 - 1)."""
    from conftest import ROOT
    from mrc_ebpf.datapath.source import C
    rows = {int(line.split("|")[1]): line for line in
            (ROOT / "docs" / "design" / "rx-validation.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert f"has length {C['MRC_TLV_LEN']} " in rows[9]
    assert f"version {C['MRC_VERSION']} " in rows[9]
    assert f"Hdr Ext Len {C['MRC_DOH_LEN'] // 8 - 1} " in rows[10]
    assert f"`MRC_DOH_LEN` {C['MRC_DOH_LEN']} bytes" in rows[10]
    assert f"PadN({C['MRC_DOH_LEN'] - 2 - C['MRC_TLV_SIZE'] - 2})" in rows[10]
