"""RoCEv2 over MRC's paths, as the datapath saw it (lib/roce.h): per queue
pair (roce_qps) and per path (roce_paths).  docs/design/roce.md."""
from __future__ import annotations

from mrc_ebpf.control.paths import peers
from mrc_ebpf.datapath.source import C

PSN_MASK = C["MRC_ROCE_PSN_MASK"]


def _prefixes(att) -> dict[int, str]:
    return {p["peer_id"]: p["prefix"] for p in peers(att)}


def in_flight(q) -> int | None:
    """PSNs sent that the responder has not acknowledged (None: it never
    acknowledged any, or we sent none)."""
    if not (q.flags & C["MRC_ROCE_F_SENT"] and q.flags & C["MRC_ROCE_F_ACKED"]):
        return None
    return (q.last_psn - q.acked_psn) & PSN_MASK


def qps(att) -> list[dict]:
    """One row per QP (peer, UDP source port), sorted."""
    names = _prefixes(att)
    rows = []
    for k, q in att.maps["roce_qps"].items():
        rows.append({
            "peer": names.get(k.peer_id, str(k.peer_id)), "peer_id": k.peer_id, "sport": k.sport,
            "dqpn": q.dqpn, "path_id": q.path_id if q.tx_packets else None, "moves": q.moves,
            "tx_packets": q.tx_packets, "tx_retrans": q.tx_retrans, "naks_seq": q.naks_seq, "acks": q.acks,
            "last_psn": q.last_psn if q.flags & C["MRC_ROCE_F_SENT"] else None,
            "acked_psn": q.acked_psn if q.flags & C["MRC_ROCE_F_ACKED"] else None,
            "in_flight": in_flight(q),
            "rx_packets": q.rx_packets, "rx_ahead": q.rx_ahead, "rx_behind": q.rx_behind,
        })
    rows.sort(key=lambda r: (r["peer_id"], r["sport"]))
    return rows


def paths(att) -> list[dict]:
    """One row per (peer, path, side): side "tx" is our path to the peer,
    "rx" the peer's path to us (by the id its TLV carries)."""
    names = _prefixes(att)
    rows = [{"peer": names.get(k.peer_id, str(k.peer_id)), "peer_id": k.peer_id, "path_id": k.path_id,
             "side": "rx" if k.side else "tx", "tx_packets": p.tx_packets, "tx_retrans": p.tx_retrans,
             "naks_seq": p.naks_seq, "rx_packets": p.rx_packets, "rx_ahead": p.rx_ahead,
             "rx_behind": p.rx_behind}
            for k, p in att.maps["roce_paths"].items()]
    rows.sort(key=lambda r: (r["peer_id"], r["side"], r["path_id"]))
    return rows
