"""Aggregate TCP goodput between two hosts under different leaves, over K
equal rate-limited spines (tbf on both directions of every leaf-spine
link; the hosts' own links unlimited), as a fraction of the fabric's
capacity K x rate, on a fabric of each link MTU in `mtus` (1500, and
9000: jumbo frames, as GPU fabrics run; the hosts' XDP then runs in
generic mode, as a veth takes no native program for frames that size).

Modes, all on one fabric (h1 under l1 sends to h2 under l2):
  ecmp      no MRC attached: the leaves hash each flow's 5-tuple over the
            spines (kernel ECMP, fib_multipath_hash_policy 3);
  rr        MRC attached on both hosts, every packet sprayed round-robin
            over the K spine paths (gso_max_segs 1);
  bytes     the same, round robin by bytes (a full-size packet a turn;
            TCP's segments are not all full, and rr balances packets);
  adaptive  the same with the `adaptive` policy (power of two choices on
            the peer's delay/loss feedback);
  single    MRC with one path (paths 1..K-1 deleted on both hosts);
  prr, plb, mptcp  what Linux users run instead (bench/contenders.py):
            flow-label hashing leaves, and for mptcp every flow an MPTCP
            connection with K subflows; run before MRC is attached.
With `encoding` "ev" the fabric is `--encoding ev` (plain IPv6 spines,
leaves hashing the flow label) and MRC sprays over `entropy` EVs per
peer instead of the K spine paths (only the MRC modes apply; `single`
keeps one EV).  Every run records l1's uplink counters per spine (which spines carried
the flows) and, per contender, its proof (contenders.proof).
Goodput is mrc-perf's receiver-side byte count over the test (-J, one
interval), for 1..16 parallel TCP flows (-P).  The ACK direction is
sprayed the same way.  The hosts run the bench's host sysctls
(`host_sysctls`, by default RACK's reordering window on the current RTT);
every mode alike.

Headers bound every mode below 1: the ceiling is the TCP payload of a
full-size segment over the bytes it takes on a link (tbf counts the
Ethernet header), (advmss - 12 for timestamps) / (link MTU + 14), from
the routes h1 uses: the plain one for ECMP, MRC's (MTU reduced by the
SRv6 encapsulation) for the others.  `of_ceiling` is fraction / ceiling.

What a fabric measured (MtuMeasured: every run's Transfer, the modes'
records and counters, the route's MSS) is kept apart from its analysis
(mtu_result, summarize), a pure function of it.
"""
from __future__ import annotations

import dataclasses
import json

from mrc_ebpf.bench import contenders
from mrc_ebpf.errors import MrcError
from mrc_ebpf.bench.runner import fmt_spread, log, spread
from mrc_ebpf.perf.iperf_json import read_result

TITLE = "TCP goodput, fraction of K x rate: MRC spraying vs kernel ECMP, PRR, PLB, MPTCP vs one path"
MODES = ("ecmp", "prr", "plb", "mptcp", "rr", "bytes", "adaptive", "single")
MODES_ALLOWED = MODES
# the sender's view of reordering (encoding ev): retransmissions the receiver
# reported as duplicates (the original had arrived), and lost retransmissions
TCP_KEYS = ("TcpRetransSegs", "TcpExtTCPDSACKRecv", "TcpExtTCPDSACKRecvSegs", "TcpExtTCPLostRetransmit",
            "TcpExtTCPTimeouts")


def params(short: bool) -> dict:
    return {"spines": 4, "rate": "50mbit" if short else "100mbit", "host_rate": None,
            "mtus": [1500] if short else [1500, 9000],
            # flows per MTU (the jumbo fabric skips 2 to keep the run short)
            "flows": {"1500": [1, 4]} if short else {"1500": [1, 2, 4, 16], "9000": [1, 4, 16]},
            "seconds": 1.5 if short else 8.0,
            "repeat": 1 if short else 3, "modes": list(MODES), "src": "h1", "dst": "h2",
            "tool": "mrc-perf -P FLOWS -t SECONDS -i 0 (TCP, 128 KiB writes)",
            "capacity": "spines x rate (one direction)", "encoding": "srh", "entropy": 64,
            # encoding ev: the hosts trace each EV's spine and rotate the spray over
            # the spines (fabric attach --ev-order, mrcctl path trace --order)
            "ev_order": True}


