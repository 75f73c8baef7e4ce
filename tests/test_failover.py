"""Failover inside the datapath: a black-holed path leaves the spray in
under a millisecond (read off the kernel timestamps of the drop and of
the datapath's event), transfers finish with their data intact, the path
returns after the failure heals, and with every path down the datapath
fails open."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import UDP_SEND, XFER, mrcctl
from mrc_ebpf.lab import faults

pytestmark = pytest.mark.root

BLACKHOLED = 2          # path id 2 goes through R3
# Where a test asserts the 1 ms it asserts it for the configured window:
# late packets would widen it (--reorder-max-us), trading detection time
# for fewer false downs (test_late_packets_widen_the_window).
FIXED_WINDOW = ("--reorder-max-us", "0")


def events(net, ns=None):
    return json.loads(mrcctl("stats", "--events", "-j", netns=ns or net.A).stdout)["events"]


def blackhole(net, router, mode="blackhole", loss=1.0) -> tuple[str, str]:
    """Router k's link from L1 black-holed (the lab's fault program on its
    receiving end): router k carries exactly path k-1 towards B."""
    hole = (net.R[router], "rup")
    faults.inject(*hole, mode, loss)
    return hole


def heal(hole) -> tuple[int, int]:
    """Heal it: (packets it dropped, kernel time of the first drop)."""
    healed = faults.heal(*hole)
    return healed["dropped"], healed["first_drop_ns"]


def start_transfer(net, nbytes, port=5201, mbit=0):
    server = net.t.popen(net.B, [*XFER, "serve", net.B6, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    client = net.t.popen(net.A, [*XFER, "send", net.B6, str(port), str(nbytes), str(mbit)],
                         stdout=subprocess.PIPE, text=True)
    return server, client


def finish_transfer(server, client, timeout=60):
    try:
        sent, _ = client.communicate(timeout=timeout)
        received, _ = server.communicate(timeout=timeout)
    finally:
        for p in (client, server):
            if p.poll() is None:
                p.kill()
                p.wait()
    return sent.strip(), received.strip(), client.returncode


def tcp_counters(net) -> dict[str, int]:
    """A's TCP retransmitted segments and retransmission timeouts."""
    out = net.t.exec(net.A, ["nstat", "-azs", "-j", "TcpRetransSegs", "TcpExtTCPTimeouts"]).stdout
    kernel = json.loads(out)["kernel"]
    return {"retrans": int(kernel["TcpRetransSegs"]), "rtos": int(kernel["TcpExtTCPTimeouts"])}


def exclusion_us(net, first_drop_ns, path_id=BLACKHOLED):
    """From the first packet the black hole ate to the path being out of
    the spray: 0 if it was already down then (taken down by an earlier
    hiccup and, being black-holed, never acknowledged back)."""
    evs = [e for e in events(net) if e["path_id"] == path_id and e["type"] in ("down", "up")]
    before = [e for e in evs if e["ns"] < first_drop_ns]
    if before and before[-1]["type"] == "down":
        return 0.0
    downs = [e for e in evs if e["type"] == "down" and e["ns"] >= first_drop_ns]
    assert downs, "\n".join(f"{e['ns'] - first_drop_ns:>12} {e['type']}" for e in evs)
    return (downs[0]["ns"] - first_drop_ns) / 1000


