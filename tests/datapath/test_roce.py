"""RoCEv2 through the real TX and RX programs (lib/roce.h): frames built
with scapy's BTH/AETH layers (scapy.contrib.roce), run with
BPF_PROG_TEST_RUN; verdicts, exact counter deltas, and the QP and path
rows the programs wrote (roce_qps, roce_paths) read back.

A QP is known by its peer and its UDP source port (rxe and RoCE NICs
derive the port from both QP numbers, so requests and ACKs share it)."""
from __future__ import annotations

import time

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from mrc_ebpf.control import path_spec, peer_table, spray
from mrc_ebpf.datapath import layout, wire
from mrc_ebpf.datapath.source import C

from . import frames as F
from .harness import provision

pytestmark = pytest.mark.root

SPORT = 0xC123          # the QP pair's UDP source port
RDMA_WRITE_MIDDLE, RDMA_WRITE_ONLY, ACK, UD_SEND_ONLY = 0x07, 0x0A, 0x11, 0x64
ACK_OK, NAK_SEQ, NAK_INVALID, RNR_NAK = 0x1F, 0x60, 0x61, 0x20


def request6(psn, dst="fd00:b::2", sport=SPORT, opcode=RDMA_WRITE_MIDDLE, dqpn=0x12):
    """An RC request from us (fd00:a::1) as rxe sends it: IPv6/UDP/BTH/payload."""
    return IPv6(src="fd00:a::1", dst=dst) / UDP(sport=sport, dport=4791) / \
        BTH(opcode=opcode, dqpn=dqpn, psn=psn, ackreq=1) / Raw(b"\0" * 64)


def ack6(psn, syndrome=ACK_OK, sport=SPORT, dqpn=0x11):
    """The responder's ACK (AETH) for our QP, sent back to us."""
    return IPv6(src="fd00:b::2", dst="fd00:a::1") / UDP(sport=sport, dport=4791) / \
        BTH(opcode=ACK, dqpn=dqpn, psn=psn) / AETH(syndrome=syndrome, msn=1)


def qp(dp, peer_id=0, sport=SPORT):
    return dp.att.maps["roce_qps"].lookup(layout.RoceKey(peer_id=peer_id, sport=sport))


def path_row(dp, peer_id, path_id, side):
    return dp.att.maps["roce_paths"].lookup(layout.RocePathKey(peer_id=peer_id, path_id=path_id, side=side))


@pytest.fixture
def roce(fresh):
    """fresh, with the RoCE maps emptied too (configure() leaves them)."""
    for name in ("roce_qps", "roce_paths"):
        m = fresh.att.maps[name]
        for key in list(m.keys()):
            m.delete(key)
    for i in range(C["MRC_ROCE_TURNS"]):
        fresh.att.maps["roce_turns"].update(layout.Index(i), layout.u64())
    return fresh


def tx(dp, l3):
    return dp.run_tx(bytes(F.eth(0x0800 if isinstance(l3, IP) else 0x86DD) / l3))


def encap(n=1, retrans=0, first=False, **more):
    d = {"tx_seen": n, "tx_encap": n, "tx_roce": n, **more}
    if retrans:
        d["tx_roce_retrans"] = retrans
    if first:
        d["state_new"] = 1
    return d


# ---------------------------------------------------------------- TX rows

def test_tx_reads_an_rc_request(roce):
    """An RC write's BTH: its QP (by source port), destination QP and PSN."""
    r = tx(roce, request6(psn=100, dqpn=0x123456))
    assert r.verdict == "TC_ACT_OK"
    assert {k: v for k, v in r.delta.items() if k != "tx_encap_bytes"} == encap(first=True)
    pkt = Ether(r.out)
    assert pkt[BTH].psn == 100 and pkt[BTH].dqpn == 0x123456      # carried unchanged
    q = qp(roce)
    assert (q.dqpn, q.last_psn, q.tx_packets, q.tx_retrans, q.path_id) == (0x123456, 100, 1, 0, 0)
    assert q.flags & C["MRC_ROCE_F_SENT"]
    assert path_row(roce, 0, 0, 0).tx_packets == 1


def test_tx_counts_a_psn_sent_again_as_a_retransmission(roce):
    """Go-back-N: a request whose PSN is not after the last one sent."""
    for psn in (100, 101, 102):
        tx(roce, request6(psn))
    r = tx(roce, request6(101))
    assert {k: v for k, v in r.delta.items() if k != "tx_encap_bytes"} == encap(retrans=1)
    r = tx(roce, request6(102))
    assert r.delta["tx_roce_retrans"] == 1
    r = tx(roce, request6(103))
    assert "tx_roce_retrans" not in r.delta
    q = qp(roce)
    assert (q.last_psn, q.tx_packets, q.tx_retrans) == (103, 6, 2)
    assert (path_row(roce, 0, 0, 0).tx_packets, path_row(roce, 0, 0, 0).tx_retrans) == (6, 2)


def test_tx_psn_wraps_at_24_bits(roce):
    tx(roce, request6(0xFFFFFF))
    r = tx(roce, request6(0))
    assert "tx_roce_retrans" not in r.delta and qp(roce).last_psn == 0


def test_tx_reads_rc_over_ipv4(roce):
    l3 = IP(src="198.18.1.1", dst="198.18.2.2") / UDP(sport=SPORT, dport=4791) / \
        BTH(opcode=RDMA_WRITE_ONLY, dqpn=7, psn=9) / Raw(b"x" * 32)
    r = tx(roce, l3)
    assert r.delta["tx_roce"] == 1
    q = qp(roce, peer_id=2)
    assert (q.dqpn, q.last_psn) == (7, 9)


NOT_ROCE = [
    ("UDP to 4791, too short for a BTH", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2") /
     UDP(sport=SPORT, dport=4791) / Raw(b"x" * 8)),
    ("UD, not RC", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2") / UDP(sport=SPORT, dport=4791) /
     BTH(opcode=UD_SEND_ONLY, dqpn=1, psn=1) / Raw(b"x" * 40)),
    ("UDP to another port", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2") / UDP(sport=SPORT, dport=4792) /
     BTH(opcode=RDMA_WRITE_ONLY, dqpn=1, psn=1) / Raw(b"x" * 40)),
    ("TCP", lambda: IPv6(src="fd00:a::1", dst="fd00:b::2") / F.TCP(sport=4791, dport=4791) / Raw(b"x" * 40)),
]


@pytest.mark.parametrize("name,build", NOT_ROCE, ids=[r[0] for r in NOT_ROCE])
def test_tx_other_packets_are_not_roce(roce, name, build):
    r = tx(roce, build())
    assert r.delta.get("tx_encap") == 1 and "tx_roce" not in r.delta
    assert not list(roce.att.maps["roce_qps"].keys())


# ---------------------------------------------------------------- RX rows

def rx(dp, l3, path_id=3, src=F.PEER_SID):
    return dp.run_rx(F.frame(F.srh_packet(l3, tlvs=[F.mrc_tlv(path_id=path_id)], src=src)))


def test_rx_ack_records_the_acknowledged_psn(roce):
    tx(roce, request6(200))
    r = rx(roce, ack6(200))
    assert r.verdict == "XDP_PASS" and r.delta.get("rx_roce") == 1 and "rx_roce_nak_seq" not in r.delta
    q = qp(roce)
    assert (q.acks, q.acked_psn, q.naks_seq) == (1, 200, 0)
    assert q.flags & C["MRC_ROCE_F_ACKED"]
    rx(roce, ack6(150))                       # an older one does not move it back
    assert qp(roce).acked_psn == 200


def test_rx_nak_sequence_error_is_counted_for_the_qp_and_its_path(roce):
    for psn in (10, 11, 12):
        tx(roce, request6(psn))
    r = rx(roce, ack6(11, syndrome=NAK_SEQ))  # "I expect 11": 10 arrived
    assert r.delta.get("rx_roce_nak_seq") == 1 and r.delta.get("rx_roce") == 1
    q = qp(roce)
    assert (q.naks_seq, q.acked_psn) == (1, 10)
    assert path_row(roce, 0, 0, 0).naks_seq == 1     # our path 0, the QP's


