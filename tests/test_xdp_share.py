"""XDP shared with xdp-loader (libxdp) in the order an operator runs it
(issue 31 item 2): `mrcctl attach` first, then xdp-loader.

On this host's kernel libxdp never builds a dispatcher (loading its
freplace component is refused, EPERM: `xdp-loader load -vv` says
"Compatibility check for dispatcher program failed"), so xdp-loader
loads one program alone and refuses a device that has any other
("Existing program is not using a dispatcher").  What works in this
order: `xdp-loader unload --all` (which takes mrc_rx off), `xdp-loader
load`, then `mrcctl attach --repair` chains mrc_rx in front of it.  And
whatever another tool did, `status` says it and exits 1, `apply` and
`attach --repair` put the hook back, `detach` never re-installs a
program the operator removed.

Witnesses: `xdp-loader status` and `bpftool net` (their own views of
the device's XDP hook), ping's count through MRC, mrcctl's JSON."""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from conftest import mrcctl

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not (shutil.which("xdp-loader") and shutil.which("bpftool")),
                                 reason="needs xdp-tools and bpftool (apt-get install xdp-tools bpftool)")]

XDP_FILTER_OBJ = "/usr/lib/x86_64-linux-gnu/bpf/xdpfilt_alw_all.o"
BPFFS = "mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf; "


def xdp_loader(t, ns: str, *args: str, check: bool = True):
    # ip netns exec gives a fresh /sys: libxdp wants a bpffs there
    return t.exec(ns, ["sh", "-c", BPFFS + "exec xdp-loader " + " ".join(args)], check=check)


def loader_status(t, ns: str, dev: str) -> str:
    """xdp-loader's own line for DEV: program name, mode, id ('' if none)."""
    out = xdp_loader(t, ns, "status", dev).stdout
    line = next((l for l in out.splitlines() if l.startswith(dev + " ")), "")
    return " ".join(line.split()[1:])


def bpftool_xdp(t, ns: str, dev: str) -> dict | None:
    """bpftool net's XDP entry for DEV: {"devname", "ifindex", "mode", "id"} or None."""
    out = json.loads(t.exec(ns, ["bpftool", "-j", "net"]).stdout)[0]
    return next((x for x in out.get("xdp", []) if x["devname"] == dev), None)


def prog_name(t, prog_id: int) -> str:
    return json.loads(t.exec(None, ["bpftool", "-j", "prog", "show", "id", str(prog_id)]).stdout)["name"]


def ping_ok(interop, count=3) -> int:
    out = interop.ping(interop.A, interop.B6, count=count).stdout
    return int(re.search(r"(\d+) received", out).group(1))


def status(A, check=False):
    r = mrcctl("status", "-j", netns=A, check=check)
    return r.returncode, json.loads(r.stdout)