def test_tcp_completes_through_a_blackhole_and_the_path_returns(spray_any):
    """One path black-holed for 0.5 s under a paced TCP flow: the data
    arrives intact and the path carries traffic again after the heal."""
    spray = spray_any
    # per packet: the probe copies counted below are made of data packets
    # (a 64 KB burst is one packet to copy: 35-97 copies, not 250)
    spray.attach("rr", "--ack-timeout-us", "300", *FIXED_WINDOW, "--probe-us", "2000",
                 "--granularity", "packet")
    server, client = start_transfer(spray, 256 << 20, mbit=200)   # ~11 s
    time.sleep(0.5)
    tcp = tcp_counters(spray)
    hole = blackhole(spray, BLACKHOLED)
    time.sleep(0.5)
    dropped, first_ns = heal(hole)
    tcp = {k: v - tcp[k] for k, v in tcp_counters(spray).items()}
    retrans = tcp["retrans"]
    assert client.poll() is None, "the transfer ended before the failure: make it longer"
    sent, received, code = finish_transfer(server, client, timeout=120)
    assert code == 0 and sent == received and sent.startswith(str(256 << 20))
    # The path is probed every 2 ms, 250 times in the 0.5 s, with header-
    # only copies of data packets: TCP loses only what the black hole ate
    # before the path went down (probing with the data packets themselves
    # cost a segment per probe).
    copies = json.loads(mrcctl("stats", "-j", netns=spray.A).stdout)["counters"]["tx_probe_copy"]
    print(f"TCP: {dropped} dropped, of which {copies} probe copies; {retrans} segments retransmitted")
    assert copies >= 100 and retrans < 100
    # The check is lazy: the next packet that would use the path makes it,
    # on evidence TCP's own acknowledgements carry.  With a steady stream
    # (xfer's small paced writes) and a 300 us window: 288-592 us measured.
    # If TCP went quiet instead (a retransmission timeout: once 213 ms
    # under a VM's load) the exclusion waits for its next packet, and
    # nothing was sent on the path meanwhile.
    took = exclusion_us(spray, first_ns)
    print(f"TCP: excluded {took:.0f} us after the first loss; {tcp['rtos']} RTOs meanwhile")
    assert took < 1000 or tcp["rtos"] > 0
    # healed: a probe is acknowledged and the path carries traffic again
    before = spray.sent()[BLACKHOLED]
    spray.udp(400)
    assert any(e["type"] == "up" and e["path_id"] == BLACKHOLED for e in events(spray))
    assert spray.sent()[BLACKHOLED] - before >= 50


def test_one_way_udp_fails_over_with_receiver_made_feedback(spray_any):
    spray = spray_any
    spray.attach("rr", "--ack-timeout-us", "300", *FIXED_WINDOW, "--probe-us", "5000")
    spray.udp(2000)                           # feedback flowing, nothing down
    assert not [e for e in events(spray) if e["type"] == "down"]
    hole = blackhole(spray, BLACKHOLED)
    try:
        spray.udp(4000)                       # 0.2 s of one-way traffic
        on_paths = spray.sent()
        spray.udp(4000)
        during = {k: v - on_paths[k] for k, v in spray.sent().items()}
        probes = during.pop(BLACKHOLED)
    finally:
        dropped, first_ns = heal(hole)
    took = exclusion_us(spray, first_ns)
    print(f"one-way: excluded after {took:.0f} us, {probes} probes in 0.2 s")
    assert 0 <= took < 1000
    assert probes <= 0.2 / 0.005 + 5          # only probes, one per probe interval
    # its turns are skipped, as if it were not in the list: the other three
    # carry equal shares to the packet (rr's next path does not get them all,
    # and probes take no turn)
    print("while it is out, the others carry", during)
    assert max(during.values()) < 1.01 * min(during.values())
    b = json.loads(mrcctl("stats", "-j", netns=spray.B).stdout)["counters"]
    assert b["fb_clone"] > 0 and b["tx_control"] == b["fb_clone"]


def test_every_path_down_fails_open(spray):
    """Every A->B path black-holed while B keeps talking to A (its packets
    carry feedback naming none of A's paths): all go down, and A keeps
    sending on them, probed, instead of dropping.  (If B fell silent too,
    nothing would show which path is at fault: no path is taken down.)"""
    spray.attach("rr", "--ack-timeout-us", "500", "--probe-us", "5000")
    mrcctl("path", "policy", "fd00:a::/64", "rr", netns=spray.B)
    spray.udp(500)
    holes = [blackhole(spray, k) for k in range(4)]
    talker = spray.t.popen(spray.B, [*UDP_SEND, spray.A6, "9", "8000", "--pps", "10000"],
                           stdout=subprocess.DEVNULL)
    try:
        spray.udp(4000)
        status = json.loads(mrcctl("status", "-j", netns=spray.A, check=False).stdout)[0]
    finally:
        talker.wait(timeout=60)
        for h in holes:
            heal(h)
    evs = events(spray)
    assert any(e["type"] == "fail-open" for e in evs)
    # status says so, and is not healthy
    assert [f["prefix"] for f in status["fail_open"]] == ["fd00:b::/64"] and not status["healthy"]
    c = json.loads(mrcctl("stats", "-j", netns=spray.A).stdout)["counters"]
    assert c["tx_fail_open"] > 0 and c["tx_drop_no_path"] == 0


