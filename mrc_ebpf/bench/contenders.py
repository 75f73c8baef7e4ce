"""What Linux users run instead of mrc-ebpf, as bench modes beside `ecmp`
and the MRC policies, on the same fabric in the same run:

  prr    Protective ReRoute: the leaves hash IPv6 on addresses + flow
         label (the kernel's default, fabric --hash flowlabel) and the
         hosts keep the kernel's defaults (net.core.txrehash=1,
         net.ipv6.auto_flowlabels=1): TCP draws a new flow label on every
         RTO, so a connection in a black hole moves to another spine.  The
         hosts' RTO floor is the run's profile's, as MRC's hosts get.
  plb    Protective Load Balancing: prr plus DCTCP, the fabric marking
         ECN and net.ipv4.tcp_plb_enabled=1 (its other knobs at their
         defaults, read back and recorded): a connection that sees CE on
         most packets for tcp_plb_rehash_rounds rounds draws a new label.
         The kernel runs PLB from DCTCP alone; without DCTCP (not built,
         no modules) it cannot run, and the bench says so.
  mptcp  every connection an MPTCP connection with as many subflows as the
         fabric has spines (docs/design/mptcp.md): each host gets K-1
         extra addresses in its own /64 (which the leaves already route to
         it), deprecated so ordinary connections do not pick them as a
         source, each an `ip mptcp endpoint ... subflow` of the in-kernel
         path manager, and `ip mptcp limits set subflow K-1` on both
         ends; the leaves hash on the flow label like prr's (each subflow
         its own label; the 5-tuple would do as well, the addresses differ).

Each proves in its own run that it is what it says (`proof` in the JSON):
the hash read back from the leaves, and per contender what only it would
show (prr: after an RTO the connection's packets on another spine's
counters; plb: TcpExtTCPPLBRehash > 0; mptcp: MP_JOINs acknowledged and the
subflows' packets on more than one spine).
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

from mrc_ebpf.errors import MrcError
from mrc_ebpf.bench.steps import log

CONTENDERS = ("prr", "plb", "mptcp")
HASH = {"prr": "flowlabel", "plb": "flowlabel", "mptcp": "flowlabel"}
PLB_CC = "dctcp"
PLB_KNOBS = ("net.ipv4.tcp_plb_enabled", "net.ipv4.tcp_plb_idle_rehash_rounds",
             "net.ipv4.tcp_plb_rehash_rounds", "net.ipv4.tcp_plb_suspend_rto_sec",
             "net.ipv4.tcp_plb_cong_thresh")
# what the kernel's repathing depends on, read back from every host per mode
REPATH_KNOBS = ("net.core.txrehash", "net.ipv6.auto_flowlabels", "net.ipv4.tcp_congestion_control",
                "net.ipv4.tcp_ecn", "net.ipv4.tcp_rto_min_us", "net.ipv4.tcp_min_rtt_wlen")
PLB_ECN_THRESHOLD = "1ms"      # where the fabric marks for plb when the scenario does not


def hash_of(mode: str) -> str:
    """The leaves' hash for a mode: the contenders run on what Linux does by
    default; ecmp and MRC on the 5-tuple (a flow stays where it hashed)."""
    return HASH.get(mode, "l4")


def unavailable(mode: str) -> str | None:
    """Why this kernel cannot run the contender, or None."""
    if mode == "plb":
        try:
            allowed = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
        except OSError:
            allowed = []
        if PLB_CC not in allowed:
            return ("the kernel runs PLB from DCTCP only, and this kernel has no DCTCP "
                    f"(available: {' '.join(allowed) or 'unknown'}; CONFIG_TCP_CONG_DCTCP)")
        try:
            open("/proc/sys/net/ipv4/tcp_plb_enabled").close()
        except OSError:
            return "this kernel has no PLB (net.ipv4.tcp_plb_enabled: Linux 6.2+)"
    if mode == "mptcp":
        try:
            socket.socket(socket.AF_INET6, socket.SOCK_STREAM, 262).close()
        except OSError as e:
            return f"no MPTCP sockets here: {e.strerror or e}"
    return None


def pick_modes(scenario: str, allowed: tuple, default: list[str], asked: list[str] | None) -> tuple[list, dict]:
    """(modes to run, {contender: why skipped}).  Contenders run first (MRC,
    once attached, owns the routes to the peers); a contender the kernel
    cannot run is an error when asked for by name, a note otherwise."""
    if asked:
        bad = [m for m in asked if m not in allowed]
        if bad:
            raise MrcError(f"{scenario} has no mode {bad[0]!r} (modes: {', '.join(allowed)})")
        for m in asked:
            why = unavailable(m)
            if why:
                raise MrcError(f"mode {m}: {why}")
        modes = list(dict.fromkeys(asked))
        skipped = {}
    else:
        skipped = {m: unavailable(m) for m in default if m in CONTENDERS and unavailable(m)}
        modes = [m for m in default if m not in skipped]
    first = [m for m in modes if m == "ecmp" or m in CONTENDERS]
    return first + [m for m in modes if m not in first], skipped


# --------------------------------------------------------------------------- host state

def _sysctl_read(env, ns: str, keys) -> dict:
    r = env.run(ns, ["sysctl", *keys], check=False)
    out = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition(" = ")
        if v:
            out[k.strip()] = v.strip()
    return out


def _sysctl_set(env, ns: str, kvs) -> None:
    if kvs:
        env.run(ns, ["sysctl", "-qw", *kvs])


def _mptcp_addrs(fab, h: int, n: int) -> list[str]:
    """n extra addresses of host h, in its own /64 (fd00:0:<h>::2, ::3, ..)."""
    base = fab.addr6(h)[:-1]            # "fd00:0:<h>::"
    return [f"{base}{i + 2:x}" for i in range(n)]


def _mptcp_up(env, fab, h: int, subflows: int) -> dict:
    ns = fab.ns(fab.host(h))
    extra = _mptcp_addrs(fab, h, subflows - 1)
    env.run(ns, ["ip", "mptcp", "endpoint", "flush"])
    env.run(ns, ["ip", "mptcp", "limits", "set", "subflow", str(subflows - 1), "add_addr_accepted", "0"])
    for a in extra:
        # deprecated (preferred_lft 0): never a source address of its own
        # choosing, still one a subflow may bind to
        env.run(ns, ["ip", "addr", "replace", f"{a}/128", "dev", "lo", "nodad", "preferred_lft", "0"])
        env.run(ns, ["ip", "mptcp", "endpoint", "add", a, "dev", "eth0", "subflow"])
    return {"extra_addresses": extra, "endpoints": env.run(ns, ["ip", "mptcp", "endpoint", "show"]).stdout.split("\n")[:-1],
            "limits": env.run(ns, ["ip", "mptcp", "limits", "show"]).stdout.strip()}


def _mptcp_down(env, fab, h: int, subflows: int) -> None:
    ns = fab.ns(fab.host(h))
    env.run(ns, ["ip", "mptcp", "endpoint", "flush"], check=False)
    env.run(ns, ["ip", "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "0"], check=False)
    for a in _mptcp_addrs(fab, h, subflows - 1):
        env.run(ns, ["ip", "addr", "del", f"{a}/128", "dev", "lo"], check=False)


@contextlib.contextmanager
def mode(env, fab, name: str, hosts: list[int]):
    """Run the block as mode `name` on fab's hosts: the leaves' hash, the
    hosts' sysctls, congestion control and MPTCP endpoints as the mode
    wants them, put back afterwards.  Yields the mode's record (what was
    read back), which the scenario stores with its results."""
    from mrc_ebpf.lab import fabric as fab_mod
    rec = {"mode": name, "hash_asked": hash_of(name)}
    rec["hash_read_back"] = fab_mod.set_hash(fab.name, hash_of(name))
    host_ns = [fab.ns(fab.host(h)) for h in hosts]
    extra = ["net.ipv4.tcp_plb_enabled=1", "net.ipv4.tcp_ecn=1"] if name == "plb" else []
    saved = {ns: _sysctl_read(env, ns, [kv.split("=")[0] for kv in extra]) for ns in host_ns}
    old_cc = env.cc
    old_mptcp = getattr(env, "mptcp", False)
    done_mptcp = []
    try:
        for ns in host_ns:
            _sysctl_set(env, ns, extra)
        if name == "plb":
            env.cc = PLB_CC
        if name == "mptcp":
            env.mptcp = True
            for h in hosts:
                done_mptcp.append(h)
                rec.setdefault("mptcp", {})[fab.host(h)] = _mptcp_up(env, fab, h, fab.spines * fab.planes)
        rec["tcp_congestion"] = env.cc
        rec["hosts"] = {ns: _sysctl_read(env, ns, REPATH_KNOBS + (PLB_KNOBS if name == "plb" else ()))
                        for ns in host_ns[:2]}
        yield rec
    finally:
        env.cc = old_cc
        env.mptcp = old_mptcp
        for h in done_mptcp:
            _mptcp_down(env, fab, h, fab.spines * fab.planes)
        for ns, vals in saved.items():
            _sysctl_set(env, ns, [f"{k}={v}" for k, v in vals.items()])
        if name in CONTENDERS:
            fab_mod.set_hash(fab.name, "l4")


# --------------------------------------------------------------------------- witnesses

def uplinks(env, fab, leaf: str = "l1") -> dict[str, int]:
    """TX packets of each of a leaf's spine uplinks (s1..sK): which spines
    its hosts' traffic crossed."""
    r = env.run(None, ["ip", "-n", fab.ns(leaf), "-s", "-j", "link", "show"])
    tx = {d["ifname"]: d["stats64"]["tx"]["packets"] for d in json.loads(r.stdout)}
    return {f"s{k}": tx.get(f"s{k}", 0) for k in range(1, fab.spines + 1)}