def set_mtu(p: dict, mtu: int) -> None:
    """`mrcctl bench --mtu`: one fabric of that MTU, with its own flow
    counts if `flows` has them, else the first MTU's."""
    counts = p["flows"].get(str(mtu), p["flows"].get(str(p["mtus"][0])))
    p["flows"] = {} if counts is None else {str(mtu): counts}
    p["mtus"] = [mtu]


def _both(env, fab, *args_for):
    for ns, args in args_for:
        env.mrcctl(ns, *args)


def _configure(env, fab, mode: str, K: int) -> None:
    """K: the paths each host has to the other (spines, or EVs)."""
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    if mode in ("rr", "bytes", "adaptive"):
        _both(env, fab, (h1, ["path", "policy", fab.prefix6(2), mode]),
              (h2, ["path", "policy", fab.prefix6(1), mode]))
    elif mode == "single":
        _both(env, fab, (h1, ["path", "policy", fab.prefix6(2), "rr"]),
              (h2, ["path", "policy", fab.prefix6(1), "rr"]))
        for i in range(1, K):
            _both(env, fab, (h1, ["path", "del", fab.prefix6(2), "--id", str(i)]),
                  (h2, ["path", "del", fab.prefix6(1), "--id", str(i)]))


def _path_events(env, fab) -> dict:
    """h1's datapath events so far (their sequence numbers), to count a run's."""
    doc = json.loads(env.mrcctl(fab.ns("h1"), "stats", "--events", "-j").stdout)
    return {"seq": max((e["seq"] for e in doc["events"]), default=0)}


def _events_since(env, fab, mark: dict) -> dict:
    """h1's path events (down, late, up, ...) since `mark`, counted by type;
    `mark` moves on."""
    doc = json.loads(env.mrcctl(fab.ns("h1"), "stats", "--events", "-j").stdout)
    counts: dict = {}
    for e in doc["events"]:
        if e["seq"] > mark["seq"]:
            counts[e["type"]] = counts.get(e["type"], 0) + 1
    mark["seq"] = max((e["seq"] for e in doc["events"]), default=mark["seq"])
    return counts


# --------------------------------------------------------------------------- what a run measured

@dataclasses.dataclass
class Transfer:
    """One mrc-perf run of `flows` TCP flows h1 -> h2, as measured."""
    flows: int
    goodput_bps: float              # the receiver's
    sender_bps: float
    retransmits: int | None
    spines: dict                    # contenders.spines_used over the run
    mptcp_subflows: int | None
    path_events: dict | None = None     # encoding ev: h1's path events during the run, by type
    tcp_h1: dict | None = None          # encoding ev: h1's TCP_KEYS deltas


@dataclasses.dataclass
class MtuMeasured:
    """Every mode's runs on one fabric of one link MTU."""
    mtu: int
    runs: dict[str, dict[str, list[Transfer]]]     # mode -> flows (str) -> runs
    mode_setup: dict[str, dict]                     # contenders.mode's record per mode
    counters: dict[str, dict]                       # contender -> counter deltas over its runs
    link_mtu: int                                   # h1's eth0
    mrc_mss: int                                    # the advmss of MRC's route to h2 (or its MTU - 60)


@dataclasses.dataclass
class Measured:
    capacity_bps: int
    mtus: list[MtuMeasured]


# --------------------------------------------------------------------------- run

def steps(p: dict) -> int:
    """Measurements run(p) makes (the progress line's total)."""
    return sum(len(p["modes"]) * p["repeat"] * len(p["flows"][str(mtu)]) for mtu in p["mtus"])


