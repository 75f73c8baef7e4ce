"""ECN through the tunnel (RFC 6040, normal mode; bpf/lib/ecn.h): a
fabric queue's CE mark on the outer header reaches the inner packet,
a CE mark on a packet that cannot carry it is dropped, and TX copies the
inner ECN field to the outer header so the fabric can mark at all.

Frames are built with scapy and sent from R into A's a0 (our XDP); the
witness is the receiving socket on A, which the kernel tells the ECN
field each datagram arrived with (IPV6_TCLASS / IP_TOS), and for IPv4
the kernel's own header checksum check (a bad one is never delivered).
TX's side is in test_wire_capture (the outer header on the wire).
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.datapath import wire
from conftest import ROOT

pytestmark = pytest.mark.root

NOT_ECT, ECT1, ECT0, CE = 0, 1, 2, 3
ECN_RECV = [sys.executable, str(ROOT / "tests" / "tools" / "ecn_recv.py")]
PORT = 9997

# (name, outer ECN, inner ECN, what arrives: the inner ECN, or None = dropped)
CASES = [("ce-on-ect0", CE, ECT0, CE), ("ce-on-ect1", CE, ECT1, CE), ("ce-on-ce", CE, CE, CE),
         ("ce-on-notect", CE, NOT_ECT, None), ("ect1-on-ect0", ECT1, ECT0, ECT1),
         ("ect1-on-notect", ECT1, NOT_ECT, NOT_ECT), ("ect0-on-ect1", ECT0, ECT1, ECT1),
         ("notect-on-ect0", NOT_ECT, ECT0, ECT0), ("ect0-on-notect", ECT0, NOT_ECT, NOT_ECT)]


def frame(interop, name, outer_ecn, inner_ecn, v4: bool, dscp: int = 0x2e):
    """An SRv6 frame to A's SID whose outer and inner headers carry the
    given ECN fields (with a DSCP, which must survive untouched)."""
    tc_in = dscp << 2 | inner_ecn
    payload = UDP(sport=4000, dport=PORT) / Raw(f"{name}-{'v4' if v4 else 'v6'}".encode())
    inner = (IP(src=interop.B4, dst=interop.A4, tos=tc_in) if v4 else
             IPv6(src=interop.B6, dst=interop.A6, tc=tc_in)) / payload
    outer = IPv6(src="fc00:b::6", dst=interop.A_SID, tc=dscp << 2 | outer_ecn) / IPv6ExtHdrSegmentRouting(
        addresses=[interop.A_SID], segleft=0, lastentry=0, tlv_objects=[wire.MrcTLV(path_id=1, path_seq=5)])
    return Ether(src=interop.mac(interop.R, "r0"), dst=interop.mac(interop.A, "a0"), type=0x86DD) / \
        (outer / inner)


def receive(interop, ns, frames, expected: int, inject_from=("R", "r0")):
    listener = interop.t.popen(ns, [*ECN_RECV, interop.A6 if ns == interop.A else interop.B6,
                                    interop.A4 if ns == interop.A else interop.B4, str(PORT), str(expected)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "ready"
        interop.inject(getattr(interop, inject_from[0]), inject_from[1], frames)
        out, _ = listener.communicate(timeout=20)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    return {line.split()[0]: None if line.split()[1] == "None" else int(line.split()[1])
            for line in out.splitlines() if line.strip()}


def test_decap_applies_the_outer_ecn_field_as_rfc6040_says(interop):
    interop.attach()
    frames, want = [], {}
    for v4 in (False, True):
        for name, outer, inner, arrives in CASES:
            frames.append(frame(interop, name, outer, inner, v4))
            if arrives is not None:
                want[f"{name}-{'v4' if v4 else 'v6'}"] = arrives
    before = interop.counters()
    got = receive(interop, interop.A, frames, expected=len(want))
    after = interop.counters()
    assert got == want
    delta = {k: after[k] - before[k] for k in after}
    dropped = sum(1 for c in CASES if c[3] is None) * 2
    assert delta["rx_drop_ecn"] == dropped
    # CE newly set on the inner header: ect0 and ect1 inners, both families
    assert delta["rx_ce"] == 4
    assert delta["rx_decap"] == len(want)


def test_ce_survives_with_every_other_traffic_class_bit(interop):
    """The mark changes two bits: the inner DSCP is untouched, and an
    IPv4 inner header's checksum still checks (or the kernel would drop
    it and nothing would arrive)."""
    interop.attach()
    frames = [frame(interop, f"dscp{d}", CE, ECT0, v4, dscp=d) for d in (0, 0x0a, 0x2e, 0x3f)
              for v4 in (False, True)]
    got = receive(interop, interop.A, frames, expected=len(frames))
    assert got == {f"dscp{d}-{f}": CE for d in (0, 0x0a, 0x2e, 0x3f) for f in ("v4", "v6")}
