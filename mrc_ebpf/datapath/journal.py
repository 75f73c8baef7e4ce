"""All or nothing, also when mrcctl is killed: the undo log of a change.

While a change holds the writer lock (lock.py), every write it makes to an
attachment (a map element or batch, routes, a device setting) first puts
on a log how to put back what it overwrites; the log is fsync'd, and only
then is the write made.  A change that fails in the process replays its
undo steps newest first.  One that is killed (kill -9, an OOM kill) leaves
the log behind: whoever takes the lock next replays it before doing
anything else (recover()), so the namespace is exactly as before the cut
short change.  Each step is absolute (a key's old value or its absence, a
prefix's old routes), so a replay that is itself killed is replayed again
with the same result.

The log is JOURNALS/ns<cookie>.log, beside the pins (a bpffs holds no
regular files), one JSON line per step; a line cut short by the kill is a
step whose write was never made, and is ignored.  Its first line names
the boot: a log from before a reboot covers state the reboot removed.

MRC_FAIL_WRITE=N makes the Nth write of a command fail before it is made
(a fail point for tests: they run a command with N = 1, 2, ... and check
that each failure leaves everything as it was).
"""
from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import sys
import time
from pathlib import Path

from mrc_ebpf.datapath import bpfsys, offload, pins, routes, swap
from mrc_ebpf.errors import MrcError

JOURNALS = Path(os.environ.get("MRC_JOURNAL_DIR") or f"{pins.BASE}.journal")
PERCPU_TYPES = {5, 6, 10}       # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
# step kinds that need more than this module (loader registers "detach")
HANDLERS: dict = {}


class InjectedFailure(MrcError):
    pass


