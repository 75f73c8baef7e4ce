"""Soft-RoCE (rxe) over MRC's paths, in the VM (Debian's 6.1 kernel ships
rdma_rxe; the host kernel has no RDMA stack).  The fabric is
mrc_ebpf/lab/roce.py's: two rxe hosts in the VM's initial namespace (6.1's
rxe works there only), each behind a gateway namespace running mrc-ebpf,
four paths through kernel End routers between the gateways.

Witnesses: perftest's and rdma-core's own reports, rxe's own counters
(/sys/class/infiniband/*/ports/1/hw_counters, `rdma statistic`), and the
capture of the RoCE packets at A's gateway.  No wall-clock asserts:
the gaps and goodputs go to the bench (`mrcctl bench roce`, docs/bench/).
One attach (one bcc compile, about a minute under TCG) serves all tests.
"""
from __future__ import annotations

import time

import pytest

from mrc_ebpf.lab import roce as lab
from mrc_ebpf.lab.topology import Topology

pytestmark = pytest.mark.root

# under emulation round trips take milliseconds: a longer clock than the
# datacenter default, the VM suite's (vm_tests/test_vm_datapath.py).  50 ms
# took healthy paths down under 8 QPs of ib_write_bw on a loaded machine,
# and each false down moves a QP; a black hole is still routed around well
# within rxe's retries (lab.QP_TIMEOUT).
TIMERS = ("--ack-timeout-us", "300000", "--probe-us", "100000")


@pytest.fixture(scope="module")
def fab():
    why = lab.unavailable()
    if why:
        pytest.skip(why)
    topo = Topology(prefix="vmroce")
    f = None
    try:
        f = lab.RoceFabric(topo)
        f.attach("roce", *TIMERS)
        yield f
    finally:
        if f is not None:
            f.close()
        topo.destroy()


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _snap(f):
    return {"rxe_a": lab.rxe_counters(lab.RXE_A), "rxe_b": lab.rxe_counters(lab.RXE_B),
            "mrc_a": f.counters(f.A), "mrc_b": f.counters(f.B)}


def _diff(f, before):
    after = _snap(f)
    return {k: _delta(after[k], before[k]) for k in after}


def test_vm_rc_pingpong_across_mrc_paths(fab):
    """ibv_rc_pingpong completes over the encapsulated paths, and the
    packets are conserved along the way: rxe A's sent >= what A's gateway
    encapsulated as RoCE >= what B's gateway decapsulated as RoCE >= rxe
    B's received (emulated veths drop a few when their backlog is full:
    the baseline without mrc-ebpf had go-back-N too), nearly all of them."""
    before = _snap(fab)
    r = fab.rc_pingpong(iters=100)
    assert r["rc"] == 0 and "100 iters" in r["client"], r
    d = _diff(fab, before)
    sent, rcvd = d["rxe_a"].get("sent_pkts", 0), d["rxe_b"].get("rcvd_pkts", 0)
    assert sent >= 200 and rcvd >= 200, d
    tx_roce, rx_roce = d["mrc_a"].get("tx_roce", 0), d["mrc_b"].get("rx_roce", 0)
    assert sent >= tx_roce >= rx_roce >= rcvd >= 0.9 * sent, d
    # rdma's netlink view is the same counters
    stat = lab.rdma_statistic(lab.RXE_A)
    assert stat["sent_pkts"] == lab.rxe_counters(lab.RXE_A)["sent_pkts"]
    # the QP is known to both gateways: A sent its requests, B heard them
    qps_a = fab.roce_stats(fab.A)["qps"]
    assert any(q["tx_packets"] >= 100 and q["acks"] > 0 for q in qps_a), qps_a


def test_vm_write_bw_8_qps_on_4_paths(fab):
    """ib_write_bw with 8 QPs under the roce policy: two QPs on each path,
    each QP on one path throughout; the NAKs MRC counts are rxe's."""
    before = _snap(fab)
    known = {q["sport"] for q in fab.roce_stats(fab.A)["qps"]}
    r = fab.write_bw(qps=8, seconds=3)
    assert r["ok"] and r["rc"] == 0, r["report"][-1500:]
    d = _diff(fab, before)
    qps = [q for q in fab.roce_stats(fab.A)["qps"] if q["sport"] not in known and q["tx_packets"] > 0]
    assert len(qps) == 8, qps
    events = fab.events(fab.A)
    print("QPs:", qps, "\nA's events:", events[-16:])
    assert all(q["moves"] == 0 for q in qps), (qps, events[-16:], d["mrc_a"])
    per_path = {}
    for q in qps:
        per_path[q["path_id"]] = per_path.get(q["path_id"], 0) + 1
    assert per_path == {0: 2, 1: 2, 2: 2, 3: 2}, per_path
    # NAK sequence errors: A's gateway read (in the AETH of what B sent
    # back) at least those rxe A's completer acted on and counted
    assert d["mrc_a"].get("rx_roce_nak_seq", 0) >= d["rxe_a"].get("rcvd_seq_err", 0), d
    assert d["rxe_a"].get("sent_pkts", 0) >= d["mrc_a"].get("tx_roce", 0) > 0, d


def _events_at(f, ns: str, t: float) -> list[tuple]:
    """NS's path events as (seconds after wall-clock time t, type, path,
    seconds its clock had run): `ago_ms` is from the read."""
    now = time.time()
    return [(round(now - e["ago_ms"] / 1000 - t, 3), e["type"], e["path_id"],
             round(e["after_us"] / 1e6, 3)) for e in f.events(ns)]


def test_vm_blackhole_under_write_bw_no_qp_errors(fab):
    """One path black-holed (both ways, by its router) 2 s after an 8-QP
    ib_write_bw's writes began: the run completes without a completion
    error, rxe counts no retry exceeded, the datapath takes the path down
    and the QPs that were on it move to live paths, and every QP is
    acknowledged again (tcpdump at A's gateway) within a bound made of the
    run's own timers: the ack timeout, two of rxe's QP timeouts (a QP on
    the dead path waits for its timer, and at most one resend of it may
    still go into the path before the path is out) and half a second for
    the emulation's stalls."""
    rtt = fab.rtt_ms()
    before = _snap(fab)
    known = {q["sport"] for q in fab.roce_stats(fab.A)["qps"]}
    events_a, events_b = len(fab.events(fab.A)), len(fab.events(fab.B))
    cap = lab.Capture(fab.A)
    marks = {}

    def fail():                 # called once the writes flow
        time.sleep(2)
        marks["t0"] = time.time()
        fab.blackhole(2)
        marks["t1"] = time.time()   # both ways dead by now
    try:
        r = fab.write_bw(qps=8, seconds=6, during=fail)
    finally:
        fab.blackhole(2, on=False)
        packets = cap.stop()
    d = _diff(fab, before)
    t0, t1 = marks["t0"], marks["t1"]
    qps = [q for q in fab.roce_stats(fab.A)["qps"] if q["sport"] not in known and q["tx_packets"] > 0]
    ev_a, ev_b = _events_at(fab, fab.A, t0)[events_a:], _events_at(fab, fab.B, t0)[events_b:]
    # the longest time without an ACK per QP, from before the failure
    # began (t0) to well after it was complete (t1), and whether each QP
    # was acknowledged after t1
    limit = int(TIMERS[1]) / 1e6 + 2 * lab.qp_timeout_s() + 0.5
    gaps = lab.ack_gaps(packets, t0 - 0.5, t1 + limit)
    resume = lab.ack_resume(packets, t1)
    print("RTT (ping, ms):", rtt, "\nblack hole put in place in", round(t1 - t0, 3), "s",
          "\nA's events (s after t0, type, path, clock s):", ev_a,
          "\nB's events:", ev_b, "\nQPs after the black hole:", qps,
          "\nlongest ACK gap per QP (s):", {k: round(v, 3) for k, v in gaps.items()},
          "\nACK gap across t1 per QP (s):",
          {k: (round(v, 3) if v is not None else None) for k, v in resume.items()},
          "\ncapture:", len(packets), "packets,", cap.stats, "\ncounters:", d)
    assert r["ok"] and r["rc"] == 0, r["report"][-1500:]
    assert d["rxe_a"].get("retry_exceeded_err", 0) == 0, d
    assert len(qps) == 8
    # path id 1 is R2's: its two QPs moved, at once (they had PSNs in
    # flight), and none is left on it
    assert sum(1 for q in qps if q["moves"] > 0) >= 2, qps
    assert all(q["path_id"] != 1 for q in qps), qps
    assert d["mrc_a"].get("tx_reroute", 0) > 0, d
    assert any(e[1] == "down" and e[2] == 1 for e in ev_a), ev_a
    # every QP acknowledged again after the failure, none waiting longer
    # than the run's timers allow
    assert len(resume) == 8 and all(v is not None for v in resume.values()), resume
    assert len(gaps) == 8 and max(gaps.values()) < limit, (gaps, limit)
