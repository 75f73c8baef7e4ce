"""One test's run, as both of mrc-perf's protocols make it (its own,
session.py, and iperf3's, iperf3_proto.py): the output, the interval
recorder, the worker threads, the results each side reports, the final
document and its summary lines, and closing what a test opened.
"""
from __future__ import annotations

import resource
import socket
import sys
import threading
import time

from mrc_ebpf.perf.control import VERSION, Params, mptcp_subflows
from mrc_ebpf.perf.mrc_view import MrcView
from mrc_ebpf.perf.report import header, interval_lines, mrc_summary_lines, summary_lines
from mrc_ebpf.perf.udp import HEADER, receive

_now = time.monotonic_ns


class Output:
    """Text lines as the test goes (iperf3's habit) or one JSON document at the end."""

    def __init__(self, json_mode: bool, stream=None, verbose: bool = False, unit: str | None = None):
        self.json_mode = json_mode
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()
        self.verbose = verbose          # iperf3 -V: more lines
        self.unit = unit                # iperf3 -f: the rate column's unit
        self.captured: list[str] = []   # the lines of the current test (--get-server-output)

    def line(self, text: str = "") -> None:
        self.captured.append(text)
        if not self.json_mode:
            with self.lock:
                print(text, file=self.stream, flush=True)

    def detail(self, text: str) -> None:
        """A line printed only with -V."""
        if self.verbose:
            self.line(text)


class Recorder:
    """Snapshots of cumulative counters at interval boundaries; every
    report is a difference of two snapshots, so the intervals add up to
    the summary exactly."""

    def __init__(self, streams, params: Params, role: str, mrc: MrcView | None, out: Output):
        self.streams, self.params, self.role, self.mrc, self.out = streams, params, role, mrc, out
        self.kind = streams[0].kind
        self.intervals: list[dict] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _snap(self, t: int) -> dict:
        return {"t": t, "streams": [s.snapshot() for s in self.streams],
                "mrc": self.mrc.snapshot() if self.mrc else None}

    def _report(self, a: dict, b: dict, final: bool = False) -> dict:
        seconds = (b["t"] - a["t"]) / 1e9
        reports = [s.report(sa, sb, seconds, final)
                   for s, sa, sb in zip(self.streams, a["streams"], b["streams"])]
        total = type(self.streams[0]).sum(self.streams, a["streams"], b["streams"], seconds, reports,
                                          final)
        return {"start": round((a["t"] - self.t0) / 1e9, 6), "end": round((b["t"] - self.t0) / 1e9, 6),
                "seconds": round(seconds, 6), "streams": reports, "sum": total,
                "mrc": self.mrc.delta(a["mrc"], b["mrc"], seconds) if self.mrc else None}

    def begin(self, t0: int) -> None:
        self.t0 = t0            # times count from here; moved to the end of -O's omitted seconds
        self.start = t0
        self.omitting = self.params.omit > 0
        self.first = self.prev = self._snap(t0)
        self.cpu0 = _cpu_times()
        self.out.line(header(self.kind, self.role, self.out.unit))
        if self.params.interval or self.omitting:
            self.thread = threading.Thread(target=self._loop, daemon=True)
            self.thread.start()

    def _boundaries(self):
        """(when, omitted) of the interval ends: through the omitted
        seconds, then from their end on; the last one is left to finish()."""
        p, t0 = self.params, self.start
        step = int(p.interval * 1e9)
        omit_end = t0 + int(p.omit * 1e9)
        if p.omit:
            k = 1
            while step and t0 + k * step < omit_end - step // 10:
                yield t0 + k * step, True
                k += 1
            yield omit_end, True
        if not step:
            return
        # the test's end closes the last interval, so no sliver follows it
        horizon = None if p.bytes else omit_end + int(p.duration * 1e9) - step // 10
        k = 1
        while horizon is None or omit_end + k * step < horizon:
            yield omit_end + k * step, False
            k += 1

    def _loop(self) -> None:
        for when, omitted in self._boundaries():
            if self.stop.wait(max(0.0, (when - _now()) / 1e9)):
                return
            snap = self._snap(_now())
            if omitted and not self.omitting:
                continue
            if self.params.interval:
                self._emit(snap, omitted)
            if omitted and when == self.start + int(self.params.omit * 1e9):
                # iperf3: the omitted seconds are not counted; times start again at 0
                self.omitting = False
                self.first = self.prev = snap
                self.t0 = snap["t"]

    def _emit(self, snap: dict, omitted: bool = False) -> None:
        rec = self._report(self.prev, snap)
        rec["omitted"] = omitted
        self.prev = snap
        self.intervals.append(rec)
        lines = interval_lines(rec, self.kind, self.role, len(self.streams) > 1, self.out.unit)
        for text in lines:
            self.out.line(text + ("  (omitted)" if omitted and not text.startswith("[MRC]") else ""))

    def finish(self, end_ns: int) -> dict:
        self.stop.set()
        if self.thread:
            self.thread.join()
        snap = self._snap(max(end_ns, self.prev["t"]))
        if snap["t"] > self.prev["t"] or not self.intervals:
            self._emit(snap, self.omitting)
        self.cpu = _cpu_percent(self.cpu0, _cpu_times())
        return self._report(self.first, snap, final=True)


