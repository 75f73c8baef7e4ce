"""The ctypes mirrors in mrc_ebpf/layout.py against the C structs, as
bcc compiles them (bcc derives Key/Leaf ctypes from the C)."""
from __future__ import annotations

import ctypes

import pytest

from mrc_ebpf.datapath import layout

pytestmark = pytest.mark.root


def flatten(ct, base=0, prefix=""):
    """(name, offset, size) of every leaf field."""
    if isinstance(ct, type) and issubclass(ct, ctypes.Structure):
        out = []
        for name, ftype, *_ in ct._fields_:
            field = getattr(ct, name)
            out += flatten(ftype, base + field.offset, f"{prefix}{name}.")
        return out
    return [(prefix.rstrip("."), base, ctypes.sizeof(ct))]


@pytest.fixture(scope="module")
def compiled(datapath):
    return datapath.module      # the session's compile (tests/conftest.py)


@pytest.mark.parametrize("name", sorted(layout.MAPS))
def test_map_layouts_match_c(compiled, name):
    key, value, percpu = layout.MAPS[name]
    table = compiled[name]
    leaf = table.Leaf._type_ if percpu else table.Leaf   # bcc gives per-CPU leaves as arrays
    assert ctypes.sizeof(table.Key) == ctypes.sizeof(key)
    assert ctypes.sizeof(leaf) == ctypes.sizeof(value)
    if issubclass(value, ctypes.Structure):
        assert [(n, o) for n, o, _ in flatten(leaf)] == [(n, o) for n, o, _ in flatten(value)]
    if issubclass(key, ctypes.Structure):
        assert [(n, o) for n, o, _ in flatten(table.Key)] == [(n, o) for n, o, _ in flatten(key)]


def test_tlv_struct_matches_c():
    """struct mrc_tlv is not a map value; compile a probe that exposes it."""
    from bcc import BPF
    from mrc_ebpf.datapath import source
    text = "\n".join([f'#include "{source.COMMON_HEADER}"',
                      "BPF_ARRAY(probe, struct mrc_tlv, 1);",
                      "int p(void *ctx) { return 0; }"])
    module = BPF(text=text.encode())
    try:
        leaf = module["probe"].Leaf
        assert [(n, o, s) for n, o, s in flatten(leaf)] == \
            [(n, o, s) for n, o, s in flatten(layout.MrcTlv)]
    finally:
        module.cleanup()


def test_ecn_marker_queue_matches_c():
    """The fabric's ECN marker (bpf/ecn_mark.c) against its mirror in
    mrc_ebpf/ecn_marks.py, which reads the pinned map later."""
    from bcc import BPF
    from mrc_ebpf.lab import ecn_marks
    module = BPF(src_file=str(ecn_marks.SOURCE).encode())
    try:
        table = module[ecn_marks.MAP.encode()]
        assert [(n, o, s) for n, o, s in flatten(table.Leaf)] == \
            [(n, o, s) for n, o, s in flatten(ecn_marks.Queue)]
        assert ctypes.sizeof(table.Key) == ctypes.sizeof(ecn_marks.QueueKey)
        assert [(n, o) for n, o, _ in flatten(table.Key)][:1] == [("mac", 0)]
    finally:
        module.cleanup()
