"""The kernel's End.DT6 decapsulates SRv6 packets that our RX drops.

Our side (each malformation dropped and counted by its reason) is a
packet table run through BPF_PROG_TEST_RUN: tests/datapath/test_tables.py.
What needs a kernel around the program stays here: a frame sent from R
to B's End.DT6 route, and a socket on B as the witness that it arrived.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire

pytestmark = pytest.mark.root


def patch(pkt, offset, value: bytes) -> bytes:
    """Rewrite bytes at an offset from the start of the outer IPv6 header."""
    b = bytearray(bytes(pkt))
    b[offset:offset + len(value)] = value
    return bytes(b)


def udp_listener(interop, ns, count, port=9999):
    """Prints the datagrams to `port`, `count` of them (or what came in 8 s)."""
    proc = interop.t.popen(ns, ["timeout", "8", sys.executable, "-c",
                                "import socket;s=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM);"
                                f"s.bind(('::',{port}));print('ready',flush=True);"
                                f"[print(s.recv(100),flush=True) for _ in range({count})]"],
                           stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


# (name, offset from the outer IPv6 header, bytes written there)
MALFORMED = [("tlv-overrun", 48 + 16 + 1, b"\x40"),     # TLV overruns the SRH
             ("segleft-above-last", 43, b"\x05")]       # segments left > last entry


def test_kernel_end_dt6_decapsulates_what_we_drop(interop):
    """The comparison the issue asks us to beat: the kernel's End.DT6 on B
    still delivers packets that our XDP drops (the `tlv` and
    `segments_left` rows of tests/datapath/test_tables.py)."""
    b_mac, r_mac = interop.mac(interop.B, "b0"), interop.mac(interop.R, "r1")
    listener = udp_listener(interop, interop.B, len(MALFORMED))
    frames = []
    for name, offset, value in MALFORMED:
        bad = IPv6(src="fc00:a::6", dst="fc00:b::6") / IPv6ExtHdrSegmentRouting(
            addresses=["fc00:b::6"], segleft=0, lastentry=0, tlv_objects=[wire.MrcTLV()]) / \
            IPv6(src="fd00:1::a", dst="fd00:2::b") / UDP(dport=9999) / Raw(name.encode())
        frames.append(Ether(src=r_mac, dst=b_mac, type=0x86DD) / Raw(patch(bad, offset, value)))
    interop.inject(interop.R, "r1", frames)
    out, _ = listener.communicate(timeout=15)
    for name, _, _ in MALFORMED:    # the kernel delivered each; our XDP would not
        assert name in out, out
