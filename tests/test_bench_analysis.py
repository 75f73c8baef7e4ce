"""The benches' analyses alone: each scenario's summarize() (and its
per-run functions) fed a small measurement built here, checked against
numbers worked out by hand.  No root, no fabric: what a scenario makes
of its measurements is testable apart from running it (tests/test_bench.py
runs the scenarios themselves)."""
from __future__ import annotations

import pytest

from mrc_ebpf.bench import collisions, contenders, cost, line_rate, reorder, spray_vs_ecmp

SID = "fc00:0:1::"


def _ping(rows) -> str:
    """`ping -D` output with one reply per (epoch s, RTT ms)."""
    return "".join(f"[{ts:.6f}] 64 bytes from fd00::2: icmp_seq={i} ttl=64 time={rtt} ms\n"
                   for i, (ts, rtt) in enumerate(rows, 1))


def _spines(**after) -> dict:
    return contenders.spines_used({k: 0 for k in after}, after)


# --------------------------------------------------------------------------- reorder

def _level(rx=True) -> reorder.Level:
    rx_before = {"received": [{"from": SID, "path_id": 0, "rx_packets": 100, "lost": 0,
                               "qdelay_hist": [100, 0, 0, 0]},
                              {"from": "fc00:0:9::", "path_id": 0, "rx_packets": 5, "lost": 0,
                               "qdelay_hist": [5, 0, 0, 0]}],
                 "reorder": [{"from": SID, "packets": 10, "reordered": 1, "reorder_hist": [1, 0]}]}
    rx_after = {"received": [{"from": SID, "path_id": 0, "rx_packets": 400, "lost": 2,
                              "qdelay_hist": [100, 0, 0, 300]},
                             {"from": SID, "path_id": 1, "rx_packets": 300, "lost": 0,
                              "qdelay_hist": [300, 0, 0, 0]},
                             {"from": "fc00:0:9::", "path_id": 0, "rx_packets": 900, "lost": 0,
                              "qdelay_hist": [900, 0, 0, 0]}],
                "reorder": [{"from": SID, "packets": 710, "reordered": 71, "reorder_hist": [1, 70]}]}
    empty = {"received": [], "reorder": []}
    during = {"s1": _ping([(1000.0, 100.0), (1006.0, 8.0), (1007.0, 8.0)])}
    during.update({k: _ping([(1006.0, 2.0)]) for k in ("s2", "s3", "s4")})
    return reorder.Level(
        delay_ms=5, window_clamp=65536, seconds=5.0, goodput_bps=150e6, mptcp_subflows=None,
        ping_idle={"s1": _ping([(999.0, 6.0), (999.1, 6.0)]), "s2": _ping([(999.0, 1.0)])},
        ping_during=during, t_done=1010.0, sender_sid=SID,
        rx_before=rx_before if rx else empty, rx_after=rx_after if rx else empty,
        tx_before={0: {"downs": 1}}, tx_after={0: {"downs": 4}, 1: {"downs": 0}},
        nstat_before={"TcpRetransSegs": 5}, nstat_after={"TcpRetransSegs": 9, "TcpExtTCPSACKReorder": 3},
        tbf_before={"packets": 10, "drops": 0}, tbf_after={"packets": 50, "drops": 2},
        spines=_spines(s1=100, s2=300, s3=300, s4=300))


def test_reorder_level_result():
    r = reorder.level_result(_level(), 200e6)
    assert r["fraction"] == pytest.approx(0.75)
    assert r["ping_idle_extra_ms"] == 5.0
    # the reply at 1000 s falls before the transfer's 5 s and is left out
    assert r["ping_during"]["s1"]["n"] == 2 and r["ping_during_extra_ms"] == 6.0
    assert (r["mrc_packets"], r["mrc_reordered"]) == (700, 70)
    assert r["mrc_reorder_fraction"] == pytest.approx(0.1)
    assert r["mrc_reorder_hist"] == [0, 70]
    paths = {x["path_id"]: x for x in r["paths"]}
    assert set(paths) == {0, 1}          # another sender's rows are not ours
    assert paths[0]["packets"] == 300 and paths[0]["lost"] == 2 and paths[0]["share"] == 0.5
    assert paths[0]["downs"] == 3 and paths[1]["downs"] == 0
    assert paths[0]["qdelay_mean_us"] == 6 and paths[1]["qdelay_mean_us"] == 0
    assert r["nstat"]["TcpRetransSegs"] == 4 and r["nstat"]["TcpExtTCPSACKReorder"] == 3
    assert r["slow_link_tbf"] == {"packets": 40, "drops": 2}


