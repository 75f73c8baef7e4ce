"""Soft-RoCE (rxe) traffic over MRC's paths: a lab for the VM.

The 6.1 kernel `make vm-test` boots ships `rdma_rxe`, but its rxe keeps its
UDP sockets and route lookups in the initial network namespace only
(per-namespace rxe came with Linux 6.12): an rxe device on a veth inside a
namespace sends nothing and hears nothing.  So the two RoCE hosts live in
the initial namespace of the VM, one veth each (HOST_A6 on `RA`, HOST_B6
on `RB`), kept apart by policy routing: what each sends from its own
address leaves by its own veth (a rule per host before the local table),
so A's traffic to B crosses the fabric instead of the loopback.  Across
each veth a gateway namespace runs mrc-ebpf: the Diamond's hosts A and B
(lab/topology.py: four paths through kernel End routers), whose TC egress
encapsulates the forwarded RoCE packets and whose XDP decapsulates them.

    rxe A (init ns, RA) -- A [mrc] -- L1 == R1..R4 (End) == L2 -- [mrc] B -- (RB, init ns) rxe B

Only for a machine where rdma_rxe loads (the VM): `unavailable()` says
why not.  perftest's and rdma-core's exchange of QP numbers goes over TCP
on 127.0.0.1 (both hosts are in one namespace); the RDMA traffic itself
goes to the GID of the peer's address, over the fabric.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from mrc_ebpf.lab import procs
from mrc_ebpf.lab.topology import Diamond, Topology

RA, RB = "mrcrxa0", "mrcrxb0"          # the RoCE hosts' veths (initial namespace)
GA, GB = "ga", "gb"                    # their peers, in the gateways A and B
RXE_A, RXE_B = "mrcrxa", "mrcrxb"      # the rxe devices
HOST_A6, HOST_B6 = "fd00:aa::a", "fd00:bb::b"
GW_A6, GW_B6 = "fd00:aa::1", "fd00:bb::1"
PREFIX_A, PREFIX_B = "fd00:aa::/64", "fd00:bb::/64"
TABLE_A, TABLE_B = 1701, 1702
RULE_PREF = 10
LOCAL_PREF = 100                       # the local table's rule, moved after ours
HW_COUNTERS = "/sys/class/infiniband/{dev}/ports/1/hw_counters"


def note(msg: str) -> None:
    """A timestamped line to $MRC_ROCE_LOG, if set: under emulation a step
    can take minutes, and this shows which one a run is in."""
    path = os.environ.get("MRC_ROCE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")


def unavailable() -> str | None:
    """Why soft-RoCE cannot run here, or None."""
    for tool in ("rdma", "ib_write_bw", "ibv_rc_pingpong"):
        if not shutil.which(tool):
            return f"no {tool} (vm_tests/setup.sh installs rdma-core, ibverbs-utils, perftest)"
    if not Path("/sys/module/rdma_rxe").exists():
        r = subprocess.run(["modprobe", "rdma_rxe"], capture_output=True, text=True)
        if r.returncode != 0:
            return "no rdma_rxe module (the host kernel has no RDMA stack: `make vm-test` runs this)"
    return None


def _ip(*args: str, check: bool = True):
    return procs.run(["ip", *args], check=check)


def rxe_counters(dev: str) -> dict[str, int]:
    """rxe's own counters of DEV (hw_counters: sent_pkts, rcvd_seq_err,
    retry_exceeded_err, ...)."""
    d = Path(HW_COUNTERS.format(dev=dev))
    return {f.name: int(f.read_text()) for f in d.iterdir()}


def rdma_statistic(dev: str) -> dict[str, int]:
    """`rdma statistic show link DEV/1`: the same counters through rdma's netlink."""
    out = procs.run(["rdma", "statistic", "show", "link", f"{dev}/1"]).stdout.split()
    at = out.index(f"{dev}/1") + 1
    return {k: int(v) for k, v in zip(out[at::2], out[at + 1::2])}


# perftest's QP timeout (-u): 4.096 us << 17 = 537 ms.  Its default (14:
# 67 ms) is below the emulated fabric's round trip under a window of
# writes (hundreds of ms under TCG): rxe resent ~90% of its packets on a
# healthy fabric (tx_roce_retrans), and the queues of resent windows
# delayed paths by over a second.  A black hole must still be routed
# around well within its 7 retries (~4 s).
QP_TIMEOUT = 17
# perftest's send queue depth per QP (-t; its default 128) and a completion
# per write (-Q 1, so the queue refills as each write completes).  rxe lets
# a QP have 128 PSNs unacknowledged (RXE_MAX_UNACKED_PSNS): 8 QPs of 4 KiB
# writes (4 packets at rxe's 1024-byte MTU) kept ~1,000 packets in the
# emulated fabric, as many as one CPU's backlog holds (netdev_max_backlog),
# so under TCG round trips grew to seconds, the backlogs dropped packets,
# QP timers fired on live paths (65-78% of PSNs resent) and resent windows
# queued behind each other: 8 QPs at 4 writes each keep 128 in flight.
TX_DEPTH = 4


