"""A TCP transfer whose data is checked: both ends print length and sha256.

    xfer.py serve ADDR PORT          # prints "<bytes> <sha256>" when the peer closes
    xfer.py send ADDR PORT BYTES [MBIT]   # sends BYTES of seeded pseudo-random data,
                                          # paced to MBIT Mbit/s if given
"""
import hashlib
import random
import socket
import sys
import time


def serve(addr, port):
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        s.listen(1)
        print("ready", flush=True)
        conn, _ = s.accept()
        digest, total = hashlib.sha256(), 0
        with conn:
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                digest.update(chunk)
                total += len(chunk)
        print(total, digest.hexdigest(), flush=True)


def send(addr, port, nbytes, mbit=0.0):
    rng = random.Random(8754)
    start = time.monotonic()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    digest = hashlib.sha256()
    with socket.create_connection((addr, port), timeout=20) as s:
        left = nbytes
        # paced: small writes, so TCP sends a steady stream and not a
        # 64 KiB burst every few milliseconds
        size = 8 << 10 if mbit else 1 << 16
        while left:
            chunk = rng.randbytes(min(left, size))
            s.sendall(chunk)
            digest.update(chunk)
            left -= len(chunk)
            if mbit:
                due = start + (nbytes - left) * 8 / (mbit * 1e6)
                time.sleep(max(0.0, due - time.monotonic()))
        s.shutdown(socket.SHUT_WR)
    print(nbytes, digest.hexdigest(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
             float(sys.argv[5]) if len(sys.argv) > 5 else 0.0)
