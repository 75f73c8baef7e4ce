"""The MRC datapath's view of a test: per-path counters of this network
namespace's attachment, as deltas between two snapshots.

The maps count every packet of the path, not only the test's: the
control connection, TCP acknowledgements and any other traffic to the
same peer prefix are in there too.  Rows are limited to the test's peer:
tx rows whose prefix holds the peer's address, rx and reorder rows from
the peer's SID (when the peer runs mrc-perf on an attached host and so
told us its SID; otherwise all senders).
"""
from __future__ import annotations

import ipaddress


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds if seconds > 0 else 0.0


class MrcView:
    def __init__(self, att, peer_addr: str | None):
        from mrc_ebpf.control import paths, stats      # only when a datapath is attached
        self._paths, self._stats = paths, stats
        self.att = att
        self.device = att.device
        self.sid = str(ipaddress.IPv6Address(bytes(att.config.sid)))
        self.peer = _address(peer_addr)
        self.peer_sid: str | None = None

    @classmethod
    def open(cls, device: str | None, peer_addr: str | None) -> "MrcView | None":
        """The attachment here, or None when nothing is attached (the tool
        then works as a plain iperf)."""
        try:
            from mrc_ebpf.datapath import loader, pins
            if device is None:
                # looked up without datapath.resolve_device's bpffs mount:
                # a benchmark must not change the host
                found = pins.attached_devices()
                if len(found) != 1:
                    return None
                device = found[0]
            return cls(loader.Attachment.open(device), peer_addr)
        except Exception:       # no bcc headers, no pins, another version: plain iperf
            return None

    def info(self) -> dict:
        return {"device": self.device, "sid": self.sid}

    def close(self) -> None:
        self.att.close()

    def snapshot(self) -> dict:
        tx = {}
        for r in self._paths.list_paths(self.att):
            if self.peer is not None and self.peer not in ipaddress.ip_network(r["prefix"]):
                continue
            tx[(r["prefix"], r["path_id"])] = (r["tx_packets"], r["tx_bytes"], r["state"])
        rx = {}
        for r in self._stats.received(self.att):
            if self.peer_sid and r["from"] != self.peer_sid:
                continue
            rx[(r["from"], r["path_id"])] = (r["rx_packets"], r["rx_bytes"], r["lost"], r["late"],
                                            r["qdelay_hist"])
        reorder = {r["from"]: (r["packets"], r["reordered"]) for r in self._stats.reorder(self.att)
                   if not self.peer_sid or r["from"] == self.peer_sid}
        return {"tx": tx, "rx": rx, "reorder": reorder}

    def delta(self, a: dict, b: dict, seconds: float) -> dict:
        percentile = self._stats.percentile
        tx = []
        for key, (packets, nbytes, state) in sorted(b["tx"].items()):
            p0, b0, _ = a["tx"].get(key, (0, 0, state))
            tx.append({"prefix": key[0], "path_id": key[1], "state": state,
                       "packets": packets - p0, "bytes": nbytes - b0,
                       "bits_per_second": _rate(nbytes - b0, seconds)})
        rx = []
        for key, (packets, nbytes, lost, late, hist) in sorted(b["rx"].items()):
            p0, b0, l0, late0, h0 = a["rx"].get(key, (0, 0, 0, 0, [0] * len(hist)))
            dh = [y - x for x, y in zip(h0, hist)]
            rx.append({"from": key[0], "path_id": key[1], "packets": packets - p0,
                       "bytes": nbytes - b0, "bits_per_second": _rate(nbytes - b0, seconds),
                       "lost": lost - l0, "late": late - late0,
                       "qdelay_p50_us": percentile(dh, 0.5), "qdelay_p99_us": percentile(dh, 0.99)})
        for rows in (tx, rx):
            total = sum(r["packets"] for r in rows)
            for r in rows:
                r["share"] = r["packets"] / total if total else 0.0
        reorder = []
        for peer, (packets, reordered) in sorted(b["reorder"].items()):
            p0, r0 = a["reorder"].get(peer, (0, 0))
            reorder.append({"from": peer, "packets": packets - p0, "reordered": reordered - r0})
        return {"tx": tx, "rx": rx, "reorder": reorder}


def _address(text: str | None):
    if not text:
        return None
    addr = ipaddress.ip_address(text.split("%")[0])
    if addr.version == 6 and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr
