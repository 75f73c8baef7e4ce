"""Replacing a path of a full template (256 paths) in place, under traffic.

On the KernelPeerLine (A --- R --- B, B the kernel's own SRv6 host): a
template of 256 paths, each through its own SID of R (one End route for
them all), B its peer.  A UDP flow from A to B is sprayed over the 256
(rr) while `mrcctl apply` of a changed file replaces one path (the
template has no free slot: the new path takes the old one's) and `path
template replace` another.  Witnesses: B's own socket counts every
datagram (none lost), and a capture on R's side of the A-R link counts
the packets by the SID they were sent to (the old paths carried packets
before, the new ones after: the replacements happened mid-flow).  Then
each write of a replacement fails in turn and leaves every map as it was.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, mrcctl
from mrc_ebpf.lab import procs

pytestmark = pytest.mark.root

BLOCK = "fc00:1:0:1::"          # R's SIDs of the template's paths: BLOCK + i
PORT = 7400
COUNT, PPS = 40000, 5000      # 8 s: both replacements fall inside it


def sid(i: int) -> str:
    return f"{BLOCK}{i:x}"


def config(net, vias: list[int]) -> str:
    paths = "".join(f'      - via: ["{sid(i)}"]\n' for i in vias)
    return f"""\
version: 1
attach:
  devices: [a0]
  sid: "{net.A_SID}"
templates:
  - name: full
    paths:
{paths}peer_blocks:
  - template: full
    prefix: "fd00:2::/64"
    sid: "{net.B_DT6}"
"""


def setup(net, tmp_path) -> str:
    # R ends every SID of the block (one route: End works on a prefix)
    net.t.exec(net.R, ["ip", "-6", "route", "add", f"{BLOCK}/118", "encap", "seg6local", "action", "End",
                       "dev", "r0"])
    f = tmp_path / "full.yaml"
    f.write_text(config(net, list(range(256))))
    mrcctl("apply", str(f), "--no-key", netns=net.A)
    assert net.ping(net.A, net.B6, count=3).returncode == 0
    return str(f)


def template_vias(net) -> dict[int, str]:
    rows = json.loads(mrcctl("path", "template", "list", "-j", netns=net.A).stdout)
    return {p["path_id"]: p["segments"][0] for p in rows[0]["paths"]}


def test_replace_in_a_full_template_loses_no_packet(interop, tmp_path):
    net = interop
    setup(net, tmp_path)
    assert len(template_vias(net)) == 256
    # the file with path 5 changed: no slot is free, so apply writes it in place
    changed = tmp_path / "changed.yaml"
    vias = list(range(256))
    vias[5] = 0x105
    changed.write_text(config(net, vias))
    dry = json.loads(mrcctl("apply", str(changed), "--no-key", "--dry-run", "-j", netns=net.A).stdout)
    assert [(c["what"], c["action"]) for c in dry["changes"]] == [("template_path", "replace")]

    pcap = tmp_path / "r0.pcap"
    capture = procs.popen(["tcpdump", "-i", "r0", "-n", "-s", "128", "-B", "16384", "-w", str(pcap),
                           "ip6", "and", "dst", "net", f"{BLOCK}/64"], net.R,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # room for seconds of the flow: a receiver slowed by a busy machine
    # must not drop what the datapath delivered
    receiver = procs.popen([sys.executable, str(ROOT / "tests" / "tools" / "udp_sink.py"), str(PORT),
                            "--rcvbuf-mb", "32", "--first", "30"], net.B, stdout=subprocess.PIPE, text=True)
    sender = None
    try:
        assert receiver.stdout.readline().strip() == "ready"
        time.sleep(1)           # tcpdump is listening (its own start-up)
        sender = procs.popen([sys.executable, str(ROOT / "tests" / "tools" / "udp_send.py"), net.B6, str(PORT),
                              str(COUNT), "--pps", str(PPS)], net.A, stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        applied = json.loads(mrcctl("apply", str(changed), "--no-key", "-j", netns=net.A).stdout)
        assert [(c["what"], c["action"]) for c in applied["changes"]] == [("template_path", "replace")]
        r = json.loads(mrcctl("path", "template", "replace", "full", "--id", "9", "--via", sid(0x109), "-j",
                              netns=net.A).stdout)
        assert r == [{"template": "full", "path_id": 9, "replaced": [sid(9)],
                      "segments": [sid(0x109), "<peer SID>"], "overhead": r[0]["overhead"]}]
        out, _ = sender.communicate(timeout=60)
        assert out.strip() == str(COUNT)
        got, _ = receiver.communicate(timeout=60)
    finally:
        for p in (sender, receiver):
            if p is not None:
                procs.end(p)
        if capture.poll() is None:
            os.killpg(capture.pid, signal.SIGINT)
        try:
            _, err = capture.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            procs.end(capture)
            err = ""
    # the receiver's own count: not one datagram lost (the kernel's UDP
    # counters in B say where any went)
    udp = net.t.exec(net.B, ["nstat", "-az", "Udp6*"], check=False).stdout
    assert int(got.strip()) == COUNT, (got, err, udp)
    vias = template_vias(net)
    assert len(vias) == 256 and vias[5] == sid(0x105) and vias[9] == sid(0x109)

    from scapy.layers.inet6 import IPv6
    from scapy.utils import PcapReader
    by_sid: dict[str, int] = {}
    order: list[str] = []
    with PcapReader(str(pcap)) as packets:
        for pkt in packets:
            if IPv6 in pkt:
                dst = pkt[IPv6].dst
                by_sid[dst] = by_sid.get(dst, 0) + 1
                order.append(dst)
    # every packet crossed R, sent to one of the template's SIDs (tcpdump
    # dropped none: its own count says so)
    assert sum(by_sid.values()) == COUNT, (sum(by_sid.values()), err)
    assert re.search(r"^0 packets dropped by kernel", err, re.M), err
    print(f"\nreceived {got.strip()} of {COUNT}; at R: {sum(by_sid.values())}, old/new SID 5: "
          f"{by_sid.get(sid(5), 0)}/{by_sid.get(sid(0x105), 0)}, 9: {by_sid.get(sid(9), 0)}/"
          f"{by_sid.get(sid(0x109), 0)}")
    # the old paths carried packets, then the new ones: mid-flow
    for old, new in ((5, 0x105), (9, 0x109)):
        assert by_sid.get(sid(old), 0) > 0 and by_sid.get(sid(new), 0) > 0, by_sid
        assert max(i for i, d in enumerate(order) if d == sid(old)) < \
            min(i for i, d in enumerate(order) if d == sid(new))


def test_replace_is_all_or_nothing(interop, tmp_path):
    from test_all_or_nothing import fail_each_write, one_line_error, state
    net = interop
    setup(net, tmp_path)
    changed = tmp_path / "changed.yaml"
    vias = list(range(256))
    vias[7] = 0x107
    changed.write_text(config(net, vias))
    last = fail_each_write(net.t, net.A, "apply", str(changed), "--no-key", every=False)
    assert last >= 8                # the spray lists, the path, its state and the lists again
    assert template_vias(net)[7] == sid(0x107)
    fail_each_write(net.t, net.A, "path", "template", "replace", "full", "--id", "3", "--via", sid(0x103),
                    every=False)
    assert template_vias(net)[3] == sid(0x103)
    # refused before any write: a path the template has, an id it has not, a
    # first hop not out of a0
    before = state(net.t, net.A)
    for args, text in ((["--id", "4", "--via", sid(0x107)], "already has a path via"),
                       (["--id", "300", "--via", sid(0x200)], "has no path 300"),
                       (["--id", "4", "--via", "fd00:1::a"], "not routed out of a device")):
        r = mrcctl("path", "template", "replace", "full", *args, netns=net.A, check=False)
        one_line_error(r, text)
    assert state(net.t, net.A) == before
