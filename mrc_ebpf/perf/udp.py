"""UDP streams: paced sending, and loss / reordering / jitter / one-way
latency at the receiver.

Every datagram starts with HEADER: magic, kind, stream id, sequence
number and the send time in CLOCK_MONOTONIC nanoseconds.  All network
namespaces of one host share that clock, so one-way latency is exact
between namespaces; across hosts it is only meaningful when the hosts'
monotonic clocks are synchronised (e.g. PTP with phc2sys steering
CLOCK_MONOTONIC), otherwise it carries the clocks' offset.

The receiver takes arrival times from the kernel (SO_TIMESTAMPNS), so a
receiver that falls behind does not inflate latency; what remains is the
path plus the sender's own delay between stamping and sendto.
"""
from __future__ import annotations

import errno
import math
import socket
import struct
import time
from array import array

HEADER = struct.Struct("!HHIQQ")
# iperf3's UDP datagram: sent at (sec, usec of CLOCK_MONOTONIC), packet count
# from 1; 32-bit count unless the client asks for 64-bit counters
IPERF3_HEADER, IPERF3_HEADER64 = struct.Struct("!III"), struct.Struct("!IIQ")
MAGIC = 0x4D50
KIND_DATA, KIND_HELLO = 1, 2
MIN_LENGTH = HEADER.size
MAX_LENGTH = 65507
# Packets sent back to back when the schedule is behind; bounds the burst
# after a late wake-up while keeping the long-run rate exact.
BURST = 64
BUFFER = 8 << 20

_now = time.monotonic_ns


def big_buffers(sock: socket.socket) -> None:
    """Large socket buffers: root may exceed net.core.[rw]mem_max with *FORCE."""
    for force, plain in ((33, socket.SO_RCVBUF), (32, socket.SO_SNDBUF)):   # SO_*BUFFORCE
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, BUFFER)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, BUFFER)


def hello(sock: socket.socket, stream_id: int, addr=None) -> None:
    packet = HEADER.pack(MAGIC, KIND_HELLO, stream_id, 0, _now())
    try:
        sock.send(packet) if addr is None else sock.sendto(packet, addr)
    except OSError:
        pass        # the next hello may get through; setup times out otherwise


def percentiles(samples) -> dict | None:
    """Nearest-rank p50/p99/p99.9 (plus min/max) of nanosecond samples, in µs."""
    if not samples:
        return None
    s = sorted(samples)
    n = len(s)

    def rank(q):
        return round(s[min(n - 1, max(0, math.ceil(q * n - 1e-9) - 1))] / 1000, 1)
    return {"p50": rank(0.5), "p99": rank(0.99), "p99.9": rank(0.999),
            "min": round(s[0] / 1000, 1), "max": round(s[-1] / 1000, 1)}


def _bps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds if seconds > 0 else 0.0


