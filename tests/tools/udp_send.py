"""Send COUNT UDP datagrams to DST PORT, paced, from FLOWS source sockets.

    udp_send.py DST PORT COUNT [--size N | --sizes N,M,...] [--tclass T] [--flows F] [--pps P]

--sizes cycles through the payload sizes given, one datagram each.
"""
import argparse
import socket
import time

p = argparse.ArgumentParser()
p.add_argument("dst")
p.add_argument("port", type=int)
p.add_argument("count", type=int)
p.add_argument("--size", type=int, default=64)
p.add_argument("--sizes", help="payload sizes to cycle through, comma-separated")
p.add_argument("--tclass", type=int, default=0, help="IPv6 traffic class byte (DSCP << 2)")
p.add_argument("--flows", type=int, default=1)
p.add_argument("--pps", type=float, default=20000)
a = p.parse_args()

socks = []
for _ in range(a.flows):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, a.tclass)
    socks.append(s)
payloads = [bytes(int(n)) for n in a.sizes.split(",")] if a.sizes else [bytes(a.size)]
start = time.monotonic()
for i in range(a.count):
    socks[i % a.flows].sendto(payloads[i % len(payloads)], (a.dst, a.port))
    due = start + (i + 1) / a.pps
    while time.monotonic() < due:
        pass
print(a.count)
