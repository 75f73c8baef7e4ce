"""Send raw Ethernet frames (hex, one per argument) out of IFACE.

Run inside a namespace: `ip netns exec NS python inject.py IFACE HEX...`.
A packet socket goes through the device's qdisc and TC egress like any
other packet, so this also feeds our TX program.
"""
import socket
import sys

iface, frames = sys.argv[1], sys.argv[2:]
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
    s.bind((iface, 0))
    for frame in frames:
        try:
            s.send(bytes.fromhex(frame))
        except OSError as e:   # ENOBUFS: a TC program dropped it, as some tests want
            print(f"dropped at send: {e.strerror}", file=sys.stderr)