class UdpSender:
    kind = "udp"

    def __init__(self, stream_id: int, sock: socket.socket, addr=None, fmt: str = "mrc",
                 counters64: bool = False):
        self.id, self.sock, self.addr = stream_id, sock, addr
        self.fmt, self.counters64 = fmt, counters64     # fmt "iperf3": iperf3's datagrams
        self.packets = self.bytes = 0
        self.error: str | None = None

    def run(self, deadline_ns: int, stop, rate: int, length: int, start_ns: int | None = None,
            limit: int = 0) -> None:
        """Send until the deadline, `stop` or `limit` bytes (0: none).  The
        schedule starts at start_ns, the test's start, not when this thread
        got to run: a late start is caught up at once (BURST at a time), so
        the first interval already carries the asked rate."""
        buf = bytearray(length)
        now, sid = _now, self.id
        if self.fmt == "iperf3":        # iperf3: sec, usec (CLOCK_MONOTONIC), count from 1
            head = IPERF3_HEADER64 if self.counters64 else IPERF3_HEADER

            def stamp(seq, _pack=head.pack_into, _buf=buf):
                t = now()
                _pack(_buf, 0, t // 1_000_000_000, t % 1_000_000_000 // 1000, seq + 1)
        else:
            def stamp(seq, _pack=HEADER.pack_into, _buf=buf):
                _pack(_buf, 0, MAGIC, KIND_DATA, sid, seq, now())
        send = self.sock.send if self.addr is None else \
            (lambda b, _s=self.sock.sendto, _a=self.addr: _s(b, _a))
        gap_ns = length * 8 * 1e9 / rate if rate else 0.0
        max_packets = -(-limit // length) if limit else 0
        start, seq = start_ns or now(), 0
        try:
            while not stop.is_set():
                t = now()
                if t >= deadline_ns or (max_packets and seq >= max_packets):
                    break
                if gap_ns:
                    due = int((t - start) / gap_ns) + 1 - seq
                    if due <= 0:
                        time.sleep((start + seq * gap_ns - t) / 1e9)
                        continue
                    due = min(due, BURST)
                else:
                    due = BURST
                if max_packets:
                    due = min(due, max_packets - seq)
                for _ in range(due):
                    stamp(seq)
                    try:
                        send(buf)
                    except OSError as e:
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED):
                            raise
                        # a full qdisc or a transient ICMP error: the
                        # datagram is not sent and keeps its number
                        continue
                    seq += 1
                self.packets, self.bytes = seq, seq * length
        except OSError as e:
            self.error = f"stream {self.id}: send failed: {e.strerror or e}"

    def snapshot(self) -> dict:
        return {"packets": self.packets, "bytes": self.bytes}

    def report(self, a, b, seconds, final=False) -> dict:
        n = b["bytes"] - a["bytes"]
        return {"id": self.id, "bytes": n, "bits_per_second": _bps(n, seconds),
                "packets": b["packets"] - a["packets"]}

    @staticmethod
    def sum(streams, a, b, seconds, reports, final=False) -> dict:
        n = sum(r["bytes"] for r in reports)
        return {"bytes": n, "bits_per_second": _bps(n, seconds),
                "packets": sum(r["packets"] for r in reports)}


class UdpReceiver:
    """Counts one stream's datagrams; fed by a recv loop (`receive`)."""
    kind = "udp"

    def __init__(self, stream_id: int):
        self.id = stream_id
        self.packets = self.bytes = 0
        self.next_seq = 0                   # highest sequence number seen + 1
        self.out_of_order = 0
        self.jitter_ns = 0.0
        self.prev_transit: int | None = None
        self.latency = array("q")           # one-way ns per datagram, for percentiles
        self.last_ns = 0                    # when read (drain), and when it arrived:
        self.end_ns = 0
        self.sent: int | None = None        # the sender's final count, for the summary
        self.error: str | None = None

    def add(self, seq: int, sent_ns: int, arrival_ns: int, nbytes: int, now: int) -> None:
        self.packets += 1
        self.bytes += nbytes
        self.last_ns, self.end_ns = now, arrival_ns
        transit = arrival_ns - sent_ns
        self.latency.append(transit)
        if seq >= self.next_seq:
            self.next_seq = seq + 1
        else:
            self.out_of_order += 1
        prev = self.prev_transit
        if prev is not None:                # RFC 3550 interarrival jitter
            self.jitter_ns += (abs(transit - prev) - self.jitter_ns) / 16
        self.prev_transit = transit

    def snapshot(self) -> dict:
        return {"packets": self.packets, "bytes": self.bytes, "expected": self.next_seq,
                "out_of_order": self.out_of_order, "jitter_ns": self.jitter_ns,
                "samples": len(self.latency)}

    def _lost(self, a, b, final):
        if final and self.sent is not None:
            # the sender's count also covers a lost tail, which the
            # highest sequence number seen cannot (sent: what the sender
            # counted in the same window, after any omitted seconds)
            return max(0, self.sent - (b["packets"] - a["packets"])), self.sent
        lost = (b["expected"] - b["packets"]) - (a["expected"] - a["packets"])
        return lost, (b["packets"] - a["packets"]) + lost

    def report(self, a, b, seconds, final=False) -> dict:
        n = b["bytes"] - a["bytes"]
        lost, total = self._lost(a, b, final)
        return {"id": self.id, "bytes": n, "bits_per_second": _bps(n, seconds),
                "packets": b["packets"] - a["packets"], "lost": lost,
                "lost_percent": 100.0 * lost / total if total > 0 else 0.0,
                "out_of_order": b["out_of_order"] - a["out_of_order"],
                "jitter_ms": b["jitter_ns"] / 1e6,
                "latency_us": percentiles(self.latency[a["samples"]:b["samples"]])}

    @staticmethod
    def sum(streams, a, b, seconds, reports, final=False) -> dict:
        n = sum(r["bytes"] for r in reports)
        lost = sum(r["lost"] for r in reports)
        packets = sum(r["packets"] for r in reports)
        total = packets + lost
        samples = array("q")
        for s, sa, sb in zip(streams, a, b):
            samples.extend(s.latency[sa["samples"]:sb["samples"]])
        return {"bytes": n, "bits_per_second": _bps(n, seconds), "packets": packets, "lost": lost,
                "lost_percent": 100.0 * lost / total if total > 0 else 0.0,
                "out_of_order": sum(r["out_of_order"] for r in reports),
                "jitter_ms": sum(r["jitter_ms"] for r in reports) / len(reports),
                "latency_us": percentiles(samples)}


SO_TIMESTAMPNS = 35            # = SCM_TIMESTAMPNS; the socket module lacks it
_TIMESPEC = struct.Struct("@qq")


def _realtime_minus_monotonic() -> int:
    return time.clock_gettime_ns(time.CLOCK_REALTIME) - _now()


def receive(sock: socket.socket, streams: dict[int, UdpReceiver], stop) -> None:
    """Feed datagrams from `sock` to their streams until `stop` is set.

    Arrival times are the kernel's (SO_TIMESTAMPNS), so latency does not
    count this loop's own delays; the kernel stamps CLOCK_REALTIME, turned
    into CLOCK_MONOTONIC by an offset refreshed every second."""
    buf = bytearray(65536)
    bufs = [buf]
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        anc = socket.CMSG_SPACE(_TIMESPEC.size)
    except OSError:
        anc = 0
    unpack, ts_unpack, now = HEADER.unpack_from, _TIMESPEC.unpack_from, _now
    recv = sock.recvmsg_into
    offset, refreshed = _realtime_minus_monotonic(), now()
    sock.settimeout(0.05)
    while not stop.is_set():
        try:
            n, ancdata, _, _ = recv(bufs, anc)
        except socket.timeout:
            continue
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.EINTR):
                continue
            for stream in streams.values():
                stream.error = f"stream {stream.id}: receive failed: {e.strerror or e}"
            return
        t = now()
        arrival = t
        if ancdata:
            _, kind, data = ancdata[0]
            if kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, nsec = ts_unpack(data)
                arrival = sec * 1_000_000_000 + nsec - offset
                if t - refreshed > 1_000_000_000:
                    offset, refreshed = _realtime_minus_monotonic(), t
        if n < HEADER.size:
            continue
        magic, kind, sid, seq, sent = unpack(buf)
        if magic != MAGIC or kind != KIND_DATA:
            continue
        stream = streams.get(sid)
        if stream is not None:
            stream.add(seq, sent, arrival, n, t)


def receive_iperf3(sock: socket.socket, stream: UdpReceiver, stop, counters64: bool = False) -> None:
    """As `receive`, for one stream of iperf3's datagrams on a connected
    socket (iperf3 gives each UDP stream a socket of its own)."""
    head = IPERF3_HEADER64 if counters64 else IPERF3_HEADER
    buf = bytearray(65536)
    unpack, now = head.unpack_from, _now
    sock.settimeout(0.05)
    while not stop.is_set():
        try:
            n = sock.recv_into(buf)
        except socket.timeout:
            continue
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.EINTR):
                continue
            stream.error = f"stream {stream.id}: receive failed: {e.strerror or e}"
            return
        if n < head.size:
            continue
        sec, usec, count = unpack(buf)
        if count < 1:
            continue
        t = now()
        # iperf3 stamps CLOCK_MONOTONIC (iperf_time_now), as mrc-perf does
        stream.add(count - 1, sec * 1_000_000_000 + usec * 1000, t, n, t)