def spines_used(before: dict, after: dict, share: float = 0.05) -> dict:
    """Per-spine packet deltas, and the spines that carried at least
    `share` of them."""
    d = {k: after[k] - before.get(k, 0) for k in after}
    total = sum(d.values())
    return {"packets": d, "carrying": [k for k, v in d.items() if total and v >= share * total]}


MPTCP_KEYS = ("MPTcpExtMPCapableSYNTX", "MPTcpExtMPCapableSYNACKRX", "MPTcpExtMPJoinSynTx",
              "MPTcpExtMPJoinSynAckRx", "MPTcpExtMPJoinSynRx", "MPTcpExtMPJoinAckRx",
              "MPTcpExtMPCapableFallbackACK", "MPTcpExtMPCapableFallbackSYNACK")
PLB_KEYS = ("TcpExtTCPPLBRehash", "TcpExtTCPTimeouts", "TcpExtTCPDeliveredCE")


def counters(env, fab, hosts: list[int], keys) -> dict:
    """nstat counters summed over hosts (absolute; take two and subtract)."""
    tot = dict.fromkeys(keys, 0)
    for h in hosts:
        got = env.nstat(fab.ns(fab.host(h)))
        for k in keys:
            tot[k] += got.get(k, 0)
    return tot


def delta_of(a: dict, b: dict) -> dict:
    return {k: b.get(k, 0) - a.get(k, 0) for k in b}


