"""How fast the datapath itself is, on links nothing shapes.

Two places, each built unshaped: a veth pair between two namespaces
(4 entropy paths to the peer: the datapath's own cost, nothing to
spread over) and a fabric of 4 spines (h1 -> h2 across it: spreading
included).  In each, every mode moves iperf3 traffic in one run: 1 and 4
TCP flows and a UDP flood, at each MTU:

- plain: kernel forwarding, no encapsulation (the fabric hashes flows: ECMP);
- seg6: the kernel's own SRv6 (`encap seg6` to an End.DT6 SID of the peer);
- mptcp (fabric only): one MPTCP connection per flow, a subflow per spine
  (mptcpize runs iperf3; left out where mptcpd is not installed);
- mrc: mrc-ebpf as `mrcctl attach` and `path add` leave it (granularity
  and XDP mode auto, policy bytes; `--param 'policy="rr"'` for another);
- mrc-packet: mrc-ebpf with --granularity packet, what the default was.

Per run: the receiver's Gbit/s, the CPU it cost (all CPUs' busy time
from /proc/stat over the run, per Gbit moved: the machine carries both
ends and the fabric), and for mrc the share of bytes each path carried
(its tx_bytes) and the spines' shares (the leaf's uplink byte counters).
On the fabric, l1's uplink counters are also read every 10 ms
(window_shares): the fraction of busy 10 ms windows in which every spine
carried its equal share within +-10%.
The hosts run the datacenter profile unless --hosts-default.

`pin` (on where there are two CPUs) makes the one machine behave as two
hosts: iperf3's client runs on CPU 0 and its server on CPU 1, and each
host's receive work is steered to its own CPU (RPS on its interface).
Without it, whichever process a softirq interrupted did the other end's
work (an ACK sent by the receiver ran the sender's transmit and the
receiver's decapsulation in the receiver's time), and where the
scheduler put the two decided a 4-flow run more than the datapath did:
the same mode, the kernel's SRv6 too, gave 10 or 30 Gbit/s from run to
run, the receiver out of window (zero-window adverts) in the slow ones.

Each run's measurement (Iperf: iperf3's summary, the CPU time, the byte
counters around it) is kept apart from its analysis (iperf_result,
summarize), a pure function of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

from mrc_ebpf.bench import window_shares
from mrc_ebpf.bench.runner import PY, fmt_spread, log, spread
from mrc_ebpf.errors import MrcError

TITLE = "line rate: one sprayed flow on unshaped links against the kernel's own forwarding, SRv6 and MPTCP"
MODES = ("plain", "seg6", "mptcp", "mrc", "mrc-packet")
MODES_ALLOWED = MODES
LOADS = ("tcp1", "tcp4", "udp")
PAIR_PATHS = 4
A_SID, B_SID, B_DT6, A_DT6 = "fc00:a::1", "fc00:b::1", "fc00:b::d76", "fc00:a::d76"
A6, B6 = "fd00:1::a", "fd00:1::b"


def params(short: bool) -> dict:
    return {"places": ["pair", "fabric"], "mtus": [1500] if short else [1500, 9000],
            "modes": list(MODES), "loads": ["tcp1"] if short else list(LOADS),
            "seconds": 2 if short else 5, "repeat": 1 if short else 3, "spines": 4,
            "pin": (os.cpu_count() or 1) >= 2,
            "policy": None}     # mrc's spray policy; None: the default (bytes)


def set_mtu(p: dict, mtu: int) -> None:
    p["mtus"] = [mtu]


def check(p: dict) -> None:
    bad = [x for x in p["places"] if x not in ("pair", "fabric")]
    if bad or not p["places"]:
        raise MrcError(f"line-rate places: pair and/or fabric, not {bad or 'none'}")
    bad = [x for x in p["loads"] if x not in LOADS]
    if bad or not p["loads"]:
        raise MrcError(f"line-rate loads: some of {', '.join(LOADS)}, not {bad or 'none'}")
    from mrc_ebpf.control.peer_table import POLICIES
    if p["policy"] is not None and p["policy"] not in POLICIES:
        raise MrcError(f"line-rate policy: one of {', '.join(POLICIES)}, not {p['policy']!r}")


def steps(p: dict) -> int:
    return len(p["places"]) * len(p["mtus"]) * len(p["modes"]) * len(p["loads"]) * p["repeat"]


# --------------------------------------------------------------------------- what a run measured

@dataclasses.dataclass
class Iperf:
    """One iperf3 run, as measured."""
    load: str                       # tcp1, tcp4, udp
    seconds: int
    end: dict                       # iperf3 -J's "end" section
    busy_s: float                   # the machine's busy CPU seconds over it
    spines_before: dict | None = None   # the fabric: l1's uplink tx bytes per spine around it
    spines_after: dict | None = None
    paths_before: dict | None = None    # mrc: the sender's tx bytes per path around it
    paths_after: dict | None = None
    windows: dict | None = None         # the fabric: l1's uplink counters every 10 ms (window_shares)


@dataclasses.dataclass
class Measured:
    runs: dict          # place -> MTU (str) -> mode -> load -> [Iperf]
    status: dict        # "place mode" -> the sender's `mrcctl status -j`
    notes: list[str]


# --------------------------------------------------------------------------- measuring

def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]            # idle + iowait
    return (sum(fields[:8]) - idle) / 100.0  # USER_HZ


def _iperf(env, client_ns: str, server_ns: str, dst: str, port: int, load: str, seconds: int,
           mtu: int, mptcp: bool = False, pin: bool = False) -> Iperf:
    wrap = ["mptcpize", "run"] if mptcp else []
    srv = env.popen(server_ns, [*wrap, "iperf3", "-s", "-1", "-p", str(port), "-J", *(["-A", "1"] if pin else [])])
    try:
        time.sleep(0.3)
        args = ["-c", dst, "-p", str(port), "-t", str(seconds), "-J", *(["-A", "0"] if pin else [])]
        if load == "tcp4":
            args += ["-P", "4"]
        elif load == "udp":
            args += ["-u", "-b", "0", "-l", str(mtu - 40 - 8 - 112)]   # fits the entropy path's 112 B
        if env.cc and load != "udp":
            args += ["-C", env.cc]
        c0 = cpu_busy_s()
        r = env.run(client_ns, [*wrap, "iperf3", *args], check=False, timeout=seconds + 60)
        busy = cpu_busy_s() - c0
    finally:
        env.wait(srv, timeout=15)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        raise MrcError(f"iperf3 failed: {r.stderr.strip()[-200:]}")
    if doc.get("error"):
        raise MrcError(f"iperf3: {doc['error']}")
    return Iperf(load, seconds, doc["end"], busy)


def _two_hosts(env, sender: tuple[str, str], receiver: tuple[str, str]) -> None:
    """Each end's receive work on its own CPU, as on two hosts: RPS of
    the sender's interface (its ACKs) to CPU 0, the receiver's to CPU 1,
    where pin puts their iperf3s.  SENDER, RECEIVER: (namespace, device)."""
    for (ns, dev), mask in ((sender, 1), (receiver, 2)):
        env.run(ns, ["sh", "-c", f"for q in /sys/class/net/{dev}/queues/rx-*; do echo {mask} > $q/rps_cpus; done"])


def _shares(before: dict, after: dict) -> list[float]:
    d = [after.get(k, 0) - before.get(k, 0) for k in sorted(before)]
    total = sum(d)
    return [round(x / total, 4) for x in d] if total else []


def _path_bytes(env, ns: str) -> dict:
    doc = json.loads(env.mrcctl(ns, "path", "list", "-j").stdout)
    rows = doc if isinstance(doc, list) else doc.get("paths", [])
    return {r["path_id"]: r["tx_bytes"] for r in rows}


def _uplink_bytes(env, fab) -> dict:
    r = env.run(None, ["ip", "-n", fab.ns("l1"), "-s", "-j", "link", "show"])
    tx = {d["ifname"]: d["stats64"]["tx"]["bytes"] for d in json.loads(r.stdout)}
    return {f"s{k}": tx.get(f"s{k}", 0) for k in range(1, fab.spines + 1)}


# --------------------------------------------------------------------------- the pair

@contextlib.contextmanager
def _pair(env, mtu: int, host_sysctls, pin: bool):
    from mrc_ebpf.bench.runner import namespaces
    with namespaces("lr", ["A", "B"]) as ns:
        A, B = ns["A"], ns["B"]
        env.run(None, ["ip", "link", "add", "a0", "netns", A, "type", "veth", "peer", "name", "b0",
                       "netns", B])
        for n, dev, me, peer, sid in ((A, "a0", A6, B6, B_SID), (B, "b0", B6, A6, A_SID)):
            for kv in [*host_sysctls, f"net.ipv6.conf.{dev}.seg6_enabled=1"]:
                env.run(n, ["sysctl", "-qw", kv])
            env.run(n, ["ip", "link", "set", dev, "mtu", str(mtu), "up"])
            # a queue on the sending veth: it pushes back instead of dropping
            # when the receiver's ring is full (ENVIRONMENT.md)
            env.run(n, ["tc", "qdisc", "replace", "dev", dev, "root", "pfifo"])
            env.run(n, ["ip", "-6", "addr", "add", f"{me}/64", "dev", dev, "nodad"])
            env.run(n, ["ip", "-6", "route", "add", f"{sid[:-1]}/48", "via", peer])
        if pin:
            _two_hosts(env, (A, "a0"), (B, "b0"))
        yield A, B


def _pair_mode(env, A: str, B: str, mode: str, policy: str | None = None):
    """Set the pair up for MODE; returns an undo."""
    if mode == "seg6":
        for n, dev, dt6, peer, peer_dt6, gw in ((A, "a0", A_DT6, B6, B_DT6, B6), (B, "b0", B_DT6, A6, A_DT6, A6)):
            env.run(n, ["ip", "-6", "route", "add", f"{dt6}/128", "encap", "seg6local", "action", "End.DT6",
                        "table", "local", "dev", dev])
            env.run(n, ["ip", "-6", "route", "add", f"{peer}/128", "encap", "seg6", "mode", "encap", "segs",
                        peer_dt6, "via", gw, "dev", dev])

        def undo():
            for n, dt6, peer in ((A, A_DT6, B6), (B, B_DT6, A6)):
                env.run(n, ["ip", "-6", "route", "del", f"{dt6}/128"], check=False)
                env.run(n, ["ip", "-6", "route", "del", f"{peer}/128"], check=False)
        return undo
    if mode.startswith("mrc"):
        extra = ["--granularity", "packet"] if mode == "mrc-packet" else []
        for n, dev, sid, peer, peer_sid in ((A, "a0", A_SID, B6, B_SID), (B, "b0", B_SID, A6, A_SID)):
            env.mrcctl(n, "attach", dev, "--sid", sid, *extra)
            env.mrcctl(n, "path", "add", f"{peer}/128", "--entropy", str(PAIR_PATHS), "--sid", peer_sid)
            if policy:
                env.mrcctl(n, "path", "policy", f"{peer}/128", policy)

        def undo():
            env.mrcctl(A, "detach", "a0", check=False)
            env.mrcctl(B, "detach", "b0", check=False)
        return undo
    return lambda: None


def _measure(p: dict, env, place: str, mtu: int, mode: str, src: str, dst_ns: str, dst: str,
             port: int, out: Measured, spines=None, uplinks: tuple[str, list[str]] | None = None) -> int:
    """Every load of MODE, repeated: iperf3 from SRC to DST, with the
    paths' (mrc) and spines' (SPINES(): byte counters) shares, and the
    spines' shares every 10 ms (UPLINKS: the leaf's namespace and its
    uplinks, sampled by window_shares); the next port."""
    if mode.startswith("mrc"):
        out.status[f"{place} {mode}"] = json.loads(env.mrcctl(src, "status", "-j").stdout)
    for load in p["loads"]:
        for rep in range(p["repeat"]):
            port += 1
            log(f"line-rate: {place}, MTU {mtu}, {mode}, {load}, run {rep + 1}", step=True)
            u0 = spines() if spines else None
            b0 = _path_bytes(env, src) if mode.startswith("mrc") else None
            sampler = env.popen(uplinks[0], [PY, "-m", "mrc_ebpf.bench.window_shares",
                                             str(p["seconds"] + 1.5), *uplinks[1]]) if uplinks else None
            try:
                rec = _iperf(env, src, dst_ns, dst, port, load, p["seconds"], mtu, mptcp=mode == "mptcp",
                             pin=p["pin"])
            finally:
                if sampler:
                    said, err = sampler.communicate(timeout=30)
            if sampler:
                if sampler.returncode:
                    raise MrcError(f"window_shares failed: {err.strip()[-200:]}")
                rec.windows = json.loads(said)
            if u0 is not None:
                rec.spines_before, rec.spines_after = u0, spines()
            if b0 is not None:
                rec.paths_before, rec.paths_after = b0, _path_bytes(env, src)
            out.runs[place][str(mtu)][mode][load].append(rec)
    return port


def _run_pair(p: dict, env, mtu: int, out: Measured) -> None:
    port = 5600
    with _pair(env, mtu, p["host_sysctls"], p["pin"]) as (A, B):
        for mode in p["modes"]:
            if mode == "mptcp":
                continue        # one link: nothing for subflows to spread over
            undo = _pair_mode(env, A, B, mode, p["policy"])
            try:
                port = _measure(p, env, "pair", mtu, mode, A, B, B6, port, out)
            finally:
                undo()


# --------------------------------------------------------------------------- the fabric

def _run_fabric(p: dict, env, mtu: int, out: Measured) -> None:
    from mrc_ebpf.bench import contenders
    from mrc_ebpf.bench.runner import fabric
    from mrc_ebpf.lab import fabric as fab_mod
    port = 5700
    with fabric("lr", spines=p["spines"], rate=None, mtu=mtu, host_sysctls=p["host_sysctls"]) as fab:
        h1, h2 = fab.ns("h1"), fab.ns("h2")
        if p["pin"]:
            _two_hosts(env, (h1, "eth0"), (h2, "eth0"))
        dt6 = fab.host_sid(2).rstrip(":") + "::d76"
        for mode in p["modes"]:
            if mode == "mptcp" and not _has_mptcpize(env):
                out.notes.append("mptcp left out: mptcpize (Debian's mptcpd) is not installed")
                continue
            undo = lambda: None
            if mode == "seg6":
                gw = _gateway(env, h1, fab.addr6(2))
                env.run(h2, ["ip", "-6", "route", "add", f"{dt6}/128", "encap", "seg6local", "action",
                             "End.DT6", "table", "local", "dev", "eth0"])
                env.run(h1, ["ip", "-6", "route", "add", f"{fab.addr6(2)}/128", "encap", "seg6", "mode",
                             "encap", "segs", dt6, "via", gw, "dev", "eth0"])

                def undo():
                    env.run(h2, ["ip", "-6", "route", "del", f"{dt6}/128"], check=False)
                    env.run(h1, ["ip", "-6", "route", "del", f"{fab.addr6(2)}/128"], check=False)
            elif mode.startswith("mrc"):
                fab_mod.attach(fab.name, "h1,h2", p["policy"],
                               ["--granularity", "packet"] if mode == "mrc-packet" else [])
                undo = lambda: fab_mod.detach(fab.name, "h1,h2")
            try:
                ctx = contenders.mode(env, fab, mode, [1, 2]) if mode == "mptcp" else contextlib.nullcontext()
                with ctx:
                    port = _measure(p, env, "fabric", mtu, mode, h1, h2, fab.addr6(2), port, out,
                                    spines=lambda: _uplink_bytes(env, fab),
                                    uplinks=(fab.ns("l1"), [f"s{k}" for k in range(1, fab.spines + 1)]))
            finally:
                undo()


def _gateway(env, ns: str, dst: str) -> str:
    r = json.loads(env.run(ns, ["ip", "-6", "-j", "route", "get", dst]).stdout)
    return r[0]["gateway"]


def _has_mptcpize(env) -> bool:
    return env.run(None, ["sh", "-c", "command -v mptcpize"], check=False).returncode == 0


# --------------------------------------------------------------------------- the scenario

def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    check(p)
    out = Measured({}, {}, [])
    for place in ("pair", "fabric"):
        for mtu in p["mtus"]:
            out.runs.setdefault(place, {})[str(mtu)] = {m: {load: [] for load in p["loads"]} for m in p["modes"]}
    for mtu in p["mtus"]:
        if "pair" in p["places"]:
            _run_pair(p, env, mtu, out)
        if "fabric" in p["places"]:
            _run_fabric(p, env, mtu, out)
    return out


# --------------------------------------------------------------------------- analysis

def iperf_result(r: Iperf) -> dict:
    """One run's Gbit/s (UDP: what arrived), CPU per Gbit, and the paths' or spines' byte shares."""
    end = r.end
    if r.load == "udp":
        bps = end["sum"]["bits_per_second"] * (1 - end["sum"].get("lost_percent", 0) / 100)
        retrans = None
    else:
        bps = end["sum_received"]["bits_per_second"]
        retrans = end["sum_sent"].get("retransmits")
    rec = {"gbps": bps / 1e9, "cpu_s_per_gbit": r.busy_s / max(bps / 1e9 * r.seconds, 1e-9),
           "retransmits": retrans}
    if r.spines_before is not None:
        rec["spine_shares"] = _shares(r.spines_before, r.spines_after)
    if r.paths_before is not None:
        rec["path_shares"] = _shares(r.paths_before, r.paths_after)
    if r.windows is not None:
        rec["spine_windows"] = window_shares.summarize(r.windows)
    return rec


