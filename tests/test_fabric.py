"""`mrcctl fabric`: an emulated leaf-spine fabric of namespaces.

Every fabric a test brings up gets a unique name and is removed by
`mrcctl fabric down` in a finalizer, also when the test fails.  Witnesses
are the kernel's own: interface counters of the spines, `ip` state,
kernel SRv6 (encap seg6 / End.DT6) independent of our datapath.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, UDP_SEND, XFER, mrcctl
from mrc_ebpf.lab import fabric as fab_mod
from mrc_ebpf.errors import MrcError
from mrc_ebpf.lab import netns, procs

pytestmark = pytest.mark.root

_counter = itertools.count()


def fabric(*args, check=True):
    return mrcctl("fabric", *args, check=check)


def one_line_error(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrcctl: error: "), r.stderr
    return lines[0]


def namespaces(prefix: str = "") -> set[str]:
    """Namespaces named PREFIX-* (other engineers' tests make their own)."""
    return {n for n in netns.existing() if n.startswith(prefix)}


COOKIE = ("import socket; s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); "
          "print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), 'little'))")


def pin_dirs(net) -> list[Path]:
    """The datapath's pin directories of the fabric's hosts (that exist)."""
    out = []
    for h in net.show["hosts"]:
        cookie = net.exec(h["name"], [sys.executable, "-c", COOKIE]).stdout.strip()
        out.append(Path("/run/mrc-ebpf") / f"ns{cookie}")
    return out


class Net:
    """A fabric that is up, with what `fabric show -j` says about it."""

    def __init__(self, name: str):
        self.name = name
        self.show = json.loads(fabric("show", name, "-j").stdout)

    def ns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def exec(self, node, cmd, check=True, timeout=60):
        r = procs.run(cmd, ns=self.ns(node), check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{node}: {' '.join(cmd)}: {r.stderr}")
        return r

    def popen(self, node, cmd, **kw):
        return procs.popen(cmd, self.ns(node), **kw)

    def tx(self, node, dev) -> int:
        link = json.loads(subprocess.run(["ip", "-n", self.ns(node), "-j", "-s", "link", "show", dev],
                                         capture_output=True, text=True, check=True).stdout)
        return link[0]["stats64"]["tx"]["packets"]

    def spine_tx(self, spines, dev) -> dict[str, int]:
        return {s: self.tx(s, dev) for s in spines}

    def host(self, name) -> dict:
        return next(h for h in self.show["hosts"] if h["name"] == name)

    def pair(self, src, dst) -> dict:
        return next(p for p in self.show["paths"] if p["src"] == src and p["dst"] == dst)

    def ping(self, src, dst_addr, count=3, interval="0.2"):
        return self.exec(src, ["ping", "-c", str(count), "-i", interval, "-W", "2", dst_addr], check=False)


@pytest.fixture
def make_fabric():
    names = []

    def make(*opts) -> Net:
        name = f"ft{os.getpid() % 1000}{next(_counter)}{int(time.time() * 1000) % 100}"
        names.append(name)
        fabric("up", name, *opts)
        return Net(name)

    try:
        yield make
    finally:
        for name in names:
            fabric("down", name, check=False)


# --------------------------------------------------------------------------- lifecycle

def test_up_show_down_round_trip(make_fabric):
    net = make_fabric("--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2")
    pins = pin_dirs(net)
    d = net.show
    assert d["status"] == "up" and d["encoding"] == "srh"
    assert {h["name"] for h in d["hosts"]} == {"h1", "h2", "h3", "h4"}
    assert [h["sid"] for h in d["hosts"]] == ["fc00:0:e001::", "fc00:0:e002::", "fc00:0:e003::",
                                               "fc00:0:e004::"]
    assert [h["nics"][0]["leaf"] for h in d["hosts"]] == ["l1", "l1", "l2", "l2"]
    spines = {s["name"]: s["sid"] for s in d["switches"] if s["kind"] == "spine"}
    assert spines == {"s1": "fc00:0:101::", "s2": "fc00:0:102::"}
    assert set(d["namespaces"]) <= namespaces()
    assert len(d["namespaces"]) == 2 + 2 + 4
    assert len(d["links"]) == 2 * 2 + 4
    assert {lk["name"] for lk in d["links"]} >= {"s1-l1", "s2-l2", "h3-l2"}
    for lk in d["links"]:
        assert lk["rate"] == ("100mbit" if lk["kind"] == "fabric" else None)
        for end in lk["ends"]:
            assert len(end["dev"]) <= 15
            # the device is really there, in that namespace
            subprocess.run(["ip", "-n", end["ns"], "link", "show", end["dev"]], check=True,
                           capture_output=True)
    # every ordered pair, one path per spine, and the path add arguments for it
    assert len(d["paths"]) == 4 * 3
    pair = net.pair("h1", "h3")
    assert pair["paths"] == [{"plane": 0, "spine": "s1", "via": "fc00:0:101::,fc00:0:e003::"},
                             {"plane": 0, "spine": "s2", "via": "fc00:0:102::,fc00:0:e003::"}]
    assert pair["path_add"] == ["path", "add", "fd00:0:3::/64", "--via", "fc00:0:101::,fc00:0:e003::",
                                "--via", "fc00:0:102::,fc00:0:e003::"]
    # tbf really on both directions of a leaf-spine link
    for node, dev in (("s1", "l2"), ("l2", "s1")):
        qd = subprocess.run(["tc", "-n", net.ns(node), "qdisc", "show", "dev", dev], capture_output=True,
                            text=True).stdout
        assert "tbf" in qd and "100Mbit" in qd, qd
    # human output says the same
    text = fabric("show", net.name).stdout
    assert "fc00:0:e003::" in text and "s2-l2" in text
    # -n NAME as exec, fail and heal take it
    assert json.loads(fabric("show", "-n", net.name, "-j").stdout)["namespaces"] == d["namespaces"]

    out = json.loads(fabric("down", net.name, "-j").stdout)
    assert out["removed"] == 8
    assert not {n for n in namespaces() if n.startswith(net.name + "-")}
    assert not fab_mod.state_path(net.name).exists()
    assert not any(p.exists() for p in pins)
    one_line_error(fabric("show", net.name, check=False))
    one_line_error(fabric("down", net.name, check=False))


def test_duplicate_up_fails_and_changes_nothing(make_fabric):
    net = make_fabric("--spines", "2", "--leaves", "1")
    before_ns, before_state = namespaces(net.name + "-"), fab_mod.state_path(net.name).read_text()
    err = one_line_error(fabric("up", net.name, "--spines", "3", check=False))
    assert "already exists" in err
    assert namespaces(net.name + "-") == before_ns
    assert fab_mod.state_path(net.name).read_text() == before_state
    assert net.ping("h1", "fd00:0:1::1", count=1).returncode == 0


def test_bad_arguments_fail_cleanly(make_fabric):
    name = f"fb{os.getpid() % 1000}x"
    for args in (["--spines", "0"], ["--leaves", "0"], ["--hosts-per-leaf", "-1"], ["--planes", "9"],
                 ["--rate", "fast"], ["--mtu", "1000"], ["--mtu", "9001"], ["--host-sysctl", "tcp=1"],
                 ["--host-sysctl", "net.ipv4.no_such_key=1"], ["--ecn-threshold", "fast"],
                 ["--ecn-threshold", "0ms"], ["--rate", "none", "--ecn-threshold", "1ms"]):
        one_line_error(fabric("up", name, *args, check=False))
        assert not fab_mod.state_path(name).exists()
        assert namespaces(name + "-") == set()
    one_line_error(fabric("up", "Bad-Name", check=False))

    net = make_fabric("--spines", "2", "--leaves", "2")
    assert "no host or switch" in one_line_error(fabric("exec", "-n", net.name, "h9", "--", "true",
                                                        check=False))
    for target in ("s1-s2", "s3-l1", "s1>h1", "x7"):
        assert "no link" in one_line_error(fabric("fail", "-n", net.name, target, check=False))
    one_line_error(fabric("fail", "-n", net.name, "s1>l1", "--mode", "down", check=False))
    one_line_error(fabric("fail", "-n", net.name, "s1-l1", "--mode", "loss=2", check=False))
    one_line_error(fabric("heal", "-n", net.name, "q1", check=False))
    one_line_error(fabric("show", "nosuchfabric", check=False))
    assert "two fabric names" in one_line_error(fabric("show", net.name, "-n", "other", check=False))
    state = json.loads(fab_mod.state_path(net.name).read_text())
    assert state["faults"] == []


def test_exec_passes_exit_code(make_fabric):
    net = make_fabric("--spines", "1", "--leaves", "1")
    r = subprocess.run([*[sys.executable, "-m", "mrc_ebpf.cli.mrcctl"], "fabric", "exec", "-n", net.name, "h1", "--",
                        "sh", "-c", "ip -6 addr show dev lo | grep -q fd00:0:1::1 && exit 7"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 7, r.stderr
    r = mrcctl("fabric", "exec", "-n", net.name, "s1", "--", "sysctl", "-n", "net.ipv6.conf.all.forwarding")
    assert r.stdout.strip() == "1"


# --------------------------------------------------------------------------- kernel routing

def test_plain_ping_over_ecmp(make_fabric):
    net = make_fabric("--spines", "4", "--leaves", "2")
    assert net.ping("h1", "fd00:0:2::1").returncode == 0
    assert net.ping("h1", "198.18.0.2").returncode == 0
    assert net.ping("h2", "fd00:0:1::1").returncode == 0
    # the leaf's baseline is one multipath route over all four spines
    route = json.loads(subprocess.run(["ip", "-n", net.ns("l1"), "-6", "-j", "route", "show", "fd00::/16"],
                                      capture_output=True, text=True, check=True).stdout)
    assert sorted(nh["dev"] for nh in route[0]["nexthops"]) == ["s1", "s2", "s3", "s4"]


@pytest.mark.parametrize("encoding", ["srh", "usid"])
def test_kernel_srv6_takes_the_chosen_spine(make_fabric, encoding):
    """Kernel encap on h1 into the kernel's End.DT6 on h2, through each
    spine in turn: only that spine's downlink to l2 carries the pings."""
    net = make_fabric("--spines", "4", "--leaves", "2", "--encoding", encoding)
    sid = net.host("h2")["sid"]
    net.exec("h2", ["ip", "-6", "route", "add", f"{sid}/128", "encap", "seg6local", "action", "End.DT6",
                    "table", "local", "dev", "eth0"])
    spines = ["s1", "s2", "s3", "s4"]
    count = 20
    for path in net.pair("h1", "h2")["paths"]:
        segs = path["usid"] if encoding == "usid" else path["via"]
        if encoding == "usid":
            assert segs == f"fc00:0:{0x100 + int(path['spine'][1:]):x}:e002::"
        net.exec("h1", ["ip", "-6", "route", "replace", "fd00:0:2::/64", "encap", "seg6", "mode", "encap",
                        "segs", segs, "via", "fe80::1", "dev", "eth0"])
        before = net.spine_tx(spines, "l2")
        r = net.ping("h1", "fd00:0:2::1", count=count, interval="0.01")
        after = net.spine_tx(spines, "l2")
        assert r.returncode == 0, r.stdout
        delta = {s: after[s] - before[s] for s in spines}
        assert delta[path["spine"]] >= count, (path, delta)
        assert all(v <= 4 for s, v in delta.items() if s != path["spine"]), (path, delta)


def test_two_planes_route_per_plane(make_fabric):
    net = make_fabric("--spines", "2", "--leaves", "2", "--planes", "2", "--encoding", "usid",
                      "--host-rate", "1gbit")
    d = net.show
    for node, dev in (("h1", "eth1"), ("p1l1", "h1")):
        qd = subprocess.run(["tc", "-n", net.ns(node), "qdisc", "show", "dev", dev], capture_output=True,
                            text=True).stdout
        assert "tbf" in qd and "1Gbit" in qd, qd
    route = json.loads(subprocess.run(["ip", "-n", net.ns("p1s2"), "-6", "-j", "route", "show",
                                       "fc00:0:202::/48"], capture_output=True, text=True).stdout)
    assert route[0]["encap"] == "seg6local" and "next-csid" in json.dumps(route[0]), route
    assert [n["dev"] for n in net.host("h1")["nics"]] == ["eth0", "eth1"]
    assert [n["leaf"] for n in net.host("h2")["nics"]] == ["l2", "p1l2"]
    assert {s["name"]: s["sid"] for s in d["switches"] if s["kind"] == "spine"} == {
        "s1": "fc00:0:101::", "s2": "fc00:0:102::", "p1s1": "fc00:0:201::", "p1s2": "fc00:0:202::"}
    paths = net.pair("h1", "h2")["paths"]
    assert [(p["plane"], p["spine"], p["usid"]) for p in paths] == [
        (0, "s1", "fc00:0:101:e002::"), (0, "s2", "fc00:0:102:e002::"),
        (1, "p1s1", "fc00:0:201:e002::"), (1, "p1s2", "fc00:0:202:e002::")]
    assert "p1s2-p1l1" in {lk["name"] for lk in d["links"]}
    assert net.ping("h1", "fd00:0:2::1").returncode == 0        # plain: plane 0
    # a plane-1 spine's SID leaves h1 by its plane-1 NIC
    got = json.loads(net.exec("h1", ["ip", "-6", "-j", "route", "get", "fc00:0:202::"]).stdout)
    assert got[0]["dev"] == "eth1"
    sid = net.host("h2")["sid"]
    net.exec("h2", ["ip", "-6", "route", "add", f"{sid}/128", "encap", "seg6local", "action", "End.DT6",
                    "table", "local", "dev", "eth1"])
    spines = ["s1", "s2", "p1s1", "p1s2"]
    for path in paths:
        dev = f"eth{path['plane']}"
        net.exec("h1", ["ip", "-6", "route", "replace", "fd00:0:2::/64", "encap", "seg6", "mode", "encap",
                        "segs", path["usid"], "via", "fe80::1", "dev", dev])
        before = net.spine_tx(spines, "l2")
        assert net.ping("h1", "fd00:0:2::1", count=20, interval="0.01").returncode == 0
        after = net.spine_tx(spines, "l2")
        delta = {s: after[s] - before[s] for s in spines}
        assert delta[path["spine"]] >= 20, (path, delta)
        assert all(v <= 4 for s, v in delta.items() if s != path["spine"]), (path, delta)


# --------------------------------------------------------------------------- faults

def test_fail_down_and_heal_restore_routes(make_fabric):
    net = make_fabric("--spines", "2", "--leaves", "2")

    def routes(node):
        return subprocess.run(["ip", "-n", net.ns(node), "-6", "route", "show"], capture_output=True,
                              text=True, check=True).stdout

    before = {n: routes(n) for n in ("s1", "l2")}
    out = json.loads(fabric("fail", "-n", net.name, "s1-l2", "--mode", "down", "-j").stdout)
    assert [(f["ns"], f["dev"]) for f in out["installed"]] == [(net.ns("s1"), "l2")]
    link = json.loads(subprocess.run(["ip", "-n", net.ns("l2"), "-j", "link", "show", "s1"],
                                     capture_output=True, text=True).stdout)[0]
    assert "NO-CARRIER" in link["flags"]
    assert "fd00:0:2::/64" not in routes("s1")      # the kernel dropped them with the device
    faults = next(lk for lk in json.loads(fabric("show", net.name, "-j").stdout)["links"]
                  if lk["name"] == "s1-l2")["faults"]
    assert faults == [{"mode": "down", "target": "s1-l2", "down_end": "s1"}]
    fabric("heal", "-n", net.name, "s1-l2")
    assert {n: routes(n) for n in ("s1", "l2")} == before
    assert json.loads(fabric("show", net.name, "-j").stdout)["links"][1]["faults"] == []
    # a node: every link of s2 down, then all healed
    fabric("fail", "-n", net.name, "s2", "--mode", "down")
    assert len(json.loads(fab_mod.state_path(net.name).read_text())["faults"]) == 2
    fabric("heal", "-n", net.name, "--all")
    assert {n: routes(n) for n in ("s1", "l2")} == before
    assert net.ping("h1", "fd00:0:2::1").returncode == 0


SERVER = r"""
import socket, sys, threading
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
print("ready", flush=True)
def serve(c):
    with c:
        while c.recv(1 << 16):
            pass
        c.sendall(b"ok")
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

CLIENT = r"""
import json, socket, sys, threading, time
src, dst, dport, nbytes, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
ports = [int(p) for p in sys.argv[6].split(",")]
done = {}
end = time.monotonic() + deadline
def flow(sp):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((src, sp))
    s.settimeout(deadline)
    try:
        s.connect((dst, dport))
        s.sendall(bytes(nbytes))
        s.shutdown(socket.SHUT_WR)
        got = b""
        while time.monotonic() < end:
            chunk = s.recv(16)
            if not chunk:
                break
            got += chunk
        done[sp] = got == b"ok"
    except OSError:
        done[sp] = False
    finally:
        s.close()
threads = [threading.Thread(target=flow, args=(p,)) for p in ports]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({str(k): v for k, v in done.items()}))
"""

PROBE = r"""
import socket, sys
for _ in range(int(sys.argv[4])):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[3])))
    s.settimeout(2)
    try:
        s.connect((sys.argv[2], 5201))
    except OSError:
        pass
    s.close()
