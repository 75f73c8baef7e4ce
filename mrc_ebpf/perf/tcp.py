"""TCP streams: a sender writing one preallocated buffer until the
deadline (optionally paced), a receiver reading into one until EOF."""
from __future__ import annotations

import socket
import struct
import time

_now = time.monotonic_ns
DATA_MAGIC = b"MRCPERF1"
DATA_HELLO = struct.Struct("!8s16sI")       # magic, test cookie, stream id
# struct tcp_info (uapi/linux/tcp.h): snd_mss @16, pmtu @60, rtt @68,
# rttvar @72, snd_cwnd @80, total_retrans @100, snd_wnd @228 (Linux 5.19+)
_TCP_INFO_LEN = 232
_EMPTY_INFO = {"retransmits": 0, "rtt_us": 0, "rttvar_us": 0, "snd_cwnd": 0, "snd_wnd": 0, "pmtu": 0}


def tcp_info(sock: socket.socket) -> dict:
    """The figures iperf3 reads from TCP_INFO for its interval reports."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return dict(_EMPTY_INFO)
    if len(raw) < 104:
        return dict(_EMPTY_INFO)
    mss, = struct.unpack_from("<I", raw, 16)
    pmtu, = struct.unpack_from("<I", raw, 60)
    rtt, rttvar = struct.unpack_from("<II", raw, 68)
    cwnd, = struct.unpack_from("<I", raw, 80)
    retrans, = struct.unpack_from("<I", raw, 100)
    snd_wnd = struct.unpack_from("<I", raw, 228)[0] if len(raw) >= 232 else 0
    return {"retransmits": retrans, "rtt_us": rtt, "rttvar_us": rttvar, "snd_cwnd": cwnd * mss,
            "snd_wnd": snd_wnd, "pmtu": pmtu}


def _bps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds if seconds > 0 else 0.0


class TcpSender:
    kind = "tcp"

    def __init__(self, stream_id: int, sock: socket.socket):
        self.id, self.sock = stream_id, sock
        self.bytes = 0
        self.error: str | None = None

    def run(self, deadline_ns: int, stop, rate: int, length: int, start_ns: int | None = None,
            limit: int = 0) -> None:
        """Send until the deadline, `stop`, or `limit` bytes (0: no limit);
        with a rate, paced from start_ns (the test's start)."""
        view = memoryview(bytearray(length))
        # a timeout makes a send blocked on a full buffer come back to
        # check the deadline
        self.sock.settimeout(0.1)
        send, now = self.sock.send, _now
        start, sent = start_ns or now(), 0
        try:
            while not stop.is_set():
                t = now()
                if t >= deadline_ns or (limit and sent >= limit):
                    break
                if rate:
                    ahead = start + sent * 8e9 / rate - t
                    if ahead > 0:
                        time.sleep(min(ahead, deadline_ns - t) / 1e9)
                        continue
                try:
                    sent += send(view if not limit or limit - sent >= length else view[:limit - sent])
                except socket.timeout:
                    continue
                self.bytes = sent
        except OSError as e:
            self.error = f"stream {self.id}: send failed: {e.strerror or e}"
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def snapshot(self) -> dict:
        return {"bytes": self.bytes, **tcp_info(self.sock)}

    def report(self, a, b, seconds, final=False) -> dict:
        n = b["bytes"] - a["bytes"]
        return {"id": self.id, "bytes": n, "bits_per_second": _bps(n, seconds),
                "retransmits": b["retransmits"] - a["retransmits"], "rtt_us": b["rtt_us"],
                "rttvar_us": b["rttvar_us"], "snd_cwnd": b["snd_cwnd"], "snd_wnd": b["snd_wnd"],
                "pmtu": b["pmtu"]}

    @staticmethod
    def sum(streams, a, b, seconds, reports, final=False) -> dict:
        n = sum(r["bytes"] for r in reports)
        return {"bytes": n, "bits_per_second": _bps(n, seconds),
                "retransmits": sum(r["retransmits"] for r in reports)}


class TcpReceiver:
    kind = "tcp"

    def __init__(self, stream_id: int, sock: socket.socket):
        self.id, self.sock = stream_id, sock
        self.bytes = 0
        self.last_ns = 0
        self.end_ns = 0             # set by freeze()
        self.eof = False
        self.frozen: int | None = None
        self.error: str | None = None

    def run(self, stop, length: int) -> None:
        buf = bytearray(max(length, 1 << 17))
        self.sock.settimeout(0.1)
        recv, now = self.sock.recv_into, _now
        try:
            while not stop.is_set():
                try:
                    n = recv(buf)
                except socket.timeout:
                    continue
                if not n:
                    self.eof = True
                    break
                self.bytes += n
                self.last_ns = now()
        except OSError as e:
            self.error = f"stream {self.id}: receive failed: {e.strerror or e}"

    def freeze(self) -> None:
        """The sender has stopped: what arrives from now on is drained but
        not counted, as iperf3 does; counting a tail delayed by a
        retransmission timeout would stretch the test and lower the rate."""
        self.frozen = self.bytes
        self.end_ns = _now()

    def snapshot(self) -> dict:
        return {"bytes": self.bytes if self.frozen is None else self.frozen}

    def report(self, a, b, seconds, final=False) -> dict:
        n = b["bytes"] - a["bytes"]
        return {"id": self.id, "bytes": n, "bits_per_second": _bps(n, seconds)}

    @staticmethod
    def sum(streams, a, b, seconds, reports, final=False) -> dict:
        n = sum(r["bytes"] for r in reports)
        return {"bytes": n, "bits_per_second": _bps(n, seconds)}
