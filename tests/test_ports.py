"""Port status on a fabric of namespaces (issue #29, item 3): a host's
plane-1 device set down under 4 one-way flows from 4 peers.  Without the
kernel hooks or the watcher the peers find out from their acknowledgement
clocks (events `down`); with `mrcctl ports watch` on the host (hooks off)
each peer takes its plane-1 paths out on the host's news (event
`port-down`); with the kernel hooks (bpf/mrc_ports.c, no watcher) the
host's own hook sets its status inside the very call that cut the link,
and each peer hears it in the feedback its next packet draws.  Witnesses:
the kernel's clock (the instant the test sets the link down,
CLOCK_MONOTONIC, which bpf_ktime_get_ns reads too, against each event's
time), and tcpdump on each peer's own plane-1 device: its data into that
plane stops.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from conftest import UDP_SEND, mrcctl
from mrc_ebpf.datapath.source import C
from mrc_ebpf.lab import procs
from test_fabric import SINK, Net, _events, fabric

pytestmark = pytest.mark.root

TARGET, PEERS = "h4", ["h1", "h2", "h3", "h5"]
PLANE, LEAF = 1, "p1l2"          # h4's plane-1 leaf
PPS, SECONDS = 2000, 4


@pytest.fixture(scope="module")
def net():
    name = f"ps{os.getpid() % 10000}"
    try:
        fabric("up", name, "--planes", "2", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "3")
        # 6 hosts verify ~1.4M instructions each: slow on a busy machine
        # a 100 ms acknowledgement clock: the port status must win its race
        # against the clock by the watcher's wake-up alone (with 1 ms, a
        # watcher woken 25 ms late on this shared machine found the paths
        # already out, and had nothing to take out)
        r = procs.run([*mrcctl_cmd(), "fabric", "attach", name, "--policy", "rr", "--", "--probe-max-us",
                       "50000", "--ack-timeout-us", "100000"], check=False, timeout=900)
        assert r.returncode == 0, r.stderr
        yield Net(name)
    finally:
        fabric("down", name, check=False)


def _hooks(net, on: bool) -> None:
    r = mrcctl("ports", "-j", "hook", "on" if on else "off", netns=net.ns(TARGET), check=False)
    if on and r.returncode != 0 and r.stdout.strip().startswith("{"):
        # the kernel refuses BPF tracing programs (6.18 here: EPERM at load)
        pytest.skip(f"the kernel hooks do not attach here: {json.loads(r.stdout)['errors']}")
    assert r.returncode == 0, r.stdout + r.stderr


def _leaf_port(net, up: bool) -> tuple[int, int]:
    """TARGET's plane-1 link cut (or back) at its leaf's end, as `fabric
    fail --mode down` cuts a host link: the host's device loses its carrier
    (the carrier case; the host's own addresses and routes stay).  One
    netlink call; the CLOCK_MONOTONIC instants just before and after it.
    Back up, the leaf gets its addresses and routes again (`fabric heal`'s
    way: the kernel drops IPv6 routes through a device set down)."""
    from pyroute2 import IPRoute
    from mrc_ebpf.lab.fabric import Fabric
    from mrc_ebpf.lab.netns import inside
    with inside(net.ns(LEAF)), IPRoute() as ipr:
        index = ipr.link_lookup(ifname=TARGET)[0]
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        ipr.link("set", index=index, state="up" if up else "down")
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    if up:
        from mrc_ebpf.lab.fabric.state import load
        plan = Fabric(load(net.name)["spec"])
        procs.batch(["ip", "-n", net.ns(LEAF)], plan.addr_cmds(LEAF), f"addresses of {LEAF}")
        procs.batch(["ip", "-n", net.ns(LEAF)], plan.route_cmds(LEAF), f"routes of {LEAF}")
    return before, after


def _flows(net):
    addr = net.host(TARGET)["addr6"]
    return [net.popen(p, [*UDP_SEND, addr, "9", str(PPS * SECONDS), f"--pps={PPS}"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in PEERS]


def _first(net, peer, kinds, since_ns) -> int | None:
    ns = [e["ns"] for e in _events(net, peer) if e["type"] in kinds and e["ns"] >= since_ns]
    return min(ns) if ns else None


def _round(net, watch: bool) -> dict[str, float | None]:
    """4 flows into TARGET, its plane-1 device down 1 s in, up again 1 s
    later: each peer's delay (ms) from the link change to its first event
    taking plane-1 paths out."""
    sink = net.popen(TARGET, SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = None
    if watch:
        # real-time priority, as a port daemon would run: on this shared
        # machine (load ~10 on 2 CPUs) a normal process is woken ms late
        watcher = net.popen(TARGET, ["chrt", "-f", "50", *mrcctl_cmd(), "ports", "-j", "watch"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
        assert "watching" in watcher.stdout.readline()
    flows = _flows(net)
    try:
        time.sleep(1.0)
        t0, t1 = _leaf_port(net, up=False)
        time.sleep(1.0)
        _leaf_port(net, up=True)
        for f in flows:
            f.wait(timeout=60)
    finally:
        for p in [sink, watcher, *flows]:
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    kinds = ("port-down",) if watch else ("down", "shared-down")
    delays = {}
    for peer in PEERS:
        first = _first(net, peer, kinds, t0)
        delays[peer] = None if first is None else round((first - t0) / 1e6, 3)
    out = watcher.stdout.read() if watcher else ""
    changes = [json.loads(line) for line in out.splitlines() if line.startswith("{\"ns\"")]
    woke = [round((c["ns"] - t0) / 1e6, 3) for c in changes]
    return {"delays_ms": delays, "set_ms": round((t1 - t0) / 1e6, 3), "watcher": out, "woke_ms": woke}


def mrcctl_cmd():
    from conftest import MRCCTL
    return list(MRCCTL)


def test_port_down_reaches_every_peer_against_the_ack_timeout(net):
    _hooks(net, on=False)       # the watcher's way (netlink), and the clock's
    today = _round(net, watch=False)
    time.sleep(1.0)             # the paths back up (probes every <= 50 ms)
    told = _round(net, watch=True)
    print(f"port down: ack timeout (no watcher) {today['delays_ms']}; port status {told['delays_ms']} "
          f"(the netlink call took {told['set_ms']} ms; the watcher read the event {told['woke_ms']} ms "
          f"after it began); watcher said {told['watcher'].strip()}")
    # today: every peer finds out, by its clock
    assert all(d is not None for d in today["delays_ms"].values()), today
    # port status: every peer took its plane-1 paths out on the news (the
    # delays are printed for docs/design/failover.md: timings are not
    # asserted, the machine is shared)
    assert all(d is not None for d in told["delays_ms"].values()), told
    changes = [json.loads(line) for line in told["watcher"].splitlines() if line.startswith("{\"ns\"")]
    assert changes and changes[0]["mask"] == 1 << PLANE
    assert len({t["peer_id"] for t in changes[0]["told"]}) >= len(PEERS)
    # and the peers' own count of it
    for peer in PEERS:
        c = json.loads(mrcctl("stats", "-j", netns=net.ns(peer)).stdout)["counters"]
        assert c["rx_port_status"] >= 2 and c["rx_port_down_paths"] >= 1, (peer, c)


def _capture(net, peer, pcap):
    """tcpdump on PEER's own plane-1 device, what it sends: data frames
    only (the flows' 512-byte datagrams; probes and feedback are headers)."""
    cap = net.popen(peer, ["tcpdump", "-i", "eth1", "-Q", "out", "-U", "--immediate-mode", "-n",
                           "--time-stamp-precision=nano", "-w", str(pcap), "greater", "500"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert b"listening on" in cap.stderr.readline()
    return cap


def test_a_device_down_stops_every_peer_sending_into_its_plane_by_the_kernel_hook(net, tmp_path):
    """Hooks on, no watcher: TARGET's own hook logs `own-port-down` within
    the netlink call that cut its plane-1 link (the carrier went in that
    call), TARGET's datapath tells every peer from the first packet in
    (`port-told`, before each peer's news), each peer takes its plane-1
    paths out (`port-down`), and from
    then on, by tcpdump on each peer's plane-1 device, sends no more data
    into that plane until the link is back (a frame already past its TC
    program when the news came may still show: at most 2)."""
    import scapy.layers.l2  # noqa: F401  (Ethernet frames dissected, not Raw)
    from scapy.utils import rdpcap
    _hooks(net, on=True)
    state = json.loads(mrcctl("ports", "-j", netns=net.ns(TARGET)).stdout)["port_status"]
    assert state["detector"] == "kernel", state
    time.sleep(1.0)             # paths back from an earlier round (probes every <= 50 ms)
    sink = net.popen(TARGET, SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    caps = {p: _capture(net, p, tmp_path / f"{p}.pcap") for p in PEERS}
    addr = net.host(TARGET)["addr6"]
    flows = [net.popen(p, [*UDP_SEND, addr, "9", str(PPS * SECONDS), f"--pps={PPS}", "--size=512"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in PEERS]
    try:
        time.sleep(1.0)
        # tcpdump's stamps are CLOCK_REALTIME: the two clocks read together
        real, mono = time.clock_gettime_ns(time.CLOCK_REALTIME), time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        t0, t1 = _leaf_port(net, up=False)
        time.sleep(1.0)
        back, _ = _leaf_port(net, up=True)
        for f in flows:
            f.wait(timeout=60)
        time.sleep(0.2)
    finally:
        for p in [sink, *flows, *caps.values()]:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    target_events = _events(net, TARGET)
    own = [e for e in target_events if e["type"] == "own-port-down" and e["ns"] >= t0]
    assert own and t0 <= own[0]["ns"] <= t1, (own, t0, t1)
    assert own[0]["path_id"] == C["MRC_EV_PLANE"] + PLANE
    # TARGET's datapath told every peer from the first packet in after the
    # change (lib/port_tell.h), on a path of the live plane
    tell = {}
    for e in target_events:
        if e["type"] == "port-told" and e["ns"] >= own[0]["ns"]:
            tell.setdefault(e["prefix"], e)
    prefixes = {peer: net.host(peer)["prefix6"] for peer in PEERS}
    assert set(tell) >= set(prefixes.values()), (tell, prefixes)
    report = {}
    for peer in PEERS:
        told = _first(net, peer, ("port-down",), t0)
        assert told is not None, peer
        said = tell[prefixes[peer]]
        # the news it filed came after TARGET sent it (one clock, the kernel's)
        assert said["ns"] <= told, (peer, said, told)
        sent = [int(pkt.time * 10**9) - real + mono for pkt in rdpcap(str(tmp_path / f"{peer}.pcap"))]
        before = [t for t in sent if t < t0]
        after = [t for t in sent if told < t < back]
        report[peer] = {"told_ms": round((told - t0) / 1e6, 3), "sent_ms": round((said["ns"] - t0) / 1e6, 3),
                        "before": len(before), "after_news": len(after),
                        "last_ms": round((max([t for t in sent if t < back], default=t0) - t0) / 1e6, 3)}
        assert before, (peer, report)           # it was sending into plane 1
        assert len(after) <= 2, (peer, report)
    print(f"kernel hook: own-port-down {(own[0]['ns'] - t0) / 1e6:.3f} ms after the call began "
          f"(call {(t1 - t0) / 1e6:.3f} ms); per peer: news, frames into plane 1 before / after it, "
          f"last frame (ms after the call): {report}")
