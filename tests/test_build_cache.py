"""The build cache (mrc_ebpf/datapath/build_cache.py): an attach after the
first loads the kept build instead of compiling, and gets the same
programs and maps.  Witnesses: the kernel's program tags (a hash of the
instructions, map references left out) and bpftool, which prints the
maps' entries field by field (their BTF) either way."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import bpfsys, build, build_cache, replace


def bpftool(*args) -> object:
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True,
                                     check=True).stdout)


def loaded(ns) -> dict:
    """The pinned programs' tags and BTF, every pinned map's shape, and
    the config as bpftool dumps it."""
    pins = Path(json.loads(mrcctl("status", "-j", netns=ns).stdout)[0]["pins"])
    out = {"tags": {}, "btf": set(), "maps": {}, "map_btf": set()}
    for pin in replace.PROGRAMS:
        fd = bpfsys.obj_get(str(pins / pin))
        try:
            out["tags"][pin] = bytes(bpfsys.prog_info(fd).tag).hex()
        finally:
            os.close(fd)
        out["btf"].add(bool(bpftool("prog", "show", "pinned", str(pins / pin)).get("btf_id")))
    for name in replace.map_names():
        fd = bpfsys.obj_get(str(pins / name))
        try:
            out["maps"][name] = build.shape_of(bpfsys.map_info(fd))
        finally:
            os.close(fd)
        out["map_btf"].add((name, bool(bpftool("map", "show", "pinned", str(pins / name)).get("btf_id"))))
    out["config"] = bpftool("map", "dump", "pinned", str(pins / "config"))
    return out


@pytest.mark.root
def test_a_cached_build_loads_the_same_programs_and_carries_traffic(interop, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MRC_EBPF_CACHE", str(cache))
    attach = lambda: json.loads(mrcctl("attach", "a0", "--sid", interop.A_SID, "-j",
                                       netns=interop.A).stdout)["build"]
    assert attach() == "compiled"                       # and keeps the build
    [entry] = cache.glob("*.json")
    kept = entry.stat().st_ino
    compiled = loaded(interop.A)
    mrcctl("detach", "a0", netns=interop.A)
    assert attach() == "cached"
    cached = loaded(interop.A)
    assert entry.stat().st_ino == kept                  # not compiled and kept again
    # programs are loaded from instructions either way, without BTF
    assert compiled["btf"] == cached["btf"] == {False}
    assert cached["tags"] == compiled["tags"] and cached["maps"] == compiled["maps"]
    # the maps keep bcc's BTF: the same ones have it, and bpftool prints
    # the cached attach's config by field name, as the compiled one's
    assert cached["map_btf"] == compiled["map_btf"] and ("config", True) in cached["map_btf"]
    [entry_c] = cached["config"]
    fields = entry_c["formatted"]["value"]      # bpftool -j: "formatted" only with BTF
    assert fields["sid"] == list(ipaddress.IPv6Address(interop.A_SID).packed)
    assert fields["n_devices"] == 1 and fields["mtu"] > 0
    assert entry_c == compiled["config"][0]
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=interop.A)
    assert interop.ping(interop.A, interop.B6, count=2).returncode == 0
    assert interop.counters()["tx_encap"] >= 2

    # a damaged build is dropped and compiled again, not loaded
    mrcctl("detach", "a0", netns=interop.A)
    entry.write_text(entry.read_text()[:-200])
    assert attach() == "compiled"
    assert loaded(interop.A)["tags"] == compiled["tags"]
    assert json.loads(entry.read_text())["format"] == build_cache.FORMAT


@pytest.mark.root
def test_a_cache_others_can_write_to_is_not_used(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MRC_EBPF_CACHE", str(cache))
    assert build_cache.directory() == cache
    cache.chmod(0o777)
    assert build_cache.directory() is None
    monkeypatch.setenv("MRC_EBPF_CACHE", "off")
    assert build_cache.directory() is None


def test_the_key_follows_the_source_and_the_flags():
    base = build_cache.key(b"int x;", ["-O2"])
    assert base == build_cache.key(b"int x;", ["-O2"])
    assert base != build_cache.key(b"int y;", ["-O2"])
    assert base != build_cache.key(b"int x;", ["-O1"])
