"""`make demo`: mrc-ebpf end to end on a small network of namespaces.

A --- R --- B, where R is the kernel's SRv6 router and B the kernel's own
SRv6 host (topology.KernelPeerLine).  A attaches mrc-ebpf, sends over a
two-segment path (R's End, then B's End.DT6), runs iperf3 through it and
prints what the maps saw.  Everything it made is removed at the end.
"""
from __future__ import annotations

import subprocess
import sys

from .topology import KernelPeerLine, Topology


def step(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def sh(t: Topology, ns: str, *cmd: str, show: bool = True) -> None:
    label = ns.rsplit("-", 1)[-1]
    print(f"[{label}]$ {' '.join(cmd)}", flush=True)
    result = t.exec(ns, list(cmd), check=False, timeout=120)
    if show:
        sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stdout.write(result.stderr)
        raise SystemExit(f"demo: `{' '.join(cmd)}` failed")


def main() -> None:
    mrcctl = [sys.executable, "-m", "cli.mrcctl"]
    with Topology(prefix="mrcdemo") as t:
        step("a network of namespaces: A --- R (kernel SRv6 End) --- B (kernel End.DT6)")
        net = KernelPeerLine(t)
        print(f"A {net.A6} SID {net.A_SID} | R End {net.R_SID} | B {net.B6} End.DT6 {net.B_DT6}")

        step("attach mrc-ebpf to A's a0 (TC egress encap + XDP decap, pinned)")
        sh(t, net.A, *mrcctl, "attach", "a0", "--sid", net.A_SID)
        step("one path to B's prefix: through R's End, then B's End.DT6")
        sh(t, net.A, *mrcctl, "path", "add", "fd00:2::/64", "--via", f"{net.R_SID},{net.B_DT6}")
        sh(t, net.A, "ip", "-6", "route", "show", "fd00:2::/64")

        step("ping B: A encapsulates, R forwards as End, B's kernel decapsulates;"
             " B replies with the kernel's own encap, A's XDP decapsulates")
        sh(t, net.A, "ping", "-c", "3", "-i", "0.2", net.B6)

        step("iperf3 TCP A -> B through the datapath (3 s)")
        server = t.popen(net.B, ["iperf3", "-s", "-1", "-B", net.B6], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        try:
            import time
            time.sleep(0.5)
            sh(t, net.A, "iperf3", "-c", net.B6, "-t", "3", "-f", "g")
        finally:
            server.wait(timeout=15) if server.poll() is None else None

        step("what the maps saw")
        sh(t, net.A, *mrcctl, "status")
        sh(t, net.A, *mrcctl, "path", "list")
        sh(t, net.A, *mrcctl, "stats")

        step("detach, and remove the namespaces")
        sh(t, net.A, *mrcctl, "detach", "a0")
    print("\ndemo done: nothing left behind")


if __name__ == "__main__":
    main()