def test_random_loss_lowers_weight_without_flapping(spray):
    # per packet: adaptive chooses per spray turn, and a 64 KB burst is
    # one turn (with bursts path 2 kept 0.22-0.25: docs/design/spraying.md)
    spray.attach("adaptive", "--granularity", "packet")
    hole = blackhole(spray, BLACKHOLED, "loss", 0.01)
    try:
        before = spray.sent()
        server, client = start_transfer(spray, 32 << 20)
        sent, received, code = finish_transfer(server, client)
        after = spray.sent()
    finally:
        dropped, _ = heal(hole)
    assert code == 0 and sent == received
    share = {k: (after[k] - before[k]) / sum(after[v] - before[v] for v in after) for k in after}
    rows = json.loads(mrcctl("path", "list", "-j", netns=spray.A).stdout)
    print("1% loss on path 2: shares", share, "dropped", dropped)
    assert dropped > 0 and share[BLACKHOLED] < 0.2
    # Loss takes no path down (later packets on the path are acknowledged):
    # it moves weight.  Packets overtaken on a path (two CPUs) are neither
    # loss nor lateness; a burst of truly late packets widens the window
    # (test_late_packets_widen_the_window), so downs are rare.
    downs = [r["downs"] for r in rows]
    print("downs per path:", downs)
    assert sum(downs) <= 3, downs


def _bursts_over_a_slow_path(spray, *options) -> tuple[int, list, dict]:
    """Bursts of one-way UDP sprayed rr while path 2 crosses a 50 Mbit/s
    tbf with room to queue: its share of each burst waits milliseconds
    there (not lost), while the other paths deliver at once.  Returns
    path 2's downs, the events and A's status."""
    spray.attach("rr", "--ack-timeout-us", "500", *options)
    spray.udp(300)                            # feedback flowing, no queue yet
    spray.t.exec(spray.R[BLACKHOLED], ["tc", "qdisc", "replace", "dev", "rdown", "root", "tbf",
                                       "rate", "50mbit", "burst", "4000", "latency", "200ms"])
    try:
        for _ in range(10):
            spray.udp(400, pps=100000, size=1200)
            time.sleep(0.05)
        status = json.loads(mrcctl("status", "-j", netns=spray.A, check=False).stdout)[0]
        rows = json.loads(mrcctl("path", "list", "-j", netns=spray.A).stdout)
        evs = events(spray)
    finally:
        spray.t.exec(spray.R[BLACKHOLED], ["tc", "qdisc", "del", "dev", "rdown", "root"], check=False)
        mrcctl("detach", "--all", netns=spray.A)
        mrcctl("detach", "--all", netns=spray.B)
    return next(r["downs"] for r in rows if r["path_id"] == BLACKHOLED), evs, status


def test_late_packets_widen_the_window(spray):
    """A path that is slow, not dead, is taken down while its packets wait
    in a queue; when they arrive the down was false, and the peer's
    window doubles (RACK's reordering window, learnt the same way).
    Measured side by side: the same bursts with learning off
    (--reorder-max-us 0) take the slow path down every burst."""
    fixed_downs, fixed_events, _ = _bursts_over_a_slow_path(spray, "--reorder-max-us", "0")
    learnt_downs, learnt_events, status = _bursts_over_a_slow_path(spray)
    print(f"slow path downs: {fixed_downs} with a fixed window, {learnt_downs} learning;"
          f" windows: {status['ack_windows']}")
    assert fixed_downs >= 5 and any(e["type"] == "late" for e in fixed_events)
    # at most log2(16 ms / 0.5 ms) + 1 = 6 doublings' worth of false downs
    # (fewer: the path's reported queue widens its own window too,
    # test_a_standing_queue_widens_its_paths_window)
    assert learnt_downs <= 6 and learnt_downs * 2 <= fixed_downs
    # every down of the slow path was false: it came back as late (its
    # queued packets reported), not up (a probe's answer).  One up is
    # allowed: on a loaded host, feedback delayed on the receiver can take
    # the path down between bursts, with nothing of it queued to come late
    # (in one CI run the only down was that one: ['up'])
    back = [e["type"] for e in learnt_events if e["path_id"] == BLACKHOLED and e["type"] in ("late", "up")]
    assert back.count("up") <= 1, back
    assert back.count("late") >= max(1, learnt_downs - 2) - back.count("up"), back
    # status lists the window while it is wide; it halves back a second
    # after the last late packet, which may come before the last burst
    for window in status["ack_windows"]:
        assert window["prefix"] == "fd00:b::/64" and 500 < window["window_us"] <= 16000


