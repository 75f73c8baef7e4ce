"""attach/detach as users of bpftool and xdp-loader expect: state pinned
and found again by later processes (on the host, through `ip netns exec`,
with --netns), one namespace's `eth0` never another's, and detach leaving
the kernel as it was before attach."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.datapath import pins

pytestmark = pytest.mark.root


def bpftool_prog_ids() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {p["id"] for p in json.loads(out.stdout)}


def kernel_view(t, ns, dev):
    link = json.loads(t.exec(ns, ["ip", "-j", "-d", "link", "show", dev]).stdout)[0]
    qdiscs = t.exec(ns, ["tc", "qdisc", "show", "dev", dev]).stdout
    filters = t.exec(ns, ["tc", "filter", "show", "dev", dev, "egress"]).stdout
    routes = t.exec(ns, ["ip", "-6", "route", "show"]).stdout + t.exec(ns, ["ip", "route", "show"]).stdout
    return {"xdp": link.get("xdp"), "qdiscs": qdiscs, "filters": filters, "routes": routes}


def pinned_paths() -> set[str]:
    """The datapath's pins in every namespace (other tools' pins, such as
    the fabric's faults, belong to other tests that may run alongside)."""
    return {str(p) for p in pins.BASE.glob("ns*/**/*")} if pins.BASE.exists() else set()


def test_detach_leaves_kernel_as_before(interop):
    t, A = interop.t, interop.A
    before = kernel_view(t, A, "a0"), bpftool_prog_ids(), pinned_paths()
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    mrcctl("path", "add", "198.18.2.0/24", "--via", interop.B_DX4, netns=A)
    during = kernel_view(t, A, "a0")
    assert during["xdp"] and "mrc_tx" in during["filters"] and "proto mrc" in during["routes"]
    ns_dir = Path(json.loads(mrcctl("status", "-j", netns=A).stdout)[0]["pins"]).parent
    mrcctl("detach", "a0", netns=A)
    after = kernel_view(t, A, "a0"), bpftool_prog_ids(), pinned_paths()
    assert after[0] == before[0] and not ns_dir.exists()
    # nothing of ours is left loaded or pinned (other tests', running
    # alongside, may come and go)
    assert not after[1] - before[1] and not {p for p in after[2] - before[2] if str(ns_dir) in p}


def test_datapath_outlives_mrcctl_and_is_found_every_way(interop):
    """attach in one process; later processes find the pins through
    `ip netns exec`, through --netns, and the datapath keeps working."""
    interop.attach()   # the attaching process has exited here
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=interop.A, via_ip_netns=True)
    assert interop.ping(interop.A, interop.B6, count=2).returncode == 0
    by_exec = json.loads(mrcctl("-j", "path", "list", netns=interop.A, via_ip_netns=True).stdout)
    by_opt = json.loads(mrcctl("-j", "path", "list", netns=interop.A).stdout)
    assert by_exec == by_opt and by_opt[0]["tx_packets"] >= 2
    status = json.loads(mrcctl("status", "-j", netns=interop.A).stdout)
    assert status[0]["healthy"] and status[0]["xdp_ours"] and status[0]["tc_ours"]


def test_same_device_name_in_two_namespaces_never_shares_state(topo):
    ns1, ns2 = topo.ns("X"), topo.ns("Y")
    peer = topo.ns("P", forwarding=True)
    topo.link(ns1, "eth0", peer, "px")
    topo.link(ns2, "eth0", peer, "py")
    for ns, net in ((ns1, "fd00:11"), (ns2, "fd00:12")):
        topo.addr(ns, "eth0", f"{net}::2/64")
        topo.route(ns, "fc00::/16", "via", f"{net}::1")
    topo.addr(peer, "px", "fd00:11::1/64")
    topo.addr(peer, "py", "fd00:12::1/64")
    mrcctl("attach", "eth0", "--sid", "fc00:11::1", netns=ns1)
    mrcctl("attach", "eth0", "--sid", "fc00:12::1", netns=ns2, via_ip_netns=True)
    mrcctl("path", "add", "fd00:99::/64", "--via", "fc00:99::1", netns=ns1)
    one = json.loads(mrcctl("-j", "path", "list", netns=ns1).stdout)
    two = json.loads(mrcctl("-j", "path", "list", netns=ns2, via_ip_netns=True).stdout)
    assert len(one) == 1 and two == []
    s1 = json.loads(mrcctl("-j", "status", netns=ns1).stdout)[0]
    s2 = json.loads(mrcctl("-j", "status", netns=ns2).stdout)[0]
    assert (s1["sid"], s2["sid"]) == ("fc00:11::1", "fc00:12::1") and s1["pins"] != s2["pins"]
    mrcctl("detach", "eth0", netns=ns1)
    assert json.loads(mrcctl("-j", "status", netns=ns2).stdout)[0]["healthy"]


@pytest.mark.parametrize("args,message", [
    (["attach", "nosuchdev", "--sid", "fc00::1"], "not found"),
    (["attach", "a0", "--sid", "not-an-address"], "bad SID"),
    (["attach", "a0", "--sid", "fe80::1"], "bad SID"),
    (["detach", "a0"], "not attached"),
    (["path", "list"], "no device is attached"),
])
def test_errors_are_one_line_and_change_nothing(interop, args, message):
    before = kernel_view(interop.t, interop.A, "a0"), pinned_paths()
    result = mrcctl(*args, netns=interop.A, check=False)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert (kernel_view(interop.t, interop.A, "a0"), pinned_paths()) == before


def test_attach_twice_and_bad_paths_fail_cleanly(interop):
    interop.attach()
    again = mrcctl("attach", "a0", "--sid", interop.A_SID, netns=interop.A, check=False)
    assert again.returncode == 1 and "already attached" in again.stderr
    for args, message in ((["path", "add", "fd00:2::/64", "--via", "fc00::1,zz"], "bad segment"),
                          (["path", "add", "nonsense", "--via", "fc00::1"], "bad prefix"),
                          (["path", "add", "fd00:2::/64", "--via", ",".join(["fc00::1"] * 7)], "at most"),
                          (["path", "del", "fd00:77::/64"], "no paths")):
        r = mrcctl(*args, netns=interop.A, check=False)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert json.loads(mrcctl("-j", "path", "list", netns=interop.A).stdout) == []


def test_not_root_is_refused(tmp_path):
    """A real non-root process: fork, drop to nobody (the modules are
    already imported, so the checkout's permissions do not matter), run
    the CLI, report through a pipe."""
    import os
    from click.testing import CliRunner
    from mrc_ebpf.cli.mrcctl import cli
    import mrc_ebpf.datapath.loader  # noqa: F401  (imported lazily by the verb)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            result = CliRunner().invoke(cli, ["attach", "lo", "--sid", "fc00::1"], obj={})
            os.write(write, f"{result.exit_code}\n{result.output}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        exit_code, output = f.read().split("\n", 1)
    os.waitpid(pid, 0)
    assert exit_code == "1" and "needs root" in output and "Traceback" not in output


def test_path_del_keeps_other_ids(interop):
    """Ids are stable (the receiver tracks sequence per id); a freed id is
    the next one given out."""
    interop.attach()
    for seg in (interop.B_DT6, f"{interop.R_SID},{interop.B_DT6}"):
        mrcctl("path", "add", "fd00:2::/64", "--via", seg, netns=interop.A)
    mrcctl("path", "del", "fd00:2::/64", "--id", "0", netns=interop.A)
    rows = json.loads(mrcctl("-j", "path", "list", netns=interop.A).stdout)
    assert [(r["path_id"], r["segments"]) for r in rows] == [(1, [interop.R_SID, interop.B_DT6])]
    assert interop.ping(interop.A, interop.B6, count=2).returncode == 0
    mrcctl("path", "del", "fd00:2::/64", netns=interop.A)
    assert "proto mrc" not in interop.t.exec(interop.A, ["ip", "-6", "route"]).stdout