def check(p: dict) -> None:
    for mtu in p["mtus"]:
        counts = p["flows"].get(str(mtu)) if isinstance(mtu, int) else None
        if not (isinstance(counts, list) and counts and all(type(n) is int and n >= 1 for n in counts)):
            raise MrcError(f"spray-vs-ecmp: no flow counts for MTU {mtu} in flows {json.dumps(p['flows'])} "
                           f"(a list like [1, 4] for each of mtus {json.dumps(p['mtus'])}, or --mtu)")
    if p["encoding"] not in ("srh", "ev"):
        raise MrcError(f"spray-vs-ecmp: bad encoding {p['encoding']!r}: srh or ev")
    if p["encoding"] == "ev" and set(p["modes"]) - {"rr", "bytes", "adaptive", "single"}:
        raise MrcError("spray-vs-ecmp with encoding ev runs only the MRC modes: rr, bytes, adaptive, single")


def run(p: dict, env) -> dict:
    """Measure (measure()), then analyse (summarize)."""
    return summarize(p, measure(p, env))


def measure(p: dict, env) -> Measured:
    from mrc_ebpf.lab.fabric import parse_rate
    check(p)
    capacity = p["spines"] * parse_rate(p["rate"])
    return Measured(capacity, [_run_mtu(p, env, mtu) for mtu in p["mtus"]])


def _run_mtu(p: dict, env, mtu: int) -> MtuMeasured:
    from mrc_ebpf.lab import fabric as fab_mod
    from mrc_ebpf.bench.runner import fabric
    flows = p["flows"][str(mtu)]
    out = MtuMeasured(mtu, {m: {str(n): [] for n in flows} for m in p["modes"]}, {}, {}, 0, 0)
    port = 5400 + mtu % 1000
    plb = "plb" in p["modes"]
    ev = p["encoding"] == "ev"
    with fabric("sve", spines=p["spines"], leaves=2, hosts_per_leaf=1, rate=p["rate"],
                host_rate=p["host_rate"], mtu=mtu, host_sysctls=p["host_sysctls"],
                ecn_threshold=contenders.PLB_ECN_THRESHOLD if plb else None, ask_ecn=False,
                encoding="ev" if ev else "srh") as fab:
        attached = False
        for mode in p["modes"]:
            if mode != "ecmp" and mode not in contenders.CONTENDERS and not attached:
                log("spray-vs-ecmp: attaching MRC on h1, h2")
                fab_mod.attach(fab.name, "h1,h2", None, [], entropy=p.get("entropy") if ev else None,
                               ev_order=p.get("ev_order", True))
                attached = True
            _configure(env, fab, mode, p["entropy"] if ev else p["spines"])
            events0 = _path_events(env, fab) if ev else None
            with contenders.mode(env, fab, mode, [1, 2]) as rec:
                if ev:
                    # EVs are flow labels: the leaves hash them (mode() set the 5-tuple)
                    rec["hash_read_back"] = fab_mod.set_hash(fab.name, "flowlabel")
                    rec["hash_asked"] = "flowlabel"
                    if p.get("ev_order", True):
                        # traced again under the hash the run uses (mode() changed it meanwhile)
                        rec["ev_trace"] = {h: [{"hops": d["hops"], "unanswered": d["unanswered"],
                                                "spray_turns": len(d["spray"])} for d in
                                               json.loads(env.mrcctl(fab.ns(h), "path", "trace", "--order",
                                                                     "-j").stdout)]
                                           for h in ("h1", "h2")}
                out.mode_setup[mode] = rec
                keys = contenders.MPTCP_KEYS + contenders.PLB_KEYS
                c0 = contenders.counters(env, fab, [1, 2], keys)
                for rep in range(p["repeat"]):
                    for n in flows:
                        port += 1
                        log(f"spray-vs-ecmp: MTU {mtu}, {mode}, {n} flow(s), run {rep + 1}/{p['repeat']}",
                            step=True)
                        u0 = contenders.uplinks(env, fab)
                        t0 = contenders.counters(env, fab, [1], TCP_KEYS) if ev else None
                        doc = env.perf(fab.ns("h1"), fab.ns("h2"), fab.addr6(2), port,
                                       ["-t", str(p["seconds"]), "-P", str(n)], p["seconds"])
                        used = contenders.spines_used(u0, contenders.uplinks(env, fab))
                        result = read_result(doc)
                        out.runs[mode][str(n)].append(Transfer(
                            n, result["received_bps"], result["sent_bps"], result["retransmits"], used,
                            doc["mrc"]["local"].get("mptcp_subflows"),
                            _events_since(env, fab, events0) if ev else None,
                            contenders.delta_of(t0, contenders.counters(env, fab, [1], TCP_KEYS)) if ev else None))
                if mode in contenders.CONTENDERS:
                    out.counters[mode] = contenders.delta_of(c0, contenders.counters(env, fab, [1, 2], keys))
        out.link_mtu, out.mrc_mss = route_mss(env, fab)
    return out