def _steady_over_a_queued_path(spray, *options) -> tuple[int, int]:
    """3 s of one-way UDP sprayed rr while path 2 crosses a tbf it
    overfills: a standing queue of ~30 ms (and drops at its tail, which
    are loss, not lateness).  Path 2's downs and the queueing delay B
    last reported for it."""
    spray.attach("rr", "--ack-timeout-us", "500", *options)
    spray.udp(300)
    spray.t.exec(spray.R[BLACKHOLED], ["tc", "qdisc", "replace", "dev", "rdown", "root", "tbf",
                                       "rate", "8mbit", "burst", "4000", "latency", "30ms"])
    try:
        before = {r["path_id"]: r["downs"] for r in json.loads(mrcctl("path", "list", "-j", netns=spray.A).stdout)}
        spray.udp(12000, pps=4000, size=1200)     # a quarter is 9.6 Mbit/s
        rows = json.loads(mrcctl("path", "list", "-j", netns=spray.A).stdout)
    finally:
        spray.t.exec(spray.R[BLACKHOLED], ["tc", "qdisc", "del", "dev", "rdown", "root"], check=False)
        mrcctl("detach", "--all", netns=spray.A)
        mrcctl("detach", "--all", netns=spray.B)
    row = next(r for r in rows if r["path_id"] == BLACKHOLED)
    return row["downs"] - before[BLACKHOLED], row["feedback"]["qdelay_us"]


def test_a_standing_queue_widens_its_paths_window(spray):
    """A path whose queue stands milliseconds above the others' is alive:
    the queueing delay the peer reports for it widens that path's window
    (up to --reorder-max-us), so it is not taken down again and again.
    Side by side with the window fixed (--reorder-max-us 0, which also
    turns off learning from late packets)."""
    fixed_downs, fixed_q = _steady_over_a_queued_path(spray, "--reorder-max-us", "0")
    downs, q = _steady_over_a_queued_path(spray)
    print(f"queued path: {fixed_downs} downs with a fixed window (queue {fixed_q} us reported), "
          f"{downs} with its queue allowed for (queue {q} us)")
    # the queue was there, and reported: 8-33 ms at the end of the run
    # (the sender, a Python loop, slows when the machine is busy)
    assert q > 5000
    # with the window fixed the path is down most of the time (838 downs
    # measured); allowed for, it goes down while its queue grows faster
    # than the reports follow (19)
    assert fixed_downs >= 100 and downs * 10 <= fixed_downs


def probe(net, *args):
    return json.loads(mrcctl("probe", net.B6, "-j", *args, netns=net.A).stdout)


def test_probe_finds_a_dead_idle_path_and_its_return(spray):
    """No traffic at all: `mrcctl probe` pins echo requests to each path;
    the black-holed one answers nothing and the datapath takes it down,
    and after the heal its probes are answered and bring it back up."""
    spray.attach("rr", "--ack-timeout-us", "500", "--probe-us", "5000")
    clean = probe(spray)
    assert [(p["path_id"], p["received"]) for p in clean["paths"]] == [(k, 3) for k in range(4)]
    hole = blackhole(spray, BLACKHOLED)
    try:
        holed = probe(spray, "--count", "4", "--timeout", "0.3")
    finally:
        dropped, _ = heal(hole)
    by_id = {p["path_id"]: p for p in holed["paths"]}
    # the hole also ate some of A's feedback-only packets for B's replies
    assert by_id[BLACKHOLED]["received"] == 0 and dropped >= 4
    assert all(by_id[k]["received"] == 4 for k in (0, 1, 3)), by_id
    assert by_id[BLACKHOLED]["state"] == "assumed-bad"
    healed = probe(spray, "--path", str(BLACKHOLED))
    assert healed["paths"][0]["received"] == 3 and healed["paths"][0]["state"] == "up"
    kinds = [e["type"] for e in events(spray) if e["path_id"] == BLACKHOLED]
    assert kinds[-2:] == ["down", "up"], kinds
    b = json.loads(mrcctl("stats", "-j", netns=spray.A).stdout)["counters"]
    assert b["tx_pinned_probe"] == 4 * 3 + 4 * 4 + 3


def test_probe_errors_are_one_line(spray):
    spray.attach("rr")
    for args, message in (([spray.B6, "--path", "9"], "has no path 9"),
                          (["fd00:99::1"], "in no peer prefix"),
                          (["not-an-address"], "bad address")):
        r = mrcctl("probe", *args, netns=spray.A, check=False)
        assert r.returncode == 1 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