def _cpu_times() -> tuple:
    """As iperf3: this process's user and system CPU time, and wall time."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.monotonic(), r.ru_utime, r.ru_stime


def _cpu_percent(a: tuple, b: tuple) -> dict:
    wall = b[0] - a[0]
    if wall <= 0:
        return {"total": 0.0, "user": 0.0, "system": 0.0}
    user, system = 100 * (b[1] - a[1]) / wall, 100 * (b[2] - a[2]) / wall
    return {"total": user + system, "user": user, "system": system}


def announce(out, mrc, connected: list[dict], params: Params | None = None) -> None:
    """iperf3's opening lines, and which datapath this end reads."""
    if params is not None:          # iperf3 -V's line
        what = f"{params.bytes} bytes to send" if params.bytes else f"{params.duration:g} second test"
        out.detail(f"Starting Test: protocol: {params.protocol.upper()}, {params.streams} streams, "
                   f"{params.length} byte blocks, omitting {params.omit:g} seconds, {what}, tos 0")
    if mrc:
        out.line(f"MRC datapath here: {mrc.device} SID {mrc.sid}; per-path lines follow each interval")
    for c in connected:
        out.line(f"[{c['id']:>3}] local {c['local_host']} port {c['local_port']} connected to "
                 f"{c['remote_host']} port {c['remote_port']}")

def _limits(params, n: int) -> list[int]:
    """-n: the bytes to send, split over the streams (0: no limit)."""
    if not params.bytes:
        return [0] * n
    share, rest = divmod(params.bytes, n)
    return [share + (1 if i < rest else 0) or 1 for i in range(n)]


def workers(role, params, streams, udp_feeds, stop, deadline, t0=None):
    if role == "sender":
        return [threading.Thread(target=s.run, args=(deadline, stop, params.bitrate, params.length,
                                                     t0, limit), daemon=True)
                for s, limit in zip(streams, _limits(params, len(streams)))]
    if params.protocol == "tcp":
        return [threading.Thread(target=s.run, args=(stop, params.length), daemon=True)
                for s in streams]
    return [threading.Thread(target=receive, args=(sock, feed, stop), daemon=True)
            for sock, feed in udp_feeds]


def results(role, mrc, recorder, summary, error, congestion, params, streams) -> dict:
    out = {"role": role, "mrc": mrc.info() if mrc else None, "tcp_congestion": congestion,
           "intervals": recorder.intervals, "summary": summary, "error": error, "cpu": recorder.cpu}
    if params.mptcp:        # each stream's subflows at the end (MPTCP_INFO)
        out["mptcp_subflows"] = [mptcp_subflows(s.sock) for s in streams]
    return out


SIDE_KEYS = ("role", "mrc", "tcp_congestion", "intervals", "mptcp_subflows", "cpu")