def test_reorder_contender_share_from_spines():
    """No MRC view (a contender): path 0's share is s1's share of the uplinks."""
    r = reorder.level_result(_level(rx=False), 200e6)
    assert [x["share"] for x in r["paths"]] == [0.1, 0.3, 0.3, 0.3]
    assert r["paths"][0]["downs"] is None and r["mrc_packets"] == 0


def test_reorder_summarize():
    p = {"delays_ms": [5]}
    m = reorder.Measured(200_000_000, "cubic", {"rr": {"5": [_level(), _level()]}},
                         {"prr": {"5": [_level(rx=False)]}},
                         {"prr": {"hash_read_back": {"hash": "flowlabel"}}}, {"prr": {"TcpExtTCPTimeouts": 1}})
    out = reorder.summarize(p, m)
    s = out["policies"]["rr"]["5"]
    assert s["fraction"]["median"] == pytest.approx(0.75) and s["fraction"]["n"] == 2
    assert s["slow_path_share"]["median"] == 0.5 and s["slow_path_downs"]["median"] == 3
    assert s["retransmits"]["median"] == 4 and s["slow_link_drops"]["median"] == 2
    assert out["contenders"]["prr"]["5"]["slow_path_share"]["median"] == 0.1
    assert out["proof"]["prr"]["hash_ok"] is True and out["proof"]["prr"]["spines"]["carrying"]
    assert out["tcp_congestion_control"] == "cubic" and out["capacity_bps"] == 200_000_000
    headers, rows = reorder.table(out)
    assert len(rows) == 2 and all(len(r) == len(headers) for r in rows)


# --------------------------------------------------------------------------- spray-vs-ecmp

def _transfer(bps, retrans, **spines) -> spray_vs_ecmp.Transfer:
    return spray_vs_ecmp.Transfer(1, bps, bps * 1.05, retrans, _spines(**spines), None)


def test_spray_vs_ecmp_summarize():
    p = {"modes": ["ecmp", "rr", "mptcp"], "flows": {"1500": [1]}}
    one = dict(s1=100, s2=0, s3=0, s4=0)
    every = dict(s1=100, s2=100, s3=100, s4=100)
    m = spray_vs_ecmp.MtuMeasured(
        1500, {"ecmp": {"1": [_transfer(45e6, 0, **one)]},
               "rr": {"1": [_transfer(160e6, 2, **every), _transfer(180e6, 4, **every)]},
               "mptcp": {"1": [_transfer(50e6, 1, **one), _transfer(120e6, 1, **every)]}},
        {"mptcp": {"hash_read_back": {"hash": "flowlabel"}}}, {"mptcp": {"MPTcpExtMPJoinAckRx": 3}},
        link_mtu=1500, mrc_mss=1300)
    out = spray_vs_ecmp.summarize(p, spray_vs_ecmp.Measured(200_000_000, [m]))
    r = out["mtus"]["1500"]
    assert r["ceiling"] == {"ecmp": round(1428 / 1514, 4), "rr": round(1288 / 1514, 4),
                            "mptcp": round(1428 / 1514, 4)}
    rr = r["modes"]["rr"]["1"]
    assert rr["fraction"]["median"] == pytest.approx(0.85) and rr["retransmits"]["median"] == 3
    assert rr["of_ceiling"]["median"] == pytest.approx(0.85 / r["ceiling"]["rr"])
    assert rr["spines_carrying"]["median"] == 4 and len(rr["runs"]) == 2
    # the proof takes the run whose packets crossed the most spines
    assert r["proof"]["mptcp"]["spines"]["carrying"] == ["s1", "s2", "s3", "s4"]
    assert r["proof"]["mptcp"]["ok"] is True
    assert out["notes"][0].startswith("MTU 1500, 1 flow: ecmp 0.23, rr 0.85, mptcp 0.42")
    headers, rows = spray_vs_ecmp.table(out)
    assert [row[1] for row in rows] == ["1", "header ceiling"]


