"""A receiver of thousands of senders at once (issue 28, the receive side):
every sender's paths are acknowledged, and a sender the receiver had to
forget is counted.

The real mrc_rx, run by BPF_PROG_TEST_RUN, receives from many senders in
turn, each on its paths in turn (an all-to-all as one host sees it: the
k-th packet of every sender before the (k+1)-th of any); then the real
mrc_tx sends one packet to each sender, which carries our feedback to
it.  The witness is those frames out: the TLV's fb_block, fb_heard and
fb_since_ns32 (read at the wire's offsets for all of them, by scapy for
a sample, which must agree) say which of the sender's paths we
acknowledge and from which of its sends on; the counters and the LRUs'
own entry counts say what the receiver kept.

Before this change rx_peers held 256 senders (2.4 KB each, most of it a
newest send per path): with 1,024 senders no sender was acknowledged for
all its paths (docs/design/scale.md, "The receive side").
"""
from __future__ import annotations

import ctypes
import ipaddress

import pytest
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.cli import mrcctl
from mrc_ebpf.control import status
from mrc_ebpf.datapath import bpfsys, layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import COUNTERS
from .test_lru_misses import _template, one_cpu  # noqa: F401 (a fixture)

pytestmark = pytest.mark.root

SENDERS = C["MRC_RX_MAX_SENDERS"]
TX0 = 1_000_000_000_000          # the senders' clock at their first send (ns)
FEEDBACK = C["MRC_F_FEEDBACK"]
_OFF = {name: getattr(layout.MrcTlv, name).offset
        for name in ("path_id", "path_seq", "peer_seq", "tx_ns", "flags", "fb_block", "fb_heard",
                     "fb_since_ns32", "fb_path_id", "fb_path_tx32")}


def sid_of(h: int) -> str:
    """Sender h's SID, as _template gives its peer h."""
    return str(ipaddress.IPv6Address(f"fc00:1:{h // 256:x}:{h % 256:x}::"))


class Sender:
    """Frames from the senders to us, from one built by scapy: the outer
    source (the sender's SID) and the TLV's path id, sequence numbers and
    send time written in place."""

    def __init__(self):
        base = F.frame(F.srh_packet(F.inner6(), tlvs=[F.mrc_tlv(path_id=0, path_seq=0, peer_seq=0)],
                                    src=sid_of(0)))
        self.base = bytearray(base)
        self.tlv = base.index(bytes(F.mrc_tlv(path_id=0, path_seq=0, peer_seq=0)))
        self.clock = TX0

    def frame(self, h: int, path_id: int, seq: int) -> tuple[bytes, int]:
        """Sender h's packet number `seq` on each path, on `path_id`
        (its peer_seq follows), and the send time it carries."""
        b, t = self.base, self.tlv
        b[22:38] = ipaddress.IPv6Address(sid_of(h)).packed
        b[t + _OFF["path_id"]:t + _OFF["path_id"] + 2] = path_id.to_bytes(2, "big")
        b[t + _OFF["path_seq"]:t + _OFF["path_seq"] + 4] = seq.to_bytes(4, "big")
        b[t + _OFF["peer_seq"]:t + _OFF["peer_seq"] + 4] = (seq * 1024 + path_id).to_bytes(4, "big")
        self.clock += 1000
        b[t + _OFF["tx_ns"]:t + _OFF["tx_ns"] + 8] = self.clock.to_bytes(8, "big")
        return bytes(b), self.clock


def receive(dp, snd: Sender, senders: range, n_paths: int, rounds: int = 1,
            first_seq: int = 0) -> dict[int, dict[int, int]]:
    """Every sender's packets on paths 0..n_paths-1, `rounds` times, in
    turn; sender -> path -> its newest send time."""
    sent: dict[int, dict[int, int]] = {h: {} for h in senders}
    for r in range(rounds):
        for path_id in range(n_paths):
            for h in senders:
                frame, tx = snd.frame(h, path_id, first_seq + r)
                ret, _, _ = bpfsys.prog_test_run(dp.rx.fd, frame, 1)
                assert ret == 2, ret            # XDP_PASS: decapsulated
                sent[h][path_id] = tx
    return sent


def _field(raw: bytes, tlv: int, name: str, size: int) -> int:
    return int.from_bytes(raw[tlv + _OFF[name]:tlv + _OFF[name] + size], "big")