"""


def test_ecmp_flows_stall_on_a_blackholed_spine(make_fabric):
    """Kernel ECMP (the baseline without MRC) hashes each flow onto one
    spine and keeps it there: with s1's downlink to l2 black-holed (a gray
    failure the leaves do not see), exactly the flows hashed onto s1 stall."""
    net = make_fabric("--spines", "4", "--leaves", "2")
    spines = ["s1", "s2", "s3", "s4"]
    src, dst = "fd00:0:1::1", "fd00:0:2::1"
    # which spine each source port hashes onto, by the spines' own counters
    # (SYNs to a closed port: each answered by a RST)
    via = {}
    for sport in range(41000, 41064):
        before = net.spine_tx(spines, "l2")
        net.exec("h1", [sys.executable, "-c", PROBE, src, dst, str(sport), "5"])
        after = net.spine_tx(spines, "l2")
        hit = [s for s in spines if after[s] - before[s] >= 5]
        assert len(hit) == 1, (sport, before, after)
        via[sport] = hit[0]
        on_s1 = [p for p, s in via.items() if s == "s1"]
        others = [p for p, s in via.items() if s != "s1"]
        if len(on_s1) >= 2 and len(others) >= 6:
            break
    ports = on_s1[:2] + others[:6]
    server = net.popen("h2", [sys.executable, "-c", SERVER, dst, "5201"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
        link = next(lk for lk in json.loads(fabric("show", net.name, "-j").stdout)["links"]
                    if lk["name"] == "s1-l2")
        assert [(f["direction"], f["mode"]) for f in link["faults"]] == [("s1>l2", "blackhole")]
        r = net.exec("h1", [sys.executable, "-c", CLIENT, src, dst, "5201", str(256 << 10), "6",
                            ",".join(map(str, ports))], timeout=60)
        done = {int(k): v for k, v in json.loads(r.stdout).items()}
        assert {p for p, ok in done.items() if not ok} == set(on_s1[:2]), (done, via)
        fabric("heal", "-n", net.name, "s1>l2")
        r = net.exec("h1", [sys.executable, "-c", CLIENT, src, dst, "5201", str(256 << 10), "10",
                            ",".join(map(str, ports))], timeout=60)
        assert all(json.loads(r.stdout).values()), r.stdout
    finally:
        server.kill()
        server.wait()


# --------------------------------------------------------------------------- with mrc-ebpf

def _sent(net, host, prefix):
    rows = json.loads(mrcctl("path", "list", "-j", netns=net.ns(host)).stdout)
    return {r["path_id"]: r["tx_packets"] for r in rows if r["prefix"] == prefix}


def _xfer(net, src, dst, dst_addr, nbytes=4 << 20, port=5202):
    server = net.popen(dst, [*XFER, "serve", dst_addr, str(port)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        sent = net.exec(src, [*XFER, "send", dst_addr, str(port), str(nbytes)], timeout=120)
        received, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return sent.stdout.strip(), received.strip()


def test_attach_sprays_over_every_spine(make_fabric):
    net = make_fabric("--spines", "4", "--leaves", "2")
    pins = pin_dirs(net)
    out = json.loads(fabric("attach", net.name, "--policy", "rr", "-j").stdout)
    assert out["hosts"] == ["h1", "h2"] and out["paths_per_peer"] == 4
    assert net.ping("h1", "fd00:0:2::1", count=8, interval="0.05").returncode == 0
    assert net.ping("h1", "198.18.0.2", count=4, interval="0.05").returncode == 0
    sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1")
    assert sent == received and sent.startswith(str(4 << 20))
    tx = _sent(net, "h1", "fd00:0:2::/64")
    assert len(tx) == 4 and all(v > 0 for v in tx.values()), tx
    shown = json.loads(fabric("show", net.name, "-j").stdout)
    assert shown["hosts"][0]["attached"]["sid"] == "fc00:0:e001::"
    one_line_error(fabric("attach", net.name, check=False))          # already attached
    fabric("detach", net.name)
    assert "nothing attached" in mrcctl("status", netns=net.ns("h1")).stdout
    assert not any(p.exists() and any(p.iterdir()) for p in pins)
    fabric("attach", net.name, "--hosts", "h1,h2")                   # again, then down detaches
    assert all(p.is_dir() and any(p.iterdir()) for p in pins)
    fabric("down", net.name)
    assert not any(p.exists() and any(p.iterdir()) for p in pins)


def test_jumbo_fabric_with_host_sysctls(make_fabric):
    """--mtu on every link (tbf bursts hold two frames), --host-sysctl on
    the hosts only; the datapath sprays `bytes` over it with jumbo frames."""
    net = make_fabric("--spines", "2", "--leaves", "2", "--mtu", "9000",
                      "--host-sysctl", "net.ipv4.tcp_min_rtt_wlen=0")
    assert net.show["mtu"] == 9000 and net.show["host_sysctls"] == ["net.ipv4.tcp_min_rtt_wlen=0"]
    for node, dev in (("h1", "eth0"), ("l1", "h1"), ("l1", "s1"), ("s2", "l2")):
        link = json.loads(net.exec(node, ["ip", "-j", "link", "show", dev]).stdout)[0]
        assert link["mtu"] == 9000, (node, dev)
    tbf = json.loads(net.exec("l1", ["tc", "-j", "qdisc", "show", "dev", "s1"]).stdout)[0]
    assert tbf["kind"] == "tbf" and tbf["options"]["burst"] > 1.99 * 9014    # tc rounds it down a little
    wlen = lambda node: net.exec(node, ["sysctl", "-n", "net.ipv4.tcp_min_rtt_wlen"]).stdout.strip()  # noqa: E731
    assert (wlen("h1"), wlen("h2"), wlen("s1"), wlen("l1")) == ("0", "0", "300", "300")
    fabric("attach", net.name, "--policy", "bytes")
    status = json.loads(mrcctl("status", "-j", netns=net.ns("h1")).stdout)[0]
    assert status["mtu"] == 9000
    # the route leaves room for two segments: 9000 - encap_len(2) fits, one byte more does not
    from mrc_ebpf.datapath.layout import encap_len
    big = 9000 - encap_len(2) - 48
    assert net.exec("h1", ["ping", "-c", "2", "-i", "0.2", "-M", "do", "-s", str(big),
                           "fd00:0:2::1"], check=False).returncode == 0
    assert net.exec("h1", ["ping", "-c", "1", "-M", "do", "-s", str(big + 1), "fd00:0:2::1"],
                    check=False).returncode != 0
    sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1")
    assert sent == received and sent.startswith(str(4 << 20))
    tx = _sent(net, "h1", "fd00:0:2::/64")
    assert len(tx) == 2 and all(v > 0 for v in tx.values()), tx


def _ecn_marks(net) -> dict[str, dict]:
    """direction (l1>s1 ...) -> the marker's counters, from `fabric show -j`."""
    shown = json.loads(fabric("show", net.name, "-j").stdout)
    return {e["ecn"]["direction"]: e["ecn"] for lk in shown["links"] for e in lk["ends"] if e.get("ecn")}


