"""A compiled datapath as data, and the one loader that makes it live.

bcc compiles (the project's choice); what it emits is captured once as a
Build: each map's spec (type, sizes, entries, flags, and the BTF type ids
bcc gave it), each program's instructions with its map references turned
into indexes into those specs, the license, and bcc's BTF.  `instantiate`
is the only loader: it creates the maps a caller does not give (attach,
a cached attach), reuses those it gives after checking each one's shape
(replace: the running, pinned maps), points every map reference at the
map's fd and loads the programs through libbpf (bpfsys.py).  Maps made
here carry bcc's BTF, so `bpftool map dump` prints their fields whether
the build came from the compiler or the cache (build_cache.py).

Programs are loaded without BTF (bcc does not hand out a program's
func_info/line_info): `bpftool prog` shows no btf_id for them, and the
verifier treats them as bcc-free loads did before (same instructions,
same tags).
"""
from __future__ import annotations

import base64
import ctypes
import dataclasses
import os

from mrc_ebpf.datapath import bpfsys

FORMAT = 2      # of the JSON form (to_json); a kept build of another format is compiled again

# struct bpf_insn: code, dst_reg:4 | src_reg:4, off, imm; a 64-bit load
# of an immediate (BPF_LD | BPF_DW | BPF_IMM) takes two slots
_INSN = 8
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE = 1, 2
# bcc's program type names (BPF.SCHED_CLS, BPF.XDP) -> enum bpf_prog_type
PROG_TYPES = {"SCHED_CLS": 3, "XDP": 6, "RAW_TRACEPOINT": 17, "TRACING": 26}
# kernel hooks (datapath/port_hook.py): loaded only when asked for by name
HOOK_TYPES = {PROG_TYPES["RAW_TRACEPOINT"], PROG_TYPES["TRACING"]}


class RelocationError(Exception):
    """A map reference `relocate` cannot turn: .ref is the reference, or
    None for a 64-bit load of a kind it does not know (.kind)."""

    def __init__(self, ref: int | None, kind: int = 0):
        super().__init__(ref, kind)
        self.ref, self.kind = ref, kind


class ShapeError(Exception):
    """A given map differs from the build's spec of it (.symbol), or the
    build needs a map that was not given (.running None)."""

    def __init__(self, symbol: str, running: tuple | None, new: tuple):
        super().__init__(symbol, running, new)
        self.symbol, self.running, self.new = symbol, running, new


def relocate(insns: bytes, relocation: dict[int, int]) -> bytes:
    """INSNS with each map reference (a 64-bit load of a map fd, or of the
    address of a map's value) X turned into RELOCATION[X]."""
    out = bytearray(insns)
    for i, src, ref in _map_refs(insns):
        if ref not in relocation:
            raise RelocationError(ref)
        out[i + 4:i + 8] = relocation[ref].to_bytes(4, "little", signed=True)
    return bytes(out)


def _map_refs(insns: bytes):
    """(offset, kind, reference) of each map reference in INSNS."""
    i = 0
    while i + _INSN <= len(insns):
        if insns[i] == _LD_IMM64:
            src = insns[i + 1] >> 4
            if src in (_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE):
                yield i, src, int.from_bytes(insns[i + 4:i + 8], "little", signed=True)
            elif src != 0:
                raise RelocationError(None, src)
            i += 2 * _INSN
        else:
            i += _INSN


@dataclasses.dataclass(frozen=True)
class MapSpec:
    symbol: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    btf_key_type_id: int = 0
    btf_value_type_id: int = 0

    @property
    def shape(self) -> tuple:
        """What must match for a running map to stand in for this one."""
        return (self.type, self.key_size, self.value_size, self.max_entries, self.flags)


def shape_of(info: bpfsys.MapInfo) -> tuple:
    return (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags)


# An LRU hash's size is the attachment's (attach --active-peers sizes the
# LRUs of learnt and receive state): no program depends on it, so a
# running one of any size stands in for the build's.
MAP_TYPE_LRU_HASH = 9


def fits(running: tuple, new: tuple) -> bool:
    """Whether a running map of shape RUNNING can stand in for NEW."""
    if running[0] == new[0] == MAP_TYPE_LRU_HASH:
        return running[:3] + running[4:] == new[:3] + new[4:]
    return running == new


