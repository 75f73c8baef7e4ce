"""Entering a network namespace for a while: `inside` moves just the
calling thread into it (setns(2) on /run/netns/NAME; `ip netns exec`
starts a new process) and brings it back, so a socket or netlink handle
made inside stays bound to it.  A module of its own so that faults (which
netns.delete calls) can use it without importing netns.
"""
from __future__ import annotations

import contextlib
import ctypes
import os

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsGone(OSError):
    """No network namespace of that name (any more)."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def inside(name: str):
    """Run the block in namespace NAME (this thread only), then come back."""
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    except FileNotFoundError:
        raise NetnsGone(f"network namespace {name!r} does not exist")
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            _setns(target)
        except OSError:   # a leftover file that is no namespace any more
            raise NetnsGone(f"network namespace {name!r} does not exist")
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)