def _nstat(net, node, key) -> int:
    out = json.loads(net.exec(node, ["nstat", "-asz", "--json"]).stdout)
    return int(out.get("kernel", out).get(key, 0))


def test_ecn_marking_switches_and_tcp_hears_the_marks(make_fabric):
    """--ecn-threshold: the switches' queues mark CE (bpf/ecn_mark.c), on
    plain ECMP and through mrc-ebpf's tunnel, whose RX carries the outer
    mark to the inner packet.  The witness is the sending kernel's TCP:
    TCPDeliveredCE counts the marks the receiver's TCP echoed back."""
    net = make_fabric("--spines", "2", "--leaves", "2", "--rate", "50mbit", "--ecn-threshold", "1ms",
                      "--host-sysctl", "net.ipv4.tcp_ecn=1")
    assert net.show["ecn_threshold"] == "1ms"
    from mrc_ebpf.lab import ecn_marks
    assert ecn_marks.pin_path(net.name).exists()
    filters = net.exec("l1", ["tc", "filter", "show", "dev", "s1", "egress"]).stdout
    assert "mrc_ecn_mark" in filters
    marks = _ecn_marks(net)
    assert set(marks) == {"s1>l1", "s1>l2", "s2>l1", "s2>l2", "l1>s1", "l1>s2", "l2>s1", "l2>s2"}

    for mode in ("ecmp", "mrc"):
        if mode == "mrc":
            fabric("attach", net.name, "--policy", "rr")
        before = _ecn_marks(net)
        ce_before = _nstat(net, "h1", "TcpExtTCPDeliveredCE")
        sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1", nbytes=8 << 20)
        assert sent == received and sent.startswith(str(8 << 20))
        after = _ecn_marks(net)
        up = {d: after[d]["marked"] - before[d]["marked"] for d in after}
        # the bottleneck is where h1's leaf sends into the spines
        assert up["l1>s1"] + up["l1>s2"] > 0, (mode, up)
        for d, q in after.items():
            assert q["marked"] <= q["ect"] <= q["packets"], (d, q)
        assert _nstat(net, "h1", "TcpExtTCPDeliveredCE") > ce_before, mode
    c = json.loads(mrcctl("stats", "-j", netns=net.ns("h2")).stdout)["counters"]
    assert c["rx_ce"] > 0 and c["rx_drop_ecn"] == 0
    fabric("down", net.name)
    assert not ecn_marks.pin_path(net.name).exists()