def describe_shape(shape: tuple) -> str:
    kind, key, value, entries, flags = shape
    return f"type {kind}, key {key} B, value {value} B, {entries} entries, flags {flags:#x}"


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    type: int           # enum bpf_prog_type
    insns: bytes        # map references are indexes into Build.maps


@dataclasses.dataclass
class Build:
    license: str
    maps: list[MapSpec]
    programs: dict[str, ProgramSpec]    # by function name
    btf: bytes = b""                    # the maps' types, as bcc made them
    origin: str = "compiled"            # or "cached": where this process got it

    def to_json(self) -> dict:
        return {"format": FORMAT, "license": self.license,
                "btf": base64.b64encode(self.btf).decode(),
                "maps": [dataclasses.asdict(m) for m in self.maps],
                "programs": {f: {"type": p.type, "insns": base64.b64encode(p.insns).decode()}
                             for f, p in self.programs.items()}}

    @classmethod
    def from_json(cls, entry: dict, origin: str = "cached") -> "Build":
        """The build of TO_JSON's ENTRY; ValueError (or KeyError,
        TypeError) when it is not one."""
        if entry.get("format") != FORMAT:
            raise ValueError("format")
        maps = [MapSpec(**m) for m in entry["maps"]]
        programs = {f: ProgramSpec(int(p["type"]), base64.b64decode(p["insns"], validate=True))
                    for f, p in entry["programs"].items()}
        for p in programs.values():       # every reference within the maps, before any load
            for _, _, ref in _map_refs(p.insns):
                if not 0 <= ref < len(maps):
                    raise ValueError(f"map reference {ref}")
        return cls(str(entry["license"]), maps, programs,
                   base64.b64decode(entry.get("btf", ""), validate=True), origin)


def module_maps(module) -> dict[str, int]:
    """A bcc BPF's maps, in its order: symbol -> fd (bcc's own)."""
    from bcc import libbcc
    lib = libbcc.lib
    # bcc's Python declares neither of these two; a handle of our own, so
    # its declarations stay ours
    own = ctypes.CDLL(lib._name)
    own.bpf_num_tables.restype, own.bpf_num_tables.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    own.bpf_table_name.restype = ctypes.c_char_p
    own.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    out = {}
    for i in range(own.bpf_num_tables(module.module)):
        symbol = own.bpf_table_name(module.module, i)
        out[symbol.decode()] = lib.bpf_table_fd(module.module, symbol)
    return out


def capture(module, programs: dict[str, str]) -> Build:
    """The build bcc compiled into MODULE (a bcc BPF, whose maps exist):
    PROGRAMS, function -> bcc program type name ("SCHED_CLS", "XDP")."""
    from bcc import libbcc
    lib = libbcc.lib
    maps, index_of, btf_ids = [], {}, set()
    for symbol, fd in module_maps(module).items():
        info = bpfsys.map_info(fd)
        index_of[fd] = len(maps)
        if info.btf_id:
            btf_ids.add(info.btf_id)
        maps.append(MapSpec(symbol, info.type, info.key_size, info.value_size,
                            info.max_entries, info.map_flags, info.btf_key_type_id,
                            info.btf_value_type_id))
    btf = b""
    if len(btf_ids) == 1:           # bcc loads one BTF per module
        btf = bpfsys.btf_raw(btf_ids.pop())
    else:                           # none, or not bcc's way: the maps go without
        maps = [dataclasses.replace(m, btf_key_type_id=0, btf_value_type_id=0) for m in maps]
    progs = {}
    for function, kind in programs.items():
        name = function.encode()
        start = lib.bpf_function_start(module.module, name)
        if not start:
            raise KeyError(function)
        size = lib.bpf_function_size(module.module, name)
        progs[function] = ProgramSpec(PROG_TYPES[kind], relocate(ctypes.string_at(start, size), index_of))
    return Build(lib.bpf_module_license(module.module).decode(), maps, progs, btf)


class _Owned:
    """An fd of ours, closed once: by close(), or when dropped."""

    def __init__(self, fd: int):
        self._fd = fd

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except (OSError, TypeError):     # at interpreter exit
            pass


