"""The fabric's state file under STATE_DIR and the lock that serialises commands on one fabric."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab import netns

from .plan import NAME_RE, STATE_DIR


def state_path(name: str) -> Path:
    return STATE_DIR / f"{name}.json"


def check_name(name: str) -> None:
    if not NAME_RE.match(name or ""):
        raise MrcError(f"bad fabric name {name!r}: a lowercase letter, then up to 15 of a-z, 0-9, _")


def list_names() -> list[str]:
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json"))


@contextlib.contextmanager
def locked(name: str, create: dict | None = None):
    """The fabric's state, locked; changes to the yielded dict are saved.
    With create, make the file (it must not exist) from that dict."""
    check_name(name)
    path = state_path(name)
    if create is not None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise MrcError(f"fabric {name} already exists (mrcctl fabric down {name} first)")
    else:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            have = list_names()
            raise MrcError(f"no fabric {name}" + (f" (have: {', '.join(have)})" if have else
                                                  " (mrcctl fabric up first)"))
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if create is not None:
            state = create
        else:
            text = f.read()
            try:
                state = json.loads(text)
            except ValueError:
                raise MrcError(f"state of fabric {name} ({path}) is damaged")
        saved = json.dumps(state, indent=1, sort_keys=True)
        if create is not None:
            f.write(saved)
            f.flush()
            saved = None
        try:
            yield state
        finally:
            if path.exists() and not state.get("_removed"):
                new = json.dumps(state, indent=1, sort_keys=True)
                if new != saved:
                    f.seek(0)
                    f.truncate()
                    f.write(new)
                    f.flush()


def load(name: str) -> dict:
    with locked(name) as state:
        return json.loads(json.dumps(state))


def existing_namespaces() -> set[str]:
    return netns.existing()