def feedback(dp, senders: range) -> dict[int, dict | None]:
    """One packet of ours to each sender (mrc_tx): sender -> what its TLV
    tells it (None: no feedback), read at the wire's offsets (Ethernet,
    IPv6, an SRH of two segments: a template's path and the peer's SID,
    then the TLV); every 61st by scapy too, which must read the same."""
    out = {}
    base = bytearray(bytes(F.eth() / IPv6(src="fd00:a::1", dst="fd00:1::9") / F.UDP(sport=1, dport=9) /
                           Raw(b"x")))
    for n, h in enumerate(senders):
        base[38:54] = ipaddress.IPv6Address(f"fd00:1:{h // 256:x}:{h % 256:x}::9").packed
        ret, _, raw = bpfsys.prog_test_run(dp.tx.fd, bytes(base), 1)
        assert ret == 0, ret
        assert raw[20] == 43 and raw[58] == 1, raw[:64].hex()     # SRH, last entry 1
        tlv = 54 + 8 + 16 * 2
        assert str(ipaddress.IPv6Address(raw[62:78])) == sid_of(h)
        got = None
        if _field(raw, tlv, "flags", 1) & FEEDBACK:
            got = {"block": _field(raw, tlv, "fb_block", 1), "heard": _field(raw, tlv, "fb_heard", 8),
                   "since32": _field(raw, tlv, "fb_since_ns32", 4),
                   "path_id": _field(raw, tlv, "fb_path_id", 2),
                   "path_tx32": _field(raw, tlv, "fb_path_tx32", 4)}
        if n % 61 == 0:
            m = wire.mrc_tlv(Ether(raw))
            seen = None if not m.flags & FEEDBACK else {
                "block": m.fb_block, "heard": m.fb_heard, "since32": m.fb_since_ns32,
                "path_id": m.fb_path_id, "path_tx32": m.fb_path_tx32}
            assert seen == got, (h, seen, got)
        out[h] = got
    return out


def acknowledged(report: dict | None, sends: dict[int, int]) -> set[int]:
    """The paths a report acknowledges for these sends: in fb_heard (its
    block of 64 path ids), with a bound at or below the path's newest
    send; and the path it names exactly, with that send's time."""
    if report is None:
        return set()
    base = 64 * report["block"]
    acked = {p for p, tx in sends.items()
             if base <= p < base + 64 and report["heard"] >> (p - base) & 1
             and report["since32"] <= tx & 0xFFFFFFFF}
    p = report["path_id"]
    if p in sends and report["path_tx32"] == sends[p] & 0xFFFFFFFF:
        acked.add(p)
    return acked


def _delta(before, after) -> dict[str, int]:
    return {n: a - b for n, a, b in zip(COUNTERS, after, before) if a != b}


def _held(dp, name: str) -> int:
    return dp.att.maps[name].dump()[2]


