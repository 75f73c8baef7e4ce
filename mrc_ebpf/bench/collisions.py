"""Collective-like rounds of fixed-size messages across the spines: flow
collisions under kernel ECMP against per-packet spraying.

Fabric: 2 leaves x H hosts, K spines (rate-limited leaf-spine links, host
links unlimited).  Every message crosses the spines: host i under l1 is
paired with a host under l2.  Rounds:
  permutation  each host sends one message of `size` bytes to its partner
               under the other leaf (the partner rotates every round), both
               directions at once: H messages per direction;
  all-to-all   each host sends one message to every host under the other
               leaf: H x H messages per direction.
A round starts all its transfers at once and ends with its slowest one.
Transfers run over TCP connections set up beforehand between every pair
(one process; sockets made in each host's namespace by setns), so a
message's completion time is from the round's start to the receiver
having the message's last byte.

ideal = the bytes one leaf sends to the other in the round / (K x rate):
every message of the round sharing the spines perfectly (headers and the
SRv6 encapsulation not counted, so real transfers cannot reach it).
Modes: ecmp (no MRC: the leaves hash each connection onto one spine),
the contenders prr, plb and mptcp (bench/contenders.py: flow-label hashing
leaves; plb repaths a connection on persistent CE marks, mptcp opens K
subflows per connection) and mrc (spraying by `mrc_policy` over the K
spines on every host).  The
hosts' TCP retransmissions and RTOs over each kind's rounds (nstat deltas
summed over the hosts) say what the tail is made of: one RTO (at least
the RTT plus tcp_rto_min, 200 ms unless the host sysctls lower it) can
decide a round.  The switches mark ECN above `ecn_threshold` of queue
(`mrcctl fabric up --ecn-threshold`) and the hosts ask for ECN, so the
senders hear of a queue before it overflows; "CE heard" counts the
packets the senders' TCP learnt were marked (TCPDeliveredCE), which
through mrc-ebpf needs its RX to carry the outer mark inwards.  In mrc mode, path_events counts the paths the hosts took
out of the spray during the kind's rounds (`mrcctl stats --events`), and
how each came back: nothing fails here, so each down is a queue's delay
("late": its packets arrived after all) or loss taken for a dead path.

Each mode's measurement (ModeMeasured: its Rounds' completion times and
counters) is kept apart from its analysis (rounds_result, summarize), a
pure function of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time

from mrc_ebpf.lab import netns
from mrc_ebpf.perf.control import set_congestion, stream_socket
from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.runner import fmt_spread, log, spread, percentile

TITLE = "message/round completion in permutation and all-to-all rounds: MRC spraying vs ECMP, PRR, PLB, MPTCP vs ideal"
MODES_ALLOWED = ("ecmp", "prr", "plb", "mptcp", "mrc")


def params(short: bool) -> dict:
    return {"spines": 4, "leaves": 2, "hosts_per_leaf": 2 if short else 4,
            "rate": "50mbit" if short else "100mbit", "size": (256 << 10) if short else (1 << 20),
            "rounds": {"permutation": 3 if short else 12, "all-to-all": 2 if short else 6},
            "repeat": 1, "modes": list(MODES_ALLOWED),
            # jumbo frames, as GPU fabrics run (headers cost 2.5%, not 14%);
            # `bytes`: TCP's segments are not all full at this MTU
            "mtu": 9000, "mrc_policy": "bytes", "transport": "TCP, one connection per host pair",
            # the switches mark CE above 1 ms of queue (a little more than one
            # 9000-byte frame at 100 Mbit/s) and the hosts ask for ECN (in
            # every mode), as datacenter fabrics run: congestion is signalled
            # before a queue overflows.  None: loss is the only signal.
            "ecn_threshold": "1ms",
            "ideal": "bytes one leaf sends the other per round / (spines x rate)"}


def connect_all(fab, pairs, port, cc: str | None, mptcp: bool = False, keep: list | None = None):
    """(src, dst) -> (sending socket, receiving socket).  With `keep` the
    listeners stay open (appended to it): MPTCP's MP_JOINs are answered by
    the listener, and one that is gone answers them with a reset."""
    listeners = {}
    for h in sorted({d for _, d in pairs}):
        with netns.inside(fab.ns(fab.host(h))):
            ls = stream_socket(socket.AF_INET6, mptcp)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((fab.addr6(h), port))
            ls.listen(128)
            listeners[h] = ls
    conns = {}
    try:
        for s, d in pairs:
            with netns.inside(fab.ns(fab.host(s))):
                c = stream_socket(socket.AF_INET6, mptcp)
                c.bind((fab.addr6(s), 0))
                set_congestion(c, cc)
                c.settimeout(10)
                c.connect((fab.addr6(d), port))
            a, _ = listeners[d].accept()
            c.settimeout(None)
            a.settimeout(None)
            conns[(s, d)] = (c, a)
    finally:
        for ls in listeners.values():
            if keep is None:
                ls.close()
            else:
                keep.append(ls)
    return conns


def run_round(conns, transfers, size):
    buf = bytes(size)
    done = {}
    start = threading.Barrier(len(transfers) * 2 + 1)
    t0 = [0]

    def send(c):
        start.wait()
        c.sendall(buf)

    def recv(key, a):
        view = bytearray(size)
        mv = memoryview(view)
        start.wait()
        got = 0
        while got < size:
            n = a.recv_into(mv[got:], size - got)
            if not n:
                raise OSError("connection closed")
            got += n
        done[key] = time.monotonic_ns()

    threads = []
    for key in transfers:
        c, a = conns[key]
        threads += [threading.Thread(target=send, args=(c,)), threading.Thread(target=recv, args=(key, a))]
    for t in threads:
        t.start()
    start.wait()
    t0[0] = time.monotonic_ns()
    for t in threads:
        t.join(120)
    if len(done) != len(transfers):
        raise RuntimeError("a transfer did not finish")
    times = [(done[k] - t0[0]) / 1e6 for k in transfers]
    return times


TCP_KEYS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPDeliveredCE", "TcpExtTCPPLBRehash",
            *contenders.MPTCP_KEYS)


def _tcp_counters(env, fab, hosts) -> dict:
    return contenders.counters(env, fab, hosts, TCP_KEYS)


def _path_events(env, fab, hosts, t_from: int, t_to: int) -> dict | None:
    """Path state changes on the hosts between t_from and t_to (kernel
    monotonic ns, the clock time.monotonic_ns reads), by type: "down",
    and of the returns "late" (its packets from before the down arrived:
    it was slow, not dead) or "up" (a probe got through); None if
    unreadable."""
    n = {"down": 0, "late": 0, "up": 0}
    for h in hosts:
        r = env.mrcctl(fab.ns(fab.host(h)), "stats", "--events", "-j", check=False)
        try:
            evs = json.loads(r.stdout)["events"]
        except (ValueError, KeyError):
            return None
        for e in evs:
            if e["type"] in n and t_from <= e["ns"] <= t_to:
                n[e["type"]] += 1
    return n



# --------------------------------------------------------------------------- what a run measured

@dataclasses.dataclass
class Rounds:
    """One mode's rounds of one kind, as measured."""
    kind: str
    per_dir: int                    # messages one leaf sends the other per round
    messages_per_round: int
    message_ms: list[float]         # every message's completion time, from its round's start
    round_ms: list[float]           # every round's (its slowest message)
    tcp_before: dict[str, int]      # TCP_KEYS summed over the hosts, around the rounds
    tcp_after: dict[str, int]
    path_events: dict | None = None     # mrc: _path_events over the rounds (None: unreadable)


