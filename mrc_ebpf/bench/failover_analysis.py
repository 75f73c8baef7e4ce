"""The failover scenario's analysis (bench/failover.py measures): from
each run's logs and counters (the measurement types below) to its outage,
losses, recovery and witnesses, then the spread over the repetitions, the
table and the plot.  A pure function of the measurements: no fabric, no
process.
"""
from __future__ import annotations

import dataclasses

from mrc_ebpf.bench import contenders
from mrc_ebpf.bench.runner import fmt_spread, spread
from mrc_ebpf.datapath import layout

NSTAT_KEYS = ("TcpRetransSegs", "TcpExtTCPTimeouts", "TcpExtTCPLossProbes", "TcpExtTCPSpuriousRTOs",
              "TcpExtTCPSACKReorder")
MRC_OVERHEAD = layout.encap_len(2)        # a path through a spine: 2 segments (128 bytes)
ETH, IP6, UDP, TCP_HDR = 14, 40, 8, 32    # TCP with timestamps


# --------------------------------------------------------------------------- what a run measured

@dataclasses.dataclass
class UdpMeasurement:
    """One UDP run: every datagram the sender logged and the receiver got."""
    mode: str
    flow_spines: list[int]          # the spine each flow was calibrated onto (index; -1: unknown)
    t_fail: int                     # CLOCK_MONOTONIC ns the black hole began
    trigger_us: float               # how long switching the fault took
    t0: int                         # the sender's start and end (ns)
    end: int
    send_errors: int
    sender_skipped: int | None
    receiver_user_timestamps: bool | None
    sends: list[tuple[int, int, int]]               # (flow, seq, send ns)
    arrivals: list[tuple[int, int, int, int]]       # (arrival ns, flow, seq, send ns)


@dataclasses.dataclass
class TcpMeasurement:
    """One TCP run: every read the receiver made, and the counters around it."""
    mode: str
    sports: list[int] | None        # calibrated source ports (None: the contenders')
    conn_spines: list[int] | None   # the spine each was calibrated onto
    t_fail: int
    trigger_us: float
    t0: int
    end: int
    reads: list[tuple[int, int, int]]               # (receive ns, connection, bytes)
    peer_ports: list[int]           # each connection's source port, as the receiver saw it
    nstat_sender: tuple[dict[str, int], dict[str, int]]     # (before, after)
    nstat_receiver: tuple[dict[str, int], dict[str, int]]
    spines_used: dict               # contenders.spines_used over the run
    failed_spine: str               # the spine black-holed
    mptcp_subflows: int | None


@dataclasses.dataclass
class PathCounters:
    """h1's per-path tx and downs, h2's per-path rx from h1 (`mrcctl stats --paths`)."""
    tx: dict[int, dict]
    rx: dict[int, dict]


@dataclasses.dataclass
class MrcWitness:
    """MRC's own view of a run: path counters around it, h1's events."""
    before: PathCounters
    after: PathCounters
    events: list[dict] | None       # None: unreadable
    dead_segment: str               # the first segment of the paths through s1


@dataclasses.dataclass
class Run:
    proto: str
    measurement: UdpMeasurement | TcpMeasurement
    mrc: MrcWitness | None = None


@dataclasses.dataclass
class Calibration:
    """Source ports that hash onto each spine in turn (ECMP), per protocol."""
    sports: list[int]
    spines: list[int]
    candidates_tried: int


@dataclasses.dataclass
class Measured:
    """The whole scenario as measured."""
    runs: dict[str, dict[str, list[Run]]]       # mode -> protocol -> runs
    calibration: dict[str, Calibration]
    armed: list[str]                            # spines whose link to l2 had the fault armed
    mode_setup: dict[str, dict]                 # contenders.mode's record per mode
    prr_witness: dict | None = None


# --------------------------------------------------------------------------- analysis

