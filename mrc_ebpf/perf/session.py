"""mrc-perf: an iperf3-like benchmark that also reads the MRC datapath.

A client and a server talk over a control TCP connection (perf_control)
and move data over TCP or UDP streams (perf_tcp, perf_udp).  Each side
records intervals of its own streams and, when a datapath is attached in
its network namespace, per-path deltas of its maps (perf_mrc); at the
end each side sends its results to the other, so the client's report
holds both ends.
"""
from __future__ import annotations

import os
import socket
import threading
import time

from mrc_ebpf.errors import MrcError
from mrc_ebpf.perf.control import (DEFAULT_PORT, TCP_LENGTH, UDP_RATE, VERSION, Control, Params, PeerGone,
                           buffer_sizes, check_congestion, congestion_of, is_mptcp,
                           set_congestion, set_window, stream_socket)
from mrc_ebpf.perf.mrc_view import MrcView
from mrc_ebpf.perf.tcp import DATA_HELLO, DATA_MAGIC, TcpReceiver, TcpSender
from mrc_ebpf.perf.udp import HEADER, KIND_HELLO, MAGIC, UdpReceiver, UdpSender, big_buffers, hello
from mrc_ebpf.perf import testrun
from mrc_ebpf.perf.testrun import Output, Recorder, close_all, print_server_output, start_extra  # noqa: F401

SETUP_TIMEOUT = 10.0
# the server's answer to an mrc-perf client's cookie (iperf3's is PARAM_EXCHANGE)
MRC_HELLO = b"M"
COOKIE_PREFIX = "mrcperf"
_COOKIE_CHARS = "abcdefghijklmnopqrstuvwxyz234567"      # iperf3's


def make_cookie() -> str:
    """A test's cookie, 36 characters as iperf3's; mrc-perf's begin with
    COOKIE_PREFIX, so a server tells an mrc-perf client from iperf3's."""
    raw = os.urandom(36 - len(COOKIE_PREFIX))
    return COOKIE_PREFIX + "".join(_COOKIE_CHARS[b % 32] for b in raw)


def data_cookie(cookie_text: str) -> bytes:
    """The 16 bytes an mrc-perf TCP data stream's hello carries."""
    return cookie_text[-16:].encode()


def is_iperf3_cookie(raw: bytes) -> bool:
    return len(raw) == 37 and raw[36] == 0 and all(chr(c) in _COOKIE_CHARS for c in raw[:36])
# a UDP receiver is done when nothing arrived for this long after the
# sender's `end` (longer than any queue the tests build), or at DRAIN_MAX
UDP_IDLE, DRAIN_MAX = 0.25, 3.0
# TCP data still queued when the sender stops is read (so its close
# completes) but not counted
TCP_DRAIN_MAX = 10.0
_now = time.monotonic_ns

__all__ = ["DEFAULT_PORT", "Params", "Output", "run_client", "serve"]


def _run_test(ctrl: Control, role: str, params: Params, streams, udp_feeds, mrc, out, t0,
              congestion: str | None) -> tuple:
    """Run this side of a started test; returns (local results, remote results).
    `congestion`: the TCP congestion control this end's data streams run."""
    stop = threading.Event()
    recorder = Recorder(streams, params, role, mrc, out)
    deadline = t0 + int(params.run_seconds * 1e9)
    threads = testrun.workers(role, params, streams, udp_feeds, stop, deadline, t0)
    recorder.begin(t0)
    for t in threads:
        t.start()
    try:
        if role == "sender":
            local = _sent(recorder, mrc, streams, threads, congestion, params)
            ctrl.send({"op": "end", "results": local})
            remote = ctrl.expect("results", TCP_DRAIN_MAX + 30, "the receiver")["results"]
            return local, remote
        remote = ctrl.expect("end", params.run_seconds + 60, "the sender")["results"]
        local = _received(recorder, mrc, streams, threads, stop, remote, congestion, params)
        ctrl.send({"op": "results", "results": local})
        return local, remote
    finally:
        stop.set()
        recorder.stop.set()


def _sent(recorder, mrc, streams, threads, congestion, params) -> dict:
    """The sending side's results, once its streams have sent all."""
    for t in threads:
        t.join()
    summary = recorder.finish(_now())
    return testrun.results("sender", mrc, recorder, summary, next((s.error for s in streams if s.error), None),
                           congestion, params, streams)


