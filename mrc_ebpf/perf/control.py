"""The control connection: test parameters out, results back, as one JSON
object per line.

The client opens with a 37-byte cookie, as iperf3's clients do (36
characters and a NUL; mrc-perf's start with "mrcperf"); an mrc-perf server
answers one byte "M" and the JSON lines follow, an iperf3 server answers
PARAM_EXCHANGE and the client speaks iperf3's protocol (perf/iperf3_proto.py);
a server seeing another cookie does the same for an iperf3 client.
Client -> server: params.  Server -> client: accept (or error), then
start once every data stream has arrived.  After the test the sending
side sends `end` with its results; the receiving side drains, then sends
`results` with its own.  Either side may send `error` instead.
"""
from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import asdict, dataclass

from mrc_ebpf.errors import MrcError
from mrc_ebpf.perf.udp import MAX_LENGTH, MIN_LENGTH

VERSION = 2         # 2: the client opens with a 37-byte cookie, as iperf3 does
DEFAULT_PORT = 5201
TCP_LENGTH = 128 * 1024         # iperf3's TCP default
UDP_RATE = 1_000_000            # iperf3's UDP default: 1 Mbit/s per stream
MAX_STREAMS = 128


@dataclass
class Params:
    protocol: str = "tcp"
    streams: int = 1
    duration: float = 10.0
    bitrate: int = 0            # bit/s per stream; 0: as fast as possible
    length: int = 0             # 0: the default for the protocol
    interval: float = 1.0       # 0: one report for the whole test
    reverse: bool = False
    congestion: str | None = None   # TCP congestion control for the data streams; None: each end's own
    mptcp: bool = False         # data streams are MPTCP connections (IPPROTO_MPTCP)
    omit: float = 0.0           # seconds at the start not counted (iperf3 -O)
    bytes: int = 0              # bytes to send in all, instead of a duration (iperf3 -n); 0: -t
    window: int = 0             # SO_SNDBUF / SO_RCVBUF of the data sockets (iperf3 -w); 0: the kernel's
    get_server_output: bool = False     # the server sends its own report (iperf3 --get-server-output)
    bidir: bool = False         # both directions at once (iperf3 --bidir): streams each way

    def check(self) -> "Params":
        if self.protocol not in ("tcp", "udp"):
            raise MrcError(f"bad protocol {self.protocol!r}")
        if not 1 <= self.streams <= MAX_STREAMS:
            raise MrcError(f"bad number of streams {self.streams}: 1..{MAX_STREAMS}")
        if not 0 < self.duration <= 86400:
            raise MrcError(f"bad duration {self.duration}: more than 0 and at most 86400 seconds")
        if self.interval and not 0.1 <= self.interval <= 3600:
            raise MrcError(f"bad interval {self.interval}: 0 (none) or 0.1..3600 seconds")
        if self.bitrate < 0:
            raise MrcError("bad bitrate: must not be negative")
        if self.protocol == "udp" and self.length and not MIN_LENGTH <= self.length <= MAX_LENGTH:
            raise MrcError(f"bad length {self.length}: UDP datagrams are {MIN_LENGTH}..{MAX_LENGTH} bytes")
        if self.protocol == "tcp" and self.length and not 1 <= self.length <= 64 << 20:
            raise MrcError(f"bad length {self.length}: 1 byte .. 64 MBytes")
        if self.congestion is not None:
            if self.protocol != "tcp":
                raise MrcError("a congestion control (-C) applies to TCP only")
            if not re.fullmatch(r"[a-z0-9_]{1,15}", self.congestion):
                raise MrcError(f"bad congestion control name {self.congestion!r}")
        if self.mptcp and self.protocol != "tcp":
            raise MrcError("MPTCP (-m) applies to TCP only")
        if self.bidir and self.reverse:
            raise MrcError("give -R or --bidir, not both")
        if not 0 <= self.omit <= 600:
            raise MrcError(f"bad omit {self.omit}: 0..600 seconds")
        if self.bytes < 0:
            raise MrcError("bad number of bytes: must not be negative")
        if 0 < self.bytes < self.streams:
            raise MrcError(f"bad number of bytes {self.bytes}: at least one per stream (-P {self.streams})")
        if not 0 <= self.window <= 512 << 20:
            raise MrcError(f"bad window {self.window}: 0 .. 512 MBytes")
        return self

    @property
    def total_streams(self) -> int:
        """Data connections: `streams` each way with --bidir."""
        return self.streams * (2 if self.bidir else 1)

    @property
    def run_seconds(self) -> float:
        """How long the senders may run: the omitted seconds, then the
        test (with -n, until the bytes are sent, at most a day)."""
        return self.omit + (86400.0 if self.bytes else self.duration)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data) -> "Params":
        try:
            return cls(protocol=str(data["protocol"]), streams=int(data["streams"]),
                       duration=float(data["duration"]), bitrate=int(data["bitrate"]),
                       length=int(data["length"]), interval=float(data["interval"]),
                       reverse=bool(data["reverse"]),
                       congestion=None if data.get("congestion") is None else str(data["congestion"]),
                       mptcp=bool(data.get("mptcp", False)), omit=float(data.get("omit", 0)),
                       bytes=int(data.get("bytes", 0)), window=int(data.get("window", 0)),
                       get_server_output=bool(data.get("get_server_output", False)),
                       bidir=bool(data.get("bidir", False))).check()
        except (KeyError, TypeError, ValueError):
            raise MrcError("malformed test parameters")