def route_mss(env, fab) -> tuple[int, int]:
    """h1's link MTU, and the MSS of its route to h2 (MRC's while MRC is attached)."""
    h1 = fab.ns("h1")
    link_mtu = json.loads(env.run(h1, ["ip", "-j", "link", "show", "eth0"]).stdout)[0]["mtu"]
    route = json.loads(env.run(h1, ["ip", "-j", "-6", "route", "show", fab.prefix6(2)]).stdout)
    metrics = {k: v for m in (route[0].get("metrics", []) if route else []) for k, v in m.items()}
    return link_mtu, metrics.get("advmss", metrics.get("mtu", link_mtu) - 60)


# --------------------------------------------------------------------------- analysis

def ceilings(link_mtu: int, mrc_mss: int, modes) -> dict:
    """mode -> the goodput fraction headers leave when every link is busy
    (the MRC modes' route exists only while MRC is attached)."""
    payload = {"ecmp": link_mtu - 60 - 12, "mrc": mrc_mss - 12}
    plain = ("ecmp", *contenders.CONTENDERS)
    return {m: round(payload["ecmp" if m in plain else "mrc"] / (link_mtu + 14), 4) for m in modes}


def transfer_result(t: Transfer, capacity: int) -> dict:
    return {"goodput_bps": t.goodput_bps, "fraction": t.goodput_bps / capacity, "path_events": t.path_events,
            "retransmits": t.retransmits, "tcp_h1": t.tcp_h1, "sender_bps": t.sender_bps, "spines": t.spines,
            "mptcp_subflows": t.mptcp_subflows}


def mtu_result(p: dict, m: MtuMeasured, capacity: int) -> dict:
    """One fabric's results: per mode and flow count the spread, the header ceilings, the proofs."""
    raw = {mode: {n: [transfer_result(t, capacity) for t in ts] for n, ts in by_n.items()}
           for mode, by_n in m.runs.items()}
    proofs = {}
    for mode, delta in m.counters.items():
        # the run whose packets crossed the most spines (MPTCP's subflows
        # hash at random: now and then all onto one)
        best = max((r for by_n in raw[mode].values() for r in by_n),
                   key=lambda r: len(r["spines"]["carrying"]))
        proofs[mode] = contenders.proof(mode, m.mode_setup[mode], best["spines"], delta, best["mptcp_subflows"])
    ceiling = ceilings(m.link_mtu, m.mrc_mss, p["modes"])
    summary = {mode: {n: {"fraction": spread([r["fraction"] for r in runs]),
                          "spines_carrying": spread([len(r["spines"]["carrying"]) for r in runs]),
                          "of_ceiling": (spread([r["fraction"] / ceiling[mode] for r in runs])
                                         if ceiling.get(mode) else None),
                          "goodput_bps": spread([r["goodput_bps"] for r in runs]),
                          "retransmits": spread([r["retransmits"] for r in runs]),
                          "runs": runs} for n, runs in by_n.items()} for mode, by_n in raw.items()}
    return {"ceiling": ceiling, "modes": summary, "mode_setup": m.mode_setup, "proof": proofs}