# --------------------------------------------------------------------------- collisions

def test_collisions_summarize():
    before = {"TcpRetransSegs": 10, "TcpExtTCPTimeouts": 1, "TcpExtTCPDeliveredCE": 0}
    after = {"TcpRetransSegs": 15, "TcpExtTCPTimeouts": 2, "TcpExtTCPDeliveredCE": 7}
    rounds = lambda: [collisions.Rounds("permutation", 2, 4, [10.0, 20.0, 30.0, 40.0, 12.0, 50.0],  # noqa: E731
                                        [40.0, 50.0], before, after, {"down": 2, "late": 1, "up": 1})]
    m = collisions.Measured(200_000_000, 1 << 20, [
        collisions.ModeMeasured("mrc", rounds(), {"hash_read_back": {"hash": "l4"}}),
        collisions.ModeMeasured("plb", rounds(), {"hash_read_back": {"hash": "flowlabel"}},
                                _spines(s1=1, s2=1), {"TcpExtTCPPLBRehash": 0})])
    out = collisions.summarize({"rounds": {"permutation": 1}}, m)
    s = out["modes"]["mrc"]["permutation"]
    ideal = 2 * (1 << 20) * 8 / 200e6 * 1e3
    assert s["ideal_ms"] == pytest.approx(ideal)
    assert s["round_p99_ms"] == 50.0 and s["round_p99_over_ideal"] == pytest.approx(50.0 / ideal)
    assert s["message_ms"] == {"p50": 30.0, "p99": 50.0, "max": 50.0}
    assert (s["retransmits"], s["rtos"], s["ce_delivered"]) == (5, 1, 7)
    assert s["path_downs"] == 2
    assert "path_downs" not in out["modes"]["plb"]["permutation"]
    assert list(out["proof"]) == ["plb"] and out["proof"]["plb"]["ok"] is False   # no rehash
    assert "plb proof: NOT SHOWN" in out["notes"][-1]
    headers, rows = collisions.table(out)
    assert len(rows) == 2 and rows[0][-1] == 2


# --------------------------------------------------------------------------- line-rate

def test_line_rate_summarize():
    tcp = lambda bps, busy: line_rate.Iperf(  # noqa: E731
        "tcp1", 2, {"sum_received": {"bits_per_second": bps}, "sum_sent": {"retransmits": 7}}, busy)
    mrc = tcp(2e9, 4.0)
    mrc.paths_before, mrc.paths_after = {0: 0, 1: 10}, {0: 300, 1: 110}
    # the uplinks every 10 ms: one window even, one not
    mrc.windows = {"ifaces": ["s1", "s2"], "t_ns": [0, 10_000_000, 20_000_000],
                   "bytes": [[0, 0], [100, 100], [250, 150]]}
    udp = line_rate.Iperf("udp", 2, {"sum": {"bits_per_second": 1e9, "lost_percent": 10}}, 1.0)
    r = line_rate.iperf_result(udp)
    assert r["gbps"] == pytest.approx(0.9) and r["retransmits"] is None
    runs = {"pair": {"1500": {"seg6": {"tcp1": [tcp(4e9, 2.0)]}, "mrc": {"tcp1": [mrc]}}}}
    p = {"places": ["pair"], "mtus": [1500]}
    out = line_rate.summarize(p, line_rate.Measured(runs, {"pair mrc": {"ok": 1}}, ["a note"]))
    s = out["summary"]["pair"]["1500"]["mrc"]["tcp1"]
    assert s["gbps"]["median"] == pytest.approx(2.0)
    assert s["cpu_s_per_gbit"]["median"] == pytest.approx(1.0)      # 4 s busy for 2 Gbit/s over 2 s
    assert s["runs"][0]["path_shares"] == [0.75, 0.25] and s["runs"][0]["retransmits"] == 7
    assert out["notes"][0] == "a note" and "= 0.50 of the kernel's SRv6 (4.00)" in out["notes"][1]
    assert out["status"] == {"pair mrc": {"ok": 1}}
    assert s["runs"][0]["spine_windows"]["fraction_within"] == 0.5
    assert s["windows_even"]["median"] == 0.5 and "windows_even" not in out["summary"]["pair"]["1500"]["seg6"]["tcp1"]
    headers, rows = line_rate.table(out)
    assert headers[-2:] == ["shares (paths or spines)", "10 ms windows even"]
    assert rows[1][-2:] == ["0.75 0.25", "0.5 (0.5-0.5)"] and rows[0][-1] == ""