@pytest.mark.parametrize("n_senders,n_paths", [(1024, 256), (16384, 4)])
def test_every_sender_of_an_all_to_all_is_acknowledged(fresh, one_cpu, n_senders, n_paths):  # noqa: F811
    """1,024 senders over 256 paths, and 16,384 (issue 28's active peers)
    over 4: our next packets to each sender (one a block of 64 paths: a
    report acknowledges one block, rotating) acknowledge every path it
    sent on, from its first send in the block on."""
    dp = fresh
    _template(dp, n_senders)
    senders = range(n_senders)
    before = dp.counters()
    sent = receive(dp, Sender(), senders, n_paths)
    delta = _delta(before, dp.counters())
    assert delta["rx_sender_new"] == n_senders and "rx_sender_fail" not in delta, delta
    assert _held(dp, "rx_peers") == n_senders
    acked: dict[int, set[int]] = {h: set() for h in senders}
    for block in range(-(-n_paths // 64)):
        reports = feedback(dp, senders)
        for h in senders:
            assert reports[h] is not None and reports[h]["block"] == block, (h, reports[h])
            acked[h] |= acknowledged(reports[h], sent[h])
            # the bound is the sender's first send in the block: every
            # path's acknowledgement stops its clock (failover.h: past
            # the send before)
            assert reports[h]["since32"] == sent[h][64 * block] & 0xFFFFFFFF
    short = {h: sorted(set(sent[h]) - acked[h]) for h in senders}
    short = {h: s for h, s in short.items() if s}
    assert not short, (f"{len(short)} of {n_senders} senders not acknowledged for all their paths",
                       list(short.items())[:3])


def test_senders_beyond_the_map_are_counted_and_acknowledged_when_heard_again(fresh, one_cpu):  # noqa: F811
    """More senders than rx_peers holds: the LRU evicts (counted: made
    minus held, in `status`), and a sender evicted gets no feedback until
    it sends again; then what it sends is acknowledged as for a new
    sender (what it sent before is not: docs/design/scale.md)."""
    dp = fresh
    n = SENDERS + 2048
    _template(dp, n)
    snd = Sender()
    before = dp.counters()
    receive(dp, snd, range(n), 1)
    delta = _delta(before, dp.counters())
    held = _held(dp, "rx_peers")
    assert delta["rx_sender_new"] == n and "rx_sender_fail" not in delta, delta
    assert held <= SENDERS and n - held >= 2048             # evicted: made minus held
    # as `status` shows it (its receive state line, JSON receive_state),
    # from the counters since the load (the earlier tests' senders too)
    made = dict(zip(COUNTERS, dp.counters()))["rx_sender_new"]
    shown = status.receive_state(dp.att)["senders"]
    assert shown == {"held": held, "max": SENDERS, "made": made, "evicted": made - held, "failed": 0}
    assert f"{held} of {SENDERS} senders ({made} made, {made - held} evicted" in \
        mrcctl.fmt_receive(status.receive_state(dp.att))
    # a sender held is acknowledged, one evicted gets no feedback
    kept = {str(ipaddress.IPv6Address(bytes(k.addr))) for k in dp.att.maps["rx_peers"].keys()}
    reports = feedback(dp, range(n))
    for h in range(n):
        assert (reports[h] is not None and reports[h]["heard"] & 1) == (sid_of(h) in kept), h
    # the LRU evicted the senders heard longest ago: none of the last
    # half was evicted
    gone = [h for h in range(n) if sid_of(h) not in kept]
    assert max(gone) < n // 2, max(gone)
    # 1,024 of those evicted send again on paths 0..3: each made anew and
    # acknowledged from its new sends on, every path.  The LRU is full, so
    # each of them evicts another, and the kernel's LRU is not exact (it
    # evicts in batches from its inactive list): a few of them may be
    # evicted again within their own 4 packets (2 here); each such one is
    # one more made, and may be short of its first paths
    early = gone[:1024]
    before = dp.counters()
    sent = receive(dp, snd, early, 4, first_seq=1)
    again = _delta(before, dp.counters())["rx_sender_new"] - len(early)
    assert 0 <= again <= 16, again
    reports = feedback(dp, early)
    short = [h for h in early if acknowledged(reports[h], sent[h]) != {0, 1, 2, 3}]
    assert len(short) <= again, (again, [(h, reports[h]) for h in short[:3]])
    for h in set(early) - set(short):
        assert reports[h]["since32"] == sent[h][0] & 0xFFFFFFFF


def test_a_path_forgotten_restarts_its_sequence(fresh, one_cpu):  # noqa: F811
    """A (sender, path) pair evicted from rx_paths and heard again starts
    afresh: counted as made (rx_path_new), its gap not a loss, not a late,
    and the path still acknowledged."""
    dp = fresh
    _template(dp, 2)
    snd = Sender()
    receive(dp, snd, range(1), 1)                 # sender 0, path 0, seq 0
    key = layout.RxKey(path_id=0)
    ctypes.memmove(key.sid, ipaddress.IPv6Address(sid_of(0)).packed, 16)
    dp.att.maps["rx_paths"].delete(key)          # as the LRU would
    before = dp.counters()
    frame, tx = snd.frame(0, 0, 9)                # seq 9: 8 skipped while forgotten
    assert bpfsys.prog_test_run(dp.rx.fd, frame, 1)[0] == 2
    delta = _delta(before, dp.counters())
    assert delta.get("rx_path_new") == 1, delta
    p = dp.att.maps["rx_paths"].lookup(key)
    assert (p.lost, p.late, p.next_seq, p.latest_tx) == (0, 0, 10, tx)
    assert 0 in acknowledged(feedback(dp, range(1))[0], {0: tx})
