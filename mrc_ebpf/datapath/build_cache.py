"""The compiled datapath kept on disk, so an attach after the first skips clang.

bcc compiles bpf/mrc.c on every load: about 5 of the 8 seconds an attach
takes on a 2-core host, and minutes in a VM under TCG.  What it builds
depends only on the source text, the compiler flags, the kernel's headers
and bcc; so the first attach keeps the build (each map's shape, each
program's instructions with its map references turned into map indexes)
under a hash of those, and a later attach creates the maps and loads the
instructions itself with bpf(2).  The verifier checks every load as
before.  A cached build carries no BTF (bcc's maps do): `bpftool map dump`
prints such maps in hex.

MRC_EBPF_CACHE=DIR keeps builds in DIR (default /var/cache/mrc-ebpf),
MRC_EBPF_CACHE=off compiles every time.  Only a compile needs the kernel's
headers (require_headers): a host whose cache holds the build for its
kernel and sources attaches without them.  The directory is root's, mode
0700: what it holds is loaded into the kernel, so a directory anyone else
could write to is not used.
"""
from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import tempfile
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, source
from mrc_ebpf.errors import MrcError

FORMAT = 1
DEFAULT_DIR = "/var/cache/mrc-ebpf"

# struct bpf_insn: code, dst_reg:4 | src_reg:4, off, imm; a 64-bit load
# of an immediate (BPF_LD | BPF_DW | BPF_IMM) takes two slots
_INSN = 8
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE = 1, 2


class RelocationError(Exception):
    """A map reference RELOCATE cannot turn: .fd is the reference, or None
    for a 64-bit load of a kind it does not know (.kind)."""

    def __init__(self, fd: int | None, kind: int = 0):
        super().__init__(fd, kind)
        self.fd, self.kind = fd, kind


def relocate(insns: bytes, relocation: dict[int, int]) -> bytes:
    """INSNS with each map reference (a 64-bit load of a map fd, or of the
    address of a map's value) X turned into RELOCATION[X]."""
    out = bytearray(insns)
    i = 0
    while i + _INSN <= len(out):
        if out[i] == _LD_IMM64:
            src = out[i + 1] >> 4
            if src in (_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE):
                ref = int.from_bytes(out[i + 4:i + 8], "little", signed=True)
                if ref not in relocation:
                    raise RelocationError(ref)
                out[i + 4:i + 8] = relocation[ref].to_bytes(4, "little", signed=True)
            elif src != 0:
                raise RelocationError(None, src)
            i += 2 * _INSN
        else:
            i += _INSN
    return bytes(out)


def cached(text: bytes, cflags: list[str], programs: dict[str, str], compile,
           attach_types: dict[str, int] | None = None):
    """(module, {function: program}) for the build of TEXT: loaded from the
    cache when it holds it, else COMPILE() (a bcc module and its loaded
    PROGRAMS, function -> program type name), then kept.  The module
    offers module[symbol].map_fd, the programs .fd, either way."""
    where = directory()
    if where is None:
        return compile()
    build_key = key(text, cflags)
    build = load(where, build_key, attach_types or {})
    if build is not None:
        return build, build.programs
    module, progs = compile()
    store(where, build_key, module, programs)
    return module, progs


def one_program(source_file: Path, function: str, kind: str = "SCHED_CLS"):
    """(module, program) for a C file of one program (the lab's): bcc
    compiles its text, quoted includes inlined, or the cache loads it."""
    require_bcc()
    from bcc import BPF

    text = source.expand(source_file).encode()     # its quoted includes (mrc_common.h) inlined

    def compile():
        require_headers()
        try:
            module = BPF(text=text)
            return module, {function: module.load_func(function.encode(), getattr(BPF, kind))}
        except Exception as e:  # bcc raises bare Exception; the verifier log went to stderr
            raise MrcError(f"cannot load {source_file.name}: {e}")
    module, progs = cached(text, [], {function: kind}, compile)
    return module, progs[function]


def require_bcc() -> None:
    """bcc is importable, or MrcError saying which Debian package brings it."""
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise MrcError("bcc is not installed: apt-get install python3-bpfcc (Debian's; the PyPI "
                       "`bcc` is another project), and run mrcctl from a venv made with "
                       "`/usr/bin/python3 -m venv --system-site-packages` so that it sees it")


def headers_dir() -> Path:
    return Path(f"/lib/modules/{os.uname().release}/build")


def require_headers() -> None:
    """The kernel headers bcc compiles against are there, or MrcError
    naming what to install: called just before a compile, never when the
    cache holds the build."""
    build = headers_dir()
    if (build / "include").exists() or (build / "Makefile").exists():
        return
    release = os.uname().release
    where = directory()
    cache = (f"an attach whose build for kernel {release} and these sources is in {where} "
             f"would need none, and there is none yet" if where is not None
             else "the build cache is off: MRC_EBPF_CACHE")
    debian = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))
    if debian:
        have = debian[-1]
        common = have.parent / (have.name[:-len("-amd64")] + "-common")
        fix = (f"link Debian's headers there: mkdir -p {build.parent}; ln -s {have} {build}; "
               f"ln -s {common} {build.parent / 'source'} (or apt-get install linux-headers-{release} "
               f"where Debian has that package)")
    else:
        fix = (f"apt-get install linux-headers-{release} (a Debian kernel's own), or for another "
               f"kernel apt-get install linux-headers-amd64 and link /usr/src/linux-headers-VER-amd64 "
               f"as {build} and /usr/src/linux-headers-VER-common as {build.parent / 'source'}")
    raise MrcError(f"kernel headers missing at {build}: bcc compiles against them ({cache}); {fix}")


