"""Failover under TCP, side by side: MRC (rr spray, datapath failover) vs
plain Linux flow-label ECMP (PRR: new flow label on RTO). 4 spines at RATE,
4 TCP connections h1->h2, s1>l2 black-holed at 1 s. Per connection: the
longest gap between reads at h2 spanning/after the failure.
Modes, run in the order given (prr first: MRC stays attached once attached):
prr (no MRC; routers hash addresses + flow label), mrcbare (MRC with its
peer route stripped to mtu/advmss and --no-retrans-steer: MRC before
docs/design/tcp.md), mrc0 (route metrics, no steering), mrc (both).
Profiles: default (no host sysctl, the host's congestion control) or dc
(tcp_rto_min_us=5000, tcp_min_rtt_wlen=0).  A measurement script for
docs/design/tcp.md, not part of the bench.
usage: scripts/tcp_failover_gaps.py PROFILE(default|dc) MODES(prr,mrc) REPS [CC|-] [RATE]"""
import json, os, sys, tempfile, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrc_ebpf.bench.runner import Env, fabric, PY
from mrc_ebpf.bench.flowtool import read_log
from mrc_ebpf.bench import failover as fo
from mrc_ebpf.lab import fabric as fab_mod

profile, modes, reps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
cc = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
rate = sys.argv[5] if len(sys.argv) > 5 else "200mbit"
secs, fail_at, conns = 3.0, 1.0, 4
sysctls = [] if profile == "default" else ["net.ipv4.tcp_rto_min_us=5000", "net.ipv4.tcp_min_rtt_wlen=0"]
KEYS = ["TcpExtTCPTimeouts", "TcpRetransSegs", "TcpExtTCPLossProbes", "TcpExtTCPSackRecovery",
        "TcpExtTCPLostRetransmit", "TcpExtTCPSpuriousRTOs", "TcpExtTCPLossProbeRecovery"]
p = {"fail_at": fail_at}
out = {m: [] for m in modes}
with fabric("fo4", spines=4, leaves=2, rate=rate, mtu=1500, host_sysctls=sysctls) as fab:
    env = Env(congestion=cc)
    # the kernel's own IPv6 hash on every router: addresses + flow label (policy 0)
    for node in ("l1", "l2", "s1", "s2", "s3", "s4"):
        env.run(fab.ns(node), ["sysctl", "-qw", "net.ipv6.fib_multipath_hash_policy=0"])
    h1, h2 = fab.ns("h1"), fab.ns("h2")
    env.run(h1, ["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])
    fab_mod.fail(fab.name, ["s1>l2"], "loss=1e-9")
    port = 5600
    try:
        attached = False
        for mode in modes:
            for rep in range(reps):
                if mode != "prr" and attached != mode:
                    if attached:
                        fab_mod.detach(fab.name, None)
                    fab_mod.attach(fab.name, "h1,h2", "rr", [] if mode == "mrc" else ["--no-retrans-steer"])
                    attached = mode
                    if mode == "mrcbare":
                        for ns, pfx in ((h1, fab.prefix6(2)), (h2, fab.prefix6(1))):
                            r = json.loads(env.run(ns, ["ip", "-j", "-6", "route", "show", pfx]).stdout)[0]
                            mt = {k: v for m in r["metrics"] for k, v in m.items()}
                            env.run(ns, ["ip", "-6", "route", "replace", pfx, "dev", r["dev"], "via", r["gateway"],
                                         "proto", str(r["protocol"]), "metric", str(r["metric"]),
                                         "mtu", str(mt["mtu"]), "advmss", str(mt["advmss"])])
                            print(env.run(ns, ["ip", "-6", "route", "show", pfx]).stdout.strip(), flush=True)
                    time.sleep(0.5)
                if mode == "prr" and attached:
                    raise SystemExit("order: prr before mrc")
                port += 1
                fd, path = tempfile.mkstemp(prefix="h4fo-"); os.close(fd)
                rcv = env.popen(h2, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-recv", fab.addr6(2), str(port),
                                     str(secs + 5), str(conns), path])
                rcv.stdout.readline()
                n0 = env.nstat(h1)
                c0 = json.loads(env.mrcctl(h1, "stats", "-j").stdout)["counters"] if mode != "prr" else {}
                snd = env.popen(h1, [PY, "-m", "mrc_ebpf.bench.flowtool", "tcp-send", fab.addr6(2), str(port),
                                     str(secs), str(conns), "-", fab.addr6(1), cc or "-"])
                t_fail, _ = fo.fail_when_due(snd, p, lambda: fo.trigger(fab))
                sout, _ = env.wait(snd, timeout=secs + 30)
                n1 = env.nstat(h1)
                env.wait(rcv, timeout=secs + 30)
                fo.disarm(fab)
                recs = read_log(path, 3); os.unlink(path)
                sent = json.loads(sout.strip().splitlines()[-1])
                gaps, pregaps = [], []
                for c in range(conns):
                    ts = sorted(r[0] for r in recs if r[1] == c)
                    before = [t for t in ts if t < t_fail]
                    after = [t for t in ts if t >= t_fail]
                    seq = before[-1:] + after + [sent["end"]]
                    g = max((b - a for a, b in zip(seq, seq[1:])), default=0)
                    gaps.append(round(g / 1e6, 1))
                    pre = [t for t in ts if sent["t0"] + 3e8 <= t < t_fail]
                    pg = max((b - a for a, b in zip(pre, pre[1:])), default=0)
                    pregaps.append(round(pg / 1e6, 1))
                d = {k: n1.get(k, 0) - n0.get(k, 0) for k in KEYS}
                tot = sum(r[2] for r in recs if r[0] >= t_fail) * 8 / (sent["end"] - t_fail) * 1e9
                ex = {}
                if mode != "prr":
                    ex = fo.exclusion(fo.events(env, fab), 0, t_fail, None, sent["end"])
                    ex = {k: ex.get(k) for k in ("exclusion_from_fail_us", "exclusion_after_unacked_us", "healthy_path_downs_after_fail", "dead_path_ups_after_fail")}
                    c1 = json.loads(env.mrcctl(h1, "stats", "-j").stdout)["counters"]
                    ex.update({k: c1.get(k, 0) - c0.get(k, 0) for k in ("tx_tcp_retrans", "tx_retrans_steered")})
                    ss = env.run(h1, ["ss", "-tin", "state", "established"], check=False).stdout
                out[mode].append({"max_gap_ms": max(gaps), "gaps": gaps, "nstat": d, "post_mbps": round(tot / 1e6)})
                print(f"RESULT {profile} {cc or 'host-cc'} {mode} rep{rep} max_gap {max(gaps)} ms gaps {gaps} "
                      f"pre-failure max gap {max(pregaps)} post {round(tot/1e6)} Mbit/s {d} {ex}", flush=True)
                time.sleep(0.5)
    finally:
        fab_mod.heal(fab.name, None)
    env.close()
for m, rs in out.items():
    print(f"SUMMARY {profile} {m} median max_gap {statistics.median(r['max_gap_ms'] for r in rs)} "
          f"all {[r['max_gap_ms'] for r in rs]} rtos {[r['nstat']['TcpExtTCPTimeouts'] for r in rs]}", flush=True)
