"""Network namespaces for the lab: entering one for a while, making and
removing them.

`inside` moves just the calling thread into a namespace (setns(2) on
/run/netns/NAME; `ip netns exec` starts a new process) and brings it
back, so a socket or netlink handle made inside stays bound to it
(lab/enter.py).  `create`/`delete` and `Namespaces` (a set of namespaces always removed,
mrc-ebpf's pins with them) are what the fabric, the bench and the test
topologies build on.
"""
from __future__ import annotations

import os

# in a module below faults (netns.delete calls faults); netns.inside is its lab name
from mrc_ebpf.lab.enter import NetnsGone, inside  # noqa: F401


# ---- making and removing namespaces --------------------------------------------

def existing() -> set[str]:
    """The names of the network namespaces that exist now (/run/netns)."""
    try:
        return {e.name for e in os.scandir("/run/netns")}
    except FileNotFoundError:
        return set()


def create(name: str, sysctls: list[str] = ()) -> None:
    """Namespace NAME with lo up and SYSCTLS (net.KEY=VALUE) set."""
    from mrc_ebpf.lab import procs
    procs.run(["ip", "netns", "add", name])
    configure(name, sysctls)


def configure(name: str, sysctls: list[str] = ()) -> None:
    """SYSCTLS (net.KEY=VALUE) set in NAME, and its lo up."""
    from mrc_ebpf.lab import procs
    if sysctls:
        procs.run(["sysctl", "-qw", *sysctls], ns=name)
    procs.run(["ip", "-n", name, "link", "set", "lo", "up"])


def has_datapath(name: str) -> bool:
    """Does mrc-ebpf have pinned state in namespace NAME?  (Its pin
    directory is named by the namespace's cookie: look from inside.)"""
    from mrc_ebpf.datapath import pins
    try:
        with inside(name):
            d = pins.netns_dir()
            return d.is_dir() and any(d.iterdir())
    except NetnsGone:
        return False
    except OSError:
        return True          # cannot tell: let detach --all decide


def delete(names: list[str]) -> list[str]:
    """Remove namespaces NAMES, taking mrc-ebpf's pinned state down first
    and clearing the pins of faults injected there (pins outlive a
    namespace); returns the problems, if any (one line each)."""
    from mrc_ebpf.lab import procs
    present = existing()
    names = [n for n in names if n in present]
    problems = []
    attached = [n for n in names if has_datapath(n)]
    for n, r in zip(attached, procs.run_parallel([procs.mrcctl_cmd(n, "detach", "--all")
                                                  for n in attached], limit=4)):
        try:
            procs.mrcctl_result(r, f"detach in {n}")
        except Exception as e:  # noqa: BLE001 - reported; the namespace goes anyway
            problems.append(str(e))
    if names:
        r = procs.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in names),
                      check=False, timeout=300)
        if r.returncode != 0:
            problems.append(" ".join(r.stderr.split())[:300])
    from mrc_ebpf.lab import faults      # their pins outlive the namespace too
    for n in names:
        try:
            faults.forget(n)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            problems.append(f"fault pins of {n}: {e}")
    return problems


class Namespaces:
    """Namespaces made through it are removed when it closes (with-block),
    also after a failure half-way."""

    def __init__(self):
        self.made: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def create(self, name: str, sysctls: list[str] = ()) -> str:
        from mrc_ebpf.lab import procs
        procs.run(["ip", "netns", "add", name])
        self.made.append(name)     # ours from here on: a half-made one is removed too
        configure(name, sysctls)
        return name

    def close(self) -> list[str]:
        problems = delete(list(reversed(self.made)))
        self.made.clear()
        return problems