@dataclasses.dataclass
class ModeMeasured:
    mode: str
    rounds: list[Rounds]
    setup: dict                     # contenders.mode's record
    spines: dict | None = None      # contenders: spines_used over the mode's rounds
    counters: dict | None = None    # contenders: TCP_KEYS deltas over the mode's rounds


@dataclasses.dataclass
class Measured:
    capacity_bps: int
    size: int                       # bytes a message
    modes: list[ModeMeasured]


def steps(p: dict) -> int:
    """Rounds run(p) makes (the progress line's total)."""
    return len(p["modes"]) * p["repeat"] * sum(p["rounds"].values())


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.lab.fabric import parse_rate
    from mrc_ebpf.bench.runner import fabric
    H = p["hosts_per_leaf"]
    measured = Measured(p["spines"] * parse_rate(p["rate"]), p["size"], [])
    left, right = list(range(1, H + 1)), list(range(H + 1, 2 * H + 1))
    pairs = [(a, b) for a in left for b in right] + [(b, a) for a in left for b in right]
    with fabric("col", spines=p["spines"], leaves=2, hosts_per_leaf=H, rate=p["rate"], mtu=p["mtu"],
                host_sysctls=p["host_sysctls"], ecn_threshold=p["ecn_threshold"]) as fab:
        for mi, mode in enumerate(p["modes"]):
            if mode == "mrc":
                log(f"collisions: attaching MRC on every host ({p['mrc_policy']})")
                fab_mod.attach(fab.name, None, p["mrc_policy"], [])
                time.sleep(0.5)
            with contextlib.ExitStack() as stack:
                rec = stack.enter_context(contenders.mode(env, fab, mode, left + right))
                m = ModeMeasured(mode, [], rec)
                measured.modes.append(m)
                time.sleep(0.2 if mode == "mptcp" else 0)
                c0 = _tcp_counters(env, fab, left + right)
                u0 = contenders.uplinks(env, fab)
                listeners = []
                stack.callback(lambda: [ls.close() for ls in listeners])
                conns = connect_all(fab, pairs, 5600 + mi, env.cc, env.mptcp, listeners)
                stack.callback(close_all, conns)
                if env.mptcp:
                    # the client's path manager opens subflows once the
                    # connection is fully established, after its first data
                    run_round(conns, pairs, 4096)
                    time.sleep(0.3)
                    rec["subflows"] = _subflows(conns)
                for kind, n_rounds in p["rounds"].items():
                    n_rounds *= p["repeat"]
                    msgs, rounds = [], []
                    before = _tcp_counters(env, fab, left + right)
                    t_from = time.monotonic_ns()
                    for r in range(n_rounds):
                        if kind == "permutation":
                            tr = [(left[i], right[(i + r) % H]) for i in range(H)]
                            tr += [(right[(i + r) % H], left[i]) for i in range(H)]
                            per_dir = H
                        else:
                            tr = pairs
                            per_dir = H * H
                        log(f"collisions: {mode} {kind} round {r + 1}/{n_rounds} ({len(tr)} messages)",
                            step=True)
                        times = run_round(conns, tr, p["size"])
                        msgs += times
                        rounds.append(max(times))
                    t_to = time.monotonic_ns()
                    after = _tcp_counters(env, fab, left + right)
                    m.rounds.append(Rounds(kind, per_dir, len(tr), msgs, rounds, before, after,
                                           _path_events(env, fab, left + right, t_from, t_to)
                                           if mode == "mrc" else None))
                if mode in contenders.CONTENDERS:
                    m.spines = contenders.spines_used(u0, contenders.uplinks(env, fab))
                    m.counters = contenders.delta_of(c0, _tcp_counters(env, fab, left + right))
    return measured