def _received(recorder, mrc, streams, threads, stop, remote, congestion, params) -> dict:
    """The receiving side's results, after the sender's end (REMOTE: its
    results, whose UDP counts tell how many were sent)."""
    _drain(params, streams, threads)
    stop.set()
    for t in threads:
        t.join()
    if params.protocol == "udp":
        sent = {s["id"]: s["packets"] for s in remote["summary"]["streams"]}
        for s in streams:
            s.sent = sent.get(s.id)
    last = max(s.end_ns for s in streams)
    summary = recorder.finish(last or _now())
    return testrun.results("receiver", mrc, recorder, summary, next((s.error for s in streams if s.error), None),
                           congestion, params, streams)


def _drain(params, streams, threads) -> None:
    """Wait for what is still in flight after the sender stopped."""
    if params.protocol == "tcp":
        if not params.bytes:
            for s in streams:
                s.freeze()
        give_up = time.monotonic() + TCP_DRAIN_MAX
        for t in threads:
            t.join(max(0.0, give_up - time.monotonic()))
        if params.bytes:    # -n: the bytes asked for are counted, up to the last one's arrival
            for s in streams:
                s.freeze()
                s.end_ns = s.last_ns or s.end_ns
        return
    give_up = _now() + int(DRAIN_MAX * 1e9)
    while _now() < give_up:
        last = max(s.last_ns for s in streams)
        if _now() - last > UDP_IDLE * 1e9:
            return
        time.sleep(UDP_IDLE / 5)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# --------------------------------------------------------------------- client

