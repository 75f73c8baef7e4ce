"""Replay a peer's own captured feedback (docs/design/threat-model.md),
for SECONDS at PPS packets per second, from a third host.

    ip netns exec C python replay_feedback.py IFACE NEXTHOP_MAC PCAP PEER_SID SECONDS [--pps N]

PCAP holds what the peer really sent the victim (captured on the way);
its frames from PEER_SID whose MRC TLV carries feedback are sent again,
byte for byte from the IPv6 header on (MAC, sequence numbers, epoch and
all), in a loop, with only the Ethernet header made C's.  Prints the
number of frames it had and the number it sent.
"""
import argparse
import socket
import time

from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from mrc_ebpf.datapath import wire
from mrc_ebpf.datapath.source import C

p = argparse.ArgumentParser()
p.add_argument("iface")
p.add_argument("mac")
p.add_argument("pcap")
p.add_argument("peer_sid")
p.add_argument("seconds", type=float)
p.add_argument("--pps", type=float, default=2000)
a = p.parse_args()

own_mac = bytes.fromhex(open(f"/sys/class/net/{a.iface}/address").read().strip().replace(":", ""))
ether = bytes.fromhex(a.mac.replace(":", "")) + own_mac + b"\x86\xdd"
frames = []
for pkt in rdpcap(a.pcap):
    if not pkt.haslayer(IPv6) or pkt[IPv6].src != a.peer_sid:
        continue
    tlv = wire.mrc_tlv(pkt)
    if tlv is None or not tlv.flags & C["MRC_F_FEEDBACK"]:
        continue
    raw = bytes(pkt)
    assert pkt.haslayer(Ether) and raw[12:14] == b"\x86\xdd", "an untagged IPv6 Ethernet frame"
    frames.append(ether + raw[14:])          # the captured bytes, IPv6 header on
if not frames:
    raise SystemExit("no feedback from the peer in the capture")

with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
    s.bind((a.iface, 0))
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < a.seconds:
        for _ in range(10):
            try:
                s.send(frames[sent % len(frames)])
            except OSError:
                pass
            sent += 1
        due = start + sent / a.pps
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
print(len(frames), sent)