def set_congestion(sock: socket.socket, name: str | None) -> None:
    """Run sock with TCP congestion control `name` (None: leave the default)."""
    if name is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    except OSError as e:
        why = "not available on this host" if e.errno == 2 else (e.strerror or str(e))
        raise MrcError(f"cannot use TCP congestion control {name!r}: {why}")


def set_window(sock: socket.socket, size: int) -> None:
    """iperf3 -w: both socket buffers of a data socket (0: the kernel's)."""
    if not size:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    except OSError as e:
        raise MrcError(f"cannot set the socket buffer size to {size}: {e.strerror or e}")


def buffer_sizes(sock: socket.socket) -> dict:
    """iperf3's start.sndbuf_actual / rcvbuf_actual."""
    return {"sndbuf_actual": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
            "rcvbuf_actual": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)}


IPPROTO_MPTCP = getattr(socket, "IPPROTO_MPTCP", 262)
SOL_MPTCP, MPTCP_INFO = 284, 1          # uapi/linux/mptcp.h; struct mptcp_info starts with u8 subflows


def stream_socket(family: int, mptcp: bool) -> socket.socket:
    """A TCP socket, or an MPTCP one (its subflows are TCP connections the
    kernel's path manager opens: `ip mptcp endpoint`, `ip mptcp limits`)."""
    if not mptcp:
        return socket.socket(family, socket.SOCK_STREAM)
    try:
        return socket.socket(family, socket.SOCK_STREAM, IPPROTO_MPTCP)
    except OSError as e:
        raise MrcError(f"cannot open an MPTCP socket: {e.strerror or e} "
                       f"(kernel without CONFIG_MPTCP, or net.mptcp.enabled=0)")


def is_mptcp(sock: socket.socket) -> bool:
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == IPPROTO_MPTCP
    except OSError:
        return False


def mptcp_subflows(sock: socket.socket) -> int | None:
    """Subflows of an MPTCP connection (the first one included), or None."""
    try:
        raw = sock.getsockopt(SOL_MPTCP, MPTCP_INFO, 64)
    except OSError:
        return None
    return raw[0] + 1 if raw else None


def check_congestion(name: str) -> None:
    """Refuse an algorithm this host does not have, before anything is set up."""
    with socket.socket() as probe:
        set_congestion(probe, name)


def congestion_of(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


class PeerGone(MrcError):
    pass


class Control:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def send(self, msg: dict) -> None:
        try:
            self.sock.settimeout(30)
            self.sock.sendall(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        except OSError as e:
            raise PeerGone(f"lost the control connection: {e.strerror or e}")

    def recv(self, timeout: float) -> dict | None:
        """The next message, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                return None
            except OSError as e:
                raise PeerGone(f"lost the control connection: {e.strerror or e}")
            if not chunk:
                raise PeerGone("the peer closed the control connection")
            self.buf += chunk
            if len(self.buf) > 64 << 20:
                raise MrcError("protocol error: oversized control message")
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            raise MrcError("protocol error: the peer is not mrc-perf (bad control message)")
        if not isinstance(msg, dict) or "op" not in msg:
            raise MrcError("protocol error: the peer is not mrc-perf (bad control message)")
        return msg

    def expect(self, op: str, timeout: float, what: str = "the peer") -> dict:
        msg = self.recv(timeout)
        if msg is None:
            raise MrcError(f"timed out after {timeout:.0f} s waiting for {what} ({op})")
        return self.check(msg, op, what)

    @staticmethod
    def check(msg: dict, op: str, what: str = "the peer") -> dict:
        if msg["op"] == "error":
            raise MrcError(f"{what}: {msg.get('message', 'error')}")
        if msg["op"] != op:
            raise MrcError(f"protocol error: expected {op!r} from {what}, got {msg['op']!r}")
        return msg

    def error(self, message: str) -> None:
        try:
            self.send({"op": "error", "message": message})
        except MrcError:
            pass
