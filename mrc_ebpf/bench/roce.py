"""RoCEv2 (soft-RoCE, rxe) over MRC's paths: goodput, go-back-N and failover.

VM only: the 6.1 kernel `make vm-test` boots has rdma_rxe, the host kernel
no RDMA stack (`mrcctl bench roce` elsewhere says so and exits 1).  The
fabric is mrc_ebpf/lab/roce.py's: two rxe hosts in the VM's initial
namespace, each behind a gateway running mrc-ebpf, four paths through
kernel End routers.  TCG emulation makes everything slow (MB/s, round
trips of milliseconds): compare the modes within one run, not with
hardware.

Modes (the gateways' policy for the RoCE peer prefix):
  ecmp    `hash`: one path per QP by the flow hash (QPs differ in UDP source
          port), and failover off (the attached ack timeout set to 10 s):
          what a fabric's ECMP gives RoCE, a QP on a dead path stays there;
  spray   `rr`: per packet over the four paths, MRC's spraying without
          an out-of-order NIC: each reordering is a go-back-N for RC;
  roce    `roce`: each QP on one path, QPs spread by turns, a QP moved only
          with nothing in flight or at once when its path is taken out.
The spray and roce modes run with the ack timeout ack_timeout_us.

Per mode and QP count: ib_write_bw (RC, `size`-byte writes, `seconds`)
goodput from perftest's report (QP timeout `qp_timeout`, perftest's -u:
537 ms at 17, as lab.QP_TIMEOUT; `tx_depth` writes outstanding per QP,
perftest's -t, as lab.TX_DEPTH, which says why); NAK sequence errors as rxe A's completer
counted them (hw_counters rcvd_seq_err) and as A's gateway read them in
the ACKs' AETH (rx_roce_nak_seq); PSNs sent again (tx_roce_retrans); each
path's share of the RoCE packets (roce_paths).  Failover, 8 QPs: path 2
(router R2) black-holed both ways `fail_at_s` after the writes began, in
a `fail_seconds` run;
per QP the longest time without an ACK reaching rxe A (tcpdump at A's
gateway) from 0.5 s before the failure began to fail_window_s after it
was complete, whether each QP was acknowledged after it, and whether a QP errored out (perftest's completion error, rxe's
retry_exceeded_err).
"""
from __future__ import annotations

import statistics
import time

from mrc_ebpf.bench.runner import log
from mrc_ebpf.errors import MrcError

TITLE = "RoCEv2 (rxe) over 4 paths: ECMP, per-packet spray, the roce policy (VM)"
USES_TCP = False
MODES = {"ecmp": "hash", "spray": "rr", "roce": "roce"}


def params(short: bool) -> dict:
    return {"modes": list(MODES), "qps": [1, 8], "seconds": 2 if short else 4, "size": 4096,
            "repeat": 1 if short else 2, "ack_timeout_us": 50000, "probe_us": 100000,
            "ecmp_ack_timeout_us": 10_000_000, "fail_at_s": 2, "fail_seconds": 5 if short else 7,
            "fail_window_s": 2.0, "fail_path": 2, "qp_timeout": 17, "tx_depth": 4}


def check(p: dict) -> None:
    from mrc_ebpf.lab import roce as lab
    why = lab.unavailable()
    if why:
        raise MrcError(f"bench roce runs in the VM only (make vm-test TESTS='vm_tests/bench_roce.py'): {why}")
    bad = [m for m in p["modes"] if m not in MODES]
    if bad:
        raise MrcError(f"roce: unknown modes {bad} (ecmp, spray, roce)")


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def _shares(f, before: list[dict]) -> list[float]:
    """Each of our paths' share of the RoCE packets A's gateway sent."""
    def tx(rows):
        return {r["path_id"]: r["tx_packets"] for r in rows if r["side"] == "tx"}
    b, a = tx(before), tx(f.roce_stats(f.A)["paths"])
    d = [a.get(i, 0) - b.get(i, 0) for i in range(f.n)]
    total = sum(d) or 1
    return [round(x / total, 4) for x in d]


