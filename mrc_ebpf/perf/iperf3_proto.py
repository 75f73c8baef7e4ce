"""iperf3's control protocol (iperf 3.x, src/iperf_api.c), so that
`mrc-perf -c` runs against `iperf3 -s` and `iperf3 -c` against
`mrc-perf -s`.

The client sends a 37-byte cookie (36 characters and a NUL); from then on
the server drives the test with one state byte at a time, and parameters
and results cross as JSON objects, each after its length in 4 bytes
(network order):

    server: PARAM_EXCHANGE    client: {"tcp"|"udp": true, "time", "parallel", "len", ...}
    server: CREATE_STREAMS    client: opens the data streams (TCP: connect, the cookie;
                              UDP: a 4-byte hello per stream, answered by the server)
    server: TEST_START, TEST_RUNNING      data flows
    client: TEST_END          (when its -t is up, whichever end sends)
    server: EXCHANGE_RESULTS  client: its results; server: its results
    server: DISPLAY_RESULTS   client: IPERF_DONE

iperf3's UDP datagrams start with the send time (seconds, microseconds of
CLOCK_MONOTONIC) and a packet count from 1 (udp.IPERF3_HEADER); its
streams are numbered 1, 3, 4, 5, ... (iperf_add_stream).  What iperf3's
protocol cannot carry (the other end's intervals and datapath view) is
absent from the report: mrc.remote.intervals is empty.
"""
from __future__ import annotations

import json
import math
import socket
import struct
import threading
import time

from mrc_ebpf.errors import MrcError
from mrc_ebpf.perf.control import (TCP_LENGTH, Params, buffer_sizes, congestion_of, set_congestion,
                                   set_window)
from mrc_ebpf.perf.mrc_view import MrcView
from mrc_ebpf.perf.tcp import TcpReceiver, TcpSender
from mrc_ebpf.perf.udp import UdpReceiver, UdpSender, big_buffers, receive_iperf3
from mrc_ebpf.perf import testrun
from mrc_ebpf.perf.testrun import Recorder, close_all, print_server_output, start_extra

TEST_START, TEST_RUNNING, TEST_END = 1, 2, 4
PARAM_EXCHANGE, CREATE_STREAMS, SERVER_TERMINATE, CLIENT_TERMINATE = 9, 10, 11, 12
EXCHANGE_RESULTS, DISPLAY_RESULTS, IPERF_DONE = 13, 14, 16
ACCESS_DENIED, SERVER_ERROR = -1, -2
# iperf.h: written as a host-order int (little-endian here): b"9876", b"6789"
UDP_CONNECT_MSG, UDP_CONNECT_REPLY, LEGACY_UDP_CONNECT_REPLY = 0x36373839, 0x39383736, 987654321
_INT = struct.Struct("=I")
_LEN = struct.Struct("!I")
SETUP_TIMEOUT = 10.0
MAX_JSON = 1 << 20
_now = time.monotonic_ns

STATE_NAMES = {TEST_START: "TEST_START", TEST_RUNNING: "TEST_RUNNING", TEST_END: "TEST_END",
               PARAM_EXCHANGE: "PARAM_EXCHANGE", CREATE_STREAMS: "CREATE_STREAMS",
               SERVER_TERMINATE: "SERVER_TERMINATE", CLIENT_TERMINATE: "CLIENT_TERMINATE",
               EXCHANGE_RESULTS: "EXCHANGE_RESULTS", DISPLAY_RESULTS: "DISPLAY_RESULTS",
               IPERF_DONE: "IPERF_DONE", ACCESS_DENIED: "ACCESS_DENIED", SERVER_ERROR: "SERVER_ERROR"}


def stream_id(i: int) -> int:
    """iperf3's id of its i-th stream (1-based): 1, 3, 4, 5, ..."""
    return 1 if i == 1 else i + 1


# ------------------------------------------------------------ wire

