"""What the receiver measured, per sender and path (rx_paths, rx_peers)."""
from __future__ import annotations

import ipaddress

from mrc_ebpf.datapath.source import C

BUCKETS = C["MRC_HIST_BUCKETS"]


def bucket_upper(i: int) -> int:
    """Upper bound of log2 bucket i (bucket 0 holds 0)."""
    return 0 if i == 0 else (1 << i) - 1


def percentile(hist, q: float) -> int | None:
    """Upper bound of the bucket holding the q-quantile (a histogram of
    log2 buckets gives percentiles to within a factor of two)."""
    total = sum(hist)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return bucket_upper(i)
    return bucket_upper(len(hist) - 1)


def received(att) -> list[dict]:
    peers = {bytes(k.addr): v for k, v in att.maps["rx_peers"].items()}
    rows = []
    for key, p in att.maps["rx_paths"].items():
        sid = bytes(key.sid)
        peer = peers.get(sid)
        hist = list(p.qdelay_hist)
        rows.append({
            "from": str(ipaddress.IPv6Address(sid)), "path_id": key.path_id,
            "rx_packets": p.packets, "rx_bytes": p.bytes, "lost": p.lost, "late": p.late, "ce": p.ce,
            "trimmed": p.trimmed,
            "qdelay_us": p.qdelay_us, "qdelay_p50_us": percentile(hist, 0.5),
            "qdelay_p99_us": percentile(hist, 0.99), "qdelay_hist": hist,
            "qdelay_sum_us": p.qdelay_sum_us,
            "peer_reordered": peer.reordered if peer else 0,
        })
    rows.sort(key=lambda r: (r["from"], r["path_id"]))
    return rows


def reorder(att) -> list[dict]:
    return [{"from": str(ipaddress.IPv6Address(bytes(k.addr))), "packets": v.packets,
             "reordered": v.reordered, "reorder_hist": list(v.reorder_hist),
             "reorder_sum": v.reorder_sum}
            for k, v in att.maps["rx_peers"].items()]
