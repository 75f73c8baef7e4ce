"""Interop with the kernel's own SRv6, both ways, on real namespaces.

Independent witnesses: the kernel's End.DT6/End.DX4/End behaviours and
its own `encap seg6`, ping, a TCP transfer whose bytes are hashed on both
ends, and captures read with scapy.
"""
from __future__ import annotations

import json

import pytest

from conftest import mrcctl

pytestmark = pytest.mark.root


def conservation(c):
    rx_outcomes = c["rx_decap"] + c["rx_pass"] + c["rx_control"] + sum(v for k, v in c.items() if k.startswith("rx_drop_"))
    tx_outcomes = c["tx_encap"] + c["tx_pass"] + sum(v for k, v in c.items() if k.startswith("tx_drop_"))
    assert rx_outcomes == c["rx_seen"], c
    assert tx_outcomes == c["tx_seen"], c


def test_our_encap_kernel_end_dt6_ping_and_tcp(interop):
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=interop.A)
    assert interop.ping(interop.A, interop.B6).returncode == 0
    sent, received = interop.transfer(interop.A, interop.B, interop.B6)
    assert sent == received and sent.startswith(str(4 << 20))
    c = interop.counters()
    assert c["tx_encap"] > 0 and c["rx_decap"] > 0   # replies come back kernel-encapsulated
    conservation(c)


def test_kernel_end_in_the_middle_two_segments(interop):
    """A two-segment path: R's kernel End, then B's End.DT6."""
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", f"{interop.R_SID},{interop.B_DT6}", netns=interop.A)
    before = _r_end_packets(interop)
    assert interop.ping(interop.A, interop.B6, count=5).returncode == 0
    # the kernel's own End on R counted our packets
    assert _r_end_packets(interop) - before >= 5
    sent, received = interop.transfer(interop.A, interop.B, interop.B6, nbytes=2 << 20)
    assert sent == received


def _r_end_packets(interop) -> int:
    """Packets R sent towards B: seg6local routes keep no counters of
    their own, so R's interface counters are the witness."""
    link = json.loads(interop.t.exec(interop.R, ["ip", "-j", "-s", "link", "show", "r1"]).stdout)
    return link[0]["stats64"]["tx"]["packets"]


def test_ipv4_inner_kernel_end_dx4_ping_and_tcp(interop):
    interop.attach()
    mrcctl("path", "add", "198.18.2.0/24", "--via", interop.B_DX4, netns=interop.A)
    assert interop.ping(interop.A, interop.B4).returncode == 0
    sent, received = interop.transfer(interop.A, interop.B, interop.B4)
    assert sent == received and sent.startswith(str(4 << 20))
    conservation(interop.counters())


def test_kernel_encap_decapsulated_by_our_xdp(interop):
    """B encapsulates with the kernel's `encap seg6`; only our XDP on A can
    decapsulate (A has no seg6local route), so a reply proves it."""
    interop.attach()
    # A answers over plain IPv6 via R (no path configured on A)
    assert interop.ping(interop.B, interop.A6).returncode == 0
    sent, received = interop.transfer(interop.B, interop.A, interop.A6)
    assert sent == received
    c = interop.counters()
    assert c["rx_decap"] > 0 and c["tx_encap"] == 0
    conservation(c)


def test_without_our_xdp_kernel_encap_does_not_arrive(interop):
    """The control for the test above: no datapath, no decapsulation."""
    assert interop.ping(interop.B, interop.A6, count=2).returncode != 0
