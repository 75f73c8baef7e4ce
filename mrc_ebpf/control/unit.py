"""The systemd template unit mrc-ebpf@DEV (packaging/systemd/, shipped in
the package as mrc_ebpf/systemd/): found, and written with the absolute
path of an mrcctl (`mrcctl install-unit`).

systemd runs ExecStart= without a shell and, for a bare name, searches
only its own fixed path (/usr/local/bin, /usr/bin, ...), so a venv's
mrcctl must be named by its absolute path: `systemd-analyze verify`
rejects the unit otherwise ("Command mrcctl is not executable").
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mrc_ebpf.errors import MrcError

NAME = "mrc-ebpf@.service"
DEFAULT_DIR = Path("/etc/systemd/system")
_HERE = Path(__file__).resolve().parent
# a checkout keeps it in packaging/systemd, an installed package in mrc_ebpf/systemd
_CHECKOUT, _INSTALLED = _HERE.parent.parent / "packaging" / "systemd", _HERE.parent / "systemd"
_EXEC = re.compile(r"^(Exec(?:Start|Stop|Reload|StartPre|StartPost|StopPost)=)([-@+!:]*)(\S+)(.*)$")


def source() -> Path:
    for base in (_CHECKOUT, _INSTALLED):
        if (base / NAME).is_file():
            return base / NAME
    raise MrcError(f"the unit {NAME} is not installed with this package (looked in {_CHECKOUT} "
                   f"and {_INSTALLED}): reinstall mrc-ebpf")


def running_mrcctl() -> Path:
    """The mrcctl that runs this process: its script, or, under `python -m
    mrc_ebpf.cli.mrcctl`, the one beside the interpreter (a venv's)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    candidates = []
    if argv0 is not None and argv0.name == "mrcctl":
        candidates.append(Path(os.path.abspath(argv0)))
    candidates.append(Path(os.path.abspath(sys.executable)).parent / "mrcctl")
    found = shutil.which("mrcctl")
    if found:
        candidates.append(Path(os.path.abspath(found)))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise MrcError("cannot find the mrcctl executable this runs as: name it with --mrcctl PATH")


def _systemd_word(path: Path) -> str:
    text = str(path)
    if not path.is_absolute():
        raise MrcError(f"--mrcctl {text}: must be an absolute path (systemd does not search a venv)")
    if any(c in text for c in "\"'\\\n\t") or not text.isprintable():
        raise MrcError(f"--mrcctl {text!r}: a path with quotes, backslashes or control characters "
                       f"cannot be written into a unit")
    text = text.replace("%", "%%")                 # a specifier otherwise
    return f'"{text}"' if " " in text else text


def text(mrcctl: Path) -> str:
    """The shipped unit with every Exec line's command MRCCTL."""
    word = _systemd_word(mrcctl)
    out = []
    for line in source().read_text().splitlines():
        m = _EXEC.match(line)
        if m and os.path.basename(m.group(3)) == "mrcctl":
            line = f"{m.group(1)}{m.group(2)}{word}{m.group(4)}"
        out.append(line)
    return "\n".join(out) + "\n"


def install(directory: Path | None = None, mrcctl: Path | None = None) -> dict:
    """Write the unit into DIRECTORY (default /etc/systemd/system), with
    MRCCTL (default: the running one) in its Exec lines; reload systemd
    when it runs and the directory is its own."""
    exe = Path(mrcctl) if mrcctl is not None else running_mrcctl()
    if mrcctl is not None and not (exe.is_file() and os.access(exe, os.X_OK)):
        raise MrcError(f"--mrcctl {exe}: not an executable file")
    body = text(exe)
    where = Path(directory) if directory is not None else DEFAULT_DIR
    target = where / NAME
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{NAME}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(body)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise MrcError(f"cannot write {target}: {e.strerror or e}")
    reloaded = False
    if where.resolve() == DEFAULT_DIR.resolve() and Path("/run/systemd/system").is_dir() \
            and shutil.which("systemctl"):
        reloaded = subprocess.run(["systemctl", "daemon-reload"], capture_output=True).returncode == 0
    return {"unit": str(target), "mrcctl": str(exe), "daemon_reload": reloaded}

