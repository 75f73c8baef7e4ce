"""Every Python mirror of a C layout against the C, as bcc compiles it.

The mirrors are registered in mrc_ebpf/datapath/mirrors.py (ctypes structs
of the maps, faults' and the ECN marker's pinned maps, the kernel's info
structs, libbpf's *_opts structs, the scapy layer of the TLV); this file walks that registry,
and fails on a ctypes struct or scapy layer in mrc_ebpf that is not in it.
bcc derives ctypes Key/Leaf types from the C of a map, so each checked C
type is the value of a probe map compiled with the file that defines it.
"""
from __future__ import annotations

import ctypes
import importlib
import inspect
import pkgutil
import shutil
import subprocess
from pathlib import Path

import pytest

import mrc_ebpf
from mrc_ebpf.datapath import layout, mirrors, source


def _import_all() -> None:
    """Import every module of mrc_ebpf, so every mirror is registered."""
    for info in pkgutil.walk_packages(mrc_ebpf.__path__, "mrc_ebpf."):
        importlib.import_module(info.name)


_import_all()
REGISTRY = list(mirrors.REGISTRY)


def flatten(ct, base=0, prefix=""):
    """(name, offset, size) of every leaf field."""
    if isinstance(ct, type) and issubclass(ct, (ctypes.Structure, ctypes.Union)):
        out = []
        for name, ftype, *_ in ct._fields_:
            field = getattr(ct, name)
            out += flatten(ftype, base + field.offset, f"{prefix}{name}.")
        return out
    return [(prefix.rstrip("."), base, ctypes.sizeof(ct))]


def _id(m: mirrors.Mirror) -> str:
    return f"{m.py.__module__.rsplit('.', 1)[-1]}.{m.py.__name__}"


def test_every_mirror_is_registered():
    """A ctypes struct or union, or a scapy layer, defined anywhere in
    mrc_ebpf is a second definition of a C layout: it must be registered."""
    from scapy.packet import Packet
    registered = {m.py for m in REGISTRY}
    found = set()
    for info in pkgutil.walk_packages(mrc_ebpf.__path__, "mrc_ebpf."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == info.name and \
                    issubclass(obj, (ctypes.Structure, ctypes.Union, Packet)):
                found.add(obj)
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in found - registered)
    assert not missing, f"not registered in mrc_ebpf/datapath/mirrors.py: {missing}"
    assert len(found) >= 25   # the walk did find them


def test_registry_is_well_formed():
    for m in REGISTRY:
        assert m.kind in mirrors.KINDS
        if m.kind == "scapy":
            assert m.of is not None and any(o.py is m.of and o.c_type == m.c_type and o.kind == "struct"
                                             for o in REGISTRY), _id(m)
        if isinstance(m.source, Path):
            assert m.source.is_file(), m.source


# ---- compiling: one bcc module per source file, a probe map per C type -----

def _program(src, c_types: list[str]) -> str:
    if isinstance(src, Path) and src.suffix == ".c":
        head = source.expand(src)                   # compiled on its own (bpf/lab/*.c), includes inlined
    elif isinstance(src, Path):
        head = f'#include "{src}"'
    else:
        head = f"#include <{src}>"
    probes = [f"BPF_ARRAY(probe{i}, {c}, 1);" for i, c in enumerate(c_types)]
    return "\n".join([head, *probes, "int layout_probe(void *ctx) { return 0; }"])


_built: dict = {}


def _compiled(src) -> tuple:
    """(module, {C type: bcc's ctypes Leaf}) for the struct-like mirrors of
    SRC: one compile per file."""
    if (src,) not in _built:
        from bcc import BPF
        c_types = sorted({m.c_type for m in REGISTRY if m.source == src and m.kind in ("struct", "prefix")})
        module = BPF(text=_program(src, c_types).encode(), cflags=["-Wno-unused-function"])
        _built[(src,)] = module, {c: module[f"probe{i}".encode()].Leaf for i, c in enumerate(c_types)}
    return _built[(src,)]


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    for src in {m.source for m in REGISTRY}:
        if (src,) in _built:
            _built[(src,)][0].cleanup()
    _built.clear()


def _fields(ct):
    return [(n, o, s) for n, o, s in flatten(ct)]


@pytest.mark.root
@pytest.mark.parametrize("m", [m for m in REGISTRY if m.kind in ("struct", "prefix")], ids=_id)
def test_struct_mirror_matches_c(m):
    _, leaves = _compiled(m.source)
    c = _fields(leaves[m.c_type])
    py = _fields(m.py)
    if m.kind == "prefix":
        c = c[:len(py)]
        assert ctypes.sizeof(m.py) <= ctypes.sizeof(leaves[m.c_type])
    else:
        assert ctypes.sizeof(m.py) == ctypes.sizeof(leaves[m.c_type])
    assert py == c


LIBBPF_HEADER = Path("/usr/include") / mirrors.LIBBPF_BPF_H


@pytest.mark.skipif(not LIBBPF_HEADER.is_file() or not shutil.which("cc"),
                    reason="libbpf's header (apt-get install libbpf-dev) and a C compiler")