def qp_timeout_s(exp: int = QP_TIMEOUT) -> float:
    """rxe's retransmission timer for perftest's -u EXP: 4.096 us << EXP."""
    return 4.096e-6 * (1 << exp)
PERFTEST_PORT = 18515                  # rdma-core's and perftest's default TCP port


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    """Until a TCP socket of this namespace listens on PORT (the server's
    exchange of QP numbers): a server started from the host's filesystem
    over 9p took over a second to listen under TCG, and a client started a
    second after it found nobody there ("Couldn't connect")."""
    deadline = time.monotonic() + timeout * procs.timeout_scale()
    while time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                rows = [ln.split() for ln in f.readlines()[1:]]
            # local address ADDR:PORT (hex), state 0A: LISTEN
            if any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows):
                return
        if proc.poll() is not None:
            raise procs.CommandError(f"{proc.args[0]} exited ({proc.returncode}) before listening")
        time.sleep(0.1)
    raise procs.CommandError(f"nothing listens on TCP port {port} after {timeout} s")


def parse_write_bw(text: str) -> dict:
    """ib_write_bw's report: the result line (bytes, iterations, peak and
    average MB/s, Mpps) and whether a completion failed."""
    result = {"ok": False, "error": None}
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m:
            result.update(ok=True, bytes=int(m.group(1)), iterations=int(m.group(2)),
                          bw_peak_mb_s=float(m.group(3)), bw_avg_mb_s=float(m.group(4)),
                          msg_rate_mpps=float(m.group(5)))
    err = re.search(r"Completion with error.*|Failed status \d+.*", text)
    if err:
        result.update(ok=False, error=" ".join(err.group(0).split()))
    return result


