"""mrcctl bench SCENARIO --short: each scenario's JSON (structure, sane
values) and PNG, and no namespace left behind.  The five scenarios run as
separate processes two at a time (started once for the module) to stay
within the CI budget; each test checks one of them."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrc_ebpf.bench.runner import DEFAULT_HOST_SYSCTLS, SCENARIOS

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parent.parent
PARALLEL = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    pending = list(SCENARIOS)
    running, done = {}, {}
    try:
        while pending or running:
            while pending and len(running) < PARALLEL:
                name = pending.pop(0)
                running[name] = subprocess.Popen(
                    [sys.executable, "-m", "mrc_ebpf.cli.mrcctl", "bench", name, "--short", "--out", str(out / name)],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    o, e = proc.communicate()
                    done[name] = (proc.returncode, o, e)
                    del running[name]
            time.sleep(0.5)
    finally:
        for proc in running.values():
            proc.kill()
            proc.wait()
    return out, done


def _load(runs, name):
    out, done = runs
    rc, o, e = done[name]
    assert rc == 0, f"{name} failed: {e[-2000:]}"
    doc = json.loads((out / name / f"{name}.json").read_text())
    png = out / name / f"{name}.png"
    assert png.stat().st_size > 1000
    assert doc["scenario"] == name and doc["short"] is True and doc["params"]
    assert doc["namespace_prefixes"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for prefix in doc["namespace_prefixes"]:
        assert prefix not in left, f"namespace {prefix}* left behind"
    assert "median (min-max)" in o
    # every TCP flow runs the congestion control the run names, not the host's default
    assert doc["params"].get("tcp_congestion") == (None if name == "cost" else "cubic")
    # and every fabric host the run's sysctls (the default set here)
    assert doc["params"].get("host_sysctls") == (None if name == "cost" else list(DEFAULT_HOST_SYSCTLS))
    assert doc["params"].get("ecn_threshold") == {"collisions": "1ms"}.get(name)
    return doc["results"]


def _sane_fraction(s):
    assert 0 < s["min"] <= s["median"] <= s["max"] <= 1.2


def test_spray_vs_ecmp(runs):
    doc = _load(runs, "spray-vs-ecmp")
    assert list(doc["mtus"]) == ["1500"]            # short mode: the 1500-byte fabric only
    r = doc["mtus"]["1500"]
    assert set(r["modes"]) == {"ecmp", "rr", "bytes", "adaptive", "single"}
    for by_n in r["modes"].values():
        for s in by_n.values():
            _sane_fraction(s["fraction"])
    # headers' ceiling: 1500-byte frames, 72 bytes of IPv6+TCP (timestamps)
    # and 14 of Ethernet; MRC's route MTU leaves room for the encapsulation
    ceiling = r["ceiling"]
    assert ceiling["ecmp"] == round((1500 - 72) / 1514, 4)
    assert ceiling["rr"] == ceiling["bytes"] == ceiling["adaptive"] == ceiling["single"] < ceiling["ecmp"]
    # nothing can beat it: a ceiling computed wrong would show here
    for m, by_n in r["modes"].items():
        for s in by_n.values():
            assert s["fraction"]["max"] <= ceiling[m] * 1.03, (m, s["fraction"], ceiling[m])
            assert s["of_ceiling"]["median"] == pytest.approx(s["fraction"]["median"] / ceiling[m])


def test_cost(runs):
    r = _load(runs, "cost")
    for keyed in (False, True):
        assert [x["paths"] for x in r["prog_test_run"] if x["policy"] == "rr" and x["key"] == keyed] == \
            [1, 16, 256]
    for x in r["prog_test_run"]:
        assert 0 < x["tx_ns_median"]["median"] < 1e6 and 0 < x["rx_ns_median"]["median"] < 1e6
    assert set(r["key_over_no_key_ns"]) and all(v > 0 for v in r["key_over_no_key_ns"].values())
    for setup in ("none", "mrc", "mrc-key", "kernel"):
        assert r["throughput"][setup]["pps"]["median"] > 1000
    assert r["mrc_over_kernel_pps"]["median"] > 0


def test_failover(runs):
    r = _load(runs, "failover")
    for mode in ("ecmp", "mrc"):
        udp = r["modes"][mode]["udp"]
        assert udp["sent"]["median"] > 0 and udp["lost"]["median"] > 0      # the hole ate something
        run = udp["runs"][0]
        assert run["goodput_bps_1ms"] and len(run["goodput_bps_1ms"]) == len(run["offered_bps_1ms"])
        assert run["lost_before_fail"] <= 0.01 * run["sent"]                # losses are the hole's
        assert r["modes"][mode]["tcp"]["runs"][0]["bytes"] > 0
    ecmp_udp, mrc_udp = r["modes"]["ecmp"]["udp"], r["modes"]["mrc"]["udp"]
    # ECMP keeps a quarter of its flows in the gray hole for good: the
    # flows calibrated onto s1 are exactly the ones that went dark
    for run in ecmp_udp["runs"]:
        assert run["flows_on_s1"] and run["flows_blackholed"] == run["flows_on_s1"]
        assert run["lost_after_fail"] >= run["sent_after_fail_on_s1"] > 0
        assert not run["recovered"] and run["outage_ms"] is None and run["outage_until_end_ms"] > 0
        assert run["recovery_ms"] is None                                   # never back at 90% either
    for run in r["modes"]["ecmp"]["tcp"]["runs"]:
        assert run["stalled_conns"] and not run["recovered"]                # s1's connection never resumes
    # MRC takes the path down: far fewer losses, and the goodput comes back
    assert mrc_udp["lost"]["median"] < ecmp_udp["lost"]["median"]
    assert all(mrc_udp["recovered"])
    fo = r["modes"]["mrc"]["udp"]["runs"][0]
    post_ms = (fo["end_ns"] - fo["t_fail_ns"]) / 1e6
    assert mrc_udp["outage_ms"]["max"] is not None and mrc_udp["outage_ms"]["max"] < post_ms / 2
    for run in mrc_udp["runs"]:
        assert run.get("exclusion_from_fail_us") is not None                # s1's path was seen going down
        # back first no later than after the last dip, and the dips after are a share of windows
        assert run["recovery_ms"] is not None and run["recovery_ms"] <= run["outage_ms"]
        assert 0 <= run["dips_after_recovery"] <= 1
    for run in r["modes"]["mrc"]["tcp"]["runs"]:
        assert 0 <= run["pre_failure_windows_below_capacity"] <= 1
        assert run["paths"][str(run["dead_path_id"])]["tx_minus_rx"] > 0


def test_collisions(runs):
    r = _load(runs, "collisions")
    for per in r["modes"].values():
        for s in per.values():
            assert s["ideal_ms"] > 0 and s["round_ms"]["min"] > 0
            assert s["message_ms"]["p50"] <= s["message_ms"]["p99"] <= s["message_ms"]["max"]
            assert s["round_p99_over_ideal"] >= 0.8
            # the hosts' own TCP counters: something was sent, and counted
            assert s["retransmits"] >= 0 and 0 <= s["rtos"] <= s["retransmits"]
    for s in r["modes"]["mrc"].values():
        ev = s["path_events"]                                           # read from every host
        assert ev is not None and ev["down"] == s["path_downs"] and min(ev.values()) >= 0
    # the switches marked and the senders' TCP heard it: through mrc-ebpf's
    # tunnel only because its RX carries the outer CE to the inner packet
    assert r["modes"]["mrc"]["permutation"]["ce_delivered"] > 0
    assert r["modes"]["ecmp"]["permutation"]["ce_delivered"] > 0


def test_bad_ecn_threshold_is_one_line_and_builds_nothing():
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    r = subprocess.run([sys.executable, "-m", "mrc_ebpf.cli.mrcctl", "bench", "collisions", "--ecn-threshold", "soon"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "mrcctl: error: bad ECN threshold 'soon': a time such as 1ms or 500us"], r.stderr
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


def test_reorder(runs):
    r = _load(runs, "reorder")
    assert set(r["policies"]) == {"rr", "adaptive"}
    for delays in r["policies"].values():
        for d, s in delays.items():
            _sane_fraction(s["fraction"])
            assert s["runs"][0]["mrc_packets"] > 0
        # the extra delay on path 0 is real (ping on s1's link vs the
        # others'), absent at 0, and made without dropping at the slow link
        top = max(delays, key=float)
        assert float(top) > 0
        assert delays[top]["ping_idle_extra_ms"]["median"] >= 0.5 * float(top)
        assert abs(delays["0"]["ping_idle_extra_ms"]["median"]) < 0.25 * float(top)
        for run in delays[top]["runs"]:
            assert run["slow_link_tbf"]["drops"] <= 0.02 * max(1, run["slow_link_tbf"]["packets"])
    # rr is blind to the delay; adaptive hears of the queue and moves off it
    rr, adaptive = (r["policies"][p][top]["slow_path_share"]["median"] for p in ("rr", "adaptive"))
    assert rr > 0.2 and adaptive < 0.7 * rr, (rr, adaptive)
