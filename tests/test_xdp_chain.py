"""Sharing a device's XDP hook (issue 21 item 8): `mrcctl attach` next to
another XDP program chains to it, both run, and `detach` puts it back.

The other program counts what it sees (loaded here with bcc, attached
with pyroute2, as another tool would).  The witnesses are independent:
ping's own count of replies, MRC's counters and the device's XDP id."""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from conftest import mrcctl
from mrc_ebpf.datapath import bpfsys, xdp_chain
from mrc_ebpf.lab import netns, procs

pytestmark = pytest.mark.root

XDP_FLAGS_DRV_MODE = 1 << 2

COUNTER_C = rb"""
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ipv6.h>
#include <linux/in.h>

/* 0 every packet, 1 SRv6-encapsulated (outer SRH), 2 echo replies from
 * fd00:1::/64 (the router: not MRC's), 3 echo replies from fd00:2::/64 (B) */
BPF_PERCPU_ARRAY(seen, u64, 4);

int count_xdp(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip6 = data + sizeof(*eth);
    __u8 *type = data + sizeof(*eth) + sizeof(*ip6);
    u32 k = 0;

    seen.increment(k);
    if ((void *)(ip6 + 1) > end || eth->h_proto != htons(ETH_P_IPV6))
        return XDP_PASS;
    if (ip6->nexthdr == IPPROTO_ROUTING) {
        k = 1;
        seen.increment(k);
    } else if (ip6->nexthdr == IPPROTO_ICMPV6 && (void *)(type + 1) <= end && *type == 129) {
        k = ip6->saddr.s6_addr[3] == 1 ? 2 : 3;
        seen.increment(k);
    }
    return XDP_PASS;
}
"""


class Counter:
    def __init__(self):
        from bcc import BPF
        self.bpf = BPF(text=COUNTER_C)
        self.fn = self.bpf.load_func(b"count_xdp", BPF.XDP)
        self.id = _prog_id(self.fn.fd)

    def seen(self) -> list[int]:
        table = self.bpf[b"seen"]
        return [sum(table[ctypes.c_int(k)]) for k in range(4)]

    def close(self):
        self.bpf.cleanup()


def _prog_id(fd: int) -> int:
    from mrc_ebpf.datapath import bpfsys
    return bpfsys.prog_info(fd).id


def xdp_attach(ns: str, dev: str, fd: int, flags: int = XDP_FLAGS_DRV_MODE) -> None:
    """As another tool would: pyroute2, in the device's namespace."""
    with netns.inside(ns), IPRoute() as ipr:
        index = ipr.link_lookup(ifname=dev)[0]
        ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]})


def xdp_on(t, ns: str, dev: str) -> dict:
    return json.loads(t.exec(ns, ["ip", "-j", "link", "show", dev]).stdout)[0].get("xdp") or {}


def ping_received(out: str) -> int:
    return int(re.search(r"(\d+) received", out).group(1))


@pytest.fixture
def counter():
    c = Counter()
    try:
        yield c
    finally:
        c.close()


