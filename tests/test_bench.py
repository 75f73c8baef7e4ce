"""mrcctl bench SCENARIO --short: each scenario's JSON (structure, sane
values) and PNG, and no namespace left behind.  The five scenarios (and a
spray-vs-ecmp run with --hosts-default) run as separate processes two at
a time (started once for the module) to stay within the CI budget; each
test checks one of them.  The contenders (prr, plb, mptcp) prove in those
runs that they are what they say (contenders.proof)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrc_ebpf.bench.contenders import unavailable
from mrc_ebpf.bench.runner import DEFAULT_HOST_SYSCTLS, SCENARIOS

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parent.parent
PARALLEL = 2
LONGEST_FIRST = ("shared-fate", "cost", "spray-vs-ecmp", "reorder", "line-rate", "hosts-default")
MRCCTL = [sys.executable, "-m", "mrc_ebpf.cli.mrcctl"]
# a user's hosts: nothing set, their own default congestion control (bbr here)
HOSTS_DEFAULT = ["spray-vs-ecmp", "--hosts-default", "--modes", "ecmp,rr,single",
                 "--param", 'flows={"1500": [1]}']


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    jobs = {name: [name] for name in SCENARIOS}
    jobs["hosts-default"] = HOSTS_DEFAULT
    # the longest first (their --short times, 9-84 s), so that the two
    # lanes finish together
    pending = sorted(jobs, key=lambda n: LONGEST_FIRST.index(n) if n in LONGEST_FIRST else len(LONGEST_FIRST))
    running, done = {}, {}
    try:
        while pending or running:
            while pending and len(running) < PARALLEL:
                name = pending.pop(0)
                running[name] = subprocess.Popen(
                    [*MRCCTL, "bench", *jobs[name], "--short", "--out", str(out / name)],
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


def _load_doc(runs, job, name):
    out, done = runs
    rc, o, e = done[job]
    assert rc == 0, f"{job} failed: {e[-2000:]}"
    doc = json.loads((out / job / f"{name}.json").read_text())
    png = out / job / f"{name}.png"
    assert png.stat().st_size > 1000
    assert doc["scenario"] == name and doc["short"] is True and doc["params"]
    return doc, o


def _load(runs, name):
    doc, o = _load_doc(runs, name, name)
    assert doc["namespace_prefixes"]
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for prefix in doc["namespace_prefixes"]:
        assert prefix not in left, f"namespace {prefix}* left behind"
    assert "median (min-max)" in o
    # every TCP flow runs the congestion control the run names, not the host's default
    assert doc["params"].get("tcp_congestion") == (None if name == "cost" else "cubic")
    # and every fabric host the run's sysctls (the default set here)
    assert doc["params"].get("host_sysctls") == (None if name == "cost" else list(DEFAULT_HOST_SYSCTLS))
    assert doc["params"].get("ecn_threshold") == {"collisions": "1ms", "congested-spine": "1ms"}.get(name)
    # every fabric's hash, read back from its leaves when built (cost builds none)
    # (probe-budget's fabric is --encoding ev: its leaves hash the flow label, no --hash to read back)
    assert set(doc["fabric_hash"].values()) == {"cost": set(), "probe-budget": {None}}.get(name, {"l4"})
    return doc["results"]


def _sane_fraction(s):
    assert 0 < s["min"] <= s["median"] <= s["max"] <= 1.2


def test_spray_vs_ecmp(runs):
    doc = _load(runs, "spray-vs-ecmp")
    assert list(doc["mtus"]) == ["1500"]            # short mode: the 1500-byte fabric only
    r = doc["mtus"]["1500"]
    assert set(r["modes"]) == {"ecmp", "prr", "mptcp", "rr", "bytes", "adaptive", "single"} | (
        set() if unavailable("plb") else {"plb"})
    for by_n in r["modes"].values():
        for s in by_n.values():
            _sane_fraction(s["fraction"])
    # headers' ceiling: 1500-byte frames, 72 bytes of IPv6+TCP (timestamps)
    # and 14 of Ethernet; MRC's route MTU leaves room for the encapsulation
    ceiling = r["ceiling"]
    assert ceiling["ecmp"] == round((1500 - 72) / 1514, 4)
    assert ceiling["rr"] == ceiling["bytes"] == ceiling["adaptive"] == ceiling["single"] < ceiling["ecmp"]
    assert ceiling["prr"] == ceiling["mptcp"] == ceiling["ecmp"]          # no encapsulation
    # nothing can beat it: a ceiling computed wrong would show here
    for m, by_n in r["modes"].items():
        for s in by_n.values():
            assert s["fraction"]["max"] <= ceiling[m] * 1.03, (m, s["fraction"], ceiling[m])
            assert s["of_ceiling"]["median"] == pytest.approx(s["fraction"]["median"] / ceiling[m])


def test_cost(runs):
    r = _load(runs, "cost")
    assert [x["paths"] for x in r["prog_test_run"] if x["policy"] == "rr"] == [1, 16, 256]
    for x in r["prog_test_run"]:
        assert 0 < x["tx_ns_median"]["median"] < 1e6 and 0 < x["rx_ns_median"]["median"] < 1e6
    # a key's cost, paired batch by batch: every point, every pair (the
    # measurement itself checks each keyed TLV verified and was filed)
    pairs = r["key_cost"][0]["pairs"]
    assert pairs > 0 and [(x["what"], x["paths"], x["pairs"]) for x in r["key_cost"]] == \
        [("data", 1, pairs), ("data", 16, pairs), ("data", 256, pairs), ("feedback", 1, pairs)]
    for x in r["key_cost"]:
        for side in ("tx", "rx"):
            assert 0 < x[f"{side}_ns"] < 1e6 and x[f"{side}_key_over_no_key"] > 0
    floors = [b[f"floor_{side}"] for b in r["key_cost_batches"] for side in ("tx", "rx")]
    assert len(r["key_cost_batches"]) == 2 * 4 * pairs and all(f > 0 for f in floors)
    for setup in ("none", "mrc", "mrc-key", "kernel"):
        assert r["throughput"][setup]["pps"]["median"] > 1000
    assert r["mrc_over_kernel_pps"]["median"] > 0
    # peers in the maps: today's layout, then 1 and 1,000 peers on a template,
    # the measured one outside the address plan and inside it (short: the
    # cache only, not the trie alone beside it)
    assert [(x["layout"], x["peers"], x["lookup"]) for x in r["peers"]] == \
        [("own paths", 1, "cache"), ("template", 1, "cache"), ("template, in the plan", 1, "cache"),
         ("template", 1000, "cache"), ("template, in the plan", 1000, "cache")]
    for x in r["peers"]:
        assert 0 < x["tx_ns_median"]["median"] < 1e6 and 0 < x["rx_ns_median"]["median"] < 1e6
        assert x["memlock_128_cpus"] >= x["memlock"] == sum(x["maps"].values())
    # the trie and SID hash grow with the peers, nothing else does
    grown = {n for n, b in r["peers"][3]["maps"].items() if b != r["peers"][1]["maps"][n]}
    assert grown == {"peers", "peer_by_sid"}
    assert "tx_1000_over_1_in_plan" in r["flatness_peers"]


def test_active_peers(runs):
    """K peers of one template sent to in turn (the real mrc_tx, frames
    read back): every peer over all its paths, equal path shares, nothing
    failed open, one learnt state each (the LRU holds them all)."""
    doc, o = _load_doc(runs, "active-peers", "active-peers")
    points = doc["results"]["points"]
    assert [p["k"] for p in points] == doc["params"]["ks"] and points[-1]["k"] >= 1024
    for p in points:
        assert p["packets"] == p["k"] * p["paths"]
        assert p["min_used"] >= 0.9 and 0.9 <= p["share_min"] <= p["share_max"] <= 1.1, p
        assert p["fail_open"] == 0 and p["state_fail"] == 0, p
        assert p["state_new"] == p["k"] and p["state_remade"] == 0, p
    assert "least/median paths used" in o


def test_line_rate(runs):
    """Every mode moved data on the pair and on the unshaped fabric; the
    default attach sprays bursts (status says so) over all 4 spines in
    equal shares (the leaf's own byte counters), per-packet stays one."""
    r = _load(runs, "line-rate")
    for place, modes in (("pair", {"plain", "seg6", "mrc", "mrc-packet"}),
                         ("fabric", {"plain", "seg6", "mptcp", "mrc", "mrc-packet"})):
        got = r["summary"][place]["1500"]
        assert modes <= set(got) | ({"mptcp"} if "mptcp" not in got else set())
        for mode, by_load in got.items():
            assert by_load["tcp1"]["gbps"]["median"] > 0, (place, mode)
    for mode in ("mrc", "mrc-packet"):
        shares = r["summary"]["fabric"]["1500"][mode]["tcp1"]["runs"][0]["spine_shares"]
        assert len(shares) == 4 and all(0.2 <= x <= 0.3 for x in shares), (mode, shares)
    # the same counters every 10 ms: windows judged, mrc's mostly even,
    # ECMP's one flow never (it sits on one spine)
    windows = {m: r["summary"]["fabric"]["1500"][m]["tcp1"]["runs"][0]["spine_windows"] for m in ("mrc", "plain")}
    assert windows["mrc"]["windows"] > 50 and windows["mrc"]["fraction_within"] >= 0.5, windows
    assert windows["plain"]["fraction_within"] == 0 and windows["plain"]["deviation_max"] == 3.0, windows
    hook = r["status"]["fabric mrc"][0]["hooks"][0]
    assert hook["granularity"].startswith("per-burst") and "auto" in hook["granularity_why"]
    assert r["status"]["fabric mrc-packet"][0]["hooks"][0]["granularity"] == "per-packet"


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
        # never back at 90% either: a window may pass by chance on a loaded
        # host (its hole-bound flows starved), not the ones after it
        assert run["recovery_ms"] is None or run["dips_after_recovery"] > 0.5, run
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


def test_congested_spine(runs):
    """A real 70% cross flow on s1 (h2 counted its datagrams over the TCP
    flow), marks where it queues (the switch's own counter), the receiver
    counting them on the path via s1, and skip only with skip_rotations."""
    r = _load(runs, "congested-spine")
    assert set(r["modes"]) >= {"ecmp", "rr", "rr-skip"}
    for mode, m in r["modes"].items():
        run = m["runs"][0]
        assert 0.5 <= run["cross"]["load_measured"] <= 0.9, (mode, run["cross"])
        assert 0 < run["of_left"] <= 1.2 and run["goodput_bps"] > 0
    for mode in ("rr", "rr-skip"):
        run = r["modes"][mode]["runs"][0]
        assert run["marks"]["s1>l2"]["marked"] > 0, run["marks"]
        # path 0 crosses s1: the receiver counted most of its CE marks there
        ce = {int(k): v for k, v in run["mrc"]["rx_ce"].items()}
        assert ce[0] == max(ce.values()) > 0, ce
        assert run["mrc"]["ce_reports"] and run["spines"]["packets"]["s1"] > 0
    assert r["modes"]["rr"]["skips"]["max"] == 0 and r["modes"]["rr-skip"]["skips"]["min"] > 0
    # skipping moves packets off the congested spine
    assert r["modes"]["rr-skip"]["cross_spine_share"]["median"] < 0.24


def test_probe_budget(runs):
    """s1 black-holed under one TCP flow over 64 EVs: its EVs go out, and
    once they are out the packets l1 still sends into s1 (its own uplink
    counter) are probes: a large share of a live spine's with fixed
    probing, a small one with backoff + budget; every EV back after the
    heal in both."""
    r = _load(runs, "probe-budget")
    fixed, backoff = r["modes"]["fixed"]["runs"][0], r["modes"]["backoff"]["runs"][0]
    for run in (fixed, backoff):
        assert 8 <= run["paths_down"] <= 32, run["out_ms"]        # ~16 of 64 EVs cross s1
        assert run["dropped_after_settle"] > 0 and not run["not_back"], run
        assert run["all_back_ms"] is not None
    assert backoff["probe_copies_per_s"] < fixed["probe_copies_per_s"] / 5
    assert backoff["dead_over_live"] < 0.05 < fixed["dead_over_live"], (backoff, fixed)
    assert backoff["probing_status"]["probe_max_us"] == 1_000_000


def test_port_down(runs):
    """h4's plane-1 link cut under 4 flows: every peer takes its plane-1
    paths out, by its clock (100 ms) without the watcher or the kernel
    hooks, by h4's port status with either (events `port-down`, kernel
    timestamps), sooner; with the hooks, h4's own hook logged the change
    (`own-port-down`)."""
    r = _load(runs, "port-down")
    clock, told = r["modes"]["ack-clock"]["runs"][0], r["modes"]["port-status"]["runs"][0]
    assert not clock["not_out"] and not told["not_out"], (clock, told)
    assert clock["by_port_status"] == 0 and told["by_port_status"] == 4, told["peers"]
    assert told["watcher_told"] and told["watcher_told"][0] >= 4
    assert told["all_out_ms"] < clock["all_out_ms"]
    for mode in ("kernel", "kernel+watcher"):
        if mode not in r["modes"]:      # a kernel that refuses BPF tracing: said in the notes
            assert any(mode in n for n in r["notes"]), r["notes"]
            continue
        run = r["modes"][mode]["runs"][0]
        assert not run["not_out"] and run["by_port_status"] == 4, (mode, run["peers"])
        assert run["hook_ms"] is not None and clock["hook_ms"] is None, (mode, run)
        assert run["all_out_ms"] < clock["all_out_ms"]


def test_trim_incast(runs):
    """Incast rounds: the switches trim only with trimming on (their own
    counters), the receiver counts the trims it got and does not count
    them as lost; every round takes at least its ideal."""
    r = _load(runs, "trim-incast")
    trim, drop, ecmp = (r["modes"][m] for m in ("mrc-trim", "mrc-drop", "ecmp"))
    assert drop["switch_trimmed"] == 0 and drop["receiver"]["trimmed"] == 0
    assert 0 < trim["receiver"]["trimmed"] <= trim["switch_trimmed"], trim
    assert trim["receiver"]["net_lost"] < trim["receiver"]["trimmed"] <= trim["receiver"]["rx_packets"], trim
    assert trim["receiver"]["late"] <= trim["receiver"]["lost"]
    assert ecmp["path_downs"] is None and isinstance(trim["path_downs"], int)
    for m in (trim, drop, ecmp):
        assert m["round_p99_over_ideal"] >= 0.9 and m["round_ms"]["n"] == 3


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


def _run_one(args):
    """Run mrcctl ARGS; (result, namespaces it made that are still there).
    The machine is shared: only names the bench would give its own fabrics
    (b<tag><pid>-) count, not other processes' namespaces."""
    import re
    p = subprocess.Popen([*MRCCTL, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    mine = re.compile(rf"^b[a-z]+{p.pid % 100000}-")
    left = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if mine.match(ns)]
    return subprocess.CompletedProcess(args, p.returncode, out, err), left


def test_bad_ecn_threshold_is_one_line_and_builds_nothing():
    r, left = _run_one(["bench", "collisions", "--ecn-threshold", "soon"])
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "mrcctl: error: bad ECN threshold 'soon': a time such as 1ms or 500us"], r.stderr
    assert not left


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
    # rr is blind to the delay (only TCP's retransmissions, steered off a
    # path not heard lately, avoid the slow path: its share falls below a
    # quarter by them); adaptive hears of the queue and moves off it
    rr, adaptive = (r["policies"][p][top]["slow_path_share"]["median"] for p in ("rr", "adaptive"))
    assert rr > 0.1 and adaptive < 0.7 * rr, (rr, adaptive)
    # the contenders ran the same levels before MRC: ECMP's one flow on one
    # spine (its share of s1 all or nothing); MPTCP joined subflows that
    # carried on several spines (its proof, at the first level).  At the top
    # delay its scheduler may keep to its fastest subflow: that is its call.
    assert {"ecmp", "prr", "mptcp"} <= set(r["contenders"])
    for run in r["contenders"]["ecmp"][top]["runs"]:
        share = run["paths"][0]["share"]
        assert len(run["spines"]["carrying"]) == 1 and (share < 0.05 or share > 0.95)
    assert r["proof"]["mptcp"]["ok"], r["proof"]["mptcp"]



def check_shared_fate(doc):
    """The shared-fate scenario's document (also run on a stored one)."""
    r, p = doc["results"], doc["params"]
    hosts = p["leaves"] * p["hosts_per_leaf"]
    assert set(r["patterns"]) == {"phased", "uniform", "uniform-nofail"}
    assert len(r["runs"]) == 6 * p["repeat"]
    for run in r["runs"]:
        # every host at its pps over ~2 s, and the black hole dropped packets
        assert run["sent"] > 0.8 * hosts * p["pps"] * 2 and 0 <= run["lost"] < 0.05 * run["sent"], run
        assert len(run["lost_by_pair"]) == hosts * (hosts - 1)
        assert {"fail_open", "reroute", "probe", "probe_copy", "false_downs", "load", "watch_suspects",
                "false_suspects"} <= set(run)
        if run["pattern"] == "uniform-nofail":
            # the control: nothing failed, nothing was dropped by a fault
            # (what a loaded machine's sockets drop is counted, not asserted)
            assert run["fault_drops"] == 0, run
            continue
        assert run["fault_drops"] > 0
        if run["shared_fate"] == "off":
            assert run["suspects"] == 0 and run["shared_downs"] == 0, run
        else:       # every host saw s1 fail and suspected its hop
            assert run["suspects"] >= hosts, run
        assert run["downs"] >= hosts


def test_shared_fate(runs):
    doc, _ = _load_doc(runs, "shared-fate", "shared-fate")
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(prefix in left for prefix in doc["namespace_prefixes"])
    check_shared_fate(doc)

# --------------------------------------------------------------------------- contenders

def test_hash_read_back_per_mode(runs):
    """Each mode ran on the hash it needs, read back from both leaves:
    the contenders on the kernel's default (flow label), the rest on the 5-tuple."""
    for name in ("spray-vs-ecmp", "failover", "collisions"):
        r = _load(runs, name)
        setups = r["mtus"]["1500"]["mode_setup"] if name == "spray-vs-ecmp" else r["mode_setup"]
        for mode, rec in setups.items():
            want = "flowlabel" if mode in ("prr", "plb", "mptcp") else "l4"
            got = rec["hash_read_back"]
            assert got["hash"] == want and set(got["leaves"]) == {"l1", "l2"}, (name, mode, got)
            policy = 0 if want == "flowlabel" else 3
            assert all(v["ipv6_policy"] == policy for v in got["leaves"].values())
            for host in rec["hosts"].values():                         # PRR's kernel defaults
                assert host["net.core.txrehash"] == "1" and host["net.ipv6.auto_flowlabels"] == "1"


def test_prr_moves_after_an_rto(runs):
    """PRR's witness: one connection steered onto s1, s1 black-holed: after
    an RTO its packets cross another spine (l1's uplink counters) and keep
    arriving; and in the scenario's own runs the black hole cost RTOs."""
    r = _load(runs, "failover")
    w = r["proof"]["prr"]["witness"]
    assert r["proof"]["prr"]["ok"] and w["ok"], w
    assert w["rtos"] >= 1 and w["delivered_after_fail"] > 0
    assert w["moved_to"] and "s1" not in w["moved_to"]
    assert w["after_fail"]["packets"][w["moved_to"][0]] >= 20
    tcp = r["modes"]["prr"]["tcp"]
    assert "udp" not in r["modes"]["prr"]                           # TCP's own repathing only
    for run in tcp["runs"]:
        assert run["failed_spine"] in run["spines"]["carrying"]     # the hole hit its traffic
        assert run["rtos"] >= 1 and run["longest_gap_ms"] > 0
        assert all(c["goodput_bps"] for c in run["conns"])          # every connection plotted


def test_mptcp_subflows_over_spines(runs):
    """MPTCP: every connection has K subflows (MPTCP_INFO), the server
    acknowledged MP_JOINs (nstat), and more than one spine carried one
    connection (l1's uplink counters)."""
    r = _load(runs, "spray-vs-ecmp")["mtus"]["1500"]
    pr = r["proof"]["mptcp"]
    assert pr["ok"] and pr["mp_join_ack_rx"] >= 3 and pr["subflows"] in ([4], [4, 4, 4, 4]), pr
    assert len(pr["spines"]["carrying"]) > 1
    one = r["modes"]["mptcp"]["1"]["runs"][0]
    assert one["mptcp_subflows"] == [4]       # (its 4 subflows may all hash onto one spine: 1 in 64)
    ecmp = r["modes"]["ecmp"]["1"]["runs"][0]
    assert len(ecmp["spines"]["carrying"]) == 1                     # a plain flow keeps its spine
    for name in ("failover", "collisions"):
        pr = _load(runs, name)["proof"]["mptcp"]
        assert pr["ok"] and pr["mp_join_ack_rx"] > 0 and len(pr["spines"]["carrying"]) > 1, (name, pr)


def test_plb(runs):
    """PLB proves itself by rehashing (TcpExtTCPPLBRehash); where the kernel
    cannot run it (PLB is driven by DCTCP alone) the runs say why."""
    why = unavailable("plb")
    doc, _ = _load_doc(runs, "collisions", "collisions")
    if why:
        assert "plb" not in doc["params"]["modes"] and doc["params"]["modes_skipped"]["plb"] == why
        assert "DCTCP" in why
        r = subprocess.run([*MRCCTL, "bench", "collisions", "--short", "--modes", "ecmp,plb"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"mrcctl: error: mode plb: {why}"]
        return
    pr = doc["results"]["proof"]["plb"]
    assert pr["ok"] and pr["plb_rehash"] > 0 and pr["ce_delivered"] > 0


def test_hosts_default_sprays_past_one_path(runs):
    """--hosts-default: nothing set on the hosts, their own congestion
    control (the machine's default; bbr here); the sprayed flow still beats
    one path."""
    doc, _ = _load_doc(runs, "hosts-default", "spray-vs-ecmp")
    p = doc["params"]
    default_cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert p["host_profile"] == "hosts-default" and p["host_sysctls"] == [] and p["tcp_congestion"] is None
    assert p["host_default_congestion"] == default_cc
    r = doc["results"]["mtus"]["1500"]
    for rec in r["mode_setup"].values():
        for host in rec["hosts"].values():
            assert host["net.ipv4.tcp_congestion_control"] == default_cc
            assert host["net.ipv4.tcp_min_rtt_wlen"] == "300"           # the kernel's, untouched
    rr, single = (r["modes"][m]["1"]["fraction"]["median"] for m in ("rr", "single"))
    assert rr > 1.5 * single, (rr, single)


def test_fabric_hash_up_show_and_switch():
    from mrc_ebpf.lab import fabric as fab_mod
    name = f"th{__import__('os').getpid() % 100000}"
    r = subprocess.run([*MRCCTL, "fabric", "up", name, "-k", "2", "--rate", "none", "--hash", "flowlabel", "-j"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["hash"] == "flowlabel"
        show = json.loads(subprocess.run([*MRCCTL, "fabric", "show", name, "-j"], cwd=ROOT, capture_output=True,
                                         text=True, timeout=60).stdout)
        assert show["hash"] == "flowlabel" and show["hash_on_leaves"]["hash"] == "flowlabel"

        def policy(leaf):     # the kernel's own word, not the state file's
            return subprocess.run(["ip", "netns", "exec", f"{name}-{leaf}", "sysctl", "-n",
                                   "net.ipv6.fib_multipath_hash_policy"], capture_output=True, text=True).stdout.strip()
        assert policy("l1") == policy("l2") == "0"
        assert fab_mod.set_hash(name, "l4")["hash"] == "l4"
        assert policy("l1") == policy("l2") == "3"
        assert fab_mod.describe(name)["hash"] == "l4"
    finally:
        subprocess.run([*MRCCTL, "fabric", "down", name], cwd=ROOT, capture_output=True, timeout=120)
    assert not any(ns.startswith(f"{name}-") for ns in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


@pytest.mark.parametrize("args,err", [
    (["fabric", "up", "thbad", "--hash", "crc"],
     "bad hash 'crc': l4 (5-tuple) or flowlabel (addresses + IPv6 flow label, the kernel's default)"),
    (["bench", "failover", "--modes", "ecmp,spray"],
     "failover has no mode 'spray' (modes: ecmp, prr, plb, mptcp, mrc)"),
    (["bench", "spray-vs-ecmp", "--param", "seconds"], "bad --param 'seconds': KEY=JSON, e.g. seconds=4"),
    (["bench", "spray-vs-ecmp", "--param", "secs=4"], None),
    (["bench", "spray-vs-ecmp", "--hosts-default", "-C", "cubic"],
     "--hosts-default leaves the hosts alone: not with --host-sysctl or -C"),
    (["bench", "cost", "--modes", "ecmp"], "cost has no modes to choose"),
    (["bench", "spray-vs-ecmp", "--param", 'flows={"1500": [1, 4]}'],
     'spray-vs-ecmp: no flow counts for MTU 9000 in flows {"1500": [1, 4]} '
     '(a list like [1, 4] for each of mtus [1500, 9000], or --mtu)'),
    (["bench", "spray-vs-ecmp", "--param", 'flows={"1500": [0]}', "--mtu", "1500"],
     'spray-vs-ecmp: no flow counts for MTU 1500 in flows {"1500": [0]} '
     '(a list like [1, 4] for each of mtus [1500], or --mtu)'),
    (["bench", "spray-vs-ecmp", "--param", 'encoding="usid"'], "spray-vs-ecmp: bad encoding 'usid': srh or ev"),
    (["bench", "spray-vs-ecmp", "--param", 'encoding="ev"', "--modes", "ecmp,bytes"],
     "spray-vs-ecmp with encoding ev runs only the MRC modes: rr, bytes, adaptive, single"),
])
def test_bad_contender_options_one_line(args, err):
    r, left = _run_one(args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("mrcctl: error: "), r.stderr
    if err:
        assert lines[0] == f"mrcctl: error: {err}"
    assert not left and not any(ns.startswith("thbad-") for ns in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
