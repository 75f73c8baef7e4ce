"""The compiled datapath kept on disk, so an attach after the first skips clang.

bcc compiles bpf/mrc.c on every load: about 5 of the 8 seconds an attach
takes on a 2-core host, and minutes in a VM under TCG.  What it builds
depends only on the source text, the compiler flags, the kernel's headers
and bcc; so the first attach keeps the build (build.py: each map's spec
and BTF, each program's instructions) under a hash of those, and a later
attach, or a replace, takes it from here instead of compiling.  Either
way build.instantiate loads it, and the verifier checks every load.

MRC_EBPF_CACHE=DIR keeps builds in DIR (default /var/cache/mrc-ebpf),
MRC_EBPF_CACHE=off compiles every time.  Only a compile needs the kernel's
headers (require_headers) and bcc: a host whose cache holds the build for
its kernel and sources attaches without them.  The directory is root's,
mode 0700: what it holds is loaded into the kernel, so a directory anyone
else could write to is not used.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, build, source
from mrc_ebpf.errors import MrcError

DEFAULT_DIR = "/var/cache/mrc-ebpf"
FORMAT = build.FORMAT
LOG_LINES = 40      # of a refused program's verifier log, shown on stderr


def obtain(text: bytes, cflags: list[str], programs: dict[str, str], what: str,
           src_file: Path | None = None) -> build.Build:
    """The build of TEXT (PROGRAMS: function -> bcc program type name):
    the kept one, or compiled now and kept.  SRC_FILE: compile that file
    (its includes relative to it) instead of TEXT, which is then its
    expansion (source.expand), the key."""
    where = directory()
    build_key = key(text, cflags) if where is not None else ""
    if where is not None:
        kept = load(where, build_key)
        if kept is not None:
            return kept
    made = compile_build(text, cflags, programs, what, src_file)
    if where is not None:
        store(where, build_key, made)
    return made


def compile_build(text: bytes, cflags: list[str], programs: dict[str, str], what: str,
                  src_file: Path | None = None) -> build.Build:
    """bcc compiles TEXT (or SRC_FILE); its build, captured (build.capture),
    and bcc's own maps closed."""
    require_bcc()
    require_headers()     # only here: a cached build needs no headers
    from bcc import BPF
    try:
        module = BPF(src_file=str(src_file).encode()) if src_file else BPF(text=text, cflags=cflags)
    except Exception as e:  # bcc raises bare Exception; the compiler's messages went to stderr
        raise MrcError(f"cannot load {what}: {e}")
    try:
        return build.capture(module, programs)
    except (KeyError, bpfsys.BpfError, build.RelocationError) as e:
        raise MrcError(f"cannot load {what}: capturing bcc's build: {e!r}")
    finally:
        module.cleanup()


def live(text: bytes, cflags: list[str], programs: dict[str, str], what: str,
         attach_types: dict[str, int] | None = None, src_file: Path | None = None,
         sizes: dict[str, int] | None = None) -> build.Instance:
    """The build of TEXT made live on fresh maps (build.instantiate; SIZES:
    its LRUs' entries).  A kept build that does not load is dropped and
    compiled again."""
    made = obtain(text, cflags, programs, what, src_file)
    try:
        return build.instantiate(made, None, attach_types, list(programs), sizes=sizes)
    except (bpfsys.BpfError, build.RelocationError, build.ShapeError, KeyError) as e:
        if made.origin != "cached":
            raise load_error(what, e)
        drop(text, cflags)
    made = compile_build(text, cflags, programs, what, src_file)
    try:
        inst = build.instantiate(made, None, attach_types, list(programs), sizes=sizes)
    except (bpfsys.BpfError, build.RelocationError, build.ShapeError) as e:
        raise load_error(what, e)
    where = directory()
    if where is not None:
        store(where, key(text, cflags), made)
    return inst


def load_error(what: str, e: BaseException) -> MrcError:
    """MrcError for a build that did not load; a verifier's refusal shows
    the end of its log on stderr first (bcc showed all of it)."""
    log = getattr(e, "log", "")
    if log:
        lines = log.rstrip().splitlines()
        sys.stderr.write("\n".join(lines[-LOG_LINES:]) + "\n")
    reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e) or type(e).__name__)
    return MrcError(f"cannot load {what}: {reason}")


def one_program(source_file: Path, function: str, kind: str = "SCHED_CLS"):
    """(instance, program) for a C file of one program (the lab's): bcc
    compiles its text, quoted includes (mrc_common.h) inlined, or the
    cache holds it."""
    inst = live(source.expand(source_file).encode(), [], {function: kind}, source_file.name)
    return inst, inst.programs[function]


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
    headers = headers_dir()
    if (headers / "include").exists() or (headers / "Makefile").exists():
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
        fix = (f"link Debian's headers there: mkdir -p {headers.parent}; ln -s {have} {headers}; "
               f"ln -s {common} {headers.parent / 'source'} (or apt-get install linux-headers-{release} "
               f"where Debian has that package)")
    else:
        fix = (f"apt-get install linux-headers-{release} (a Debian kernel's own), or for another "
               f"kernel apt-get install linux-headers-amd64 and link /usr/src/linux-headers-VER-amd64 "
               f"as {headers} and /usr/src/linux-headers-VER-common as {headers.parent / 'source'}")
    raise MrcError(f"kernel headers missing at {headers}: bcc compiles against them ({cache}); {fix}")


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


def store(where: Path, build_key: str, made: build.Build) -> None:
    """Keep MADE under BUILD_KEY.  Best effort: a build not kept is
    compiled again next time."""
    try:
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".build-")
        with os.fdopen(fd, "w") as f:
            json.dump(made.to_json(), f)
        os.replace(tmp, where / f"{build_key}.json")
    except OSError:
        pass


def load(where: Path, build_key: str) -> build.Build | None:
    """The build kept under BUILD_KEY; None when there is none or it is not
    one (it is then dropped)."""
    path = where / f"{build_key}.json"
    try:
        entry = json.loads(path.read_text())
    except OSError:
        return None
    except ValueError:
        entry = None
    try:
        return build.Build.from_json(entry, "cached")
    except (ValueError, KeyError, TypeError, AttributeError, build.RelocationError):
        _unlink(path)
        return None


def drop(text: bytes, cflags: list[str]) -> None:
    where = directory()
    if where is not None:
        _unlink(where / f"{key(text, cflags)}.json")


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