def summarize(p: dict, measured: Measured) -> dict:
    capacity = measured.capacity_bps
    by_mtu = {str(m.mtu): mtu_result(p, m, capacity) for m in measured.mtus}
    notes = []
    for mtu, r in by_mtu.items():
        one = str(p["flows"][mtu][0])
        notes.append(f"MTU {mtu}, {one} flow: "
                     + ", ".join(f"{m} {r['modes'][m][one]['fraction']['median']:.2f}" for m in p["modes"])
                     + " of capacity (median); header ceiling "
                     + ", ".join(f"{m} {c:.3f}" for m, c in r["ceiling"].items() if c))
    return {"capacity_bps": capacity, "mtus": by_mtu, "notes": notes}


def _mtus(results: dict) -> list[str]:
    return sorted(results["mtus"], key=int)


def _modes(r: dict) -> list[str]:
    # in run order also when re-plotted from the JSON (written with sorted keys)
    return sorted(r["modes"], key=lambda m: MODES.index(m) if m in MODES else len(MODES))


def table(results: dict):
    first = results["mtus"][_mtus(results)[0]]
    modes = _modes(first)
    headers = ["MTU", "flows", *[f"{m} fraction" for m in modes], *[f"{m} retrans" for m in modes]]
    rows = []
    for mtu in _mtus(results):
        r = results["mtus"][mtu]
        for n in sorted(r["modes"][modes[0]], key=int):
            rows.append([mtu, n, *[fmt_spread(r["modes"][m][n]["fraction"]) for m in modes],
                         *[fmt_spread(r["modes"][m][n]["retransmits"]) for m in modes]])
        ceiling = r.get("ceiling", {})
        rows.append([mtu, "header ceiling", *[f"{ceiling[m]:.3f}" if ceiling.get(m) else "" for m in modes],
                     *["" for _ in modes]])
    return headers, rows


def plot(results: dict, plt):
    mtus = _mtus(results)
    fig, axes = plt.subplots(1, len(mtus), figsize=(7 * len(mtus), 4), squeeze=False)
    for ax, mtu in zip(axes[0], mtus):
        r = results["mtus"][mtu]
        modes = _modes(r)
        flows = sorted(r["modes"][modes[0]], key=int)
        width = 0.8 / len(modes)
        for i, m in enumerate(modes):
            med = [r["modes"][m][n]["fraction"]["median"] for n in flows]
            lo = [x - r["modes"][m][n]["fraction"]["min"] for x, n in zip(med, flows)]
            hi = [r["modes"][m][n]["fraction"]["max"] - x for x, n in zip(med, flows)]
            ax.bar([j + i * width for j in range(len(flows))], med, width, yerr=[lo, hi], label=m)
        ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(flows))])
        ax.set_xticklabels([f"{n} flow(s)" for n in flows])
        ax.set_ylabel("goodput / (K x rate)")
        ax.set_title(f"link MTU {mtu}", fontsize=9)
        ax.set_ylim(0, 1.2)
        ax.axhline(1.0, color="grey", lw=0.5)
        ceilings = sorted({c for c in r.get("ceiling", {}).values() if c})
        for c in ceilings:
            ax.axhline(c, color="grey", lw=0.5, ls="--")
        # one label for ceilings too close to read apart (0.976 and 0.991 at 9000)
        groups = []
        for c in ceilings:
            if groups and c - groups[-1][-1] < 0.04:
                groups[-1].append(c)
            else:
                groups.append([c])
        for g in groups:
            ax.annotate("header ceiling " + " / ".join(f"{c:.2f}" for c in g), (len(flows) - 0.4, g[-1]),
                        fontsize=6, va="bottom", ha="right")
        ax.legend(fontsize=8, ncol=len(modes), loc="upper left")
    return fig