def summarize(p: dict, measured: Measured) -> dict:
    summary: dict = {}
    for place in p["places"]:
        for mtu in p["mtus"]:
            for mode, by_load in measured.runs[place][str(mtu)].items():
                for load, runs in by_load.items():
                    if not runs:
                        continue
                    runs = [iperf_result(r) for r in runs]
                    entry = {"gbps": spread([r["gbps"] for r in runs]),
                             "cpu_s_per_gbit": spread([r["cpu_s_per_gbit"] for r in runs]),
                             "runs": runs}
                    windows = [r["spine_windows"] for r in runs if r.get("spine_windows")]
                    if windows:
                        # the fraction of busy 10 ms windows with every spine within +-10%
                        entry["windows_even"] = spread([w["fraction_within"] for w in windows])
                    summary.setdefault(place, {}).setdefault(str(mtu), {}).setdefault(mode, {})[load] = entry
    notes = list(measured.notes)
    for place, by_mtu in summary.items():
        for mtu, by_mode in by_mtu.items():
            ref = by_mode.get("seg6", {}).get("tcp1")
            mine = by_mode.get("mrc", {}).get("tcp1")
            if ref and mine:
                notes.append(f"{place}, MTU {mtu}, one TCP flow: mrc {mine['gbps']['median']:.2f} Gbit/s = "
                             f"{mine['gbps']['median'] / ref['gbps']['median']:.2f} of the kernel's SRv6 "
                             f"({ref['gbps']['median']:.2f})")
    return {"summary": summary, "status": measured.status, "notes": notes}


