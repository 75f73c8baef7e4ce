"""`mrcctl path trace`: which spine each entropy path (EV) crosses, learnt
by a hop-limited probe per EV, and the spray ordered to rotate over the
spines.  Witnesses: the spines themselves -- tcpdump on each spine's
port towards the sender's leaf says which spine forwarded which flow
label, the spines' own interface counters say how the spray spread, and
each spine's own address names it."""
from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import time

import pytest

from conftest import UDP_SEND, mrcctl
from test_fabric import fabric, make_fabric, one_line_error  # noqa: F401
from mrc_ebpf.control import ev_trace, paths
from mrc_ebpf.control.spray import rotation
from mrc_ebpf.datapath import layout


PREFIX = "fd00:0:2::/64"
H2_SID = "fc00:0:e002::"


def _trace(net, *args, host="h1"):
    return json.loads(mrcctl("path", "trace", PREFIX, *args, "-j", netns=net.ns(host)).stdout)[0]


def _rows(net, host="h1"):
    return [r for r in json.loads(mrcctl("path", "list", "-j", netns=net.ns(host)).stdout)
            if r["prefix"] == PREFIX]


def _spine_of_addr(net, spines=4) -> dict[str, str]:
    """Each spine's own addresses on its port to l1 -> the spine's name."""
    out = {}
    for k in range(1, spines + 1):
        doc = json.loads(net.exec(f"s{k}", ["ip", "-j", "-6", "addr", "show", "dev", "l1"]).stdout)
        for a in doc[0]["addr_info"]:
            out[a["local"]] = f"s{k}"
    return out


def _send(net, count, pps=20000):
    net.exec("h1", [*UDP_SEND, "fd00:0:2::1", "9", str(count), f"--pps={pps}"], timeout=120)


def _down_counts(net, spines=4):
    return [net.tx(f"s{k}", "l2") for k in range(1, spines + 1)]


def _shares(before, after):
    d = [a - b for a, b in zip(after, before)]
    return [x / sum(d) for x in d]