@pytest.mark.parametrize("syndrome", [NAK_INVALID, RNR_NAK], ids=["nak invalid request", "rnr nak"])
def test_rx_other_naks_are_not_sequence_errors(roce, syndrome):
    tx(roce, request6(10))
    r = rx(roce, ack6(10, syndrome=syndrome))
    assert r.delta.get("rx_roce") == 1 and "rx_roce_nak_seq" not in r.delta
    assert qp(roce).naks_seq == 0 and not qp(roce).flags & C["MRC_ROCE_F_ACKED"]


def test_rx_ack_of_a_qp_we_never_sent_on_makes_no_state(roce):
    r = rx(roce, ack6(5, syndrome=NAK_SEQ))
    assert r.delta.get("rx_roce") == 1 and "rx_roce_nak_seq" not in r.delta
    assert not list(roce.att.maps["roce_qps"].keys())


def test_rx_from_a_stranger_is_counted_not_tracked(roce):
    r = rx(roce, ack6(5), src=F.STRANGER_SID)
    assert r.delta.get("rx_roce") == 1
    assert not list(roce.att.maps["roce_qps"].keys())


def test_rx_requests_psn_gaps_per_qp_and_per_path(roce):
    """As responder: a PSN ahead of the next expected (a gap: rxe drops it
    and NAKs) and one behind it (a retransmission), on the sender's path
    the TLV names."""
    def req(psn, path_id):
        l3 = IPv6(src="fd00:b::2", dst="fd00:a::1") / UDP(sport=SPORT, dport=4791) / \
            BTH(opcode=RDMA_WRITE_MIDDLE, dqpn=0x11, psn=psn) / Raw(b"\0" * 64)
        return rx(roce, l3, path_id=path_id)
    assert "rx_roce_ahead" not in req(500, 3).delta
    assert "rx_roce_ahead" not in req(501, 3).delta
    assert req(503, 4).delta.get("rx_roce_ahead") == 1       # 502 missing
    req(502, 3)
    req(501, 3)                                               # behind: again
    q = qp(roce)
    assert (q.rx_packets, q.rx_ahead, q.rx_behind, q.rx_next_psn, q.dqpn) == (5, 1, 1, 503, 0x11)
    p3, p4 = path_row(roce, 0, 3, 1), path_row(roce, 0, 4, 1)
    assert (p3.rx_packets, p3.rx_ahead, p3.rx_behind) == (4, 0, 1)
    assert (p4.rx_packets, p4.rx_ahead, p4.rx_behind) == (1, 1, 0)


# ---------------------------------------------------------------- the roce policy

ROCE_PEER, ROCE_PREFIX = 3, "fd00:e::/64"


def _roce_peer(dp, n_paths=4, policy="roce"):
    specs = [path_spec.PathSpec.via(f"fc00:0:e{i + 1}::,fc00:0:e::") for i in range(n_paths)]
    peer = provision(dp.att, ROCE_PEER, ROCE_PREFIX, specs)
    peer.policy = peer_table.POLICIES[policy]
    spray.rebuild(dp.att, peer)
    dp.att.maps["peers"].update(peer_table.peer_key(path_spec.parse_prefix(ROCE_PREFIX)), peer)
    return peer


def _path_of(result) -> int:
    return wire.mrc_tlv(Ether(result.out)).path_id


def _req(dp, sport, psn):
    r = tx(dp, request6(psn, dst="fd00:e::2", sport=sport))
    assert r.delta.get("tx_roce") == 1, r
    return _path_of(r)