def _recv_exact(sock: socket.socket, n: int, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise MrcError("the iperf3 peer closed the control connection")
            data += chunk
    except socket.timeout:
        raise MrcError(f"timed out after {timeout:.0f} s waiting for the iperf3 peer")
    except OSError as e:
        raise MrcError(f"lost the control connection: {e.strerror or e}")
    return data


def send_state(sock: socket.socket, state: int) -> None:
    try:
        sock.settimeout(30)
        sock.sendall(bytes([state & 0xff]))
    except OSError as e:
        raise MrcError(f"lost the control connection: {e.strerror or e}")


def read_state(sock: socket.socket, timeout: float) -> int:
    b = _recv_exact(sock, 1, timeout)[0]
    return b - 256 if b > 127 else b


def server_error(sock: socket.socket) -> str:
    """After SERVER_ERROR: iperf3's i_errno and errno."""
    try:
        i_errno, err = struct.unpack("!ii", _recv_exact(sock, 8, 5))
    except MrcError:
        return "the iperf3 server reported an error"
    return f"the iperf3 server reported error {i_errno} (errno {err}); see its output"


def json_write(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    try:
        sock.settimeout(30)
        sock.sendall(_LEN.pack(len(data)) + data)
    except OSError as e:
        raise MrcError(f"lost the control connection: {e.strerror or e}")


def json_read(sock: socket.socket, timeout: float) -> dict:
    n, = _LEN.unpack(_recv_exact(sock, 4, timeout))
    if n > MAX_JSON:
        raise MrcError("protocol error: oversized JSON from the iperf3 peer")
    try:
        obj = json.loads(_recv_exact(sock, n, timeout))
    except ValueError:
        raise MrcError("protocol error: bad JSON from the iperf3 peer")
    if not isinstance(obj, dict):
        raise MrcError("protocol error: bad JSON from the iperf3 peer")
    return obj


def _expect(sock: socket.socket, want: int, timeout: float) -> None:
    got = read_state(sock, timeout)
    if got == want:
        return
    if got == SERVER_ERROR:
        raise MrcError(server_error(sock))
    if got == ACCESS_DENIED:
        raise MrcError("the iperf3 server is busy running a test; try again later")
    raise MrcError(f"protocol error: expected {STATE_NAMES.get(want, want)} from the iperf3 peer, "
                   f"got {STATE_NAMES.get(got, got)}")


# ------------------------------------------------------------ parameters

def params_to_iperf3(p: Params) -> dict:
    """send_parameters(): what an iperf3 server reads."""
    out = {p.protocol: True, "omit": math.ceil(p.omit), "time": math.ceil(p.duration),
           "num": p.bytes, "blockcount": 0, "parallel": p.streams, "len": p.length,
           "client_version": "3.12"}
    if p.reverse:
        out["reverse"] = True
    if p.bidir:
        out["bidirectional"] = True
    if p.window:
        out["window"] = p.window
    if p.bitrate:
        out["bandwidth"] = p.bitrate
    if p.congestion:
        out["congestion"] = p.congestion
    if p.get_server_output:
        out["get_server_output"] = 1
    return out


def params_from_iperf3(j: dict, udp_length: int) -> tuple[Params, bool]:
    """get_parameters(): iperf3's JSON -> Params, and whether the client
    uses 64-bit UDP counters.  What mrc-perf cannot do is refused."""
    if j.get("sctp"):
        raise MrcError("the iperf3 client asks for SCTP, which mrc-perf does not support")
    if j.get("blockcount"):
        raise MrcError("the iperf3 client asks for -k (blocks), which mrc-perf does not support")
    try:
        udp = bool(j.get("udp"))
        p = Params(protocol="udp" if udp else "tcp", streams=int(j.get("parallel", 1)),
                   duration=float(j.get("time", 10)) or 10.0, bitrate=int(j.get("bandwidth", 0)),
                   length=int(j.get("len", 0)) or (udp_length if udp else TCP_LENGTH),
                   interval=1.0, reverse=bool(j.get("reverse")), congestion=j.get("congestion"),
                   omit=float(j.get("omit", 0)), bytes=int(j.get("num", 0)),
                   window=int(j.get("window", 0)),
                   get_server_output=bool(j.get("get_server_output")),
                   bidir=bool(j.get("bidirectional")))
        if udp and not p.bitrate:
            p.bitrate = 1_000_000
        return p.check(), bool(j.get("udp_counters_64bit"))
    except (TypeError, ValueError):
        raise MrcError("malformed test parameters from the iperf3 client")


# ------------------------------------------------------------ results

def _results_json(halves, params: Params, cpu: dict, congestion: str | None) -> dict:
    """send_results(): this end's figures, per stream, of every half
    (role, ids, streams, summary)."""
    tcp = params.protocol == "tcp"
    sends = any(role == "sender" for role, *_ in halves)
    out = {"cpu_util_total": cpu["total"], "cpu_util_user": cpu["user"],
           "cpu_util_system": cpu["system"],
           "sender_has_retransmits": (1 if tcp else 0) if sends else -1, "streams": []}
    if congestion:
        out["congestion_used"] = congestion
    for role, ids, streams, summary in halves:
        for i, r, s in zip(ids, summary["streams"], streams):
            if role == "sender":
                packets, jitter, errors = r.get("packets", 0), 0.0, 0
            elif tcp:
                packets, jitter, errors = 0, 0.0, 0
            else:       # iperf3's receiver: highest count seen, and the gaps in it
                packets, jitter, errors = s.next_seq, r["jitter_ms"] / 1000, r["lost"]
            out["streams"].append({
                "id": stream_id(i), "bytes": r["bytes"],
                "retransmits": r.get("retransmits", -1) if role == "sender" and tcp else -1,
                "jitter": jitter, "errors": errors, "packets": packets,
                "start_time": 0, "end_time": summary["seconds"]})
    return out


def _remote_side(j: dict, role: str, params: Params, ids) -> dict:
    """get_results(): the iperf3 peer's figures of streams `ids` (all in
    `role`) as session's side record."""
    by_id = {}
    for s in j.get("streams") or []:
        if isinstance(s, dict) and "id" in s:
            by_id[s["id"]] = s
    tcp = params.protocol == "tcp"
    streams, seconds = [], 0.0
    for i in ids:
        s = by_id.get(stream_id(i))
        if s is None:
            raise MrcError(f"protocol error: the iperf3 peer's results lack stream {stream_id(i)}")
        secs = float(s.get("end_time", 0)) - float(s.get("start_time", 0))
        seconds = max(seconds, secs)
        n = int(s["bytes"])
        bps = n * 8 / secs if secs > 0 else 0.0
        if role == "sender":
            r = {"id": i, "bytes": n, "bits_per_second": bps, "packets": int(s.get("packets", 0)),
                 "retransmits": max(0, int(s.get("retransmits", 0)))}
        elif tcp:
            r = {"id": i, "bytes": n, "bits_per_second": bps}
        else:
            lost, highest = int(s.get("errors", 0)), int(s.get("packets", 0))
            r = {"id": i, "bytes": n, "bits_per_second": bps, "packets": max(0, highest - lost),
                 "lost": lost, "lost_percent": 100.0 * lost / highest if highest else 0.0,
                 "out_of_order": 0, "jitter_ms": float(s.get("jitter", 0)) * 1000, "latency_us": None}
        streams.append(r)
    total = sum(r["bytes"] for r in streams)
    summ = {"bytes": total, "bits_per_second": total * 8 / seconds if seconds > 0 else 0.0}
    if role == "sender":
        summ.update(packets=sum(r["packets"] for r in streams),
                    retransmits=sum(r["retransmits"] for r in streams))
    elif not tcp:
        lost = sum(r["lost"] for r in streams)
        packets = sum(r["packets"] for r in streams)
        summ.update(packets=packets, lost=lost,
                    lost_percent=100.0 * lost / (packets + lost) if packets + lost else 0.0,
                    out_of_order=0, jitter_ms=sum(r["jitter_ms"] for r in streams) / len(streams),
                    latency_us=None)
    cpu = {"total": float(j.get("cpu_util_total", 0)), "user": float(j.get("cpu_util_user", 0)),
           "system": float(j.get("cpu_util_system", 0))}
    side = {"role": role, "mrc": None, "tcp_congestion": j.get("congestion_used") if tcp else None,
            "intervals": [], "error": None, "cpu": cpu,
            "summary": {"start": 0.0, "end": round(seconds, 6), "seconds": round(seconds, 6),
                        "streams": streams, "sum": summ, "mrc": None}}
    return side


# ------------------------------------------------------------ the test

def _run(halves, params, out, mrc, t0, counters64, end_when, send_seconds):
    """Run this end's halves of the test, each (role, ids, sockets), at
    once.  end_when(sender threads): blocks until the test's end (client:
    its deadline; server: the client's TEST_END); a sender stops after
    send_seconds at the latest.  Returns (role, ids, streams, recorder,
    summary, error) per half."""
    tcp = params.protocol == "tcp"
    stop = threading.Event()
    deadline = t0 + int(send_seconds * 1e9)
    runs, senders = [], []
    for n, (role, ids, socks) in enumerate(halves):
        if role == "sender":
            streams = [TcpSender(i, s) if tcp else UdpSender(i, s, fmt="iperf3", counters64=counters64)
                       for i, s in zip(ids, socks)]
            threads = testrun.workers("sender", params, streams, [], stop, deadline, t0)
            senders += threads
        else:
            streams = [TcpReceiver(i, s) if tcp else UdpReceiver(i) for i, s in zip(ids, socks)]
            if tcp:
                threads = [threading.Thread(target=s.run, args=(stop, params.length), daemon=True)
                           for s in streams]
            else:
                threads = [threading.Thread(target=receive_iperf3, args=(sk, s, stop, counters64),
                                            daemon=True) for sk, s in zip(socks, streams)]
        recorder = Recorder(streams, params, role, mrc if n == 0 else None, out)
        runs.append((role, ids, streams, recorder, threads))
    for *_, recorder, threads in runs:
        recorder.begin(t0)
    for *_, threads in runs:
        for t in threads:
            t.start()
    try:
        end_when(senders)
        end = _now()
        for role, _, streams, _, _ in runs:
            if role == "receiver" and tcp:
                for s in streams:
                    s.freeze()
        stop.set()
        results = []
        for role, ids, streams, recorder, threads in runs:
            for t in threads:
                t.join(10)
            last = end
            if role == "receiver":
                last = max([s.last_ns if tcp else s.end_ns for s in streams] + [0]) or end
            summary = recorder.finish(min(last, _now()))
            error = next((s.error for s in streams if s.error), None)
            results.append((role, ids, streams, recorder, summary, error))
        return results
    finally:
        stop.set()
        for run in runs:
            run[3].stop.set()


def _halves(params: Params, socks, client: bool):
    """(role, ids, sockets) of this end: the client's first `streams`
    send (iperf3 makes the senders first with --bidir)."""
    n = params.streams
    first, second = list(range(1, n + 1)), list(range(n + 1, 2 * n + 1))
    if params.bidir:
        mine = "sender" if client else "receiver"
        other = "receiver" if client else "sender"
        return [(mine, first, socks[:n]), (other, second, socks[n:])]
    sends = params.reverse != client
    return [("sender" if sends else "receiver", first, socks)]


def _finish(who, sock, params, connected, results, remote_json, cpu, timestamp, extra, congestion):
    """session's record of the test from this end's halves and the peer's results."""
    docs = []
    for role, ids, streams, recorder, summary, error in results:
        other = "receiver" if role == "sender" else "sender"
        remote = _remote_side(remote_json, other, params, ids)
        if role == "receiver" and params.protocol == "udp":   # the sender's counts close the loss
            for s, r in zip(streams, remote["summary"]["streams"]):
                s.sent = r["packets"]
            summary = recorder._report(recorder.first, recorder.prev, final=True)
        local = testrun.results(role, recorder.mrc, recorder, summary, error, congestion, params, streams)
        local["cpu"] = cpu
        docs.append(testrun.document(who, sock, params, connected, local, remote, timestamp, extra))
    doc = docs[0]
    if len(docs) > 1:
        doc["bidir_reverse"] = {k: docs[1][k] for k in ("local", "remote", "end")}
        doc["error"] = doc["error"] or docs[1]["error"]
    doc["peer"] = "iperf3"
    if "server_output_json" in remote_json:
        doc["server_output"] = {"json": remote_json["server_output_json"]}
    elif "server_output_text" in remote_json:
        doc["server_output"] = {"text": remote_json["server_output_text"]}
    return doc


def client_test(csock: socket.socket, cookie_text: str, params: Params, out, mrc_device, use_mrc) -> dict:
    """mrc-perf -c against iperf3 -s; the server has sent PARAM_EXCHANGE."""
    if params.mptcp:
        raise MrcError("the server is iperf3: MPTCP (-m) needs an mrc-perf server")
    if params.bytes and params.reverse:
        raise MrcError("the server is iperf3: -n with -R needs an mrc-perf server")
    out.line("The server speaks iperf3's protocol (iperf3 -s): its intervals and datapath view "
             "are not reported")
    local_addr, remote_addr = csock.getsockname(), csock.getpeername()
    if not params.length:
        params.length = TCP_LENGTH if params.protocol == "tcp" else testrun.udp_length(csock)
    params.check()
    timestamp = time.time()
    out.detail(f"      Cookie: {cookie_text}")
    json_write(csock, params_to_iperf3(params))
    _expect(csock, CREATE_STREAMS, SETUP_TIMEOUT)
    mrc = MrcView.open(mrc_device, remote_addr[0]) if use_mrc else None
    socks, connected, bufs = [], [], {}
    try:
        for i in range(1, params.total_streams + 1):
            tcp = params.protocol == "tcp"
            s = socket.socket(csock.family, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
            socks.append(s)
            s.bind((local_addr[0], 0))
            if tcp:
                set_congestion(s, params.congestion)
            else:
                big_buffers(s)
            set_window(s, params.window)
            if i == 1:
                bufs = buffer_sizes(s)
            s.settimeout(SETUP_TIMEOUT)
            try:
                s.connect(remote_addr[:2])
                if tcp:
                    s.sendall(cookie_text.encode() + b"\0")
                else:
                    s.send(_INT.pack(UDP_CONNECT_MSG))
                    reply, = _INT.unpack(s.recv(4)[:4].ljust(4, b"\0"))
                    if reply not in (UDP_CONNECT_REPLY, LEGACY_UDP_CONNECT_REPLY):
                        raise MrcError(f"data stream {i}: the iperf3 server did not accept it")
            except socket.timeout:
                raise MrcError(f"cannot open data stream {i}: the iperf3 server did not answer")
            except OSError as e:
                raise MrcError(f"cannot open data stream {i}: {e.strerror or e}")
            lh, lp = s.getsockname()[:2]
            connected.append({"id": i, "local_host": lh, "local_port": lp,
                              "remote_host": remote_addr[0], "remote_port": remote_addr[1]})
        _expect(csock, TEST_START, SETUP_TIMEOUT)
        _expect(csock, TEST_RUNNING, SETUP_TIMEOUT)
        t0 = _now()
        testrun.announce(out, mrc, connected, params)

        def until_end(senders):
            for t in senders:               # they stop at the deadline, or after -n bytes
                t.join()
            if not senders:
                time.sleep(max(0.0, (t0 + params.run_seconds * 1e9 - _now()) / 1e9))

        results = _run(_halves(params, socks, client=True), params, out, mrc, t0, False, until_end,
                       params.run_seconds)
        send_state(csock, TEST_END)
        _expect(csock, EXCHANGE_RESULTS, 30)
        congestion = congestion_of(socks[0]) if params.protocol == "tcp" else None
        cpu = results[0][3].cpu
        json_write(csock, _results_json([(r[0], r[1], r[2], r[4]) for r in results], params, cpu,
                                        congestion))
        remote_json = json_read(csock, 30)
        _expect(csock, DISPLAY_RESULTS, 30)
        send_state(csock, IPERF_DONE)
        doc = _finish("client", csock, params, connected, results, remote_json, cpu, timestamp,
                      start_extra(cookie_text, params, socks[0], bufs), congestion)
        testrun.print_end(out, doc, params)
        print_server_output(out, doc.get("server_output", {}))
        out.line("")
        out.line("mrc-perf Done.")
        return doc
    finally:
        close_all(socks, mrc=mrc)


def serve_one(listener, conn, addr, port, bind, out, cookie_text, mrc_device, use_mrc, json_mode) -> dict:
    """iperf3 -c against mrc-perf -s; the client's cookie has been read."""
    send_state(conn, PARAM_EXCHANGE)
    try:
        params, counters64 = params_from_iperf3(json_read(conn, SETUP_TIMEOUT), testrun.udp_length(conn))
    except MrcError as e:
        _refuse(conn)
        raise MrcError(f"rejected an iperf3 client from {addr[0]}: {e}")
    out.line(f"Accepted connection from {addr[0]}, port {addr[1]} (an iperf3 client)")
    mrc = MrcView.open(mrc_device, addr[0]) if use_mrc else None
    socks: list[socket.socket] = []
    pending = None
    try:
        tcp = params.protocol == "tcp"
        if not tcp:
            pending = _udp_listener(conn, bind, port)
        send_state(conn, CREATE_STREAMS)
        timestamp = time.time()
        give_up = time.monotonic() + SETUP_TIMEOUT
        while len(socks) < params.total_streams:
            left = give_up - time.monotonic()
            if left <= 0:
                raise MrcError(f"only {len(socks)} of {params.total_streams} data streams connected within "
                               f"{SETUP_TIMEOUT:.0f} s")
            if tcp:
                listener.settimeout(left)
                try:
                    s, _ = listener.accept()
                except socket.timeout:
                    continue
                try:
                    got = _recv_exact(s, 37, 2)
                except MrcError:
                    got = b""
                if got[:36].decode("ascii", "replace") != cookie_text:
                    try:
                        s.sendall(bytes([ACCESS_DENIED & 0xff]))
                    except OSError:
                        pass
                    s.close()
                    continue
                set_congestion(s, params.congestion)
                set_window(s, params.window)
                socks.append(s)
            else:
                pending.settimeout(left)
                try:
                    data, peer = pending.recvfrom(64)
                except socket.timeout:
                    continue
                if len(data) != 4:
                    continue
                pending.connect(peer)
                big_buffers(pending)
                set_window(pending, params.window)
                socks.append(pending)
                # the next stream's hello goes to a fresh socket on the port
                pending = _udp_listener(conn, bind, port)
                socks[-1].send(_INT.pack(UDP_CONNECT_REPLY))
        listener.settimeout(None)
        connected = [testrun.conn_info(i, s) for i, s in enumerate(socks, 1)]
        send_state(conn, TEST_START)
        send_state(conn, TEST_RUNNING)
        t0 = _now()
        testrun.announce(out, mrc, connected, params)

        def until_end(senders):
            _expect(conn, TEST_END, params.run_seconds + 60)

        results = _run(_halves(params, socks, client=False), params, out, mrc, t0, counters64, until_end,
                       params.run_seconds + 60)
        send_state(conn, EXCHANGE_RESULTS)
        remote_json = json_read(conn, 30)
        congestion = congestion_of(socks[0]) if tcp else None
        cpu = results[0][3].cpu
        doc = _finish("server", conn, params, connected, results, remote_json, cpu, timestamp,
                      start_extra(cookie_text, params, socks[0], buffer_sizes(socks[0])),
                      congestion)
        testrun.print_end(out, doc, params)
        # as iperf3's receiver: the UDP loss is the gaps in the counts
        results = _results_json([(r[0], r[1], r[2], r[4]) for r in results], params, cpu, congestion)
        if params.get_server_output:
            if json_mode:
                from mrc_ebpf.perf.iperf_json import document
                results["server_output_json"] = document(doc)
            else:
                results["server_output_text"] = "\n".join(out.captured) + "\n"
        json_write(conn, results)
        send_state(conn, DISPLAY_RESULTS)
        try:
            read_state(conn, 10)        # IPERF_DONE, or the client has gone
        except MrcError:
            pass
        return doc
    finally:
        listener.settimeout(None)
        close_all(socks, pending, mrc=mrc)


def _refuse(conn: socket.socket) -> None:
    """iperf3's SERVER_ERROR with i_errno IEUNIMP (an unimplemented option)."""
    try:
        conn.sendall(bytes([SERVER_ERROR & 0xff]) + struct.pack("!ii", 13, 0))   # IEUNIMP
    except OSError:
        pass


def _udp_listener(conn: socket.socket, bind: str | None, port: int) -> socket.socket:
    family = conn.family
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and not bind:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind((bind or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
    except OSError as e:
        s.close()
        raise MrcError(f"cannot listen on UDP port {port}: {e.strerror or e}")
    return s