def test_attach_usid_over_two_planes(make_fabric):
    """One datapath over both plane NICs: uSID containers through all four
    spines of two planes; the spines' own counters agree."""
    net = make_fabric("--spines", "2", "--leaves", "2", "--planes", "2", "--encoding", "usid")
    fabric("attach", net.name, "--policy", "rr", "--ipv4")
    spines = ["s1", "s2", "p1s1", "p1s2"]
    before = net.spine_tx(spines, "l2")
    assert net.ping("h1", "fd00:0:2::1", count=40, interval="0.02").returncode == 0
    after = net.spine_tx(spines, "l2")
    tx = _sent(net, "h1", "fd00:0:2::/64")
    assert len(tx) == 4 and all(v >= 10 for v in tx.values()), tx
    assert all(after[s] - before[s] >= 10 for s in spines), (before, after)
    rows = json.loads(mrcctl("path", "list", "-j", netns=net.ns("h1")).stdout)
    assert {r["prefix"] for r in rows} == {"fd00:0:2::/64", "198.18.0.2/32"}
    assert net.ping("h1", "198.18.0.2", count=8, interval="0.02").returncode == 0
    assert sum(_sent(net, "h1", "198.18.0.2/32").values()) >= 8
    sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1", nbytes=2 << 20)
    assert sent == received and sent.startswith(str(2 << 20))


