"""One writer at a time: the lock that commands changing an attachment hold.

The lock is an exclusive flock(2) on the network namespace's pin
directory (pins.netns_dir(), on the bpffs).  flock belongs to the inode,
and the bpffs at pins.BASE is one mount seen from every mount namespace
(`ip netns exec` included), so every process that changes this
namespace's attachments, however it got here, contends on the same lock;
the kernel drops it when the holder exits, even by SIGKILL.

A holder may remove the directory (the last detach, gc) while others
wait on it: whoever then wins the lock on the removed inode sees that the
path now names another one (or none) and starts over.

Whoever takes the lock first rolls back what a killed holder left
half-done (journal.recover): every command that changes an attachment
starts from a state some command left whole.

Waiting is bounded: after `timeout()` seconds (--lock-timeout,
MRC_LOCK_TIMEOUT) the command gives up with a one-line error.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from mrc_ebpf.datapath import journal, pins
from mrc_ebpf.errors import MrcError

DEFAULT_TIMEOUT_S = 10.0
_timeout_s: float | None = None
_held: dict[str, int] = {}      # directory -> depth: the lock is re-entrant within a process


def set_timeout(seconds: float) -> None:
    global _timeout_s
    _timeout_s = seconds


def timeout() -> float:
    if _timeout_s is not None:
        return _timeout_s
    text = os.environ.get("MRC_LOCK_TIMEOUT")
    if text:
        try:
            return parse_timeout(text)
        except ValueError as e:
            raise MrcError(f"MRC_LOCK_TIMEOUT: {e}")
    return DEFAULT_TIMEOUT_S


def parse_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"bad timeout {text!r}: seconds, e.g. 10 or 0.5")
    if not 0 <= value <= 3600:      # also refuses nan and inf
        raise ValueError(f"bad timeout {text!r}: 0..3600 seconds")
    return value


def _acquire(fd: int, deadline: float) -> bool:
    pause = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 0.05)


def _same_inode(fd: int, directory: Path) -> bool:
    try:
        return os.stat(directory).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def writer(directory: Path | None = None, create: bool = True, wait: float | None = None,
           recover: str = "strict"):
    """Hold the writer lock of DIRECTORY (default: this namespace's pin
    directory).  With create=False a missing directory means there is
    nothing to change: yields False without locking.  An empty directory
    is removed on the way out (nothing attached here any more).  RECOVER:
    how a killed change's log is rolled back first ("strict": a failed
    rollback is an error; "lenient": the log is dropped anyway, for
    detach, which clears everything; "no")."""
    pins.ensure_bpffs()
    here = directory is None or directory == pins.netns_dir()
    directory = directory or pins.netns_dir()
    key = str(directory)
    if _held.get(key):
        _held[key] += 1
        try:
            yield True
        finally:
            _held[key] -= 1
        return
    wait = timeout() if wait is None else wait
    deadline = time.monotonic() + wait
    while True:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                yield False
                return
            continue        # removed between mkdir and open: again
        if not _acquire(fd, deadline):
            os.close(fd)
            raise MrcError(f"another mrcctl is changing this network namespace's attachments: "
                           f"gave up waiting for its lock after {wait:g} s "
                           f"(--lock-timeout SECONDS to wait longer)")
        if _same_inode(fd, directory):
            break
        os.close(fd)         # won the lock of a directory that was removed: again
    _held[key] = 1
    try:
        if here and recover != "no":
            journal.recover(strict=recover == "strict")
        yield True
    finally:
        del _held[key]
        try:
            directory.rmdir()       # only if empty: nothing attached here any more
        except OSError:
            pass
        os.close(fd)