def test_roce_policy_spreads_qps_evenly_and_keeps_each_on_one_path(roce):
    _roce_peer(roce)
    sports = [0xC000 + 17 * i for i in range(8)]
    paths = {s: set() for s in sports}
    for psn in range(5):
        for s in sports:
            paths[s].add(_req(roce, s, psn))
    assert all(len(p) == 1 for p in paths.values()), paths     # one path per QP
    per_path = [sum(1 for p in paths.values() if p == {i}) for i in range(4)]
    assert per_path == [2, 2, 2, 2]
    # non-RoCE packets of a roce peer: round robin
    seen = {_path_of(tx(roce, IPv6(src="fd00:a::1", dst="fd00:e::2") / UDP(sport=1, dport=9) / Raw(b"x")))
            for _ in range(4)}
    assert seen == {0, 1, 2, 3}


def test_per_packet_policies_still_spray_a_qp(roce):
    """rr stays per packet for RoCE too: the go-back-N cost the bench shows."""
    _roce_peer(roce, policy="rr")
    assert {_req(roce, 0xC001, psn) for psn in range(4)} == {0, 1, 2, 3}


def _take_out(dp, path_id):
    """The datapath's failover has taken path_id out (as lib/failover.h
    leaves it: down, next probe far off, nothing acknowledged since)."""
    now = time.monotonic_ns()

    def heard(state):
        state.acks.last_ns = 1      # feedback was heard (failover on), long ago

    def out(row):
        live = row.paths[path_id].live
        live.down_ns, live.next_probe_ns, live.down_after_ns = now, now + 60 * 10**9, now
    peer_table.change_learnt(dp.att, ROCE_PEER, heard)
    peer_table.change_row(dp.att, ROCE_PEER, out)


def test_a_qp_moves_at_once_when_its_path_is_taken_out_and_back_only_when_idle(roce):
    _roce_peer(roce)
    s = 0xC0DE
    home = _req(roce, s, 1)
    _req(roce, s, 2)                                   # PSN 2 in flight (never acked)
    _take_out(roce, home)
    r = tx(roce, request6(3, dst="fd00:e::2", sport=s))
    moved = _path_of(r)
    assert moved != home and r.delta.get("tx_roce_move") == 1 and r.delta.get("tx_reroute") == 1
    # its path back up: the QP stays where it is while PSNs are in flight ...
    peer_table.change_row(roce.att, ROCE_PEER, lambda row: setattr(row.paths[home].live, "down_ns", 0))
    assert _req(roce, s, 4) == moved
    rx(roce, ack6(3, sport=s), src="fc00:0:e::")      # acked up to 3, 4 in flight
    assert _req(roce, s, 5) == moved
    # ... and returns to its turn's path once the responder acked all it sent
    rx(roce, ack6(5, sport=s), src="fc00:0:e::")
    r = tx(roce, request6(6, dst="fd00:e::2", sport=s))
    assert _path_of(r) == home and r.delta.get("tx_roce_move") == 1
    q = qp(roce, peer_id=ROCE_PEER, sport=s)
    assert (q.moves, q.path_id, q.acked_psn, q.last_psn) == (2, home, 5, 6)


def test_stats_rows_read_what_the_programs_wrote(roce):
    """`mrcctl stats --roce` and the exporter read these rows."""
    from mrc_ebpf.control import roce as roce_stats
    for psn in (1, 2, 3):
        tx(roce, request6(psn, dqpn=0x44))
    tx(roce, request6(2, dqpn=0x44))
    rx(roce, ack6(2, syndrome=NAK_SEQ))
    [q] = roce_stats.qps(roce.att)
    assert (q["peer"], q["sport"], q["dqpn"], q["path_id"], q["tx_packets"], q["tx_retrans"],
            q["naks_seq"], q["last_psn"], q["acked_psn"], q["in_flight"]) == \
        ("fd00:b::/64", SPORT, 0x44, 0, 4, 1, 1, 3, 1, 2)
    [p] = roce_stats.paths(roce.att)
    assert (p["peer"], p["side"], p["path_id"], p["tx_packets"], p["tx_retrans"], p["naks_seq"]) == \
        ("fd00:b::/64", "tx", 0, 4, 1, 1)