def test_failed_up_removes_what_it_made(monkeypatch):
    """A failure half-way (here: a route the kernel refuses) leaves nothing."""
    name = f"fz{os.getpid() % 1000}{int(time.time() * 1000) % 100}"
    real = fab_mod.Fabric.route_cmds

    def broken(self, node):
        return real(self, node) + (["route add fd00:dead::/64 via fe80::99 dev nosuchdev"]
                                   if node == "l2" else [])
    monkeypatch.setattr(fab_mod.Fabric, "route_cmds", broken)
    try:
        with pytest.raises(MrcError, match="removed what it made"):
            fab_mod.up(name, 2, 2, 1)
        assert namespaces(name + "-") == set()
        assert not fab_mod.state_path(name).exists()
    finally:
        if fab_mod.state_path(name).exists():
            fab_mod.down(name)


def test_up_refuses_a_namespace_it_did_not_make():
    name = f"fy{os.getpid() % 1000}{int(time.time() * 1000) % 100}"
    subprocess.run(["ip", "netns", "add", f"{name}-s2"], check=True)
    try:
        err = one_line_error(fabric("up", name, "--spines", "2", check=False))
        assert f"{name}-s2 already exists" in err
        assert namespaces(name + "-") == {f"{name}-s2"}      # kept, and nothing else made
        assert not fab_mod.state_path(name).exists()
    finally:
        subprocess.run(["ip", "netns", "del", f"{name}-s2"], check=False)


