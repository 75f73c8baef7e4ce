"""Reading a pinned BPF ring buffer (BPF_MAP_TYPE_RINGBUF) with libbpf.

bcc reads ring buffers only of the module it loaded; `mrcctl monitor` runs
long after `attach` compiled the datapath, so it opens the pin and hands
the fd to libbpf's ring_buffer__new/poll (Debian's libbpf1) via ctypes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

from mrc_ebpf.datapath import bpfsys
from mrc_ebpf.errors import MrcError

_SAMPLE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _libbpf():
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise MrcError("libbpf is not installed: apt-get install libbpf1")
    lib.ring_buffer__new.restype = ctypes.c_void_p
    lib.ring_buffer__new.argtypes = [ctypes.c_int, _SAMPLE, ctypes.c_void_p, ctypes.c_void_p]
    lib.ring_buffer__poll.restype = ctypes.c_int
    lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ring_buffer__free.restype = None
    lib.ring_buffer__free.argtypes = [ctypes.c_void_p]
    return lib


class RingReader:
    """Calls on_sample(bytes) for each record of the pinned ring at PATH."""

    def __init__(self, path: str, on_sample):
        self._lib = _libbpf()
        try:
            self._fd = bpfsys.obj_get(path)
        except bpfsys.BpfError as e:
            raise MrcError(f"no event ring at {path} ({e}): the datapath was attached by an older "
                           f"mrc-ebpf; detach and attach again")

        def sample(_ctx, data, size):
            on_sample(ctypes.string_at(data, size))
            return 0
        self._cb = _SAMPLE(sample)      # kept: libbpf calls it until freed
        self._rb = self._lib.ring_buffer__new(self._fd, self._cb, None, None)
        if not self._rb:
            os.close(self._fd)
            raise MrcError(f"cannot open the event ring {path}: "
                           f"{os.strerror(ctypes.get_errno() or 22)}")

    def poll(self, timeout_ms: int) -> int:
        n = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        if n < 0 and -n != 4:      # EINTR: a signal, not an error
            raise MrcError(f"reading the event ring: {os.strerror(-n)}")
        return max(n, 0)

    def close(self) -> None:
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None
            os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