@pytest.mark.skipif(not os.path.exists(XDP_FILTER_OBJ), reason="needs xdp-tools' xdpfilt objects")
def test_attach_first_then_xdp_loader_and_repair(interop):
    t, A = interop.t, interop.A
    interop.attach()
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    ours = bpftool_xdp(t, A, "a0")
    assert ours["mode"] == "generic" and prog_name(t, ours["id"]) == "mrc_rx"
    assert ping_ok(interop) == 3
    code, rows = status(A)
    assert code == 0 and rows[0]["healthy"], rows[0]["problems"]

    # xdp-loader on a device mrc_rx holds: refused by libxdp here (no
    # dispatcher), mrc_rx untouched.  Where libxdp makes a dispatcher it
    # would be refused the same way (mrc_rx is not one): xdp-loader asks
    # to unload first.
    r = xdp_loader(t, A, "load", "-m", "skb", "a0", XDP_FILTER_OBJ, check=False)
    assert r.returncode != 0 and "not using a dispatcher" in r.stderr, r.stderr
    assert bpftool_xdp(t, A, "a0")["id"] == ours["id"]

    # the operator unloads everything XDP: mrc_rx goes, TC keeps running;
    # status says so, exits 1, and names the repair
    xdp_loader(t, A, "unload", "a0", "--all")
    assert bpftool_xdp(t, A, "a0") is None and loader_status(t, A, "a0").startswith("<No XDP program")
    code, rows = status(A)
    assert code == 1 and isinstance(rows, list), rows
    assert not rows[0]["healthy"]
    (gone,) = rows[0]["hook_changes"]
    assert gone["hook"] == "xdp" and gone["found"] == 0 and gone["expected"] == ours["id"]
    assert "taken off a0's xdp hook by another tool" in gone["why"] and "--repair" in gone["why"]
    human = mrcctl("status", netns=A, check=False)
    assert human.returncode == 1 and "DEGRADED" in human.stdout and "another tool" in human.stdout
    # --replace will not swap programs that are not on the hooks; it says what to run
    r = mrcctl("attach", "a0", "--replace", netns=A, check=False)
    assert r.returncode == 1 and "--repair" in r.stderr

    # xdp-loader loads its program on the now free hook, then --repair
    # puts mrc_rx in front of it: both run
    xdp_loader(t, A, "load", "-m", "skb", "a0", XDP_FILTER_OBJ)
    theirs = bpftool_xdp(t, A, "a0")
    assert prog_name(t, theirs["id"]) == "xdpfilt_alw_all"
    repaired = json.loads(mrcctl("attach", "a0", "--repair", "-j", netns=A).stdout)
    assert [c["hook"] for c in repaired["repaired"]] == ["xdp"]
    assert f"chained to prog {theirs['id']} xdpfilt_alw_all" in repaired["repaired"][0]["done"]
    # libbpf loads with attach type BPF_XDP, bcc with none: a tail call
    # needs them alike, so mrc_rx was loaded again (on the same maps)
    now = bpftool_xdp(t, A, "a0")
    assert prog_name(t, now["id"]) == "mrc_rx" and now["mode"] == "generic"
    assert f"mrc_rx  skb  {now['id']}" in "  ".join(loader_status(t, A, "a0").split())
    code, rows = status(A)
    assert code == 0 and rows[0]["xdp_chained"] == {"id": theirs["id"], "name": "xdpfilt_alw_all"}
    assert rows[0]["programs"]["rx"]["id"] == now["id"]
    assert ping_ok(interop) == 3
    # a second repair finds nothing to do
    again = mrcctl("attach", "a0", "--repair", netns=A)
    assert "nothing to repair" in again.stdout

    # unload --all again takes mrc_rx (and, as far as its user knows,
    # everything): detach must not put xdpfilt_alw_all back
    xdp_loader(t, A, "unload", "a0", "--all")
    assert bpftool_xdp(t, A, "a0") is None
    detached = json.loads(mrcctl("detach", "a0", "-j", netns=A).stdout)[0]
    assert detached["xdp_restored"] == []
    assert bpftool_xdp(t, A, "a0") is None
    assert loader_status(t, A, "a0").startswith("<No XDP program")
    code, rows = status(A)
    assert code == 0 and rows == []


def test_apply_puts_back_hooks_another_tool_removed(interop, tmp_path):
    t, A = interop.t, interop.A
    interop.attach("--key-file", _key(tmp_path))
    mrcctl("path", "add", "fd00:2::/64", "--via", interop.B_DT6, netns=A)
    conf = tmp_path / "a.yaml"
    conf.write_text(mrcctl("show-config", "--key-file", str(tmp_path / "k"), netns=A).stdout)
    mrcctl("apply", str(conf), netns=A)      # records the key file
    assert "no change" in mrcctl("apply", str(conf), netns=A).stdout
    ours = bpftool_xdp(t, A, "a0")["id"]

    # XDP off by ip(8), the clsact qdisc (both TC filters) deleted by tc(8)
    t.exec(A, ["ip", "link", "set", "dev", "a0", "xdpgeneric", "off"])
    t.exec(A, ["tc", "qdisc", "del", "dev", "a0", "clsact"])
    assert bpftool_xdp(t, A, "a0") is None
    assert ping_ok(interop, 2) == 0           # no encap, no decap: B's replies are lost
    code, rows = status(A)
    gone = ["tc egress", "tc ingress", "xdp"]
    assert code == 1 and sorted(c["hook"] for c in rows[0]["hook_changes"]) == gone

    dry = json.loads(mrcctl("apply", str(conf), "--dry-run", "-j", netns=A).stdout)
    assert dry["changed"] and sorted(c["key"] for c in dry["changes"]) == gone
    assert bpftool_xdp(t, A, "a0") is None
    applied = json.loads(mrcctl("apply", str(conf), "-j", netns=A).stdout)
    assert applied["changed"] and sorted(c["key"] for c in applied["changes"]) == gone
    assert bpftool_xdp(t, A, "a0")["id"] == ours
    tc = json.loads(t.exec(A, ["tc", "-j", "filter", "show", "dev", "a0", "egress"]).stdout)
    assert any(f.get("options", {}).get("prog", {}).get("name") == "mrc_tx" for f in tc)
    code, rows = status(A)
    assert code == 0 and rows[0]["healthy"], rows[0]["problems"]
    assert ping_ok(interop) == 3
    assert "no change" in mrcctl("apply", str(conf), netns=A).stdout
    mrcctl("detach", "a0", netns=A)
    # the clsact apply added goes with detach, as attach's does
    assert "clsact" not in t.exec(A, ["tc", "qdisc", "show", "dev", "a0"]).stdout
    assert bpftool_xdp(t, A, "a0") is None


def _key(tmp_path) -> str:
    path = tmp_path / "k"
    path.write_text(os.urandom(16).hex() + "\n")
    path.chmod(0o600)
    return str(path)