def test_down_after_namespaces_vanished(make_fabric):
    net = make_fabric("--spines", "2", "--leaves", "2")
    for node in ("s1", "h2"):
        subprocess.run(["ip", "netns", "del", net.ns(node)], check=True)
    fabric("down", net.name)
    assert namespaces(net.name + "-") == set()
    assert not fab_mod.state_path(net.name).exists()


def test_down_all_in_its_own_state_dir(tmp_path, monkeypatch):
    """--all removes every fabric of the state directory (a private one
    here: other engineers' fabrics live in the shared one)."""
    monkeypatch.setenv("MRC_FABRIC_STATE", str(tmp_path))
    names = [f"fa{os.getpid() % 1000}{i}{int(time.time() * 1000) % 100}" for i in range(2)]
    try:
        for name in names:
            fabric("up", name, "--spines", "1", "--leaves", "1")
        assert sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(names)
        out = json.loads(fabric("down", "--all", "-j").stdout)
        assert sorted(r["name"] for r in out) == sorted(names)
        assert not any(namespaces(n + "-") for n in names)
        assert list(tmp_path.glob("*.json")) == []
        assert list(tmp_path.glob("*.key")) == []          # each fabric's key went with it
    finally:
        for name in names:
            fabric("down", name, check=False)


def test_gray_loss_on_a_node_is_shown_counted_and_removed_by_down(make_fabric):
    from mrc_ebpf.lab import faults
    net = make_fabric("--spines", "2", "--leaves", "2")
    out = json.loads(fabric("fail", "-n", net.name, "s1", "--mode", "loss=0.5", "-j").stdout)
    # both directions of both of s1's links: the receiving end of each
    assert sorted((f["ns"], f["dev"]) for f in out["installed"]) == sorted(
        [(net.ns("s1"), "l1"), (net.ns("l1"), "s1"), (net.ns("s1"), "l2"), (net.ns("l2"), "s1")])
    sid = net.host("h2")["sid"]
    net.exec("h2", ["ip", "-6", "route", "add", f"{sid}/128", "encap", "seg6local", "action", "End.DT6",
                    "table", "local", "dev", "eth0"])
    net.exec("h1", ["ip", "-6", "route", "replace", "fd00:0:2::/64", "encap", "seg6", "mode", "encap",
                    "segs", "fc00:0:101::,fc00:0:e002::", "via", "fe80::1", "dev", "eth0"])
    net.ping("h1", "fd00:0:2::1", count=100, interval="0.005")
    link = next(lk for lk in json.loads(fabric("show", net.name, "-j").stdout)["links"]
                if lk["name"] == "s1-l1")
    assert sorted(f["direction"] for f in link["faults"]) == ["l1>s1", "s1>l1"]
    into_s1 = next(f for f in link["faults"] if f["direction"] == "l1>s1")
    assert into_s1["mode"] == "loss" and into_s1["loss"] == 0.5
    assert 20 <= into_s1["dropped"] <= 80 and into_s1["passed"] >= 20, into_s1
    # heal one direction only
    fabric("heal", "-n", net.name, "l1>s1")
    assert faults.status(net.ns("s1"), "l1") is None
    assert faults.status(net.ns("l1"), "s1") is not None
    fabric("down", net.name)
    for node in ("s1", "l1", "l2"):
        assert faults.list_faults(net.ns(node)) == []
        assert not (Path("/run/mrc-ebpf/faults") / net.ns(node)).exists()