def _connect(host: str, port: int, bind: str | None, family: int = 0) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        only = {socket.AF_INET: " as IPv4 (-4)", socket.AF_INET6: " as IPv6 (-6)"}.get(family, "")
        raise MrcError(f"cannot resolve {host}{only}: {e.strerror}")
    if bind:
        infos = [i for i in infos if i[0] == _family(bind)] or infos
    last = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            if bind:
                sock.bind((bind, 0))
            sock.settimeout(SETUP_TIMEOUT)
            sock.connect(addr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            last = e
    what = last.strerror if isinstance(last, OSError) and last.strerror else str(last or "no address")
    if isinstance(last, socket.timeout):
        what = "timed out"
    raise MrcError(f"cannot connect to {host} port {port}: {what}")


def run_client(host: str, port: int, params: Params, out: Output, bind: str | None = None,
               mrc_device: str | None = None, use_mrc: bool = True, family: int = 0) -> dict:
    """One test against an mrc-perf server, or an iperf3 one (its protocol,
    perf/iperf3_proto.py): the server's first byte tells which.
    `family`: socket.AF_INET or AF_INET6 only (-4, -6); 0 either."""
    params.check()
    if params.congestion is not None:      # refused here, before the server hears of it
        check_congestion(params.congestion)
    out.line(f"Connecting to host {host}, port {port}")
    csock = _connect(host, port, bind, family)
    try:
        cookie_text = make_cookie()
        ctrl = _greet(csock, cookie_text)
        if ctrl is None:
            from mrc_ebpf.perf import iperf3_proto
            return iperf3_proto.client_test(csock, cookie_text, params, out, mrc_device, use_mrc)
        return _client_test(ctrl, cookie_text, params, out, mrc_device, use_mrc)
    finally:
        csock.close()


def _greet(csock: socket.socket, cookie_text: str) -> Control | None:
    """Send the cookie (as iperf3 does: 36 characters and a NUL) and read
    the server's first byte: mrc-perf's MRC_HELLO, or iperf3's PARAM_EXCHANGE
    (None: speak iperf3's protocol from here on)."""
    from mrc_ebpf.perf.iperf3_proto import ACCESS_DENIED, PARAM_EXCHANGE, SERVER_ERROR, server_error
    ctrl = Control(csock)
    try:
        csock.settimeout(SETUP_TIMEOUT)
        csock.sendall(cookie_text.encode() + b"\0")
        first = csock.recv(1)
    except socket.timeout:
        raise MrcError(f"the server did not answer within {SETUP_TIMEOUT:.0f} s")
    except OSError as e:
        raise MrcError(f"lost the control connection: {e.strerror or e}")
    if first == MRC_HELLO:
        return ctrl
    if first == bytes([PARAM_EXCHANGE]):
        return None
    if first == bytes([ACCESS_DENIED & 0xff]):
        raise MrcError("the server (iperf3) is busy running a test; try again later")
    if first == bytes([SERVER_ERROR & 0xff]):
        raise MrcError(server_error(csock))
    if first == b"{":                   # mrc-perf's error line (busy, or a refusal)
        ctrl.buf = first
        ctrl.expect("hello", SETUP_TIMEOUT, "the server")
    if not first:
        raise MrcError("the server closed the control connection")
    raise MrcError("protocol error: the server speaks neither mrc-perf's nor iperf3's protocol")


def _client_test(ctrl, cookie_text, params, out, mrc_device, use_mrc) -> dict:
    csock = ctrl.sock
    local_addr, remote_addr = csock.getsockname(), csock.getpeername()
    mrc = MrcView.open(mrc_device, remote_addr[0]) if use_mrc else None
    if not params.length:
        params.length = TCP_LENGTH if params.protocol == "tcp" else testrun.udp_length(csock)
    params.check()
    timestamp = time.time()
    cookie = data_cookie(cookie_text)
    out.detail(f"      Cookie: {cookie_text}")
    ctrl.send({"op": "params", "version": VERSION, "cookie": cookie.hex(),
               "sid": mrc.sid if mrc else None, "params": params.to_json()})
    reply = ctrl.expect("accept", SETUP_TIMEOUT, "the server")
    if mrc:
        mrc.peer_sid = reply.get("sid")
    socks, connected = [], []
    try:
        for i in range(1, params.streams * (2 if params.bidir else 1) + 1):
            if params.protocol == "tcp":
                s = stream_socket(csock.family, params.mptcp)
            else:
                s = socket.socket(csock.family, socket.SOCK_DGRAM)
            socks.append(s)
            s.bind((local_addr[0], 0))
            if params.protocol == "udp":
                big_buffers(s)
            else:
                set_congestion(s, params.congestion)
            set_window(s, params.window)
            if i == 1:
                bufs = buffer_sizes(s)
            s.settimeout(SETUP_TIMEOUT)
            try:
                s.connect(remote_addr[:2])
                if params.protocol == "tcp":
                    s.sendall(DATA_HELLO.pack(DATA_MAGIC, cookie, i))
            except OSError as e:
                raise MrcError(f"cannot open data stream {i}: {e.strerror or e}")
            lh, lp = s.getsockname()[:2]
            connected.append({"id": i, "local_host": lh, "local_port": lp,
                              "remote_host": remote_addr[0], "remote_port": remote_addr[1]})
        if params.protocol == "tcp":
            ctrl.expect("start", SETUP_TIMEOUT, "the server")
        else:
            _udp_handshake(ctrl, socks)
        t0 = _now()
        testrun.announce(out, mrc, connected, params)
        doc = _test_both_or_one("client", ctrl, params, socks, None, mrc, out, t0, connected, timestamp,
                                start_extra(cookie_text, params, socks[0], bufs))
        testrun.print_end(out, doc, params)
        if params.get_server_output:
            got = ctrl.expect("output", SETUP_TIMEOUT, "the server")
            doc["server_output"] = {k: got[k] for k in ("json", "text") if got.get(k) is not None}
            print_server_output(out, doc["server_output"])
        out.line("")
        out.line("mrc-perf Done.")
        return doc
    finally:
        close_all(socks, mrc=mrc)


def _udp_handshake(ctrl: Control, socks) -> None:
    """Hellos tell the server the streams' addresses; repeated, since
    datagrams may be lost, until the server says start."""
    give_up = time.monotonic() + SETUP_TIMEOUT
    while time.monotonic() < give_up:
        for i, s in enumerate(socks, start=1):
            hello(s, i)
        msg = ctrl.recv(0.1)
        if msg is not None:
            Control.check(msg, "start", "the server")
            return
    raise MrcError(f"the server did not hear the UDP streams within {SETUP_TIMEOUT:.0f} s "
                   f"(a firewall, or no route back?)")


def _make_streams(role, params, socks, addrs=None, ids=None):
    """Stream objects for this side, and the (socket, {id: receiver}) feeds
    that UDP receive loops read.  `ids`: the streams' numbers (default
    1..streams); with `addrs`, socks is the server's one UDP socket."""
    tcp = params.protocol == "tcp"
    ids = list(ids or range(1, params.streams + 1))
    if role == "sender":
        if tcp:
            return [TcpSender(i, s) for i, s in zip(ids, socks)], []
        if addrs:       # the server's one UDP socket, to each client stream
            return [UdpSender(i, socks[0], addrs[i]) for i in ids], []
        return [UdpSender(i, s) for i, s in zip(ids, socks)], []
    if tcp:
        return [TcpReceiver(i, s) for i, s in zip(ids, socks)], []
    streams = [UdpReceiver(i) for i in ids]
    if addrs or (len(socks) == 1 and len(ids) > 1):
        return streams, [(socks[0], {s.id: s for s in streams})]
    return streams, [(sock, {s.id: s}) for sock, s in zip(socks, streams)]


def _run_both(ctrl, params, socks, addrs, mrc, out, t0, congestion, first_sends: bool):
    """--bidir: this end sends on one half of the streams and receives on
    the other, at once (`first_sends`: the first `streams` are this end's
    to send, as the client's are).  Both ends send `end` when their
    senders stop, then `results` when their receivers have drained, so
    the messages cross in a fixed order.  Returns ((sending half's local,
    remote), (receiving half's local, remote))."""
    n = params.streams
    first, second = list(range(1, n + 1)), list(range(n + 1, 2 * n + 1))
    send_ids, recv_ids = (first, second) if first_sends else (second, first)
    if addrs:                               # the server's one UDP socket
        send_socks = recv_socks = socks
    else:
        send_socks = [socks[i - 1] for i in send_ids]
        recv_socks = [socks[i - 1] for i in recv_ids]
    senders, _ = _make_streams("sender", params, send_socks, addrs, send_ids)
    receivers, feeds = _make_streams("receiver", params, recv_socks, addrs, recv_ids)
    stop_send, stop_recv = threading.Event(), threading.Event()
    rec_send = Recorder(senders, params, "sender", mrc, out)
    rec_recv = Recorder(receivers, params, "receiver", None, out)
    deadline = t0 + int(params.run_seconds * 1e9)
    send_threads = testrun.workers("sender", params, senders, [], stop_send, deadline, t0)
    recv_threads = testrun.workers("receiver", params, receivers, feeds, stop_recv, deadline, t0)
    rec_send.begin(t0)
    rec_recv.begin(t0)
    for t in send_threads + recv_threads:
        t.start()
    try:
        local_send = _sent(rec_send, mrc, senders, send_threads, congestion, params)
        ctrl.send({"op": "end", "results": local_send})
        remote_send = ctrl.expect("end", params.run_seconds + 60, "the peer")["results"]
        local_recv = _received(rec_recv, None, receivers, recv_threads, stop_recv, remote_send, congestion,
                               params)
        ctrl.send({"op": "results", "results": local_recv})
        remote_recv = ctrl.expect("results", TCP_DRAIN_MAX + 30, "the peer")["results"]
        return (local_send, remote_recv), (local_recv, remote_send)
    finally:
        stop_send.set()
        stop_recv.set()
        rec_send.stop.set()
        rec_recv.stop.set()


def _test_both_or_one(who, ctrl, params, socks, addrs, mrc, out, t0, connected, timestamp, extra) -> dict:
    """Run the test (one direction, or both with --bidir) and make its record."""
    congestion = congestion_of(socks[0]) if params.protocol == "tcp" else None
    client = who == "client"
    if not params.bidir:
        role = ("receiver" if params.reverse else "sender") if client else \
            ("sender" if params.reverse else "receiver")
        streams, feeds = _make_streams(role, params, socks, addrs)
        local, remote = _run_test(ctrl, role, params, streams, feeds, mrc, out, t0, congestion)
        return testrun.document(who, ctrl.sock, params, connected, local, remote, timestamp, extra)
    mine, theirs = _run_both(ctrl, params, socks, addrs, mrc, out, t0, congestion, first_sends=client)
    # the record's main half is the client's sending one, as iperf3's sum / sum_sent
    forward, backward = (mine, theirs) if client else (theirs, mine)
    doc = testrun.document(who, ctrl.sock, params, connected, *forward, timestamp, extra)
    back = testrun.document(who, ctrl.sock, params, connected, *backward, timestamp, extra)
    doc["bidir_reverse"] = {k: back[k] for k in ("local", "remote", "end")}
    doc["error"] = doc["error"] or back["error"]
    return doc


# --------------------------------------------------------------------- server

def _listen(bind: str | None, port: int, kind: int, mptcp: bool = False, only: int = 0) -> socket.socket:
    """`only`: AF_INET or AF_INET6 (-4, -6); 0 both."""
    family = _family(bind) if bind else (only or socket.AF_INET6)
    addr = bind or ("0.0.0.0" if family == socket.AF_INET else "::")
    # an MPTCP listener takes plain TCP clients too (they fall back to TCP)
    sock = stream_socket(family, True) if mptcp else socket.socket(family, kind)
    try:
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not bind:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if only else 0)
        sock.bind((addr, port))
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
    except OSError as e:
        sock.close()
        proto = "TCP" if kind == socket.SOCK_STREAM else "UDP"
        raise MrcError(f"cannot listen on {proto} {addr} port {port}: {e.strerror or e}")
    return sock


