"""Print the ECN field each datagram arrived with, as the kernel gives it
to the receiving socket (IPV6_TCLASS / IP_TOS ancillary data).

Run inside a namespace: `ip netns exec NS python ecn_recv.py ADDR6 ADDR4 PORT COUNT`.
Prints "ready", then "PAYLOAD ECN" per datagram (ECN 0..3) until COUNT
arrived or nothing came for 3 s.
"""
import select
import socket
import sys

addr6, addr4, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)

s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s6.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
s6.bind((addr6, port))
s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s4.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
s4.bind((addr4, port))
print("ready", flush=True)
got = 0
while got < count:
    ready, _, _ = select.select([s6, s4], [], [], 3)
    if not ready:
        break
    for s in ready:
        data, anc, _, _ = s.recvmsg(2048, 256)
        ecn = None
        for level, kind, cdata in anc:
            if (level, kind) in ((socket.IPPROTO_IPV6, IPV6_TCLASS), (socket.IPPROTO_IP, socket.IP_TOS)):
                ecn = int.from_bytes(cdata[:4] if kind == IPV6_TCLASS else cdata[:1], sys.byteorder) & 3
        print(data.decode(errors="replace"), ecn, flush=True)
        got += 1