def test_mrc_carries_tcp_through_a_blackholed_spine(make_fabric):
    """The contrast with kernel ECMP: sprayed over all four spines, one of
    them black-holed towards the receiver, a TCP transfer still completes;
    the datapath takes the path through s1 down."""
    net = make_fabric("--spines", "4", "--leaves", "2")
    fabric("attach", net.name, "--policy", "rr")
    fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
    sent, received = _xfer(net, "h1", "h2", "fd00:0:2::1")
    assert sent == received and sent.startswith(str(4 << 20))
    events = json.loads(mrcctl("stats", "--events", "-j", netns=net.ns("h1")).stdout)["events"]
    assert any(e["type"] == "down" and e["path_id"] == 0 for e in events), events
    tx = _sent(net, "h1", "fd00:0:2::/64")
    assert tx[0] < min(tx[1], tx[2], tx[3]) / 4, tx
    shown = next(lk for lk in json.loads(fabric("show", net.name, "-j").stdout)["links"]
                 if lk["name"] == "s1-l2")["faults"][0]
    assert shown["dropped"] >= 1 and shown["direction"] == "s1>l2"


# --------------------------------------------------------------------------- failover on the fabric

SINK = [sys.executable, "-c", "import socket\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        "s.bind(('::', 9))\n"
        "while True: s.recv(65536)"]