def serve(port: int, out: Output, bind: str | None = None, one_off: bool = False,
          mrc_device: str | None = None, use_mrc: bool = True, on_doc=None,
          on_error=None, mptcp: bool = False, family: int = 0) -> int:
    """Serve tests until interrupted (or one with one_off); returns the exit
    status: with one_off, that of the test.  With mptcp the listener is an
    MPTCP socket, so clients may ask for MPTCP data streams (-m)."""
    listener = _listen(bind, port, socket.SOCK_STREAM, mptcp, family)
    try:
        while True:
            out.line("-" * 61)
            out.line(f"Server listening on {port}")
            out.line("-" * 61)
            conn, addr = listener.accept()
            status = 0
            out.captured = []
            try:
                doc = _serve_one(listener, conn, addr, port, bind, out, mrc_device, use_mrc,
                                 out.json_mode)
                if on_doc:
                    on_doc(doc)
            except MrcError as e:
                status = 1
                if on_error:
                    on_error(str(e))
            finally:
                conn.close()
            if one_off:
                return status
    finally:
        listener.close()


def _serve_one(listener, conn, addr, port, bind, out, mrc_device, use_mrc, json_mode=False) -> dict:
    ctrl = Control(conn)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cookie_raw = _read_cookie(conn)
    mine = cookie_raw.startswith(COOKIE_PREFIX.encode()) and cookie_raw.endswith(b"\0")
    if not mine and is_iperf3_cookie(cookie_raw):
        from mrc_ebpf.perf import iperf3_proto
        return iperf3_proto.serve_one(listener, conn, addr, port, bind, out, cookie_raw[:36].decode(),
                                      mrc_device, use_mrc, json_mode)
    if not mine:
        ctrl.error("protocol error: not an mrc-perf or iperf3 client (or an mrc-perf older than "
                   f"protocol {VERSION})")
        raise MrcError(f"rejected a client from {addr[0]}: it speaks neither mrc-perf's protocol "
                       f"{VERSION} nor iperf3's")
    cookie_text = cookie_raw[:36].decode()
    conn.sendall(MRC_HELLO)
    msg = ctrl.expect("params", SETUP_TIMEOUT, "the client")
    try:
        if msg.get("version") != VERSION:
            raise MrcError(f"client speaks protocol {msg.get('version')}, this server {VERSION}")
        params = Params.from_json(msg.get("params") or {})
        cookie = bytes.fromhex(str(msg.get("cookie", "")))
        if cookie != data_cookie(cookie_text):
            raise MrcError("protocol error: bad cookie")
        if params.mptcp and not is_mptcp(listener):
            raise MrcError("the client asks for MPTCP data streams (-m): start the server with -m")
    except (MrcError, ValueError) as e:
        ctrl.error(str(e))
        raise MrcError(f"rejected a client: {e}")
    out.line(f"Accepted connection from {addr[0]}, port {addr[1]}")
    mrc = MrcView.open(mrc_device, addr[0]) if use_mrc else None
    if mrc:
        mrc.peer_sid = msg.get("sid")
    usock = None
    socks: list[socket.socket] = []
    try:
        if params.protocol == "udp":
            try:
                usock = _listen(conn.getsockname()[0] if bind else None, port, socket.SOCK_DGRAM)
            except MrcError as e:
                ctrl.error(str(e))
                raise
            big_buffers(usock)
            set_window(usock, params.window)
        ctrl.send({"op": "accept", "sid": mrc.sid if mrc else None})
        timestamp = time.time()
        if params.protocol == "tcp":
            socks = _accept_streams(listener, cookie, params.total_streams)
            try:
                for s in socks:
                    set_congestion(s, params.congestion)
                    set_window(s, params.window)
            except MrcError as e:
                ctrl.error(str(e))
                raise
            connected = [testrun.conn_info(i, s) for i, s in enumerate(socks, 1)]
            addrs = None
        else:
            addrs = _udp_hellos(usock, params.total_streams)
            socks = [usock]
            lh, lp = conn.getsockname()[0], usock.getsockname()[1]
            connected = [{"id": i, "local_host": lh, "local_port": lp, "remote_host": a[0],
                          "remote_port": a[1]} for i, a in sorted(addrs.items())]
        ctrl.send({"op": "start"})
        t0 = _now()
        testrun.announce(out, mrc, connected, params)
        doc = _test_both_or_one("server", ctrl, params, socks, addrs, mrc, out, t0, connected, timestamp,
                                start_extra(cookie_text, params, socks[0], buffer_sizes(socks[0])))
        testrun.print_end(out, doc, params)
        if params.get_server_output:        # iperf3: the server's JSON if it runs -J, else its text
            if json_mode:
                from mrc_ebpf.perf.iperf_json import document
                ctrl.send({"op": "output", "json": document(doc)})
            else:
                ctrl.send({"op": "output", "text": "\n".join(out.captured)})
        return doc
    except PeerGone as e:
        raise MrcError(f"client {addr[0]}: {e}")
    except MrcError as e:
        ctrl.error(str(e))
        raise
    finally:
        close_all(socks, usock, mrc=mrc)