def table(results: dict):
    headers = ["place", "MTU", "mode", "load", "Gbit/s", "CPU s / Gbit", "shares (paths or spines)",
               "10 ms windows even"]
    rows = []
    for place, by_mtu in results["summary"].items():
        for mtu, by_mode in by_mtu.items():
            for mode, by_load in by_mode.items():
                for load, s in by_load.items():
                    last = s["runs"][-1]
                    shares = last.get("path_shares") or last.get("spine_shares") or []
                    rows.append([place, mtu, mode, load, fmt_spread(s["gbps"], digits=2),
                                 fmt_spread(s["cpu_s_per_gbit"], digits=3),
                                 " ".join(f"{x:.2f}" for x in shares),
                                 fmt_spread(s["windows_even"], digits=2) if "windows_even" in s else ""])
    return headers, rows


def plot(results: dict, plt):
    places = list(results["summary"])
    fig, axes = plt.subplots(1, max(len(places), 1), figsize=(7 * max(len(places), 1), 4), squeeze=False)
    for ax, place in zip(axes[0], places):
        labels, values = [], []
        for mtu, by_mode in results["summary"][place].items():
            for mode, by_load in by_mode.items():
                if "tcp1" in by_load:
                    labels.append(f"{mode}\n{mtu}")
                    values.append(by_load["tcp1"]["gbps"]["median"])
        ax.bar(range(len(values)), values)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_ylabel("Gbit/s, one TCP flow")
        ax.set_title(place, fontsize=9)
    return fig
