"""The pinned event ring (BPF_MAP_TYPE_RINGBUF) used as a doorbell.

A ring buffer has one consumer position, shared by everyone who maps it:
two readers consuming records take them from each other (issue 31: of
222 events one monitor saw 149, the other 119).  So no reader consumes
records here.  The events themselves are read from the datapath's event
log (`mrc_events`, each with a global sequence number), each reader at its
own position (control/events.py); the ring only wakes the readers:

* the datapath outputs every event with BPF_RB_FORCE_WAKEUP, which wakes
  every waiter on the ring (wake_up_all), whatever the consumer position;
* each reader waits in its own epoll, edge-triggered: it is told of each
  wake-up once, and the ring need not be drained for the next;
* an edge is reported only if the ring then holds unread data
  (ringbuf_map_poll), so readers keep the last record unconsumed: they set
  the consumer position to the producer's less one record, never to it.
  A reader that drained the ring completely would hide the wake-up from a
  reader whose epoll had not yet looked.  Keeping the ring that close to
  empty also keeps the datapath's output from failing on a full ring.

No libbpf: the two positions are one mmap each (the kernel's layout: the
consumer page at offset 0, writable; the producer page next, read-only).
"""
from __future__ import annotations

import mmap
import os
import select
import struct

from mrc_ebpf.datapath import bpfsys
from mrc_ebpf.errors import MrcError

_HDR = 8        # BPF_RINGBUF_HDR_SZ: each record's length and page offset


class Doorbell:
    """Waits for the datapath's next event on the pinned ring at PATH.

    RECORD is the size of one record's payload (struct mrc_event)."""

    def __init__(self, path: str, record: int):
        try:
            self._fd = bpfsys.obj_get(path)
        except bpfsys.BpfError as e:
            raise MrcError(f"no event ring at {path} ({e}): the datapath was attached by an older "
                           f"mrc-ebpf; detach and attach again")
        self._keep = _HDR + (record + 7) // 8 * 8      # one whole record stays unconsumed
        page = mmap.PAGESIZE
        try:
            self._cons = mmap.mmap(self._fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, 0)
            self._prod = mmap.mmap(self._fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except OSError as e:
            os.close(self._fd)
            raise MrcError(f"cannot map the event ring {path}: {e.strerror}")
        self._ep = select.epoll()
        self._ep.register(self._fd, select.EPOLLIN | select.EPOLLET)
        self.release()

    def release(self) -> None:
        """Frees the ring's space but for its last record (see above).
        Racing readers may store positions out of order: the consumer
        position then lags a little, which only costs free space."""
        prod = struct.unpack_from("Q", self._prod, 0)[0]
        cons = struct.unpack_from("Q", self._cons, 0)[0]
        if prod - cons > self._keep:
            struct.pack_into("Q", self._cons, 0, prod - self._keep)

    def wait(self, timeout: float) -> bool:
        """True when woken by an event (or several) within TIMEOUT seconds."""
        try:
            woken = bool(self._ep.poll(timeout))
        except InterruptedError:
            woken = False
        self.release()
        return woken

    def fileno(self) -> int:
        """Readable when woken (for select with other sources; then wait(0))."""
        return self._ep.fileno()

    def close(self) -> None:
        if self._fd >= 0:
            self._ep.close()
            self._cons.close()
            self._prod.close()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