class RoceFabric:
    """The Diamond with two rxe hosts behind its mrc-ebpf hosts (see the
    module's docstring).  `close()` removes what it made in the initial
    namespace; the namespaces go with the topology."""

    def __init__(self, topo: Topology, n_paths: int = 4):
        self.t = topo
        self.d = Diamond(topo, n_paths=n_paths)
        self.A, self.B = self.d.A, self.d.B
        self.n = n_paths
        self._rules: list[list[str]] = []
        self._links: list[str] = []
        self._rxe: list[str] = []
        note("building")
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        t = self.t
        for gw in (self.A, self.B):
            t.sysctl(gw, "net.ipv6.conf.all.forwarding", 1)
        for dev, gw, gdev, host, gw6, other in ((RA, self.A, GA, HOST_A6, GW_A6, PREFIX_B),
                                                (RB, self.B, GB, HOST_B6, GW_B6, PREFIX_A)):
            _ip("link", "add", dev, "type", "veth", "peer", "name", gdev, "netns", gw)
            self._links.append(dev)
            procs.run(["sysctl", "-qw", f"net.ipv6.conf.{dev}.accept_dad=0"])
            _ip("-6", "addr", "add", f"{host}/64", "dev", dev, "nodad")
            _ip("link", "set", dev, "up")
            t.addr(gw, gdev, f"{gw6}/64")
            t.exec(gw, ["ip", "link", "set", gdev, "up"])
        # each host's own traffic by its own veth: rules before the local table
        for host, table, dev, gw6, other in ((HOST_A6, TABLE_A, RA, GW_A6, PREFIX_B),
                                             (HOST_B6, TABLE_B, RB, GW_B6, PREFIX_A)):
            _ip("-6", "route", "add", other, "via", gw6, "dev", dev, "table", str(table))
            rule = ["pref", str(RULE_PREF), "iif", "lo", "from", host, "lookup", str(table)]
            _ip("-6", "rule", "add", *rule)
            self._rules.append(rule)
        if "lookup local" in _ip("-6", "rule", "show", "pref", "0").stdout:
            _ip("-6", "rule", "add", "pref", str(LOCAL_PREF), "lookup", "local")
            _ip("-6", "rule", "del", "pref", "0", "lookup", "local")
            self._rules.append(["local"])
        for rxe, dev in ((RXE_A, RA), (RXE_B, RB)):
            procs.run(["rdma", "link", "add", rxe, "type", "rxe", "netdev", dev])
            self._rxe.append(rxe)
        # the GID of each host's address (index 1 after the link-local one)
        self.gid_a, self.gid_b = self._gid_index(RXE_A, HOST_A6), self._gid_index(RXE_B, HOST_B6)

    def _gid_index(self, dev: str, addr: str, wait_s: float = 10) -> int:
        import ipaddress
        want = ipaddress.IPv6Address(addr)
        deadline = time.monotonic() + wait_s * procs.timeout_scale()
        while time.monotonic() < deadline:
            gids = Path(f"/sys/class/infiniband/{dev}/ports/1/gids")
            for i in range(16):
                try:
                    text = (gids / str(i)).read_text().strip()
                except OSError:
                    break
                if ipaddress.IPv6Address(text) == want:
                    return i
            time.sleep(0.2)
        raise procs.CommandError(f"{dev}: no GID for {addr}")

    def close(self) -> None:
        for rxe in reversed(self._rxe):
            procs.run(["rdma", "link", "delete", rxe], check=False)
        for rule in reversed(self._rules):
            if rule == ["local"]:
                _ip("-6", "rule", "add", "pref", "0", "lookup", "local", check=False)
                _ip("-6", "rule", "del", "pref", str(LOCAL_PREF), "lookup", "local", check=False)
            else:
                _ip("-6", "rule", "del", *rule, check=False)
        for dev in self._links:
            _ip("link", "del", dev, check=False)
        for table in (TABLE_A, TABLE_B):
            _ip("-6", "route", "flush", "table", str(table), check=False)
        self._rxe, self._rules, self._links = [], [], []

    # ---- mrc-ebpf on the gateways ------------------------------------------------
    def attach(self, policy: str, *options: str) -> None:
        from mrc_ebpf.control import paths
        d = self.d
        note(f"attach A {options}")
        # the verifier's run over mrc_tx took 8.5 min under TCG on a
        # loaded machine (10 min, procs' default, was too short once)
        procs.mrcctl(self.A, "attach", "a0", "--sid", d.A_SID, *options, timeout=480)
        note("attach B")
        procs.mrcctl(self.B, "attach", "b0", "--sid", d.B_SID, *options, timeout=480)
        note("paths")
        # `mrcctl path add`, all paths in one change, in this process: an
        # mrcctl call took 1.5-2 min under TCG on a loaded machine
        self._change(self.A, lambda att: paths.add(att, PREFIX_B, [d.path_via(k, d.B_SID)
                                                                  for k in range(1, self.n + 1)]))
        self._change(self.B, lambda att: paths.add(att, PREFIX_A, [d.path_via(k, d.A_SID)
                                                                  for k in range(1, self.n + 1)]))
        self.policy(policy)
        note("attached")

    def set_ack_timeout(self, us: int) -> None:
        """Both gateways' ack timeout, written into the attached config (a
        re-attach costs minutes of verifier under emulation).  10 s: the
        datapath's failover is off for any run of seconds."""
        from mrc_ebpf.datapath import layout

        def write(att):
            cfg = att.maps["config"].lookup(layout.Index(0))
            cfg.ack_timeout_us = us
            att.maps["config"].update(layout.Index(0), cfg)
        for ns in (self.A, self.B):
            self._read(ns, write)
        note(f"ack timeout {us} us")

    def detach(self) -> None:
        procs.mrcctl(self.A, "detach", "a0")
        procs.mrcctl(self.B, "detach", "b0")

    def policy(self, name: str) -> None:
        """`mrcctl path policy` on both gateways, in this process."""
        from mrc_ebpf.control import paths
        self._read(self.A, lambda att: paths.set_policy(att, PREFIX_B, name))
        self._read(self.B, lambda att: paths.set_policy(att, PREFIX_A, name))
        note(f"policy {name}")

    def _change(self, ns: str, what):
        """what(attachment) of the gateway NS's attachment as `mrcctl` changes
        it (the writer lock, all or nothing), in this process."""
        from mrc_ebpf.datapath import loader
        from mrc_ebpf.lab.enter import inside
        with inside(ns):
            with loader.changing("a0" if ns == self.A else "b0") as att:
                return what(att)

    def _read(self, ns: str, what):
        """what(attachment) of the gateway NS's attachment, read in this
        process: what `mrcctl stats` reads, without a Python start-up per
        read (tens of seconds each under emulation)."""
        from mrc_ebpf.datapath import loader
        from mrc_ebpf.lab.enter import inside
        with inside(ns):
            att = loader.Attachment.open("a0" if ns == self.A else "b0")
            try:
                return what(att)
            finally:
                att.close()

    def roce_stats(self, ns: str) -> dict:
        """As `mrcctl stats --roce -j`: {"qps": [...], "paths": [...]}."""
        from mrc_ebpf.control import roce
        return self._read(ns, lambda att: {"qps": roce.qps(att), "paths": roce.paths(att)})

    def events(self, ns: str) -> list[dict]:
        """As `mrcctl stats --events -j`'s events (path downs and ups)."""
        from mrc_ebpf.control import events
        return self._read(ns, lambda att: events.read(att))

    def counters(self, ns: str) -> dict:
        """As `mrcctl stats -j`'s counters."""
        return self._read(ns, lambda att: att.counters())

    def blackhole(self, k: int, on: bool = True) -> None:
        """Router Rk drops what it would forward to either host's SID: path k
        is black-holed both ways, by the kernel (no program to compile)."""
        r = self.d.R[k - 1]
        if on:
            # both ways in one `ip` process: under TCG each `ip netns exec`
            # took ~0.5 s, so one way was dead that long before the other
            lines = [f"route replace blackhole {sid.rsplit('::', 1)[0]}::/48"
                     for sid in (self.d.B_SID, self.d.A_SID)]
            procs.run(["ip", "-6", "-batch", "-"], ns=r, input="\n".join(lines) + "\n")
            return
        for sid in (self.d.B_SID, self.d.A_SID):
            prefix = sid.rsplit("::", 1)[0] + "::/48"
            self.t.exec(r, ["ip", "-6", "route", "del", "blackhole", prefix], check=False)
            via = f"fd00:20:{k:x}::1" if sid == self.d.B_SID else f"fd00:10:{k:x}::1"
            self.t.exec(r, ["ip", "-6", "route", "replace", prefix, "via", via])

    # ---- traffic -----------------------------------------------------------------
    def rtt_ms(self, count: int = 10) -> dict:
        """ping from host A's address to B's across the gateways (sprayed
        over the paths: ICMP is not RoCE): min/avg/max round trip in ms, the
        emulation's own scale for the timers and windows of a run."""
        r = procs.run(["ping", "-6", "-n", "-q", "-c", str(count), "-i", "0.2", "-I", HOST_A6, HOST_B6],
                      check=False, timeout=60)
        m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", r.stdout)
        got = {"min": float(m.group(1)), "avg": float(m.group(2)), "max": float(m.group(3))} if m else {}
        note(f"rtt {got or r.stdout[-200:]}")
        return got

    @staticmethod
    def _wait_writes(client: subprocess.Popen, packets: int = 200, timeout: float = 60) -> None:
        """Until rxe A has sent PACKETS more: ib_write_bw took seconds under
        TCG to start and connect its QPs, and a failure timed from the
        client's start came before any write (no ACK to measure around it)."""
        start = rxe_counters(RXE_A)["sent_pkts"]
        deadline = time.monotonic() + timeout * procs.timeout_scale()
        while time.monotonic() < deadline and client.poll() is None:
            if rxe_counters(RXE_A)["sent_pkts"] - start >= packets:
                note("writes flowing")
                return
            time.sleep(0.05)
    def rc_pingpong(self, iters: int = 100, size: int = 4096, timeout: float = 60) -> dict:
        note(f"rc_pingpong {iters}")
        server = procs.popen(["ibv_rc_pingpong", "-d", RXE_B, "-g", str(self.gid_b), "-n", str(iters),
                              "-s", str(size)], None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        try:
            wait_listening(PERFTEST_PORT, server)
            client = procs.run(["ibv_rc_pingpong", "-d", RXE_A, "-g", str(self.gid_a), "-n", str(iters),
                                "-s", str(size), "127.0.0.1"], check=False, timeout=timeout)
            try:
                out, _ = server.communicate(timeout=30 * procs.timeout_scale())
            except subprocess.TimeoutExpired:   # the client's report says why
                out = "(server did not finish)"
        finally:
            procs.end(server)
        return {"rc": client.returncode, "client": client.stdout + client.stderr, "server": out}

    def write_bw(self, qps: int, seconds: float = 3, size: int = 4096, during=None,
                 extra: tuple[str, ...] = (), qp_timeout: int = QP_TIMEOUT,
                 depth: int = TX_DEPTH) -> dict:
        """ib_write_bw from A to B: `qps` RC QPs for `seconds`, `depth`
        writes outstanding on each; `during` (if given) is called once the
        writes flow.  Its report, parsed."""
        note(f"write_bw {qps} QPs {seconds} s depth {depth}")
        args = ["-x", None, "-q", str(qps), "-s", str(size), "-D", str(seconds), "-F",
                "-u", str(qp_timeout), "-t", str(depth), "-Q", "1", *extra]
        srv = [a if a is not None else str(self.gid_b) for a in args]
        cli = [a if a is not None else str(self.gid_a) for a in args]
        server = procs.popen(["ib_write_bw", "-d", RXE_B, *srv], None, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        try:
            wait_listening(PERFTEST_PORT, server)
            client = procs.popen(["ib_write_bw", "-d", RXE_A, *cli, "127.0.0.1"], None,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                started = time.monotonic()
                if during is not None:
                    self._wait_writes(client)
                    during()
                out, _ = client.communicate(timeout=(seconds + 60) * procs.timeout_scale())
                wall = time.monotonic() - started
            finally:
                procs.end(client)
        finally:
            procs.end(server)
        note(f"write_bw done rc {client.returncode}")
        return {**parse_write_bw(out), "rc": client.returncode, "wall_s": round(wall, 2), "report": out}


# ---- a capture of the RoCE packets at A's gateway, for completion gaps -------------

class Capture:
    """tcpdump on A's gateway veth (GA: the RoCE packets as rxe A sends and
    receives them, unencapsulated): per QP, the arrival times of the ACKs
    rxe A receives, an independent witness of when its completions came."""

    def __init__(self, ns: str, dev: str = GA, path: str | None = None):
        self.path = path or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp") + "/mrc-roce-ga.pcap"
        self.stats = ""
        # only what rxe A receives (the requests are most of the traffic),
        # into memory, with a large buffer: under TCG the kernel dropped
        # what tcpdump did not read in time
        self.p = procs.popen(["tcpdump", "-i", dev, "-n", "-s", "96", "-B", "16384", "-w", self.path,
                              "ip6", "dst", HOST_A6, "and", "udp", "dst", "port", "4791"],
                             ns, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(2)

    def stop(self) -> list[tuple[float, int, int, int]]:
        """(time, UDP source port, opcode, PSN) of each RoCE packet rxe A received."""
        import signal
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGINT)
        try:
            _, err = self.p.communicate(timeout=20 * procs.timeout_scale())
            # tcpdump's own count: "N packets captured ... M dropped by kernel"
            self.stats = " ".join(ln for ln in err.splitlines() if "packets" in ln)
        except subprocess.TimeoutExpired:
            procs.end(self.p)
        from scapy.contrib.roce import BTH
        from scapy.layers.inet import UDP
        from scapy.layers.inet6 import IPv6
        from scapy.utils import PcapReader
        out = []
        with PcapReader(self.path) as pcap:
            for pkt in pcap:
                if IPv6 in pkt and UDP in pkt and pkt[IPv6].dst == HOST_A6 and BTH in pkt:
                    out.append((float(pkt.time), pkt[UDP].sport, pkt[BTH].opcode, pkt[BTH].psn))
        os.unlink(self.path)
        return out


def ack_gaps(packets, t0: float, t1: float) -> dict[int, float]:
    """Per QP (UDP source port): the longest time without an ACK between
    t0 and t1 (seconds, the capture's clock), edges included."""
    by_qp: dict[int, list[float]] = {}
    for ts, sport, op, _ in packets:
        if op == 0x11 and t0 <= ts <= t1:
            by_qp.setdefault(sport, []).append(ts)
    gaps = {}
    for qp, times in by_qp.items():
        edges = [t0, *sorted(times), t1]
        gaps[qp] = max(b - a for a, b in zip(edges, edges[1:]))
    return gaps


def ack_resume(packets, t: float) -> dict[int, float | None]:
    """Per QP (UDP source port) ACKed before t: the gap across t, from its
    last ACK at or before t to its first one after (seconds), or None when
    none came after t in the capture.  A QP the failure did not touch shows
    its usual spacing; one on the dead path, how long it waited."""
    before: dict[int, float] = {}
    after: dict[int, float] = {}
    for ts, sport, op, _ in packets:
        if op != 0x11:
            continue
        if ts <= t:
            before[sport] = max(before.get(sport, ts), ts)
        elif sport not in after or ts < after[sport]:
            after[sport] = ts
    return {qp: (after[qp] - b if qp in after else None) for qp, b in before.items()}


def dump(obj) -> str:
    return json.dumps(obj, indent=1, default=str)