def _events(net, host="h1"):
    return json.loads(mrcctl("stats", "--events", "-j", netns=net.ns(host)).stdout)["events"]


def _arm(net, target="s1>l2"):
    """Load the fault now, dropping (almost) nothing: switching it to a
    black hole later is one map write, at a known instant."""
    fabric("fail", "-n", net.name, target, "--mode", "loss=1e-9")


def _first_drop_ns(net):
    from mrc_ebpf.lab import faults
    return faults.status(net.ns("l2"), "s1")["first_drop_ns"]


def _exclusion_us(net, first_ns, path_id=0):
    """From the first packet the hole ate to the path leaving the spray: 0
    if it was already down then (taken down by an earlier hiccup and, being
    black-holed, never acknowledged back)."""
    assert first_ns, "the fault dropped nothing"
    evs = [e for e in _events(net) if e["path_id"] == path_id and e["type"] in ("down", "up")]
    before = [e for e in evs if e["ns"] < first_ns]
    if before and before[-1]["type"] == "down":
        return 0.0
    downs = [e for e in evs if e["type"] == "down" and e["ns"] >= first_ns]
    assert downs, evs
    return (downs[0]["ns"] - first_ns) / 1000


def test_one_way_udp_leaves_a_blackholed_spine_within_1ms(make_fabric):
    """No reverse traffic: the receiver's own feedback packets tell h1 that
    the path through s1 went silent; the datapath drops it from the spray
    within a millisecond of the first packet lost (kernel timestamps of
    the drop and of the event), and takes it back after the heal."""
    net = make_fabric("--spines", "4", "--leaves", "2")
    # the configured window: late packets could widen it (--reorder-max-us)
    fabric("attach", net.name, "--policy", "rr", "--", "--ack-timeout-us", "300",
           "--reorder-max-us", "0")
    sink = net.popen("h2", SINK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _arm(net)
        sender = net.popen("h1", [*UDP_SEND, "fd00:0:2::1", "9", "40000", "--pps=20000"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
        _, err = sender.communicate(timeout=120)
        assert sender.returncode == 0, err
        first = _first_drop_ns(net)
        took_us = _exclusion_us(net, first)
        print(f"fabric one-way UDP: path via s1 excluded {took_us:.0f} us after the first loss")
        assert took_us < 1000
        fabric("heal", "-n", net.name, "s1>l2")
        before = _sent(net, "h1", "fd00:0:2::/64")[0]
        net.exec("h1", [*UDP_SEND, "fd00:0:2::1", "9", "2000", "--pps=20000"], timeout=120)
        assert _sent(net, "h1", "fd00:0:2::/64")[0] - before > 200      # back in the spray
        assert any(e["type"] == "up" and e["path_id"] == 0 and e["ns"] > first for e in _events(net))
    finally:
        sink.kill()
        sink.wait()


def test_tcp_keeps_going_through_a_spine_blackholed_mid_transfer(make_fabric):
    """A paced TCP transfer sprayed over 4 spines; s1's downlink black-holed
    for a second in the middle: the transfer completes with its data
    intact, the path carries almost nothing while the hole lasts (probes),
    and its share again after the heal."""
    net = make_fabric("--spines", "4", "--leaves", "2")
    fabric("attach", net.name, "--policy", "rr", "--", "--ack-timeout-us", "500")
    _arm(net)
    server = net.popen("h2", [*XFER, "serve", "fd00:0:2::1", "5203"], stdout=subprocess.PIPE,
                       text=True)
    client = None
    try:
        assert server.stdout.readline().strip() == "ready"
        client = net.popen("h1", [*XFER, "send", "fd00:0:2::1", "5203", str(64 << 20), "100"],
                           stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        fabric("fail", "-n", net.name, "s1>l2", "--mode", "blackhole")
        during_start = _sent(net, "h1", "fd00:0:2::/64")
        time.sleep(1.0)
        during_end = _sent(net, "h1", "fd00:0:2::/64")
        assert client.poll() is None, "the transfer ended before the failure: make it longer"
        first = _first_drop_ns(net)
        fabric("heal", "-n", net.name, "s1>l2")
        sent, _ = client.communicate(timeout=120)
        received, _ = server.communicate(timeout=60)
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert client.returncode == 0 and sent.strip() == received.strip()
    assert sent.startswith(str(64 << 20))
    during = {k: during_end[k] - during_start[k] for k in during_end}
    assert during[0] < min(during[1], during[2], during[3]) / 4, during
    # the exclusion time is printed, not asserted: see test_failover.py
    print(f"fabric TCP: path via s1 excluded {_exclusion_us(net, first):.0f} us after the first "
          f"loss; packets sent per path during the hole {during}")
    # healed: the path carries traffic again
    before = _sent(net, "h1", "fd00:0:2::/64")[0]
    net.exec("h1", [*UDP_SEND, "fd00:0:2::1", "9", "2000", "--pps=20000"], timeout=120)
    assert _sent(net, "h1", "fd00:0:2::/64")[0] - before > 200