def close_all(conns):
    for c, a in conns.values():
        c.close()
        a.close()


def _subflows(conns) -> list:
    from mrc_ebpf.perf.control import mptcp_subflows
    return [mptcp_subflows(c) for c, _ in conns.values()]


# --------------------------------------------------------------------------- analysis

def rounds_result(r: Rounds, capacity: int, size: int, mrc: bool) -> dict:
    """One kind's rounds: message and round completion against the ideal, TCP's counters."""
    msgs, rounds = r.message_ms, r.round_ms
    ideal = r.per_dir * size * 8 / capacity * 1e3
    out = {"ideal_ms": ideal, "messages_per_round": r.messages_per_round,
           "message_ms": {"p50": percentile(msgs, 0.5), "p99": percentile(msgs, 0.99), "max": max(msgs)},
           "round_ms": spread(rounds), "round_p99_ms": percentile(rounds, 0.99),
           "round_p99_over_ideal": percentile(rounds, 0.99) / ideal,
           "retransmits": r.tcp_after["TcpRetransSegs"] - r.tcp_before["TcpRetransSegs"],
           "rtos": r.tcp_after["TcpExtTCPTimeouts"] - r.tcp_before["TcpExtTCPTimeouts"],
           "ce_delivered": r.tcp_after["TcpExtTCPDeliveredCE"] - r.tcp_before["TcpExtTCPDeliveredCE"],
           "message_times_ms": [round(x, 3) for x in msgs], "round_times_ms": rounds}
    if mrc:
        ev = r.path_events
        out["path_downs"] = ev and ev["down"]
        out["path_events"] = ev
    return out