def print_server_output(out: Output, server_output: dict) -> None:
    """--get-server-output in text mode, as iperf3 prints it."""
    if "text" in server_output:
        out.line("")
        out.line("Server output:")
        out.line(server_output["text"].rstrip("\n"))
    elif "json" in server_output:
        import json
        out.line("")
        out.line("Server JSON output:")
        out.line(json.dumps(server_output["json"], indent=2))


def start_extra(cookie_text: str, params: Params, sock: socket.socket, bufs: dict) -> dict:
    """iperf3's start figures: the cookie, the first data stream's MSS and
    its socket buffers (read before it connected, as iperf3 does)."""
    extra = {"cookie": cookie_text, "sock_bufsize": params.window, **bufs}
    if params.protocol == "tcp":
        try:
            extra["tcp_mss_default"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        except OSError:
            extra["tcp_mss_default"] = 0
    return extra


def document(who, ctrl_sock, params, connected, local, remote, timestamp, extra=None) -> dict:
    lh, lp = ctrl_sock.getsockname()[:2]
    rh, rp = ctrl_sock.getpeername()[:2]
    by_role = {local["role"]: local, remote["role"]: remote}
    errors = [r["error"] for r in (local, remote) if r.get("error")]
    return {
        "tool": "mrc-perf", "version": VERSION,
        "start": {"timestamp": timestamp, "role": who, "local_host": lh, "local_port": lp,
                  "remote_host": rh, "remote_port": rp, "test": params.to_json(),
                  "connected": connected, **(extra or {})},
        "local": {k: local[k] for k in SIDE_KEYS if k in local},
        "remote": {k: remote[k] for k in SIDE_KEYS if k in remote},
        "end": {"sender": by_role["sender"]["summary"], "receiver": by_role["receiver"]["summary"]},
        "error": errors[0] if errors else None,
    }


def print_end(out: Output, doc: dict, params: Params) -> None:
    out.detail("Test Complete. Summary Results:")
    for text in summary_lines(doc["end"], params.protocol, params.streams > 1, out.unit):
        out.line(text)
    if "bidir_reverse" in doc:              # --bidir: the server's sending half
        for text in summary_lines(doc["bidir_reverse"]["end"], params.protocol, params.streams > 1,
                                  out.unit)[1:]:
            out.line(text if text.startswith("[ ID]") else text + " (reverse)")
    cpu = {k: doc[k].get("cpu") for k in ("local", "remote")}
    if cpu["local"] and cpu["remote"]:       # iperf3 -V's line
        out.detail("CPU Utilization: " + ", ".join(
            f"{k}/{doc[k]['role']} {c['total']:.1f}% ({c['user']:.1f}%u/{c['system']:.1f}%s)"
            for k, c in cpu.items()))
    if params.protocol == "tcp":    # iperf3's snd_tcp_congestion / rcv_tcp_congestion
        cc = {doc[k]["role"]: doc[k]["tcp_congestion"] for k in ("local", "remote")}
        out.line(f"TCP congestion control: sender {cc['sender']}, receiver {cc['receiver']}")
    if doc["local"]["mrc"] or doc["remote"]["mrc"]:
        for text in mrc_summary_lines(doc["end"], doc["local"], doc["remote"]):
            out.line(text)
    if doc["error"]:
        out.line(f"warning: {doc['error']}")


def udp_length(ctrl_sock: socket.socket) -> int:
    """As iperf3: the control connection's MSS, which fits in the path MTU
    (SRv6 encapsulation lowers it through the route's MTU) with room for a
    UDP header."""
    try:
        mss = ctrl_sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        mss = 0
    return mss if HEADER.size <= mss <= 9000 else 1200


def conn_info(i: int, s: socket.socket) -> dict:
    lh, lp = s.getsockname()[:2]
    rh, rp = s.getpeername()[:2]
    return {"id": i, "local_host": lh, "local_port": lp, "remote_host": rh, "remote_port": rp}


def close_all(socks, *others, mrc: MrcView | None = None) -> None:
    """Close a test's data sockets, the other sockets it opened (None:
    not opened) and its datapath view, whatever happened."""
    for s in [*socks, *others]:
        if s is not None:
            s.close()
    if mrc:
        mrc.close()