# --------------------------------------------------------------------------- cost

def _point(policy, paths, tx, rx):
    return {"policy": policy, "paths": paths, "key": False,
            "tx_ns": {"p10": tx - 5, "median": tx, "p90": tx + 5}, "rx_ns": {"p10": rx - 5, "median": rx, "p90": rx + 5}}


def _peer_row(layout_, peers, tx):
    return {"layout": layout_, "lookup": "cache", "peers": peers, "paths": 256, "memlock": 1 << 20,
            "memlock_128_cpus": 2 << 20, "maps": {}, "tx_ns": {"median": tx}, "rx_ns": {"median": 50}}


def test_cost_summarize():
    assert cost.flood_result(cost.Flood(1000, 98_000, 0.5)) == {
        "pps": 2000.0, "payload_gbps": 2000 * 64 * 8 / 1e9, "wire_gbps": 98_000 * 8 / 0.5 / 1e9,
        "frame_bytes": 98.0, "seconds": 0.5}
    progs = [[_point("rr", 1, 100, 50), _point("rr", 256, 150, 60)],
             [_point("rr", 1, 110, 50), _point("rr", 256, 160, 60)]]
    peers = [[_peer_row("own paths", 1, 100), _peer_row("template", 1, 110), _peer_row("template", 1000, 132)]]
    batches = [{"what": "data", "paths": 1, "key": k, "batch": 0, "tx": 120.0 if k else 100.0, "rx": 60.0,
                "floor_tx": 20.0, "floor_rx": 10.0} for k in (False, True)]
    floods = {"none": [cost.Flood(4000, 1, 1.0)], "mrc": [cost.Flood(2000, 1, 1.0)],
              "mrc-key": [cost.Flood(1800, 1, 1.0)], "kernel": [cost.Flood(2500, 1, 1.0)]}
    p = {"policies": ["rr"], "setups": ["none", "mrc", "mrc-key", "kernel"]}
    out = cost.summarize(p, cost.Measured(progs, peers, batches, floods))
    assert out["prog_test_run"][1]["tx_ns_median"] == {"min": 150, "median": 155.0, "max": 160, "n": 2}
    assert out["flatness_256_over_1"]["rr_tx_256_over_1"] == pytest.approx(155 / 105)
    assert out["throughput"]["mrc"]["ratio_to_none"]["median"] == 0.5
    assert out["mrc_over_kernel_pps"]["median"] == pytest.approx(0.8)
    assert out["key_cost"][0]["tx_key_over_no_key"] == pytest.approx(1.2)
    assert out["key_cost"][0]["tx_own_key_over_no_key"] == pytest.approx(100 / 80)
    assert out["flatness_peers"]["tx_1000_over_1"] == pytest.approx(1.2)
    assert out["flatness_peers"]["tx_template_1_over_own_paths"] == pytest.approx(1.1)
    assert "mrc with a key / without pps ratio 0.90" in out["notes"]
    headers, rows = cost.table(out)
    assert len(rows) == 2 + 1 + 3 + 4
