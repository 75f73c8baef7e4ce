"""The datapath on the VM's kernel (Debian's 6.1): the host suite's core
checks, sharing one attachment per host because a bcc compile costs about
a minute under TCG.  Run by `make vm-test` (vm_tests/run.py).

One network: A --- L1 ===(R1, R2: kernel End)=== L2 --- B, mrc-ebpf on A
and B; B also has the kernel's own End.DT6 (fc00:b::6) and `encap seg6`
towards A's SID, for interop both ways.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import Spray, mrcctl  # noqa: E402

from mrc_ebpf.lab import faults  # noqa: E402
from mrc_ebpf.lab.topology import Topology  # noqa: E402

pytestmark = pytest.mark.root

B_KERNEL_SID, B_EXTRA, A_EXTRA = "fc00:b::6", "fd00:bb::b", "fd00:aa::a"


@pytest.fixture(scope="module")
def net():
    topo = Topology(prefix="vm")
    try:
        s = Spray(topo, n_paths=2)
        topo.exec(s.B, ["ip", "-6", "route", "add", f"{B_KERNEL_SID}/128", "encap", "seg6local",
                        "action", "End.DT6", "table", "local", "dev", "b0"])
        topo.exec(s.B, ["ip", "-6", "addr", "add", f"{B_EXTRA}/128", "dev", "lo"])
        topo.exec(s.A, ["ip", "-6", "addr", "add", f"{A_EXTRA}/128", "dev", "lo"])
        # through R1's End: L2 routes only the routers' SIDs towards A
        topo.exec(s.B, ["ip", "-6", "route", "add", "fd00:aa::/64", "encap", "seg6", "mode", "encap",
                        "segs", f"fc00:1:1::,{s.A_SID}", "via", "fd00:b::1", "dev", "b0"])
        # under emulation round trips take milliseconds: a longer clock
        s.attach("rr", "--ack-timeout-us", "300000", "--probe-us", "100000")
        yield s
    finally:
        topo.destroy()


def counters(ns):
    return json.loads(mrcctl("stats", "-j", netns=ns).stdout)["counters"]


def diagnosis(net) -> str:
    """What to look at when a check fails in the VM."""
    events = json.loads(mrcctl("stats", "--events", "-j", netns=net.A).stdout)["events"]
    nonzero = {k: v for k, v in counters(net.A).items() if v}
    return f"A counters {nonzero}; A events {events[-12:]}"


def ping(net, ns, dst):
    return net.t.exec(ns, ["ping", "-c", "3", "-i", "0.3", "-W", "5", dst], check=False, timeout=60)


def test_vm_our_encap_into_kernel_end_dt6(net):
    mrcctl("path", "add", "fd00:bb::/64", "--via", f"fc00:1:1::,{B_KERNEL_SID}", netns=net.A)
    assert ping(net, net.A, B_EXTRA).returncode == 0


def test_vm_kernel_encap_into_our_xdp(net):
    before = counters(net.A)["rx_decap"]
    assert ping(net, net.B, A_EXTRA).returncode == 0, diagnosis(net)
    assert counters(net.A)["rx_decap"] - before >= 3


def test_vm_rr_spray_counts(net):
    """rr alternates A's packets over the two paths.  Under emulation A
    also makes feedback-only packets for B's feedback (its own data cannot
    carry it often enough), and those are sprayed too: the split is exact
    up to them, and the routers' counters agree with the maps."""
    net.udp(4, pps=100)
    before_maps, before_routers = net.sent(), net.router_tx()
    before_control = counters(net.A)["tx_control"]
    net.udp(400, pps=500)
    maps = {k: v - before_maps[k] for k, v in net.sent().items()}
    control = counters(net.A)["tx_control"] - before_control
    assert sum(maps.values()) == 400 + control, (maps, control, diagnosis(net))
    assert max(maps.values()) - min(maps.values()) <= control + 1, (maps, control)
    routers = [a - b for a, b in zip(net.router_tx(), before_routers)]
    # router k carries path k-1, plus its own neighbour discovery: a few
    # packets more under emulation, where neighbour entries go stale
    # between the slow steps of a long run (4 each, seen)
    assert all(0 <= r - maps[k] <= 10 for k, r in enumerate(routers)), (routers, maps)


def _fault(net, mode, loss=1.0):
    """R2 (path 1 towards B) drops what arrives from L1: the lab's fault
    program on its receiving end."""
    faults.inject(net.R[1], "rup", mode, loss)


def test_vm_loss_counted_exactly(net):
    def lost():
        # a packet overtaken on its path (two CPUs sending) is counted as a
        # gap when the one behind it arrives, then as late when it does:
        # what the path lost is the difference (seen once: path 0 lost 1,
        # with no fault on it)
        rx = net.stats(net.B)["received"]
        return {r["path_id"]: r["lost"] - r["late"] for r in rx if r["from"] == net.A_SID}
    before = lost()
    _fault(net, "loss", 1 / 7)
    try:
        net.udp(700, pps=500)
    finally:
        dropped = faults.heal(net.R[1], "rup")["dropped"]
    # a loss shows when the path's next packet arrives; if the loss took
    # the path out (slow emulation delays the acknowledgements), that is
    # once a probe brings it back: send until it has carried again
    for _ in range(10):
        net.udp(20, pps=500)
        after = lost()
        if after[1] - before.get(1, 0) >= dropped:
            break
    assert dropped > 20 and after[1] - before.get(1, 0) == dropped, (before, after, diagnosis(net))
    assert after[0] == before.get(0, 0), (before, after)


def test_vm_failover_on_blackhole(net):
    _fault(net, "blackhole")
    try:
        net.udp(1500, pps=500)
    finally:
        faults.heal(net.R[1], "rup")
    events = json.loads(mrcctl("stats", "--events", "-j", netns=net.A).stdout)["events"]
    assert any(e["type"] == "down" and e["path_id"] == 1 for e in events), events


def test_vm_entropy_paths(net):
    """Entropy paths on 6.1: outer IPv6 straight to B's SID with the TLV in
    Destination Options, one flow label each; B's XDP decapsulates them."""
    net.t.exec(net.B, ["ip", "-6", "addr", "add", "fd00:bc::b/128", "dev", "lo"])
    net.t.route(net.L1, "fc00:b::/48", "via", "fd00:10:1::2")     # B_SID fc00:b::1, via R1
    mrcctl("path", "add", "fd00:bc::/64", "--entropy", "2", "--sid", net.B_SID, netns=net.A)
    before = counters(net.B)["rx_decap"]
    assert ping(net, net.A, "fd00:bc::b").returncode == 0, diagnosis(net)
    assert counters(net.B)["rx_decap"] - before >= 3
    rows = [r for r in json.loads(mrcctl("path", "list", "-j", netns=net.A).stdout)
            if r["prefix"] == "fd00:bc::/64"]
    assert [r["encoding"] for r in rows] == ["entropy", "entropy"]
    assert all(r["tx_packets"] >= 1 for r in rows) and rows[0]["flowlabel"] != rows[1]["flowlabel"]
