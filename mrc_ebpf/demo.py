"""`make demo`: mrc-ebpf end to end on a small network of namespaces.

A --- L1 ===(R1..R4)=== L2 --- B (topology.Diamond): four paths, each
through its own kernel SRv6 End router.  A and B attach mrc-ebpf, each
gets one path per router towards the other, and a TCP transfer is sprayed
packet by packet over all four; then one router is slowed with tbf and the
adaptive policy moves the traffic off it.  Everything it made is removed
at the end.
"""
from __future__ import annotations

import subprocess
import sys
import time

from .topology import Diamond, Topology


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


def iperf(t: Topology, net: Diamond, seconds: int = 3) -> None:
    server = t.popen(net.B, ["iperf3", "-s", "-1", "-B", net.B6], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        sh(t, net.A, "iperf3", "-c", net.B6, "-t", str(seconds), "-f", "m")
    finally:
        if server.poll() is None:
            server.wait(timeout=15)


def main() -> None:
    mrcctl = [sys.executable, "-m", "cli.mrcctl"]
    with Topology(prefix="mrcdemo") as t:
        step("four paths between A and B: A --- L1 ===(R1..R4: kernel SRv6 End)=== L2 --- B")
        net = Diamond(t, n_paths=4)
        print(f"A {net.A6} SID {net.A_SID} | B {net.B6} SID {net.B_SID} | "
              f"R1..R4 End SIDs fc00:1:1:: .. fc00:1:4::")
        for r in net.R:   # finite capacity per path, so queues can form
            t.exec(r, ["tc", "qdisc", "add", "dev", "rdown", "root", "tbf", "rate", "40mbit",
                       "burst", "16kb", "latency", "20ms"])

        step("attach mrc-ebpf on both hosts (TC egress encap + XDP decap, pinned)")
        sh(t, net.A, *mrcctl, "attach", "a0", "--sid", net.A_SID)
        sh(t, net.B, *mrcctl, "attach", "b0", "--sid", net.B_SID)

        step("one path per router, each way; spray A's traffic with the adaptive policy")
        vias = [x for k in range(1, 5) for x in ("--via", net.path_via(k, net.B_SID))]
        sh(t, net.A, *mrcctl, "path", "add", "fd00:b::/64", *vias)
        back = [x for k in range(1, 5) for x in ("--via", net.path_via(k, net.A_SID))]
        sh(t, net.B, *mrcctl, "path", "add", "fd00:a::/64", *back, show=False)
        sh(t, net.A, *mrcctl, "path", "policy", "fd00:b::/64", "adaptive")
        sh(t, net.A, *mrcctl, "status")

        step("iperf3 TCP A -> B, sprayed per packet over 4 paths of 40 Mbit/s each")
        iperf(t, net)
        sh(t, net.A, *mrcctl, "path", "list")

        step("slow R1 to 10 Mbit/s: adaptive moves traffic off path 0 (see tx pkts)")
        t.exec(net.R[0], ["tc", "qdisc", "change", "dev", "rdown", "root", "tbf", "rate", "10mbit",
                          "burst", "16kb", "latency", "20ms"])
        iperf(t, net)
        sh(t, net.A, *mrcctl, "path", "list")

        step("what B measured per path of A's: loss, queueing delay, reordering")
        sh(t, net.B, *mrcctl, "stats", "--paths")
        sh(t, net.A, *mrcctl, "stats")

        step("detach, and remove the namespaces")
        sh(t, net.A, *mrcctl, "detach", "a0")
        sh(t, net.B, *mrcctl, "detach", "b0")
    print("\ndemo done: nothing left behind")


if __name__ == "__main__":
    main()