def _buckets(times_ns, weights, t0, n, width_ns):
    out = [0.0] * n
    for t, w in zip(times_ns, weights):
        i = int((t - t0) // width_ns)
        if 0 <= i < n:
            out[i] += w
    return out


def _below(p, good, ref, i_from, i_to, k, judged=None):
    """Windows of k buckets ending at i_from..i_to-1 whose goodput is below
    threshold x ref(first bucket, last bucket + 1).  With `judged`, only
    windows whose reference is at least `judged` count either way (a
    window the starved sender offered a datagram or two in says nothing:
    one lost probe would make it 100% loss); the others are listed in
    judged_out if it is a list."""
    bad = []
    for i in range(max(i_from, k - 1), i_to):
        want = ref(i - k + 1, i + 1)
        if judged is not None and want < judged[0]:
            judged[1].append(i)
        elif sum(good[i - k + 1:i + 1]) < p["threshold"] * want:
            bad.append(i)
    return bad


def _noise_floor(p, good, ref, t0, t_fail, window_ms, judged=None):
    """The same test on the `pre_ms` before the failure (against the
    pre-failure reference): how often the measure dips with nothing wrong."""
    W = int(p["bucket_ms"] * 1e6)
    k = max(1, int(round(window_ms / p["bucket_ms"])))
    fail_i = int((t_fail - t0) // W)
    start = max(0, fail_i - int(p["pre_ms"] / p["bucket_ms"])) + k - 1
    if fail_i <= start:
        return None
    j = None if judged is None else (judged * k, [])
    bad = _below(p, good, ref, start, fail_i, k, j)
    n = fail_i - start - (len(j[1]) if j else 0)
    return round(len(bad) / n, 3) if n > 0 else None


def _outage(p, good, ref, t0, t_fail, n, window_ms, judged=None):
    """good: payload bits per bucket; ref(i0, i1) -> the reference bits for
    buckets i0..i1-1.  Windows of window_ms sliding by one bucket, those
    ending after t_fail; see the module's doc."""
    W = int(p["bucket_ms"] * 1e6)
    k = max(1, int(round(window_ms / p["bucket_ms"])))
    fail_i = int((t_fail - t0) // W)
    n -= int(p["tail_ms"] / p["bucket_ms"])     # the senders' last moments are not the network's
    j = None if judged is None else (judged * k, [])
    bad = _below(p, good, ref, fail_i, n, k, j)
    last_bad = bad[-1] if bad else None
    end_ns = t0 + n * W
    recovered = last_bad is None or (n - 1 - last_bad) * p["bucket_ms"] >= p["stable_ms"]
    out = {"recovered": recovered, "below_threshold_ms": len(bad) * p["bucket_ms"], "window_ms": window_ms,
           "unjudged_ms": len(j[1]) * p["bucket_ms"] if j else 0,
           "outage_until_end_ms": None if recovered else round((end_ns - t_fail) / 1e6, 1)}
    # The first recovery, and how often goodput dips afterwards: a bulk TCP
    # flow's own sawtooth dips 100 ms windows below 90% of the line with
    # nothing failed (pre_failure_windows_below_capacity), and the strict
    # outage above counts the last such dip after the failure, wherever it is.
    # A window left unjudged (the sender offered next to nothing) is no
    # evidence of recovery either way, so the first good one must be judged.
    not_good = set(bad) | set(j[1] if j else ())
    first_good = next((i for i in range(fail_i + k, n) if i not in not_good), None)
    early = [i for i in bad if first_good is None or i < first_good]
    out["recovery_ms"] = (None if first_good is None else
                          round(max(0.0, (t0 + (early[-1] + 1) * W - t_fail) / 1e6), 1) if early else 0.0)
    later = n - first_good if first_good is not None else 0
    out["dips_after_recovery"] = round(sum(1 for i in bad if first_good is not None and i > first_good)
                                       / later, 3) if later > 0 else None
    if last_bad is None:
        out["outage_ms"] = 0.0
    elif recovered:
        out["outage_ms"] = round(max(0.0, (t0 + (last_bad + 1) * W - t_fail) / 1e6), 1)
    else:
        out["outage_ms"] = None
    return out


def _longest_gap(rows, t_fail, t_end):
    """The longest time a connection received nothing, from the black hole
    (or its last arrival before it) to t_end, in ms; t_end itself closes a
    gap still open there (a stalled connection's gap runs to the end)."""
    times = sorted(r[0] for r in rows)
    before = [t for t in times if t < t_fail]
    after = [t for t in times if t_fail <= t <= t_end]
    if not before and not after:
        return None
    marks = ([before[-1]] if before else [t_fail]) + after + [t_end]
    return round(max(b - a for a, b in zip(marks, marks[1:])) / 1e6, 1)


def _longest_gap_before(rows, t_start, t_fail):
    """The noise floor of _longest_gap: the longest time a connection
    received nothing between t_start and the failure, in ms (what the
    machine's own scheduling does to a healthy flow)."""
    times = sorted(r[0] for r in rows)
    earlier = [t for t in times if t < t_start]
    inside = [t for t in times if t_start <= t < t_fail]
    if not earlier and not inside:
        return None
    marks = ([earlier[-1]] if earlier else [t_start]) + inside + [t_fail]
    return round(max(b - a for a, b in zip(marks, marks[1:])) / 1e6, 1)


def _pct(v, q):
    return round(v[min(len(v) - 1, int(q * len(v)))] / 1e3, 1) if v else None


def _capacity(p, mode, payload, wire, spines):
    return spines * p["rate_bps"] * payload / wire


def udp_result(p: dict, m: UdpMeasurement) -> dict:
    """One UDP run's outage, losses and delays (the module's doc of
    bench/failover.py says how each is measured)."""
    mode, flow_spines, t_fail, sends = m.mode, m.flow_spines, m.t_fail, m.sends
    cap_all = p["spines"] * p["rate_bps"]
    size = p["udp_size"]
    wire = size + UDP + IP6 + ETH + (MRC_OVERHEAD if mode == "mrc" else 0)
    got = {(f, q): t for t, f, q, ts in m.arrivals}
    t0, t1 = m.t0, m.end
    W = int(p["bucket_ms"] * 1e6)
    n = int((t1 - t0) // W)
    bits = size * 8
    late_ns = int(p["late_ms"] * 1e6)
    owd = [(ts, got[(f, q)] - ts) for f, q, ts in sends if (f, q) in got]
    in_time = [ts for ts, d in owd if d <= late_ns]
    good = _buckets(in_time, [bits] * len(in_time), t0, n, W)              # by send time
    good_arr = _buckets([t for t in got.values()], [bits] * len(got), t0, n, W)   # by arrival
    offered = _buckets([ts for _, _, ts in sends], [bits] * len(sends), t0, n, W)
    fail_i = int((t_fail - t0) // W)
    cap_pre = _capacity(p, mode, size, wire, p["spines"]) * p["bucket_ms"] / 1e3
    cap_post = _capacity(p, mode, size, wire, p["spines"] - 1) * p["bucket_ms"] / 1e3

    def ref(i0, i1):
        return sum(min(offered[i], cap_post if i >= fail_i else cap_pre) for i in range(i0, i1))

    # a window is judged if the reference is at least half the nominal one
    judged = p["judged"] * min(p["load"] * cap_all * p["bucket_ms"] / 1e3, cap_post)
    res = _outage(p, good, ref, t0, t_fail, n, p["window_ms"], judged)
    res["pre_failure_windows_below"] = _noise_floor(p, good, ref, t0, t_fail, p["window_ms"], judged)
    res["arrival_axis"] = _outage(p, good_arr, ref, t0, t_fail, n, p["window_ms"], judged)
    res["arrival_axis"]["pre_failure_windows_below"] = _noise_floor(p, good_arr, ref, t0, t_fail,
                                                                    p["window_ms"], judged)
    pre_d = sorted(d for ts, d in owd if ts < t_fail)
    post_d = sorted(d for ts, d in owd if ts >= t_fail)
    res["one_way_delay_us"] = {
        "before_p50": _pct(pre_d, 0.5), "before_p99": _pct(pre_d, 0.99),
        "after_p50": _pct(post_d, 0.5), "after_p99": _pct(post_d, 0.99)}
    res["late"] = len(owd) - len(in_time)
    lost = [(f, q, ts) for f, q, ts in sends if (f, q) not in got]
    after = [x for x in lost if x[2] >= t_fail]
    per_flow_sent, per_flow_lost = [0] * p["udp_flows"], [0] * p["udp_flows"]
    for f, q, ts in sends:
        if ts >= t_fail:
            per_flow_sent[f] += 1
    for f, q, ts in after:
        per_flow_lost[f] += 1
    dead = [f for f in range(p["udp_flows"]) if per_flow_sent[f] and per_flow_lost[f] >= 0.95 * per_flow_sent[f]]
    first_loss = min((x[2] for x in after), default=None)
    res.update({
        "sent": len(sends), "received": len(got), "lost": len(sends) - len(got),
        "lost_before_fail": len(lost) - len(after), "lost_after_fail": len(after),
        "lost_first_10ms": sum(1 for x in after if x[2] < t_fail + 10_000_000),
        "flows_blackholed": dead, "flow_spines": [f"s{k + 1}" for k in flow_spines],
        "offered_bps": p["load"] * cap_all, "offered_bps_actual": len(sends) * bits / ((t1 - t0) / 1e9),
        "reference_bps_after": min(p["load"] * cap_all, cap_post / p["bucket_ms"] * 1e3),
        "capacity_after_bps": cap_post / p["bucket_ms"] * 1e3, "wire_bytes": wire,
        "capacity_before_bps": cap_pre / p["bucket_ms"] * 1e3,
        "goodput_after_bps": sum(good[fail_i + 1:]) / max(1e-9, (n - fail_i - 1) * p["bucket_ms"] / 1e3),
        "t_fail_ns": t_fail, "t0_ns": t0, "end_ns": t1, "trigger_us": m.trigger_us,
        "first_loss_sent_ns": first_loss,
        "first_loss_after_fail_us": round((first_loss - t_fail) / 1e3, 1) if first_loss else None,
        "receiver_user_timestamps": m.receiver_user_timestamps, "send_errors": m.send_errors,
        "sender_skipped": m.sender_skipped,
        "goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good],
        "arrival_goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good_arr],
        "offered_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in offered]})
    if mode == "ecmp":
        on_s1 = {f for f, k in enumerate(flow_spines) if k == 0}
        res["flows_on_s1"] = sorted(on_s1)
        res["sent_after_fail_on_s1"] = sum(1 for f, q, ts in sends if f in on_s1 and ts >= t_fail)
    return res


def tcp_result(p: dict, m: TcpMeasurement) -> dict:
    """One TCP run's outage, per-connection progress and retransmissions."""
    mode, t_fail, recs, peer_ports = m.mode, m.t_fail, m.reads, m.peer_ports
    mss = p["mtu"] - IP6 - TCP_HDR - (MRC_OVERHEAD if mode == "mrc" else 0)
    wire = p["mtu"] + ETH
    t0, t1 = m.t0, m.end
    W = int(p["bucket_ms"] * 1e6)
    n = int((t1 - t0) // W)
    good = _buckets([r[0] for r in recs], [r[2] * 8 for r in recs], t0, n, W)
    fail_i = int((t_fail - t0) // W)
    pre_n = max(1, int(p["pre_ms"] / p["bucket_ms"]))
    pre = good[max(0, fail_i - pre_n):fail_i]
    pre_bps = sum(pre) / max(1e-9, len(pre) * p["bucket_ms"] / 1e3)
    cap_post_bps = _capacity(p, mode, mss, wire, p["spines"] - 1)
    ref_bps = min(pre_bps, cap_post_bps)
    ref_bucket = ref_bps * p["bucket_ms"] / 1e3
    res = _outage(p, good, lambda i0, i1: ref_bucket * (i1 - i0), t0, t_fail, n, p["tcp_window_ms"])
    pre_bucket = pre_bps * p["bucket_ms"] / 1e3
    res["pre_failure_windows_below"] = {
        str(w): _noise_floor(p, good, lambda i0, i1: pre_bucket * (i1 - i0), t0, t_fail, w)
        for w in sorted({p["window_ms"], p["tcp_window_ms"]})}
    # against the line, as the outage is after the failure: TCP's own dips
    cap_pre_bucket = _capacity(p, mode, mss, wire, p["spines"]) * p["bucket_ms"] / 1e3
    res["pre_failure_windows_below_capacity"] = _noise_floor(
        p, good, lambda i0, i1: cap_pre_bucket * (i1 - i0), t0, t_fail, p["tcp_window_ms"])
    # per connection: which spine (ECMP), bytes after the failure, stalled?
    spine_of_port = dict(zip(m.sports or [], m.conn_spines or []))
    half = t_fail + (t1 - t_fail) // 2
    end_judged = t0 + (n - int(p["tail_ms"] / p["bucket_ms"])) * W
    CW = int(p["conn_bucket_ms"] * 1e6)
    # the noise floor: the second before the failure, after the start-up
    noise_from = max(t_fail - 1_000_000_000, t0 + int(p["pre_ms"] * 1e6))
    conns = []
    for c in range(p["conns"]):
        rows = [r for r in recs if r[1] == c]
        conns.append({"sport": peer_ports[c] if c < len(peer_ports) else None,
                      "longest_gap_ms": _longest_gap(rows, t_fail, end_judged),
                      "noise_gap_ms": _longest_gap_before(rows, noise_from, t_fail),
                      "goodput_bps": [round(x * 8 / p["conn_bucket_ms"] * 1e3) for x in
                                      _buckets([r[0] for r in rows], [r[2] for r in rows], t0,
                                               int((t1 - t0) // CW), CW)],
                      "spine": (f"s{spine_of_port[peer_ports[c]] + 1}"
                                if c < len(peer_ports) and peer_ports[c] in spine_of_port else None),
                      "bytes_before": sum(r[2] for r in rows if r[0] < t_fail),
                      "bytes_after": sum(r[2] for r in rows if r[0] >= t_fail),
                      "bytes_second_half": sum(r[2] for r in rows if r[0] >= half)})
    stalled = [c for c, x in enumerate(conns) if x["bytes_second_half"] == 0]
    res["aggregate"] = dict(res)
    if stalled and res["recovered"]:
        res.update({"recovered": False, "outage_ms": None,
                    "outage_until_end_ms": round((t0 + n * W - t_fail) / 1e6, 1)})
    post = good[fail_i + 1:]
    (before, after), (before_rx, after_rx) = m.nstat_sender, m.nstat_receiver
    nst = {k2: after.get(k2, 0) - before.get(k2, 0) for k2 in NSTAT_KEYS + contenders.PLB_KEYS}
    for k2 in contenders.MPTCP_KEYS:
        nst[k2] = after.get(k2, 0) - before.get(k2, 0) + after_rx.get(k2, 0) - before_rx.get(k2, 0)
    gaps = [x["longest_gap_ms"] for x in conns if x["longest_gap_ms"] is not None]
    res["longest_gap_ms"] = max(gaps) if gaps else None
    noise = [x["noise_gap_ms"] for x in conns if x["noise_gap_ms"] is not None]
    res["noise_gap_ms"] = max(noise) if noise else None
    res["spines"] = m.spines_used
    res["failed_spine"] = m.failed_spine
    res["mptcp_subflows"] = m.mptcp_subflows
    res.update({"bytes": sum(r[2] for r in recs), "pre_failure_bps": pre_bps,
                "post_failure_bps": sum(post) / max(1e-9, len(post) * p["bucket_ms"] / 1e3),
                "reference_bps": ref_bps, "capacity_after_bps": cap_post_bps, "mss": mss,
                "conns": conns, "stalled_conns": stalled,
                "nstat": nst, "retransmits": nst["TcpRetransSegs"], "rtos": nst["TcpExtTCPTimeouts"],
                "t_fail_ns": t_fail, "t0_ns": t0, "end_ns": t1, "trigger_us": m.trigger_us,
                "goodput_bps_1ms": [round(x / p["bucket_ms"] * 1e3) for x in good]})
    return res


def _path_delta(a, b):
    (tx0, rx0), (tx1, rx1) = a, b
    out = {}
    for pid, x in tx1.items():
        y = tx0.get(pid, {"tx": 0, "downs": 0})
        r1, r0 = rx1.get(pid, {"rx": 0, "lost": 0}), rx0.get(pid, {"rx": 0, "lost": 0})
        out[pid] = {"first_segment": x["segments"][0] if x["segments"] else None,
                    "tx": x["tx"] - y["tx"], "rx": r1["rx"] - r0["rx"], "downs": x["downs"] - y["downs"],
                    "rx_seq_gaps": r1["lost"] - r0["lost"]}
        out[pid]["tx_minus_rx"] = out[pid]["tx"] - out[pid]["rx"]
    return out


def exclusion(evs, dead_path, t_fail, first_loss, end_ns):
    if evs is None:
        return {"events": "unreadable"}
    mine = [e for e in evs if e["path_id"] == dead_path]
    if evs and evs[0]["seq"] > 1 and evs[0]["ns"] > t_fail - 50_000_000:
        return {"events": "ring wrapped: events around t_fail were overwritten"}
    before = [e for e in mine if e["ns"] < t_fail]
    down_at_fail = bool(before) and before[-1]["type"] == "down"
    down = next((e for e in mine if e["ns"] >= t_fail and e["type"] == "down"), None)
    others = [e for e in evs if e["path_id"] != dead_path and t_fail <= e["ns"] <= end_ns and e["type"] == "down"]
    out = {"dead_path_id": dead_path, "dead_path_down_at_fail": down_at_fail,
           "dead_path_ups_after_fail": sum(1 for e in mine if e["ns"] >= t_fail and e["type"] == "up"),
           "healthy_path_downs_after_fail": len(others),
           "healthy_path_downs_per_s": round(len(others) / max(1e-9, (end_ns - t_fail) / 1e9), 1),
           "dead_path_events": [{k: e[k] for k in ("seq", "ns", "type", "after_us")}
                                for e in mine if e["ns"] >= t_fail - 10_000_000][:20]}
    if down_at_fail:
        out["exclusion_from_fail_us"] = 0.0
    elif down:
        out["exclusion_from_fail_us"] = round((down["ns"] - t_fail) / 1e3, 1)
        out["exclusion_after_unacked_us"] = down["after_us"]
        if first_loss:
            out["exclusion_from_first_loss_us"] = round((down["ns"] - first_loss) / 1e3, 1)
    return out


def analyse_run(p: dict, run: Run) -> dict:
    m = run.measurement
    r = udp_result(p, m) if isinstance(m, UdpMeasurement) else tcp_result(p, m)
    if run.mrc is not None:
        w = run.mrc
        paths = _path_delta((w.before.tx, w.before.rx), (w.after.tx, w.after.rx))
        dead = next((pid for pid, x in paths.items() if x["first_segment"] == w.dead_segment), 0)
        r["paths"] = paths
        r.update(exclusion(w.events, dead, r["t_fail_ns"], r.get("first_loss_sent_ns"), r["end_ns"]))
    return r


def _proof(mode: str, rs: list[dict], measured: Measured) -> dict:
    """A contender's proof that it is what it says (contenders.proof)."""
    rec = measured.mode_setup[mode]
    nst = {k: sum(r["nstat"].get(k, 0) for r in rs) for k in contenders.MPTCP_KEYS + contenders.PLB_KEYS}
    best = max(rs, key=lambda r: len(r["spines"]["carrying"]))
    pr = contenders.proof(mode, rec, best["spines"], nst, best.get("mptcp_subflows"))
    if mode == "prr":
        w = measured.prr_witness
        pr["witness"] = w
        pr["ok"] = pr["hash_ok"] and bool(w.get("ok"))
    return pr


# --------------------------------------------------------------------------- the scenario's results

def summarize(p: dict, measured: Measured) -> dict:
    """The scenario's results (the JSON document's "results"): every run
    analysed, the repetitions' spread per mode and protocol, the
    contenders' proofs, and notes."""
    runs = {mode: {proto: [analyse_run(p, r) for r in rs] for proto, rs in by.items()}
            for mode, by in measured.runs.items()}
    calib = {proto: dataclasses.asdict(c) for proto, c in measured.calibration.items()}
    extra = {"armed": measured.armed}
    if measured.mode_setup:
        extra["mode_setup"] = measured.mode_setup
    if measured.prr_witness is not None:
        extra["prr_witness"] = measured.prr_witness
    for mode in measured.runs:
        if mode in contenders.CONTENDERS:
            extra.setdefault("proof", {})[mode] = _proof(mode, runs[mode]["tcp"], measured)
    summary = {}
    for mode, by in runs.items():
        by = {proto: rs for proto, rs in by.items() if rs}
        summary[mode] = {}
        for proto, rs in by.items():
            s = {"outage_ms": spread([r["outage_ms"] for r in rs]),
                 "recovery_ms": spread([r["recovery_ms"] for r in rs]),
                 "dips_after_recovery": spread([r["dips_after_recovery"] for r in rs]),
                 "recovered": [r["recovered"] for r in rs],
                 "outage_until_end_ms": [r["outage_until_end_ms"] for r in rs], "runs": rs}
            if proto == "udp":
                for k in ("lost", "sent", "lost_after_fail", "lost_first_10ms"):
                    s[k] = spread([r[k] for r in rs])
            else:
                for k in ("retransmits", "rtos", "pre_failure_bps", "post_failure_bps",
                          "pre_failure_windows_below_capacity", "longest_gap_ms", "noise_gap_ms"):
                    s[k] = spread([r[k] for r in rs])
                s["stalled_conns"] = spread([len(r["stalled_conns"]) for r in rs])
            if mode == "mrc":
                for k in ("exclusion_from_fail_us", "exclusion_from_first_loss_us",
                          "healthy_path_downs_per_s"):
                    s[k] = spread([r.get(k) for r in rs])
            summary[mode][proto] = s
    notes = []
    for mode in summary:
        for proto, s in summary[mode].items():
            r = s["runs"][0]
            what = (f"outage {_outage_text(s)}; lost {fmt_spread(s['lost'])} of {fmt_spread(s['sent'])}"
                    if proto == "udp" else
                    f"outage {_outage_text(s)}; stalled connections {fmt_spread(s['stalled_conns'])}; "
                    f"retransmits {fmt_spread(s['retransmits'])}, RTOs {fmt_spread(s['rtos'])}")
            notes.append(f"{mode} {proto}: {what}")
            if proto == "udp" and mode == "ecmp":
                notes.append(f"  ecmp udp check: flows on s1 {r['flows_on_s1']}, black-holed "
                             f"{r['flows_blackholed']}; sent after t_fail on s1's flows "
                             f"{r['sent_after_fail_on_s1']} = lost after t_fail {r['lost_after_fail']}")
            if mode == "mrc":
                dp = r.get("dead_path_id")
                pd = (r.get("paths") or {}).get(dp, {})
                notes.append(f"  mrc {proto} check: s1's path {dp} "
                             + ("already down at t_fail" if r.get("dead_path_down_at_fail") else
                                f"down {r.get('exclusion_from_fail_us')} us after t_fail")
                             + f"; its tx-rx {pd.get('tx_minus_rx')}; healthy paths went down "
                             f"{r.get('healthy_path_downs_after_fail')} times after t_fail")
    for mode, pr in extra.get("proof", {}).items():
        notes.append(f"{mode} proof: {'ok' if pr.get('ok') else 'NOT SHOWN'} (hash {pr['hash']}"
                     + (f"; witness moved after {pr['witness'].get('moved_after_ms')} ms to "
                        f"{pr['witness'].get('moved_to')}, RTOs {pr['witness'].get('rtos')}" if "witness" in pr else "")
                     + (f"; joins {pr['mp_join_ack_rx']}, spines {pr['spines']['carrying']}" if mode == "mptcp" else "")
                     + (f"; PLB rehashes {pr['plb_rehash']}" if mode == "plb" else "") + ")")
    return {"modes": summary, "calibration": calib, "notes": notes, "conn_bucket_ms": p["conn_bucket_ms"],
            **extra}


def _outage_text(s) -> str:
    n_bad = sum(1 for x in s["recovered"] if not x)
    if n_bad:
        ends = [x for x in s["outage_until_end_ms"] if x is not None]
        return f"until the end (>= {min(ends):.0f} ms) in {n_bad}/{len(s['recovered'])} runs"
    return f"{fmt_spread(s['outage_ms'])} ms"


def table(results: dict):
    headers = ["mode", "proto", "outage ms (to last dip)", "recovered", "to first recovery ms",
               "dips after (TCP: before)", "UDP lost (after fail)", "TCP retrans",
               "TCP RTOs", "stalled conns", "TCP longest gap ms (before)", "MRC exclusion us (from fail)"]
    rows = []
    for mode, by in results["modes"].items():
        for proto, s in by.items():
            dips = fmt_spread(s.get("dips_after_recovery"))
            if "pre_failure_windows_below_capacity" in s:
                dips += f" ({fmt_spread(s['pre_failure_windows_below_capacity'])})"
            rows.append([mode, proto, _outage_text(s), f"{sum(s['recovered'])}/{len(s['recovered'])}",
                         fmt_spread(s.get("recovery_ms")), dips,
                         f"{fmt_spread(s['lost'])} ({fmt_spread(s['lost_after_fail'])})" if "lost" in s else "",
                         fmt_spread(s.get("retransmits")) if "retransmits" in s else "",
                         fmt_spread(s.get("rtos")) if "rtos" in s else "",
                         fmt_spread(s.get("stalled_conns")) if "stalled_conns" in s else "",
                         (f"{fmt_spread(s.get('longest_gap_ms'))} ({fmt_spread(s.get('noise_gap_ms'))})"
                          if "longest_gap_ms" in s else ""),
                         fmt_spread(s.get("exclusion_from_fail_us")) if "exclusion_from_fail_us" in s else ""])
    return headers, rows


def plot(results: dict, plt):
    """Goodput of every mode per protocol (the sum), UDP's delivered ratio,
    and one panel per mode with each TCP connection on its own line, so a
    connection that stalls shows even when the others fill its share."""
    modes = results["modes"]
    protos = list(dict.fromkeys(proto for by in modes.values() for proto in by))
    panels = [(proto, "goodput", None) for proto in protos]
    if "udp" in protos:
        panels.insert(protos.index("udp") + 1, ("udp", "ratio", None))
    panels += [("tcp", "conns", mode) for mode, by in modes.items() if "tcp" in by]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)

    def avg(g, k):
        return [sum(g[max(0, i - k + 1):i + 1]) / min(k, i + 1) / 1e6 for i in range(len(g))]

    for ax, (proto, what, only) in zip(axes[:, 0], panels):
        for mode, by in modes.items():
            if proto not in by or (only and mode != only):
                continue
            r = by[proto]["runs"][0]
            k = int(r.get("window_ms") or 10)
            t_fail_ms = (r["t_fail_ns"] - r["t0_ns"]) / 1e6
            g = r["goodput_bps_1ms"]
            xs = [i + 1 - t_fail_ms for i in range(len(g))]
            out = ("until the end" if not r["recovered"] else f"{r['outage_ms']:.1f} ms")
            if what == "conns":
                cb = results.get("conn_bucket_ms", 10)
                kk = max(1, int(50 / cb))
                for c, conn in enumerate(r["conns"]):
                    cg = conn.get("goodput_bps") or []
                    cx = [(i + 1) * cb - t_fail_ms for i in range(len(cg))]
                    ax.plot(cx, avg(cg, kk), lw=0.9,
                            label=f"conn {c + 1}{' on ' + conn['spine'] if conn.get('spine') and mode == 'ecmp' else ''}: "
                                  f"longest gap {conn.get('longest_gap_ms')} ms")
                ax.set_title(f"{mode}: every TCP connection (run 1, 50 ms avg); RTOs {r['rtos']}, "
                             f"longest gap {r.get('longest_gap_ms')} ms", fontsize=8)
                continue
            if what == "ratio":
                cap = r["capacity_after_bps"]
                fail_i = int(t_fail_ms)
                ref = [min(o, cap if i >= fail_i else r["capacity_before_bps"])
                       for i, o in enumerate(r["offered_bps_1ms"])]
                ratio = []
                for i in range(len(g)):
                    want = sum(ref[max(0, i - k + 1):i + 1])
                    ratio.append(sum(g[max(0, i - k + 1):i + 1]) / want if want > 0 else float("nan"))
                ax.plot(xs, ratio, lw=1.0, label=f"{mode}: lost {r['lost_after_fail']} after t_fail; outage {out}")
                continue
            axis = "by send time" if proto == "udp" else "by arrival"
            line, = ax.plot(xs, avg(g, k), lw=1.0, label=f"{mode} {axis} ({k} ms avg; outage {out})")
            if r.get("arrival_goodput_bps_1ms"):
                ax.plot(xs, avg(r["arrival_goodput_bps_1ms"], k), lw=0.5, alpha=0.5, color=line.get_color(),
                        label=f"{mode} by arrival ({k} ms avg)")
            ref = r.get("reference_bps_after") or r.get("reference_bps")
            if ref:
                ax.axhline(0.9 * ref / 1e6, color=line.get_color(), lw=0.6, ls="--")
        ax.axvline(0, color="red", lw=0.8)
        if what == "ratio":
            ax.axhline(0.9, color="grey", lw=0.6, ls="--")
            ax.set_ylabel("udp: delivered / reference\n(sliding windows)")
            ax.set_ylim(0, 1.3)
        else:
            ax.set_ylabel(f"{proto} goodput Mbit/s" if what != "conns" else "per connection Mbit/s")
            ax.set_ylim(bottom=0)
        ax.set_xlabel("ms since the black hole" + (" (dashed: 90% of the reference)" if what == "goodput" else ""))
        ax.legend(fontsize=6)
    return fig