def _one(f, p, mode: str, qps: int) -> dict:
    from mrc_ebpf.lab import roce as lab
    rxe0, mrc0, paths0 = lab.rxe_counters(lab.RXE_A), f.counters(f.A), f.roce_stats(f.A)["paths"]
    known = {q["sport"] for q in f.roce_stats(f.A)["qps"]}
    r = f.write_bw(qps=qps, seconds=p["seconds"], size=p["size"], qp_timeout=p["qp_timeout"],
                   depth=p.get("tx_depth", lab.TX_DEPTH))
    new = [q for q in f.roce_stats(f.A)["qps"] if q["sport"] not in known and q["tx_packets"]]
    rxe, mrc = _delta(lab.rxe_counters(lab.RXE_A), rxe0), _delta(f.counters(f.A), mrc0)
    mb = r.get("bytes", 0) * r.get("iterations", 0) / 1e6
    naks = rxe.get("rcvd_seq_err", 0)
    return {"mode": mode, "qps": qps, "ok": r["ok"], "error": r["error"],
            "goodput_mb_s": r.get("bw_avg_mb_s"), "mb": round(mb, 2),
            "naks_seq_rxe": naks, "naks_seq_mrc": mrc.get("rx_roce_nak_seq", 0),
            "naks_per_mb": round(naks / mb, 3) if mb else None,
            "retrans_psns": mrc.get("tx_roce_retrans", 0), "retry_exceeded": rxe.get("retry_exceeded_err", 0),
            "shares": _shares(f, paths0), "qps_moved": sum(1 for q in new if q["moves"])}


def _failover(f, p, mode: str) -> dict:
    from mrc_ebpf.lab import roce as lab
    rxe0 = lab.rxe_counters(lab.RXE_A)
    known = {q["sport"] for q in f.roce_stats(f.A)["qps"]}
    cap = lab.Capture(f.A)
    mark = {}

    def fail():
        time.sleep(p["fail_at_s"])
        mark["t0"] = time.time()
        f.blackhole(p["fail_path"])
        mark["t1"] = time.time()    # both ways dead by now
    try:
        r = f.write_bw(qps=8, seconds=p["fail_seconds"], size=p["size"], during=fail,
                       qp_timeout=p["qp_timeout"], depth=p.get("tx_depth", lab.TX_DEPTH))
    finally:
        f.blackhole(p["fail_path"], on=False)
        packets = cap.stop()
    rxe = _delta(lab.rxe_counters(lab.RXE_A), rxe0)
    gaps = lab.ack_gaps(packets, mark["t0"] - 0.5, mark["t1"] + p["fail_window_s"])
    # per QP, from its last ACK before the black hole was complete to its first after
    resume = lab.ack_resume(packets, mark["t1"])
    back = [v for v in resume.values() if v is not None]
    qps = [q for q in f.roce_stats(f.A)["qps"] if q["sport"] not in known and q["tx_packets"]]
    errored = (not r["ok"]) or rxe.get("retry_exceeded_err", 0) > 0
    return {"mode": mode, "ok": r["ok"], "error": r["error"], "qp_errored": errored,
            "retry_exceeded": rxe.get("retry_exceeded_err", 0), "goodput_mb_s": r.get("bw_avg_mb_s"),
            "qps_acked_after": len(back), "blackhole_s": round(mark["t1"] - mark["t0"], 3),
            "ack_gap_ms": {str(k): round(v * 1000, 1) for k, v in sorted(gaps.items())},
            "longest_gap_ms": round(max(gaps.values()) * 1000, 1) if gaps else None,
            "resume_ms": {str(k): (round(v * 1000, 1) if v is not None else None)
                          for k, v in sorted(resume.items())},
            "longest_resume_ms": round(max(back) * 1000, 1) if back else None,
            "qps_moved": sum(1 for q in qps if q["moves"]), "naks_seq_rxe": rxe.get("rcvd_seq_err", 0)}


def steps(p: dict) -> int:
    return len(p["modes"]) * (len(p["qps"]) * p["repeat"] + 1)