class Table(_Owned):
    @property
    def map_fd(self) -> int:
        return self._fd


class Program(_Owned):
    @property
    def fd(self) -> int:
        return self._fd


class Instance:
    """A build made live: instance[symbol].map_fd and .programs[function].fd,
    as bcc's BPF and its functions offer them.  Each fd is its Table's or
    Program's: a program kept after the instance is dropped stays loaded."""

    def __init__(self, build: Build):
        self.build = build
        self.tables: dict[bytes, Table] = {}
        self.programs: dict[str, Program] = {}

    def __getitem__(self, symbol) -> Table:
        return self.tables[symbol.encode() if isinstance(symbol, str) else symbol]

    def close(self) -> None:
        owned = [*self.tables.values(), *self.programs.values()]
        self.tables, self.programs = {}, {}
        for o in owned:
            o.close()

    cleanup = close          # bcc's name for it


def instantiate(build: Build, maps: dict[str, int] | None = None,
                attach_types: dict[str, int] | None = None,
                functions: list[str] | None = None,
                hooks: dict[str, int] | None = None,
                sizes: dict[str, int] | None = None) -> Instance:
    """BUILD's programs loaded (FUNCTIONS, default all) on its maps.

    MAPS None: every map created from its spec, with the build's BTF, and
    the entries SIZES gives (symbol -> max entries; LRU hashes only: see
    fits) instead of the spec's.
    MAPS given (symbol -> fd, e.g. the pinned maps): each is checked
    against its spec and used (a duplicate of its fd); a map of the build
    not given is an error if a program uses it, else left out.
    ATTACH_TYPES: function -> expected_attach_type, where one is needed.
    A kernel hook (tracing, raw tracepoint: datapath/port_hook.py) is
    loaded only if named in HOOKS (function -> its kernel function's BTF
    id, 0 for a raw tracepoint): left out otherwise.
    Raises ShapeError, RelocationError, or bpfsys.BpfError
    (VerifierError with the verifier's log); nothing is left loaded then."""
    inst = Instance(build)
    try:
        fds: dict[int, int] = {}
        if maps is None:
            btf_fd = bpfsys.btf_load(build.btf) if build.btf else -1
            try:
                for i, m in enumerate(build.maps):
                    typed = btf_fd >= 0 and m.btf_value_type_id
                    entries = (sizes or {}).get(m.symbol, m.max_entries)
                    if entries != m.max_entries and m.type != MAP_TYPE_LRU_HASH:
                        raise ValueError(f"{m.symbol}: only an LRU hash is sized at load")
                    fds[i] = bpfsys.map_create(m.type, m.key_size, m.value_size, entries,
                                               m.symbol, m.flags, btf_fd if typed else 0,
                                               m.btf_key_type_id if typed else 0,
                                               m.btf_value_type_id if typed else 0)
                    inst.tables[m.symbol.encode()] = Table(fds[i])
            finally:
                if btf_fd >= 0:
                    os.close(btf_fd)     # the maps hold their own reference to it
        else:
            for i, m in enumerate(build.maps):
                if m.symbol not in maps:
                    continue
                running = shape_of(bpfsys.map_info(maps[m.symbol]))
                if not fits(running, m.shape):
                    raise ShapeError(m.symbol, running, m.shape)
                fds[i] = os.dup(maps[m.symbol])
                inst.tables[m.symbol.encode()] = Table(fds[i])
        for function in list(build.programs) if functions is None else functions:
            p = build.programs[function]
            if p.type in HOOK_TYPES and function not in (hooks or {}):
                continue
            btf_id = (hooks or {}).get(function, 0)
            try:
                insns = relocate(p.insns, fds)
            except RelocationError as e:
                if e.ref is None or not 0 <= e.ref < len(build.maps):
                    raise
                m = build.maps[e.ref]
                raise ShapeError(m.symbol, None, m.shape)
            try:
                fd = bpfsys.prog_load(p.type, insns, build.license, function,
                                      (attach_types or {}).get(function, 0), attach_btf_id=btf_id)
            except bpfsys.BpfError as e:
                e.function = function
                raise
            inst.programs[function] = Program(fd)
        return inst
    except BaseException:
        inst.close()
        raise
