"""The one loader (mrc_ebpf/datapath/build.py): a build captured from bcc,
made live by build.instantiate through libbpf.  Witnesses: the kernel
(its verifier's refusal and log, map info) and bpftool, which prints a
map's entries by field name only when the map carries BTF."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import time

import pytest

from mrc_ebpf.datapath import bpfsys, build

TEXT = b"""
struct probe_value { u32 alpha; u64 beta; };
BPF_ARRAY(probe_typed, struct probe_value, 2);
BPF_PROG_ARRAY(probe_jumps, 1);
int probe_fn(struct __sk_buff *skb) {
    int k = 0;
    struct probe_value *v = probe_typed.lookup(&k);
    if (v)
        v->alpha++;
    probe_jumps.call(skb, 0);
    return 0;
}
"""


def bpftool(*args):
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True,
                                     check=True).stdout)


def map_ids_named(name: str, settle_s: float = 3.0) -> list[int]:
    """Maps called NAME, once none is left or SETTLE_S passed: a program
    lets go of its maps after an RCU grace period, not at close."""
    deadline = time.monotonic() + settle_s
    while True:
        found = [m["id"] for m in bpftool("map", "show") if m.get("name") == name]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture(scope="module")
def captured():
    from bcc import BPF
    module = BPF(text=TEXT)
    try:
        return build.capture(module, {"probe_fn": "SCHED_CLS"})
    finally:
        module.cleanup()        # bcc's own maps: gone, so the ones seen later are ours


@pytest.mark.root
def test_fresh_maps_keep_bcc_btf_and_the_program_runs(captured):
    made = build.Build.from_json(json.loads(json.dumps(captured.to_json())))
    assert made == dataclasses.replace(captured, origin="cached")
    assert made.btf and any(m.btf_value_type_id for m in made.maps)
    inst = build.instantiate(made)
    try:
        fd = inst["probe_typed"].map_fd
        info = bpfsys.map_info(fd)
        assert info.btf_id and info.btf_value_type_id
        ret, _, _ = bpfsys.prog_test_run(inst.programs["probe_fn"].fd, bytes(64), 3)
        assert ret == 0
        dump = bpftool("map", "dump", "id", str(info.id))
        assert dump[0]["formatted"]["value"] == {"alpha": 3, "beta": 0}, dump   # by field name: BTF
        for m in made.maps:         # each map typed as bcc typed it
            info = bpfsys.map_info(inst[m.symbol].map_fd)
            assert (info.btf_key_type_id, info.btf_value_type_id) == (m.btf_key_type_id,
                                                                       m.btf_value_type_id)
    finally:
        inst.close()
    assert not map_ids_named("probe_typed")


@pytest.mark.root
def test_given_maps_are_checked_and_used(captured):
    typed = next(m for m in captured.maps if m.symbol == "probe_typed")
    jumps = next(m for m in captured.maps if m.symbol == "probe_jumps")
    right = bpfsys.map_create(typed.type, typed.key_size, typed.value_size, typed.max_entries,
                              "probe_typed")
    wrong = bpfsys.map_create(typed.type, typed.key_size, typed.value_size, typed.max_entries + 1,
                              "probe_typed")
    other = bpfsys.map_create(jumps.type, jumps.key_size, jumps.value_size, jumps.max_entries,
                              "probe_jumps")
    try:
        with pytest.raises(build.ShapeError) as refused:
            build.instantiate(captured, {"probe_typed": wrong, "probe_jumps": other})
        assert refused.value.symbol == "probe_typed"
        assert refused.value.running[3] == typed.max_entries + 1
        with pytest.raises(build.ShapeError) as missing:      # used by the program, not given
            build.instantiate(captured, {"probe_typed": right})
        assert missing.value.symbol == "probe_jumps" and missing.value.running is None
        inst = build.instantiate(captured, {"probe_typed": right, "probe_jumps": other})
        try:
            bpfsys.prog_test_run(inst.programs["probe_fn"].fd, bytes(64), 2)
            value = (ctypes.c_uint8 * typed.value_size)()
            assert bpfsys.map_lookup(right, ctypes.c_uint32(0), value)
            assert int.from_bytes(bytes(value)[:4], "little") == 2     # the given map was used
        finally:
            inst.close()
    finally:
        for fd in (right, wrong, other):
            os.close(fd)


@pytest.mark.root
def test_a_refused_program_raises_with_the_verifiers_log_and_leaves_nothing():
    """r0 never set, then exit: the verifier refuses; the maps made for it
    are gone again."""
    spec = build.MapSpec("probe_refused", bpfsys.BPF_MAP_TYPE_ARRAY, 4, 8, 1)
    made = build.Build("GPL", [spec], {"refused": build.ProgramSpec(3, bytes.fromhex("9500000000000000"))})
    with pytest.raises(bpfsys.VerifierError) as refused:
        build.instantiate(made)
    assert "R0 !read_ok" in refused.value.log and refused.value.function == "refused"
    assert not map_ids_named("probe_refused")


@pytest.mark.root
def test_from_json_refuses_a_reference_outside_the_maps(captured):
    entry = captured.to_json()
    entry["maps"] = entry["maps"][:1]
    with pytest.raises(ValueError):
        build.Build.from_json(entry)
    with pytest.raises(ValueError):
        build.Build.from_json({**captured.to_json(), "format": build.FORMAT + 1})