def run(p: dict, env) -> dict:
    from mrc_ebpf.bench.runner import MADE
    from mrc_ebpf.lab import roce as lab
    from mrc_ebpf.lab.topology import Topology
    topo = Topology(prefix="broce")
    MADE.append("broce")
    f = None
    try:
        f = lab.RoceFabric(topo)
        log("roce: attaching (a verifier run of minutes under emulation)")
        f.attach(MODES[p["modes"][0]], "--ack-timeout-us", str(p["ack_timeout_us"]),
                 "--probe-us", str(p["probe_us"]))
        return measure(f, p)
    finally:
        if f is not None:
            f.close()
        topo.destroy()


def measure(f, p: dict) -> dict:
    """Every mode's runs and failover on an attached RoceFabric (the VM
    suite's bench_roce.py reuses its tests' fabric: an attach is minutes)."""
    runs, fails = [], []
    rtt = f.rtt_ms()
    for mode in p["modes"]:
        f.set_ack_timeout(p["ecmp_ack_timeout_us"] if mode == "ecmp" else p["ack_timeout_us"])
        f.policy(MODES[mode])
        for rep in range(p["repeat"]):
            for qps in p["qps"]:
                r = _one(f, p, mode, qps)
                log(f"roce: {mode} {qps} QPs: {r['goodput_mb_s']} MB/s, NAK seq {r['naks_seq_rxe']} "
                    f"(mrc {r['naks_seq_mrc']}), shares {r['shares']}")
                runs.append(r)
        r = _failover(f, p, mode)
        log(f"roce: failover {mode}: errored {r['qp_errored']}, longest ACK gap {r['longest_gap_ms']} ms, "
            f"moved {r['qps_moved']}")
        fails.append(r)
    f.set_ack_timeout(p["ack_timeout_us"])
    summary = {}
    for r in runs:
        s = summary.setdefault(f"{r['mode']}/{r['qps']}", {"goodput_mb_s": [], "naks_per_mb": [],
                                                             "naks_seq_rxe": [], "max_share_dev": []})
        s["goodput_mb_s"].append(r["goodput_mb_s"])
        s["naks_per_mb"].append(r["naks_per_mb"])
        s["naks_seq_rxe"].append(r["naks_seq_rxe"])
        used = [x for x in r["shares"] if x] if r["qps"] < len(r["shares"]) else r["shares"]
        mean = 1 / len(used) if used else 0
        s["max_share_dev"].append(round(max(abs(x - mean) / mean for x in used), 3) if used else None)
    return {"runs": runs, "failover": fails, "summary": summary, "rtt_ms": rtt}


def _med(v):
    v = [x for x in v if x is not None]
    return round(statistics.median(v), 3) if v else None


def table(results: dict):
    headers = ["mode/QPs", "goodput MB/s", "NAK seq (rxe)", "NAKs per MB", "max path share dev"]
    rows = [[k, _med(s["goodput_mb_s"]), _med(s["naks_seq_rxe"]), _med(s["naks_per_mb"]),
             _med(s["max_share_dev"])] for k, s in results["summary"].items()]
    rows += [[f"failover {r['mode']}", r["goodput_mb_s"], r["naks_seq_rxe"], "",
              f"errored {r['qp_errored']}, longest ACK gap {r['longest_gap_ms']} ms, "
              f"{r['qps_acked_after']}/8 QPs acked after"] for r in results["failover"]]
    return headers, rows


def plot(results: dict, plt):
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    keys = list(results["summary"])
    a.bar(keys, [_med(results["summary"][k]["goodput_mb_s"]) or 0 for k in keys], color="tab:blue")
    a.set_ylabel("ib_write_bw goodput, MB/s (median)")
    a.tick_params(axis="x", rotation=45)
    modes = [r["mode"] for r in results["failover"]]
    b.bar(modes, [r["longest_gap_ms"] or 0 for r in results["failover"]],
          color=["tab:red" if r["qp_errored"] else "tab:green" for r in results["failover"]])
    b.set_ylabel("longest ACK gap after the failure, ms")
    return fig