def test_attach_chains_to_the_device_program_and_detach_puts_it_back(interop, counter):
    t, A = interop.t, interop.A
    xdp_attach(A, "a0", counter.fn.fd)
    assert xdp_on(t, A, "a0")["prog"]["id"] == counter.id

    # a steady ping to the router (not MRC's) runs through attach and
    # detach: the counter must see every reply ping gets, so it was on
    # the packets' way all along (the swaps left no gap)
    flood = t.popen(A, ["ping", "-n", "-i", "0.005", "fd00:1::1"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        attached = mrcctl("attach", "a0", "--sid", interop.A_SID, netns=A)
        assert f"chained to a0's XDP program {counter.id} count_xdp" in attached.stdout
        status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
        assert status["healthy"] and status["xdp_ours"], status["problems"]
        assert status["xdp_chained"] == {"id": counter.id, "name": "count_xdp"}
        human = mrcctl("status", netns=A).stdout
        assert re.search(rf"a0 XDP chained\s+prog {counter.id} count_xdp", human)
        # what a program swap (attach --replace) needs: the attach type
        # (bcc loads with none) and the chain carried into a new map
        pinned = Path(status["pins"])
        assert xdp_chain.rx_attach_type(pinned, 1) == 0
        fresh = bpfsys.map_create(xdp_chain.BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 8, "chain_copy")
        try:
            xdp_chain.copy_chain(pinned, fresh, 1)
            assert xdp_chain.chained_id(fresh, 0) == counter.id
        finally:
            os.close(fresh)

        # MRC traffic: B answers encapsulated to A's SID; MRC decapsulates
        # it, and the counter gets the decapsulated replies, never the
        # encapsulated packets
        mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
        decap0 = interop.counters()["rx_decap"]
        before = counter.seen()
        mrc_ping = interop.ping(A, interop.B6, count=5)
        assert ping_received(mrc_ping.stdout) == 5, mrc_ping.stdout
        after = counter.seen()
        assert interop.counters()["rx_decap"] - decap0 >= 5
        assert after[1] == before[1] == 0          # no SRv6 packet got past MRC
        assert after[3] - before[3] == 5           # the inner replies did

        # a program swap keeps the chain: the new mrc_rx tail-calls
        # through the running chain map (the ping flood's count covers it)
        replaced = json.loads(mrcctl("attach", "a0", "--replace", "-j", netns=A).stdout)
        new_rx = replaced["programs"]["rx"]["new_id"]
        assert xdp_on(t, A, "a0")["prog"]["id"] == new_rx
        assert json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["xdp_chained"]["id"] == counter.id
        before = counter.seen()
        assert ping_received(interop.ping(A, interop.B6, count=3).stdout) == 3
        assert counter.seen()[3] - before[3] == 3

        detached = json.loads(mrcctl("detach", "a0", "-j", netns=A).stdout)[0]
        assert detached["xdp_restored"] == [{"device": "a0", "id": counter.id}]
        assert xdp_on(t, A, "a0")["prog"]["id"] == counter.id
        time.sleep(0.5)
        os.kill(flood.pid, signal.SIGINT)     # ping prints its count and exits
        out, _ = flood.communicate(timeout=30)
    finally:
        procs.end(flood)
    received = ping_received(out)
    seen = counter.seen()
    assert received > 100 and seen[2] == received, (received, seen)

    # still attached and counting after detach
    assert ping_received(interop.ping(A, "fd00:1::1", count=3).stdout) == 3
    assert counter.seen()[2] == received + 3
    assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []


def test_mode_mismatch_is_one_line_and_changes_nothing(interop, counter):
    t, A = interop.t, interop.A
    xdp_attach(A, "a0", counter.fn.fd)
    r = mrcctl("attach", "a0", "--sid", interop.A_SID, "--mode", "skb", netns=A, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "runs in native mode" in r.stderr
    assert xdp_on(t, A, "a0")["prog"]["id"] == counter.id
    assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []


def _load_frags_program() -> int:
    """`return XDP_PASS` loaded with BPF_F_XDP_HAS_FRAGS (an xdp.frags,
    multi-buffer program), which mrc_rx (not one) cannot tail-call."""
    from mrc_ebpf.datapath import bpfsys
    # r0 = XDP_PASS (2); exit
    insns = bytes((ctypes.c_uint64 * 2)(0x00000002000000b7, 0x0000000000000095))
    return bpfsys.prog_load(6, insns, "GPL", "frags_pass", flags=1 << 5)   # BPF_PROG_TYPE_XDP


def test_frags_program_cannot_be_chained_one_line_error(interop):
    t, A = interop.t, interop.A
    fd = _load_frags_program()
    try:
        xdp_attach(A, "a0", fd)
        r = mrcctl("attach", "a0", "--sid", interop.A_SID, netns=A, check=False)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "cannot chain to a0's XDP program frags_pass" in r.stderr and "xdp.frags" in r.stderr
        assert xdp_on(t, A, "a0")["prog"]["id"] == _prog_id(fd)
        assert json.loads(mrcctl("status", "-j", netns=A).stdout) == []
    finally:
        os.close(fd)


XDP_FILTER_OBJ = "/usr/lib/x86_64-linux-gnu/bpf/xdpfilt_alw_all.o"


@pytest.mark.skipif(not (shutil.which("xdp-loader") and os.path.exists(XDP_FILTER_OBJ)),
                    reason="needs xdp-tools (apt-get install xdp-tools)")
def test_next_to_a_program_xdp_loader_loaded(interop):
    """xdp-loader (libxdp) as a user runs it.  Where libxdp's dispatcher
    works, the device's program is the dispatcher, which mrc_rx cannot
    join: one clear line.  Where it does not (this host's 6.18 kernel:
    libxdp 1.3.1's compatibility check fails), libxdp attaches the
    program alone, and mrc_rx chains to it."""
    t, A = interop.t, interop.A
    loader = ["sh", "-c", "mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf; "
                          f"exec xdp-loader load -m native a0 {XDP_FILTER_OBJ}"]
    t.exec(A, loader)
    theirs = xdp_on(t, A, "a0")["prog"]
    r = mrcctl("attach", "a0", "--sid", interop.A_SID, netns=A, check=False)
    if theirs["name"] == "xdp_dispatcher":
        assert r.returncode == 1 and "libxdp's dispatcher" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        return
    assert r.returncode == 0, r.stderr
    assert theirs["name"] == "xdpfilt_alw_all"
    status = json.loads(mrcctl("status", "-j", netns=A).stdout)[0]
    assert status["xdp_chained"] == {"id": theirs["id"], "name": theirs["name"]}
    # libbpf loads SEC("xdp") with BPF_XDP: mrc_rx was loaded alike
    assert xdp_chain.rx_attach_type(Path(status["pins"]), 1) == xdp_chain.BPF_XDP
    assert ping_received(interop.ping(A, "fd00:1::1", count=3).stdout) == 3
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    assert ping_received(interop.ping(A, interop.B6, count=3).stdout) == 3
    mrcctl("detach", "a0", netns=A)
    assert xdp_on(t, A, "a0")["prog"]["id"] == theirs["id"]
    shown = t.exec(A, ["xdp-loader", "status", "a0"]).stdout
    assert "xdpfilt_alw_all" in shown and "mrc_rx" not in shown
    t.exec(A, ["xdp-loader", "unload", "a0", "--all"])
    assert not xdp_on(t, A, "a0")
