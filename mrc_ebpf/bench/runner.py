"""The benchmark runner behind `mrcctl bench SCENARIO` and `make bench`.

Each scenario is a module of this package with

    TITLE                     one line
    params(short) -> dict     every parameter the run uses (stored in the JSON)
    run(p, env) -> dict       measures; builds and always removes its own fabric
    table(results) -> (headers, rows)
    plot(results, plt) -> figure
    USES_TCP = False          optional: the scenario starts no TCP flow

Every TCP flow a scenario starts runs the congestion control the run names
(`--congestion`, default cubic, Linux's default): the namespaces would
otherwise inherit the host's default, and results would depend on it.
Every host of a scenario's fabric gets the run's host sysctls
(`--host-sysctl`, default DEFAULT_HOST_SYSCTLS), in every mode alike.

The runner adds the repetitions' min/median/max (`summary`), writes
`<out>/<scenario>.json` and `<out>/<scenario>.png`, and prints a table.
Shared helpers (a fabric that is always torn down, nstat, interface
counters) live here; processes and namespaces go through the lab's
harness (mrc_ebpf/lab/procs.py, netns.py).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mrc_ebpf.bench import steps
# bench/steps.py, so that contenders (imported here) logs too; scenarios import log from here
from mrc_ebpf.bench.steps import log  # noqa: F401
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab import netns, procs

ROOT = Path(__file__).resolve().parent.parent.parent
SCENARIOS = {"spray-vs-ecmp": "spray_vs_ecmp", "failover": "failover", "cost": "cost",
             "collisions": "collisions", "reorder": "reorder", "shared-fate": "shared_fate",
             "line-rate": "line_rate", "active-peers": "active_peers",
             "congested-spine": "congested_spine", "probe-budget": "probe_budget", "port-down": "port_down",
             "trim-incast": "trim_incast"}
# Scenarios that need the VM's kernel (rdma_rxe): named, not in `all`
VM_SCENARIOS = {"roce": "roce"}
VERSION = 1
PY = sys.executable
MADE: list[str] = []        # fabric / namespace-set names this process made (the JSON lists them)
HASHED: dict[str, dict] = {}  # fabric -> its leaves' ECMP hash as read back after it was built


def spread(values) -> dict:
    """min/median/max (and n) of a list of numbers; None entries skipped."""
    v = [x for x in values if x is not None]
    if not v:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def fmt_spread(s: dict, scale: float = 1.0, digits: int = 3) -> str:
    """'median (min-max)' of an spread() dict."""
    if not s or s.get("median") is None:
        return "-"
    f = lambda x: f"{x * scale:.{digits}g}"  # noqa: E731
    return f"{f(s['median'])} ({f(s['min'])}-{f(s['max'])})"


def percentile(values, q: float):
    v = sorted(values)
    if not v:
        return None
    return v[min(len(v) - 1, int(q * len(v)))]


# --------------------------------------------------------------------------- processes

class Env(procs.Procs):
    """What a scenario runs with: processes it starts are ended (by pid) on
    exit (lab/procs.py, the lab's process harness)."""

    def __init__(self, repeat: int | None = None, congestion: str | None = None):
        super().__init__()
        self.repeat = repeat
        self.cc = congestion        # TCP congestion control for every benchmark flow
        self.mptcp = False          # TCP flows as MPTCP connections (the mptcp contender)

    def run(self, ns: str | None, cmd: list[str], check: bool = True, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess:
        return procs.run(cmd, ns=ns, input=input, check=check, timeout=timeout)

    def popen(self, ns: str | None, cmd: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        return super().popen(ns, cmd, **kw)

    # -- mrcctl / mrc-perf / nstat
    def mrcctl(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(None, [*procs.MRCCTL, "--netns", ns, *args], check=check)

    def perf_server(self, ns: str, port: int, bind: str) -> subprocess.Popen:
        return self.popen(ns, [PY, "-m", "mrc_ebpf.cli.mrc_perf", "-s", "-1", "-p", str(port), "-B", bind, "-J",
                               *(["-m"] if self.mptcp else [])])

    def perf_client(self, ns: str, host: str, port: int, args: list[str], timeout: float) -> dict:
        """Run mrc-perf -c, retrying while the server is not yet listening."""
        deadline = time.monotonic() + 10
        if self.cc and "-u" not in args:
            args = [*args, "-C", self.cc]
        if self.mptcp and "-u" not in args:
            args = [*args, "-m"]
        while True:
            r = self.run(ns, [PY, "-m", "mrc_ebpf.cli.mrc_perf", "-c", host, "-p", str(port), "-J", "-i", "0",
                              *args], check=False, timeout=timeout)
            if r.returncode == 0 or time.monotonic() > deadline or "refused" not in r.stderr:
                break
            time.sleep(0.2)
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            raise MrcError(f"mrc-perf client failed: {r.stderr.strip()[-300:]}")
        if doc.get("error"):
            raise MrcError(f"mrc-perf: {doc['error']}")
        return doc

    def perf(self, client_ns: str, server_ns: str, server_addr: str, port: int, args: list[str],
             duration: float) -> dict:
        srv = self.perf_server(server_ns, port, server_addr)
        try:
            time.sleep(0.3)
            return self.perf_client(client_ns, server_addr, port, args, timeout=duration + 60)
        finally:
            self.wait(srv, timeout=15)

    def nstat(self, ns: str) -> dict[str, int]:
        r = self.run(ns, ["nstat", "-asz", "--json"], check=False)
        try:
            d = json.loads(r.stdout)
        except ValueError:
            return {}
        return {k: int(v) for k, v in d.get("kernel", d).items()}

    def link_stats(self, ns: str, dev: str) -> dict:
        r = self.run(ns, ["ip", "-s", "-j", "link", "show", dev])
        st = json.loads(r.stdout)[0]["stats64"]
        return {"rx_packets": st["rx"]["packets"], "rx_bytes": st["rx"]["bytes"],
                "tx_packets": st["tx"]["packets"], "tx_bytes": st["tx"]["bytes"],
                "rx_dropped": st["rx"]["dropped"], "tx_dropped": st["tx"]["dropped"]}


def delta(a: dict, b: dict, keys=None) -> dict:
    keys = keys or sorted(set(a) | set(b))
    return {k: b.get(k, 0) - a.get(k, 0) for k in keys}


# --------------------------------------------------------------------------- fabric

def unique_name(tag: str) -> str:
    return f"b{tag}{os.getpid() % 100000}"[:16]


@contextlib.contextmanager
def no_interrupt():
    """Teardown is not cut short by a second Ctrl-C."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def fabric(tag: str, spines: int = 4, leaves: int = 2, hosts_per_leaf: int = 1, rate: str | None = "100mbit",
           host_rate: str | None = None, mtu: int = 1500, host_sysctls=(), ecn_threshold: str | None = None,
           ask_ecn: bool = True, encoding: str = "srh", planes: int = 1, trim_threshold: str | None = None):
    """A fabric of its own (unique name), always removed on the way out.
    With ECN marking the hosts ask for ECN (net.ipv4.tcp_ecn=1) too, unless
    ask_ecn is False (marking only for a mode that asks by itself)."""
    from mrc_ebpf.lab import fabric as fab_mod
    if ecn_threshold and ask_ecn:
        host_sysctls = [*host_sysctls, "net.ipv4.tcp_ecn=1"]
    name = unique_name(tag)
    MADE.append(name)
    log(f"fabric {name}: {f'{planes} planes x ' if planes > 1 else ''}{spines} spines x {leaves} leaves x "
        f"{hosts_per_leaf} hosts, rate {rate}, "
        f"MTU {mtu}{f', ECN marking above {ecn_threshold}' if ecn_threshold else ''}"
        f"{f', trimming above {trim_threshold}' if trim_threshold else ''}"
        f"{''.join(', ' + kv for kv in host_sysctls)}")
    fab_mod.up(name, spines, leaves, hosts_per_leaf, planes, rate, host_rate, encoding, mtu, list(host_sysctls),
               ecn_threshold, trim_threshold=trim_threshold)
    try:
        fab = fab_mod.Fabric(fab_mod.load(name)["spec"])
        HASHED[name] = fab_mod.read_hash(fab)
        yield fab
    finally:
        with no_interrupt():
            try:
                fab_mod.down(name)
            except MrcError as e:
                log(f"fabric down {name}: {e}")
                netns.delete([ns for ns in netns.existing() if ns.startswith(f"{name}-")])


def set_attach(env, fab, hosts, **fields) -> None:
    """Change attach settings (skip_rotations, probe_max_us, ...) of the
    running datapaths of fab's hosts in place: `show-config | apply`, no
    re-attach (no new verification), counters and learnt state kept."""
    from mrc_ebpf.lab import fabric as fab_mod
    key_file = fab_mod.load(fab.name).get("key_file")
    key = ["--key-file", key_file] if key_file else []
    for h in hosts:
        ns = fab.ns(h)
        doc = json.loads(env.mrcctl(ns, "show-config", "-j", *key).stdout)
        doc["attach"].update(fields)
        env.run(None, [*procs.MRCCTL, "--netns", ns, "apply", "-"], input=json.dumps(doc))


@contextlib.contextmanager
def namespaces(tag: str, nodes: list[str]):
    """Plain namespaces NAME-<node> (seg6 and forwarding on), always deleted
    (mrc-ebpf detached first)."""
    name = unique_name(tag)
    MADE.append(name)
    made = netns.Namespaces()
    try:
        for n in nodes:
            made.create(f"{name}-{n}", ["net.ipv6.conf.all.seg6_enabled=1", "net.ipv6.conf.default.seg6_enabled=1",
                                        "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
                                        "net.ipv6.conf.all.forwarding=1"])
        yield {n: f"{name}-{n}" for n in nodes}
    finally:
        with no_interrupt():
            made.close()


# --------------------------------------------------------------------------- running

def _sigterm(signum, frame):
    raise KeyboardInterrupt


def module(scenario: str):
    known = {**SCENARIOS, **VM_SCENARIOS}
    if scenario not in known:
        raise MrcError(f"no scenario {scenario!r} (one of {', '.join(known)}, all)")
    return importlib.import_module(f"{__package__}.{known[scenario]}")


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MrcError("the plots need matplotlib: apt-get install python3-matplotlib "
                       "(or .venv/bin/pip install matplotlib)")
    return plt


DEFAULT_CC = "cubic"
# Datacenter TCP for every host of every mode (`--host-sysctl` replaces it):
# - tcp_min_rtt_wlen 0: RACK waits a quarter of the minimum RTT before it
#   takes a packet overtaken by later ones for lost, and keeps that
#   minimum for 5 minutes (300), so on an idle fabric it is tens of
#   microseconds while sprayed paths' queues differ by milliseconds; with
#   0 it is the current RTT, queues included.  Flows that are not
#   reordered (ECMP) do not notice.
# - tcp_rto_min_us 5000 (Linux 6.11+; left out where the kernel lacks it):
#   the 200 ms floor is for the Internet; a fabric's RTT is microseconds
#   plus its queues.
# What each changed, measured: docs/performance.md ("The host profile").
DEFAULT_HOST_SYSCTLS = tuple(
    kv for kv in ("net.ipv4.tcp_min_rtt_wlen=0", "net.ipv4.tcp_rto_min_us=5000")
    if os.path.exists("/proc/sys/" + kv.split("=")[0].replace(".", "/")))


def run_scenario(scenario: str, short: bool = False, out: str | Path = "bench-results",
                 repeat: int | None = None, quiet: bool = False, congestion: str | None = None,
                 host_sysctls=None, mtu: int | None = None, ecn_threshold: str | None = None,
                 hosts_default: bool = False, modes: list[str] | None = None,
                 overrides: dict | None = None) -> dict:
    """congestion: every TCP flow's (default DEFAULT_CC).  hosts_default: the hosts' sysctls untouched and their own default
    congestion control (what a user gets), in place of the datacenter
    profile (congestion, DEFAULT_HOST_SYSCTLS).  modes: the scenario's
    modes to run (default all it has, contenders the kernel cannot run
    left out with a note).  overrides: scenario parameters by name."""
    mod = module(scenario)
    if scenario in VM_SCENARIOS:
        mod.check(mod.params(short))    # before anything is made: one line, exit 1
    if hosts_default and (host_sysctls or congestion is not None):
        raise MrcError("--hosts-default leaves the hosts alone: not with --host-sysctl or -C")
    if congestion is None and not hosts_default:
        congestion = DEFAULT_CC
    plt = _plt()                      # fail before measuring, not after
    if os.geteuid() != 0:
        raise MrcError("mrcctl bench needs root (namespaces, BPF)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    p = mod.params(short)
    for k, v in (overrides or {}).items():
        if k not in p:
            raise MrcError(f"{scenario} has no parameter {k!r} (has: {', '.join(sorted(p))})")
        if type(v) is not type(p[k]) and not (isinstance(p[k], (int, float)) and isinstance(v, (int, float))) \
                and p[k] is not None:
            raise MrcError(f"--param {k}: expected {type(p[k]).__name__} like {json.dumps(p[k])}")
        p[k] = v
    if hasattr(mod, "MODES_ALLOWED"):
        from mrc_ebpf.bench.contenders import pick_modes
        p["modes"], skipped = pick_modes(scenario, mod.MODES_ALLOWED, p["modes"], modes)
        if skipped:
            p["modes_skipped"] = skipped
    elif modes:
        raise MrcError(f"{scenario} has no modes to choose")
    if repeat is not None:
        if repeat < 1:
            raise MrcError("--repeat must be at least 1")
        p["repeat"] = repeat
    if mtu is not None:
        from mrc_ebpf.lab.fabric import MAX_MTU, MIN_MTU
        if not MIN_MTU <= mtu <= MAX_MTU:
            raise MrcError(f"--mtu {mtu}: must be {MIN_MTU}..{MAX_MTU}")
        if hasattr(mod, "set_mtu"):
            mod.set_mtu(p, mtu)
        elif "mtu" in p:            # (cost builds no fabric)
            p["mtu"] = mtu
    if ecn_threshold is not None and "ecn_threshold" in p:
        if ecn_threshold == "none":
            p["ecn_threshold"] = None
        else:
            from mrc_ebpf.lab.ecn_marks import parse_threshold
            parse_threshold(ecn_threshold)
            p["ecn_threshold"] = ecn_threshold
    if getattr(mod, "USES_TCP", True):
        from mrc_ebpf.perf.control import check_congestion
        if hosts_default:
            congestion = None
            p["host_profile"] = "hosts-default"
            p["host_default_congestion"] = _read("/proc/sys/net/ipv4/tcp_congestion_control")
        else:
            check_congestion(congestion)       # before any fabric is built
            p["host_profile"] = "datacenter"
        p["tcp_congestion"] = congestion
        p["host_sysctls"] = [] if hosts_default else check_sysctls(
            DEFAULT_HOST_SYSCTLS if host_sysctls is None else host_sysctls)
    if hasattr(mod, "check"):
        mod.check(p)        # parameters that depend on each other, before anything runs
    old = signal.signal(signal.SIGTERM, _sigterm)
    env = Env(p.get("repeat"), p.get("tcp_congestion"))
    del MADE[:]
    HASHED.clear()
    started, t0 = time.time(), time.monotonic()
    steps.STEPS.update(done=0, total=mod.steps(p) if hasattr(mod, "steps") else 0)
    if steps.PROGRESS is not None:
        steps.PROGRESS.restart()
    log(f"{scenario}: {mod.TITLE} ({'short' if short else 'full'}, repeat {p.get('repeat')})")
    try:
        results = mod.run(p, env)
    finally:
        env.close()
        signal.signal(signal.SIGTERM, old)
    doc = {"tool": "mrc-bench", "version": VERSION, "scenario": scenario, "title": mod.TITLE,
           "short": short, "params": p, "method": (mod.__doc__ or "").strip(),
           "started": started, "duration_s": round(time.monotonic() - t0, 2),
           "machine": {"kernel": platform.release(), "cpus": os.cpu_count(),
                       "loadavg_at_end": list(os.getloadavg())},
           "results": results, "namespace_prefixes": [f"{n}-" for n in MADE],
           # how each fabric's leaves hashed when built (modes that change it record theirs)
           "fabric_hash": {n: h["hash"] for n, h in HASHED.items()}}
    path_json = out / f"{scenario}.json"
    path_json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    fig = mod.plot(results, plt)
    fig.suptitle(f"{scenario}{' (short)' if short else ''}: {mod.TITLE}", fontsize=9)
    fig.tight_layout()
    path_png = out / f"{scenario}.png"
    fig.savefig(path_png, dpi=100)
    plt.close(fig)
    doc["files"] = {"json": str(path_json), "png": str(path_png)}
    if steps.PROGRESS is not None:
        steps.PROGRESS.close()            # the table goes where the line was
    if not quiet:
        from tabulate import tabulate
        headers, rows = mod.table(results)
        print(f"\n{scenario}: {mod.TITLE}  [{doc['duration_s']} s; median (min-max) of "
              f"{p.get('repeat')} runs]")
        print(tabulate(rows, headers=headers))
        for line in results.get("notes", []):
            print(f"  note: {line}")
        print(f"  -> {path_json}, {path_png}")
    return doc


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def check_sysctls(items) -> list[str]:
    from mrc_ebpf.lab.fabric import SYSCTL_RE
    for kv in items:
        if not SYSCTL_RE.match(kv):
            raise MrcError(f"bad --host-sysctl {kv!r}: net.KEY=VALUE")
    return list(items)


def run_all(names: list[str], **kw) -> list[dict]:
    docs = []
    for n in names:
        docs.append(run_scenario(n, **kw))
    return docs