def summarize(p: dict, measured: Measured) -> dict:
    results = {m.mode: {r.kind: rounds_result(r, measured.capacity_bps, measured.size, m.mode == "mrc")
                        for r in m.rounds} for m in measured.modes}
    setups = {m.mode: m.setup for m in measured.modes}
    proofs = {m.mode: contenders.proof(m.mode, m.setup, m.spines, m.counters, m.setup.get("subflows"))
              for m in measured.modes if m.counters is not None}
    notes = [f"{k}: round p99 / ideal = " + ", ".join(
        f"{m} {results[m][k]['round_p99_over_ideal']:.2f}" for m in results) for k in p["rounds"]]
    notes += [f"{m} proof: {'ok' if pr.get('ok') else 'NOT SHOWN'} (hash {pr['hash']}"
              + (f"; joins {pr['mp_join_ack_rx']}, spines {pr['spines']['carrying']}" if m == "mptcp" else "")
              + (f"; PLB rehashes {pr['plb_rehash']}" if m == "plb" else "") + ")" for m, pr in proofs.items()]
    return {"capacity_bps": measured.capacity_bps, "modes": results, "notes": notes, "mode_setup": setups,
            "proof": proofs}


def table(results: dict):
    headers = ["mode", "round kind", "msgs/round", "msg p50 ms", "msg p99 ms", "msg max ms",
               "round ms", "round p99 ms", "ideal ms", "p99/ideal", "retrans", "RTOs", "CE heard", "path downs"]
    rows = []
    for mode, per in results["modes"].items():
        for kind, s in per.items():
            rows.append([mode, kind, s["messages_per_round"], f"{s['message_ms']['p50']:.1f}",
                         f"{s['message_ms']['p99']:.1f}", f"{s['message_ms']['max']:.1f}",
                         fmt_spread(s["round_ms"]), f"{s['round_p99_ms']:.1f}", f"{s['ideal_ms']:.1f}",
                         f"{s['round_p99_over_ideal']:.2f}", s.get("retransmits", ""), s.get("rtos", ""),
                         s.get("ce_delivered", ""),
                         "-" if s.get("path_downs", "") is None else s.get("path_downs", "")])
    return headers, rows


def plot(results: dict, plt):
    kinds = list(next(iter(results["modes"].values())))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for mode, per in results["modes"].items():
            xs = sorted(per[kind]["message_times_ms"])
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=f"{mode} messages")
            rs = sorted(per[kind]["round_times_ms"])
            ax.plot(rs, [(i + 1) / len(rs) for i in range(len(rs))], "--", label=f"{mode} rounds")
        ax.axvline(per[kind]["ideal_ms"], color="black", lw=0.8, label="ideal")
        ax.set_xlabel("completion time (ms)")
        ax.set_ylabel("CDF")
        ax.set_title(kind, fontsize=9)
        ax.legend(fontsize=7)
    return fig