@pytest.mark.root
def test_traced_hops_are_the_spines_that_forward_each_ev_and_the_spray_rotates(make_fabric):
    """32 EVs over 4 spines.  (1) The hop `path trace` names for each EV is
    the spine that forwards the EV's data: tcpdump on every spine's port
    from l1 sees each EV's flow label on exactly that spine.  (2) rr over
    the ordered spray gives each spine the same share of packets (spine
    counters); in id order the shares follow the hash's counts.
    (3) `path deny --hop` of one traced spine drains it.  (4) Bad input."""
    net = make_fabric("--spines", "4", "--leaves", "2", "--encoding", "ev", "--rate", "none")
    out = json.loads(fabric("attach", net.name, "--entropy", "32", "--policy", "rr", "-j").stdout)
    assert out["ev_order"] is True
    # the spines' ICMPv6 limit the fabric sets (a requirement of tracing at speed)
    assert net.exec("s1", ["sysctl", "-n", "net.ipv6.icmp.ratelimit"]).stdout.strip() == "0"
    rows = _rows(net)
    assert len(rows) == 32 and all(r["hop"] for r in rows), rows
    spine_of = _spine_of_addr(net)
    traced = {r["ev"]: spine_of[r["hop"]] for r in rows}

    # (1) ground truth: which spine forwards each EV's packets
    caps = {}
    for k in range(1, 5):
        caps[f"s{k}"] = net.popen(f"s{k}", ["tcpdump", "-nn", "-v", "-l", "-i", "l1", "-Q", "in",
                                            f"ip6 and dst host {H2_SID}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for p in caps.values():        # listening before anything is sent
            while "listening on" not in p.stderr.readline():
                pass
        _send(net, 3200)
        time.sleep(0.3)
    finally:
        for p in caps.values():
            p.terminate()
    seen: dict[int, set] = {}
    for spine, p in caps.items():
        text, _ = p.communicate(timeout=30)
        for label in re.findall(r"flowlabel 0x([0-9a-f]+)", text):
            seen.setdefault(int(label, 16), set()).add(spine)
    assert set(seen) >= set(traced), sorted(set(traced) - set(seen))
    wrong = {ev: (traced[ev], sorted(seen[ev])) for ev in traced if seen[ev] != {traced[ev]}}
    counts = {s: list(traced.values()).count(s) for s in sorted(set(traced.values()))}
    print(f"traced 32 EVs: {counts} per spine; spines' own captures agree for "
          f"{32 - len(wrong)} of 32")
    assert not wrong, wrong

    # (2) ordered: equal shares; id order (hops forgotten): the hash's counts
    b = _down_counts(net)
    _send(net, 8000)
    ordered = _shares(b, _down_counts(net))
    mrcctl("path", "trace", PREFIX, "--forget", netns=net.ns("h1"))
    assert all(r["hop"] is None for r in _rows(net))
    b = _down_counts(net)
    _send(net, 8000)
    id_order = _shares(b, _down_counts(net))
    print(f"rr over 32 EVs, spine shares: ordered {[round(s, 3) for s in ordered]}, "
          f"id order {[round(s, 3) for s in id_order]}")
    assert max(ordered) - min(ordered) < 0.02, ordered
    if max(counts.values()) != min(counts.values()):
        assert max(id_order) - min(id_order) > max(ordered) - min(ordered)

    # (3) the recorded hop is what deny --hop matches
    doc = _trace(net, "--order")
    assert doc["recorded"] and not doc["unanswered"]
    hop = next(h for h, s in spine_of.items() if s == "s2" and h in doc["hops"])
    mrcctl("path", "deny", "--hop", hop, netns=net.ns("h1"))
    b = _down_counts(net)
    _send(net, 4000)
    drained = [a - x for a, x in zip(_down_counts(net), b)]
    print(f"deny --hop {hop} (s2): packets down each spine {drained}")
    assert drained[1] < 40, drained        # none of the data; a stray neighbour packet at most
    mrcctl("path", "allow", "--hop", hop, netns=net.ns("h1"))

    # bad input: one line, nothing changed; without --order nothing is recorded
    one_line_error(mrcctl("path", "trace", "fd00:0:9::/64", netns=net.ns("h1"), check=False))
    one_line_error(mrcctl("path", "trace", PREFIX, "--order", "--forget", netns=net.ns("h1"), check=False))
    one_line_error(mrcctl("path", "trace", "nonsense", netns=net.ns("h1"), check=False))
    mrcctl("path", "trace", PREFIX, "--forget", netns=net.ns("h1"))
    doc = _trace(net)
    assert len(doc["paths"]) == 32 and not doc["recorded"] and not doc["unanswered"]
    assert all(r["hop"] is None for r in _rows(net))



def _ev(hop: str | None) -> layout.Path:
    p = layout.Path(n_segments=1, state=paths.UP, flags=paths.USID | paths.ENTROPY)
    if hop:
        p.segments[ev_trace.HOP_SLOT].addr[:] = ipaddress.IPv6Address(hop).packed
    return p


def test_rotation_gives_every_hop_a_turn_per_round_and_keeps_every_ev():
    hops = ["fd01::1"] * 5 + ["fd01::2"] * 2 + ["fd01::3"] * 3 + [None]
    members = [(i, _ev(h)) for i, h in enumerate(hops)]
    order = rotation(members, 1024)
    by_id = dict(enumerate(hops))
    body, tail = order[:-1], order[-1:]
    assert tail == [10]                                   # the untraced EV, once, at the end
    assert len(body) == 5 * 3 and set(body) == set(range(10))
    for r in range(5):                                    # each round: every hop once, in order
        assert [by_id[i] for i in body[3 * r:3 * r + 3]] == ["fd01::1", "fd01::2", "fd01::3"]
    assert rotation([(0, _ev(None))], 1024) is None      # nothing traced: id order
    assert len(rotation(members, 7)) <= 7 and rotation(members, 7)[:3] == [0, 5, 7]


def test_probe_has_the_evs_outer_header():
    """The leaf must hash the probe as the EV's data: addresses, flow label,
    next header (Destination Options); hop limit 2.  Read back by scapy."""
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt
    src, dst = ipaddress.IPv6Address("fc00:0:e001::"), ipaddress.IPv6Address("fc00:0:e002::")
    pkt = IPv6(ev_trace.probe_packet(src.packed, dst.packed, 0xABCDE))
    assert (pkt.src, pkt.dst, pkt.fl, pkt.nh, pkt.hlim, pkt.plen) == (str(src), str(dst), 0xABCDE, 60, 2, 8)
    assert pkt.haslayer(IPv6ExtHdrDestOpt) and pkt[IPv6ExtHdrDestOpt].nh == 59
    # a spine's answer as the kernel builds it: ICMPv6 Time Exceeded quoting the probe
    from scapy.layers.inet6 import ICMPv6TimeExceeded
    from scapy.layers.l2 import Ether
    answer = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IPv6(src="fd01:0:3:1::1", dst=str(src)) / ICMPv6TimeExceeded() / pkt)
    assert ev_trace.parse_reply(answer) == ("fd01:0:3:1::1", src.packed, dst.packed, 0xABCDE)
    assert ev_trace.parse_reply(answer[:60]) is None