def directory() -> Path | None:
    """Where builds are kept, or None for nowhere (off, or not safe)."""
    setting = os.environ.get("MRC_EBPF_CACHE", DEFAULT_DIR)
    if setting.lower() in ("", "off", "0", "no"):
        return None
    path = Path(setting)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None             # read-only /var, say: compile every time
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return path


def key(text: bytes, cflags: list[str]) -> str:
    """What a build depends on: the source, the flags, the kernel (its
    headers are found by release) and bcc's library."""
    h = hashlib.sha256()
    uname = os.uname()
    for part in (str(FORMAT), uname.release, uname.version, _libbcc_identity(), *cflags):
        h.update(part.encode() + b"\0")
    h.update(text)
    return h.hexdigest()


def _libbcc_identity() -> str:
    try:
        from bcc import libbcc
        path = Path(libbcc.lib._name).resolve()
        st = path.stat()
        return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except (ImportError, OSError, AttributeError):
        return "libbcc"


def store(where: Path, build_key: str, module, programs: dict[str, str]) -> None:
    """Keep MODULE's build (a bcc BPF, programs compiled): its maps and
    PROGRAMS (function name -> program type name).  Best effort: a build
    not kept is compiled again next time."""
    try:
        entry = _entry(module, programs)
    except (OSError, RelocationError, UnicodeError):
        return
    try:
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".build-")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, where / f"{build_key}.json")
    except OSError:
        pass


def _entry(module, programs: dict[str, str]) -> dict:
    from bcc import libbcc
    lib = libbcc.lib
    # bcc's Python declares neither of these two; a handle of our own, so
    # its declarations stay ours
    own = ctypes.CDLL(lib._name)
    own.bpf_num_tables.restype, own.bpf_num_tables.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    own.bpf_table_name.restype = ctypes.c_char_p
    own.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    maps, index_of = [], {}
    for i in range(own.bpf_num_tables(module.module)):
        symbol = own.bpf_table_name(module.module, i)
        fd = lib.bpf_table_fd(module.module, symbol)
        info = bpfsys.map_info(fd)
        index_of[fd] = len(maps)
        maps.append({"symbol": symbol.decode(), "type": info.type, "key_size": info.key_size,
                     "value_size": info.value_size, "max_entries": info.max_entries,
                     "flags": info.map_flags})
    progs = {}
    for function, kind in programs.items():
        name = function.encode()
        start = lib.bpf_function_start(module.module, name)
        size = lib.bpf_function_size(module.module, name)
        insns = relocate(ctypes.string_at(start, size), index_of)
        progs[function] = {"type": kind, "insns": base64.b64encode(insns).decode()}
    return {"format": FORMAT, "license": lib.bpf_module_license(module.module).decode(),
            "maps": maps, "programs": progs}


class Table:
    def __init__(self, fd: int):
        self.map_fd = fd


class Program:
    def __init__(self, fd: int):
        self.fd = fd


class CachedBuild:
    """A build loaded from the cache: module[symbol].map_fd and the
    programs' .fd, as bcc's BPF and its functions offer them; owns the fds."""

    def __init__(self):
        self.tables: dict[bytes, Table] = {}
        self.programs: dict[str, Program] = {}

    def __getitem__(self, symbol) -> Table:
        return self.tables[symbol.encode() if isinstance(symbol, str) else symbol]

    def close(self) -> None:
        fds = [t.map_fd for t in self.tables.values()] + [p.fd for p in self.programs.values()]
        self.tables, self.programs = {}, {}
        for fd in fds:
            os.close(fd)

    cleanup = close          # bcc's name for it

    def __del__(self):
        try:
            self.close()
        except (OSError, TypeError):     # at interpreter exit
            pass


def load(where: Path, build_key: str, attach_types: dict[str, int]) -> CachedBuild | None:
    """The build kept under BUILD_KEY, its maps created and programs loaded
    (ATTACH_TYPES: function -> expected_attach_type, where one is needed);
    None when there is none or it does not load (it is then dropped)."""
    from bcc import BPF     # its program type numbers, as compile() used them
    path = where / f"{build_key}.json"
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    build = CachedBuild()
    try:
        if entry.get("format") != FORMAT:
            raise ValueError("format")
        fds = []
        for m in entry["maps"]:
            fd = bpfsys.map_create(m["type"], m["key_size"], m["value_size"], m["max_entries"],
                                   m["symbol"], m["flags"])
            build.tables[m["symbol"].encode()] = Table(fd)
            fds.append(fd)
        for function, p in entry["programs"].items():
            insns = relocate(base64.b64decode(p["insns"]), dict(enumerate(fds)))
            fd = bpfsys.prog_load(getattr(BPF, p["type"]), insns, entry["license"], function,
                                  attach_types.get(function, 0))
            build.programs[function] = Program(fd)
        return build
    except (bpfsys.BpfError, KeyError, ValueError, TypeError, AttributeError, RelocationError):
        build.close()
        try:
            path.unlink()
        except OSError:
            pass
        return None