def log_path(cookie: int | None = None) -> Path:
    return JOURNALS / f"ns{pins.netns_cookie() if cookie is None else cookie}.log"


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class Log:
    """The steps of the change in progress: in memory, and (path given)
    on disk, each durable before the write it covers."""

    def __init__(self, path: Path | None):
        self.path, self.fd, self.steps = path, -1, []
        if path is None:
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._write({"op": "begin", "boot": boot_id(), "pid": os.getpid(),
                     "command": " ".join(os.path.basename(a) if i == 0 else a
                                         for i, a in enumerate(sys.argv)),
                     "time": round(time.time(), 3)})

    def _write(self, entry: dict) -> None:
        os.write(self.fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        os.fsync(self.fd)

    def append(self, step: dict) -> None:
        if self.fd >= 0:
            self._write(step)
        self.steps.append(step)

    def close(self, remove: bool) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            if remove:
                self.path.unlink(missing_ok=True)


_active: Log | None = None


@contextlib.contextmanager
def logged(durable: bool = True):
    """The log of this process's change: opened by the outermost caller
    (the lock holder), shared by changes nested in it.  On success it is
    removed; on a failure the outermost replays what is left of it, and
    removes it if that worked (else the next command tries again)."""
    global _active
    if _active is not None:
        yield _active
        return
    log = _active = Log(log_path() if durable else None)
    ok = False
    try:
        yield log
        ok = True
    except BaseException as e:
        problems = replay(log.steps)
        ok = not problems
        if problems and "rolling back failed" not in str(e):
            raise MrcError(f"{_reason(e)}; rolling back failed too, state may be half-changed "
                           f"(the next mrcctl command that changes it tries again; `mrcctl detach` "
                           f"clears it): {'; '.join(problems)}") from e
        raise
    finally:
        _active = None
        log.close(remove=ok)


class Journal:
    """One transaction's writes (loader.Attachment.transaction): counts
    them for MRC_FAIL_WRITE, logs their undo steps, rolls them back."""

    def __init__(self, log: Log | None = None):
        self.log = log if log is not None else Log(None)
        self._start = len(self.log.steps)
        self.writes = 0
        text = os.environ.get("MRC_FAIL_WRITE", "")
        self._fail_at = int(text) if text.isdigit() else 0

    def before_write(self, what: str) -> None:
        """Called before each change: counts it, and fails it on request."""
        self.writes += 1
        if self.writes == self._fail_at:
            raise InjectedFailure(f"failure injected at write {self.writes} ({what}) by MRC_FAIL_WRITE")

    @staticmethod
    def injected(message: str) -> InjectedFailure:
        """The failure MRC_FAIL_WRITE asked for, for a writer below the
        journal (bpfsys's batch writes) to raise."""
        return InjectedFailure(message)

    def reserve(self, count: int, what: str) -> int | None:
        """COUNT writes made in one batch: counts them, and returns the
        index among them of the one to fail on request (the caller writes
        those before it, then raises), else None."""
        start = self.writes
        self.writes += count
        if start < self._fail_at <= self.writes:
            self.writes = self._fail_at
            return self._fail_at - start - 1
        return None

    # ---- undo steps: each is logged before the write it undoes is made

    def record_map(self, pin: str, delete: bytes = b"", keys: bytes = b"", values: bytes = b"") -> None:
        """Undo of writes to the map pinned at PIN: delete the packed keys
        DELETE (they were new), write back KEYS' old VALUES."""
        self.log.append({"op": "map", "pin": pin, "delete": _b64(delete), "keys": _b64(keys),
                         "values": _b64(values)})

    def record_routes(self, saved: list[tuple[str, list]]) -> None:
        """Undo of route changes: each prefix's routes of ours as they were
        (routes.snapshot)."""
        self.log.append({"op": "routes", "saved": saved})

    def record_gso(self, device: str, segs: int) -> None:
        self.log.append({"op": "gso", "device": device, "segs": segs})

    def rollback(self) -> list[str]:
        """Undo this transaction's writes, newest first; returns what could
        not be undone."""
        problems = replay(self.log.steps[self._start:])
        if not problems:        # else left for the log's owner to try once more
            del self.log.steps[self._start:]
        return problems


def replay(steps: list[dict]) -> list[str]:
    """Carry out undo STEPS newest first; returns what failed (the rest is
    still done)."""
    problems, maps = [], {}
    try:
        for step in reversed(steps):
            try:
                _undo(step, maps)
            except Exception as e:  # keep undoing the rest; report what stuck
                problems.append(f"{step['op']}: {_reason(e)}")
    finally:
        for m in maps.values():
            if m is not None:
                m.close()
    return problems


def _open(pin: str) -> bpfsys.PinnedMap | None:
    """The map pinned at PIN with raw byte keys and values; None when the
    attachment it belonged to is gone (nothing left to undo)."""
    try:
        fd = bpfsys.obj_get(pin)
    except bpfsys.BpfError:
        if not os.path.isdir(os.path.dirname(pin)):
            return None
        raise
    try:
        info = bpfsys.map_info(fd)
        return bpfsys.PinnedMap(pin, ctypes.c_char * info.key_size, ctypes.c_char * info.value_size,
                                info.type in PERCPU_TYPES, fd=os.dup(fd))
    finally:
        os.close(fd)


def _undo(step: dict, maps: dict) -> None:
    op = step["op"]
    if op == "map":
        if step["pin"] not in maps:
            maps[step["pin"]] = _open(step["pin"])
        m = maps[step["pin"]]
        if m is None:
            return
        ks = ctypes.sizeof(m.key_type)
        delete, keys = base64.b64decode(step["delete"]), base64.b64decode(step["keys"])
        m.delete_batch(delete, len(delete) // ks)
        m.update_batch(keys, base64.b64decode(step["values"]), len(keys) // ks)
    elif op == "routes":
        routes.restore_many([(prefix, [tuple(e) for e in saved]) for prefix, saved in step["saved"]])
    elif op == "gso":
        if os.path.isdir(f"/sys/class/net/{step['device']}"):
            offload.set_gso_max_segs(step["device"], step["segs"])
    elif op == "replace":           # attach --replace cut short (swap.py)
        swap.undo(step)
    elif op == "replace_phase":     # a mark of its progress, nothing to undo
        pass
    elif op in HANDLERS:
        HANDLERS[op](step)
    else:
        raise MrcError(f"unknown undo step {op!r} (from another version?)")


def read(path: Path) -> tuple[dict | None, list[dict]]:
    """(header, steps) of the log at PATH; (None, []) when there is none.
    A last line without its newline was cut short: its write never began."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, []
    lines = raw.split(b"\n")[:-1]       # the part after the last newline is torn
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            raise MrcError(f"{path}: unreadable change log; remove it after checking the state")
    if not entries or entries[0].get("op") != "begin":
        return None, []
    return entries[0], entries[1:]


def describe(header: dict, steps: list[dict]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(header.get("time", 0)))
    return (f"`{header.get('command', '?')}` (pid {header.get('pid')}, {when}) was cut short "
            f"with {len(steps)} undo steps logged")


def pending() -> dict | None:
    """The log a killed change left in this namespace, if any, without
    taking the lock (for `status`): None when there is none, or when its
    writer is still at work (holds the lock)."""
    import fcntl
    path = log_path()
    header, steps = read(path)
    if header is None or header.get("boot") != boot_id():
        return None
    try:
        fd = os.open(pins.netns_dir(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return None         # its writer is still at work
        finally:
            os.close(fd)
    return {"log": str(path), "command": header.get("command"), "pid": header.get("pid"),
            "time": header.get("time"), "steps": len(steps), "what": describe(header, steps)}


def recover(strict: bool = True) -> dict | None:
    """Roll back the change a killed mrcctl left half-done in this
    namespace (call with the writer lock held).  Returns what was rolled
    back, or None.  STRICT: a rollback that fails raises (and the log
    stays for the next try); otherwise the log is dropped anyway (detach,
    which clears everything)."""
    path = log_path()
    header, steps = read(path)
    if header is None:
        path.unlink(missing_ok=True)
        return None
    if header.get("boot") != boot_id():      # the reboot took the state it covers
        path.unlink(missing_ok=True)
        return None
    problems = replay(steps)
    what = describe(header, steps)
    if problems and strict:
        raise MrcError(f"{what}; rolling it back failed: {'; '.join(problems)} "
                       f"(`mrcctl detach` clears the attachment)")
    path.unlink(missing_ok=True)
    print(f"mrcctl: {what}: rolled back", file=sys.stderr)
    return {"what": what, "steps": len(steps), "problems": problems}


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