def proof(name: str, rec: dict, spines: dict | None, nstat_delta: dict, subflows=None) -> dict:
    """The mode's own evidence, and whether it holds ('ok')."""
    out = {"hash": rec["hash_read_back"]["hash"], "hash_ok": rec["hash_read_back"]["hash"] == hash_of(name)}
    if spines is not None:
        out["spines"] = spines
    if name == "mptcp":
        joins = nstat_delta.get("MPTcpExtMPJoinAckRx", 0)
        out.update({"mp_join_ack_rx": joins, "subflows": subflows,
                    "ok": out["hash_ok"] and joins > 0 and spines is not None and len(spines["carrying"]) > 1})
    elif name == "plb":
        out.update({"plb_rehash": nstat_delta.get("TcpExtTCPPLBRehash", 0),
                    "ce_delivered": nstat_delta.get("TcpExtTCPDeliveredCE", 0)})
        out["ok"] = out["hash_ok"] and out["plb_rehash"] > 0
    else:
        out["ok"] = out["hash_ok"]
    return out


# --------------------------------------------------------------------------- PRR's own witness

def prr_witness(env, fab, trigger, disarm, dead_spine: str = "s1", chunk: int = 16 << 10,
                gap_s: float = 0.004, tries: int = 24, settle_s: float = 0.6, max_wait_s: float = 3.0) -> dict:
    """One TCP connection alone on the fabric, h1 -> h2: reconnect until its
    packets cross `dead_spine` (l1's uplink counters), black-hole that
    spine (trigger), keep sending, and watch for the RTO (the sender's
    TcpExtTCPTimeouts) and for its packets showing up on another spine's
    counters while data keeps arriving at h2.  disarm() afterwards."""
    from mrc_ebpf.lab import netns
    port = 5990
    buf = bytes(chunk)
    with netns.inside(fab.ns("h2")):
        ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((fab.addr6(2), port))
        ls.listen(64)
    got = [0]
    stop = threading.Event()

    def drain(a):
        a.settimeout(0.2)
        while not stop.is_set():
            try:
                n = a.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                return
            if not n:
                return
            got[0] += len(n)

    out = {"dead_spine": dead_spine, "tries": 0}
    threads = []
    try:
        for _ in range(tries):
            out["tries"] += 1
            with netns.inside(fab.ns("h1")):
                c = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            if env.cc:
                from mrc_ebpf.perf.control import set_congestion
                set_congestion(c, env.cc)
            c.settimeout(5)
            c.connect((fab.addr6(2), port))
            a, _ = ls.accept()
            t = threading.Thread(target=drain, args=(a,), daemon=True)
            t.start()
            threads.append((t, a))
            before = uplinks(env, fab)
            for _ in range(8):
                c.sendall(buf)
                time.sleep(gap_s)
            time.sleep(0.05)
            used = spines_used(before, uplinks(env, fab), 0.5)
            if used["carrying"] == [dead_spine]:
                break
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            c.close()
            c = None
        if c is None:
            out["error"] = f"no connection hashed onto {dead_spine} in {tries} tries"
            return out
        ns1 = fab.ns("h1")
        rto0 = env.nstat(ns1).get("TcpExtTCPTimeouts", 0)
        t_fail, _ = trigger()
        before = uplinks(env, fab)
        got_at_fail = got[0]
        c.settimeout(0.2)
        moved_at = None
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(socket.timeout, BlockingIOError):
                c.send(buf)
            time.sleep(gap_s)
            if moved_at is None:
                now = uplinks(env, fab)
                other = {k: v - before[k] for k, v in now.items() if k != dead_spine}
                if sum(other.values()) >= 20 and got[0] > got_at_fail:
                    moved_at = time.monotonic_ns()
                    out["moved_after_ms"] = round((moved_at - t_fail) / 1e6, 1)
                    out["moved_to"] = [k for k, v in other.items() if v >= 20]
            elif time.monotonic_ns() - moved_at > settle_s * 1e9:
                break
        after = uplinks(env, fab)
        out["rtos"] = env.nstat(ns1).get("TcpExtTCPTimeouts", 0) - rto0
        out["after_fail"] = spines_used(before, after, 0.05)
        out["delivered_after_fail"] = got[0] - got_at_fail
        out["ok"] = bool(moved_at) and out["rtos"] > 0 and out["delivered_after_fail"] > 0
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        c.close()
        log(f"prr witness: {'moved to ' + ','.join(out.get('moved_to', [])) if moved_at else 'did not move'}"
            f" {out.get('moved_after_ms')} ms after the black hole, {out['rtos']} RTO(s)")
        return out
    finally:
        stop.set()
        disarm()
        ls.close()
        for t, a in threads:
            t.join(1)
            a.close()
