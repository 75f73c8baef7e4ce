"""Count the UDP datagrams that reach PORT: prints "ready" once bound, then,
after the first datagram, counts until QUIET seconds pass without one and
prints the count.

    udp_sink.py PORT [--rcvbuf-mb N] [--first S] [--quiet S]

--rcvbuf-mb: room for seconds of a flow (SO_RCVBUFFORCE: root, past
rmem_max), so a receiver slowed by a busy machine does not drop what the
network delivered.  --first: how long to wait for the first datagram
(default: for ever).
"""
import argparse
import socket

SO_RCVBUFFORCE = 33

p = argparse.ArgumentParser()
p.add_argument("port", type=int)
p.add_argument("--rcvbuf-mb", type=int, default=8)
p.add_argument("--first", type=float, default=None)
p.add_argument("--quiet", type=float, default=2.0)
a = p.parse_args()

s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, a.rcvbuf_mb << 20)
s.bind(("::", a.port))
print("ready", flush=True)
s.settimeout(a.first)
s.recv(65536)           # a GSO datagram arrives whole: up to 64 KB
n = 1
s.settimeout(a.quiet)
try:
    while True:
        s.recv(65536)
        n += 1
except socket.timeout:
    pass
print(n, flush=True)