def _read_cookie(conn: socket.socket) -> bytes:
    """The client's first 37 bytes (iperf3's cookie size)."""
    conn.settimeout(SETUP_TIMEOUT)
    try:
        return _read_exact(conn, 37)
    except socket.timeout:
        raise MrcError(f"the client sent no cookie within {SETUP_TIMEOUT:.0f} s")
    except (OSError, ValueError):
        raise MrcError("the client closed the control connection")


def _accept_streams(listener, cookie: bytes, n: int) -> list[socket.socket]:
    """The test's data connections; anything else that connects meanwhile
    (another client) is told the server is busy."""
    got: dict[int, socket.socket] = {}
    give_up = time.monotonic() + SETUP_TIMEOUT
    try:
        while len(got) < n:
            left = give_up - time.monotonic()
            if left <= 0:
                raise MrcError(f"only {len(got)} of {n} data streams connected within "
                               f"{SETUP_TIMEOUT:.0f} s")
            listener.settimeout(left)
            try:
                s, _ = listener.accept()
            except socket.timeout:
                continue
            s.settimeout(2)
            try:
                raw = _read_exact(s, DATA_HELLO.size)
                magic, their_cookie, sid = DATA_HELLO.unpack(raw)
            except (OSError, ValueError):
                magic = their_cookie = None
                sid = 0
            if magic == DATA_MAGIC and their_cookie == cookie and 1 <= sid <= n and sid not in got:
                got[sid] = s
                continue
            if isinstance(magic, bytes) and magic.startswith(COOKIE_PREFIX.encode()):
                Control(s).error("the server is busy running a test; try again later")
            elif isinstance(their_cookie, bytes) and is_iperf3_cookie(raw + b"a" * 8 + b"\0"):
                _try_send(s, b"\xff")          # iperf3's ACCESS_DENIED
            s.close()
    except BaseException:
        for s in got.values():
            s.close()
        raise
    finally:
        listener.settimeout(None)
    return [got[i] for i in range(1, n + 1)]


def _try_send(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:
        pass


def _read_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ValueError("short")
        data += chunk
    return data


def _udp_hellos(usock: socket.socket, n: int) -> dict[int, tuple]:
    addrs: dict[int, tuple] = {}
    buf = bytearray(2048)
    give_up = time.monotonic() + SETUP_TIMEOUT
    while len(addrs) < n:
        left = give_up - time.monotonic()
        if left <= 0:
            raise MrcError(f"heard only {len(addrs)} of {n} UDP streams within {SETUP_TIMEOUT:.0f} s")
        usock.settimeout(left)
        try:
            size, addr = usock.recvfrom_into(buf)
        except socket.timeout:
            continue
        if size < HEADER.size:
            continue
        magic, kind, sid, _, _ = HEADER.unpack_from(buf)
        if magic == MAGIC and kind == KIND_HELLO and 1 <= sid <= n:
            addrs[sid] = addr
    return addrs