def test_libbpf_mirrors_match_the_installed_header(tmp_path):
    """The *_opts structs passed to libbpf (bpfsys.py): each field's offset
    and size against the installed libbpf's bpf/bpf.h, by the host's C
    compiler (libbpf is host code).  A twin may be shorter than the
    header's struct (its `sz` says how much is passed), never different."""
    checks = ["#include <stddef.h>", f"#include <{mirrors.LIBBPF_BPF_H}>"]
    found = [m for m in REGISTRY if m.kind == "libbpf"]
    assert len(found) >= 5
    for m in found:
        base = m.py.__name__
        for name, offset, size in flatten(m.py):
            checks.append(f'_Static_assert(offsetof({m.c_type}, {name}) == {offset}, '
                          f'"{base}.{name}: offset {offset}");')
            checks.append(f'_Static_assert(sizeof((({m.c_type} *)0)->{name}) == {size}, '
                          f'"{base}.{name}: size {size}");')
        checks.append(f'_Static_assert(sizeof({m.c_type}) >= {ctypes.sizeof(m.py)}, "{base}: size");')
    src = tmp_path / "libbpf_mirrors.c"
    src.write_text("\n".join(checks) + "\n")
    r = subprocess.run(["cc", "-fsyntax-only", str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr   # a failed _Static_assert names the field


def test_scapy_mirrors_match_their_struct():
    """A scapy layer's fields, in order, by name and size, are those of the
    ctypes twin of the same C type (which the tests above check against C)."""
    for m in [m for m in REGISTRY if m.kind == "scapy"]:
        layer = [(f.name, f.sz) for f in m.py.fields_desc]
        twin = [(n, s) for n, _, s in flatten(m.of)]
        assert layer == twin, _id(m)


# ---- the maps: each map of lib/maps.h has the key and value types layout.MAPS says

@pytest.fixture(scope="module")
def compiled(datapath):
    return datapath.module      # the session's compile (tests/conftest.py)


@pytest.mark.root
@pytest.mark.parametrize("name", sorted(layout.MAPS))
def test_map_layouts_match_c(compiled, name):
    key, value, percpu = layout.MAPS[name]
    table = compiled[layout.symbol(name)]
    leaf = table.Leaf._type_ if percpu else table.Leaf   # bcc gives per-CPU leaves as arrays
    assert ctypes.sizeof(table.Key) == ctypes.sizeof(key)
    assert ctypes.sizeof(leaf) == ctypes.sizeof(value)
    if issubclass(value, ctypes.Structure):
        assert [(n, o) for n, o, _ in flatten(leaf)] == [(n, o) for n, o, _ in flatten(value)]
    if issubclass(key, ctypes.Structure):
        assert [(n, o) for n, o, _ in flatten(table.Key)] == [(n, o) for n, o, _ in flatten(key)]


# ---- constants and macros Python reads from the C ---------------------------

def test_macros_evaluate_like_c():
    C = source.C
    for n in range(1, C["MRC_MAX_SEGMENTS"] + 1):
        assert layout.srh_len(n) == 8 + 16 * n + C["MRC_TLV_SIZE"]
        assert layout.encap_len(n) == 40 + layout.srh_len(n)
    assert layout.encap_len(1, usid=True) == C["MRC_USID_ENCAP_LEN"]


def test_fault_constants_come_from_fault_c():
    from mrc_ebpf.lab import faults
    assert faults.MODES == {"blackhole": 1, "loss": 2}
    assert faults.COUNTER_NAMES == ("dropped", "passed", "dropped_skbs")
    assert faults.FIRST_DROP_NS == 3
    assert faults.CFG_CLSACT_OURS == source.C["MRC_DEV_F_CLSACT_OURS"]


def test_timer_defaults_are_the_headers():
    from click.testing import CliRunner
    from mrc_ebpf.cli import mrcctl
    from mrc_ebpf.datapath import loader
    assert loader.TIMERS is layout.TIMER_DEFAULTS
    assert set(layout.TIMER_DEFAULTS) == {n for n, *_ in layout.Config._fields_ if n.endswith("_us")}
    params = {p.name: p.default for p in mrcctl.attach.params}
    for name, value in layout.TIMER_DEFAULTS.items():
        assert params[name] == value == source.C[f"MRC_DEFAULT_{name.upper()}"]
    assert CliRunner().invoke(mrcctl.cli, ["attach", "--help"]).exit_code == 0


def test_every_datapath_map_is_named_mrc():
    """`bpftool map` lists everyone's maps: ours say whose they are."""
    import re
    text = (source.BPF_DIR / "lib" / "maps.h").read_text()
    names = [m.group(2) for m in re.finditer(r"^BPF_(?:F_)?TABLE\((?:[^,]+,){3}\s*(\w+)|^BPF_\w+\((\w+)",
                                             text, flags=re.M) if m.group(2)]
    names += [m.group(1) for m in re.finditer(r"^BPF_(?:F_)?TABLE\((?:[^,]+,){3}\s*(\w+)", text, flags=re.M)]
    assert len(names) >= len(layout.MAPS) and all(n.startswith("mrc_") for n in names), names


def test_common_headers_are_all_read():
    """Every header of bpf/lib/common/ is included by mrc_common.h, so
    source.py (which follows its includes) reads its constants."""
    common = sorted((source.BPF_DIR / "lib" / "common").glob("*.h"))
    assert len(common) >= 10
    text = source.header_text()
    for header in common:
        assert f'#line 1 "{header.resolve()}"' in text, header.name
    assert "enum mrc_counter" in text and source.C["MRC_TLV_SIZE"] == 64
