"""Prometheus metrics of the attachments in this network namespace.

Read from the pinned maps at each scrape (nothing is sampled in between),
so a scrape shows the same numbers `mrcctl stats -j` would at that moment.
docs/ops.md has the table of families, labels and their cardinality.

Labels have one meaning each: `peer` is a peer prefix (what we send to),
`sid` a peer's SID (who sent what we received: the datapath knows a
sender only by its SID), `path` a path id of that peer or sender.
`mrc_peer_info{peer, sid}` joins the two.

By default the series are per peer and per sender (paths summed, their
histograms merged); `per_path=True` (`exporter --per-path`) adds the
per-path series, about 8 per path sent on and 21 per path received on.

Histograms: the datapath's log2 buckets (upper bounds 2^i - 1 us or
packets), cumulative, with `_count` (the packets histogrammed).  There is
no `_sum`: the maps keep none, and a sum estimated from the buckets would
not be the observations' sum.

Paths have MRC's states, `skip` among them (a CE report skips the path
for some turns: lib/path_select.h); `mrc_path_ce_reports_total` counts the
peer's reports of CE marks on a path we send on, `*_rx_ce_total` the
CE-marked packets we received.
"""
from __future__ import annotations

import threading

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from mrc_ebpf.control import events, paths, roce, stats
from mrc_ebpf.datapath import loader, pins
from mrc_ebpf.errors import MrcError

STATES = ("up", "assumed-bad", "denied", "unknown", "skip", "spare")     # MRC's path states (path list)


def _buckets(hist: list[int], divisor: int) -> list[tuple[str, float]]:
    """Cumulative buckets with upper bounds (2^i - 1) / divisor; the last
    of the datapath's buckets holds everything above, so it is +Inf.  The
    bound is divided, not multiplied by 1e-6, so that it prints as the
    number it is (1.5e-05, not 1.4999999999999999e-05)."""
    out, seen = [], 0
    for i, n in enumerate(hist[:-1]):
        seen += n
        out.append((floatToGoString(stats.bucket_upper(i) / divisor), seen))
    out.append(("+Inf", seen + hist[-1]))
    return out


def _histogram(family: HistogramMetricFamily, labels: list[str], hist: list[int], divisor: int,
               total: int) -> None:
    """_bucket, _count and _sum; TOTAL is the datapath's own sum of what
    the buckets count (rx_track.h keeps it beside them), in the buckets'
    unit, which DIVISOR turns into the metric's."""
    family.add_metric(labels, _buckets(hist, divisor), total / divisor)


class EventTally:
    """Events by kind, per device, as read so far from the ring."""

    def __init__(self):
        self.lock = threading.Lock()
        self.last: dict[str, int] = {}
        self.kinds: dict[tuple[str, str], int] = {}
        self.missed: dict[str, int] = {}

    def update(self, device: str, rows: list[dict]) -> None:
        with self.lock:
            last = self.last.get(device, 0)
            new = [r for r in rows if r["seq"] > last]
            if not new:
                return
            if last and new[0]["seq"] > last + 1:
                self.missed[device] = self.missed.get(device, 0) + new[0]["seq"] - last - 1
            elif not last and new[0]["seq"] > 1:
                self.missed[device] = self.missed.get(device, 0) + new[0]["seq"] - 1
            for r in new:
                key = (device, r["type"])
                self.kinds[key] = self.kinds.get(key, 0) + 1
            self.last[device] = new[-1]["seq"]


class MrcCollector:
    def __init__(self, per_path: bool = False):
        self.tally = EventTally()
        self.per_path = per_path

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily("mrc_attached", "1 when the attachment's pinned state could be read",
                               labels=["dev"])
        families: dict[str, object] = {}

        def family(kind, name, doc, labels):
            if name not in families:
                families[name] = kind(name, doc, labels=labels)
            return families[name]

        for device in pins.attached_devices():
            try:
                att = loader.Attachment.open(device)
            except MrcError:
                up.add_metric([device], 0)
                continue
            with att:
                up.add_metric([device], 1)
                self._one(device, att, family)
        yield up
        yield from families.values()
        kinds = CounterMetricFamily("mrc_events", "Path events by kind (from the datapath's event log)",
                                    labels=["dev", "kind"])
        missed = CounterMetricFamily("mrc_events_missed",
                                     "Events that left the datapath's log before they were read",
                                     labels=["dev"])
        with self.tally.lock:
            for (device, kind), n in sorted(self.tally.kinds.items()):
                kinds.add_metric([device, kind], n)
            for device, n in sorted(self.tally.missed.items()):
                missed.add_metric([device], n)
        yield kinds
        yield missed

    def _one(self, device, att, family):
        counter = lambda *a: family(CounterMetricFamily, *a)     # noqa: E731
        gauge = lambda *a: family(GaugeMetricFamily, *a)         # noqa: E731
        histogram = lambda *a: family(HistogramMetricFamily, *a)  # noqa: E731
        for name, value in att.counters().items():
            counter(f"mrc_{name}", f"Datapath counter {name} (enum mrc_counter), summed over CPUs",
                    ["dev"]).add_metric([device], value)
        self._sent(device, att, counter, gauge)
        self._received(device, att, counter, gauge, histogram)
        self._roce(device, att, counter)
        self.tally.update(device, events.read(att))

    def _sent(self, device, att, counter, gauge):
        """Per peer prefix; every peer, template peers included before they
        carry traffic (their paths then `unknown`, counters 0)."""
        # one walk of the peers (a template peer's rows carry its own SID)
        rows = paths.list_paths(att, every_template_peer=True)
        sids: dict[str, set[str]] = {}
        agg: dict[str, dict] = {}
        for r in rows:
            a = agg.setdefault(r["prefix"], {"tx_packets": 0, "tx_bytes": 0, "downs": 0,
                                             "states": dict.fromkeys(STATES, 0)})
            for k in ("tx_packets", "tx_bytes", "downs"):
                a[k] += r[k]
            a["states"][r["state"]] = a["states"].get(r["state"], 0) + 1
            if r["peer_sid"] and r["peer_sid"] != "::":
                sids.setdefault(r["prefix"], set()).add(r["peer_sid"])
        info = gauge("mrc_peer_info", "1 for each peer prefix and the SID its paths end at",
                     ["dev", "peer", "sid"])
        for prefix, a in agg.items():
            for sid in sorted(sids.get(prefix) or {""}):
                info.add_metric([device, prefix, sid], 1)
            labels = [device, prefix]
            counter("mrc_peer_tx_packets", "Packets sent to the peer (all its paths)",
                    ["dev", "peer"]).add_metric(labels, a["tx_packets"])
            counter("mrc_peer_tx_bytes", "Bytes sent to the peer (all its paths; a template's "
                    "peers: their template's, shared)",
                    ["dev", "peer"]).add_metric(labels, a["tx_bytes"])
            counter("mrc_peer_path_downs", "Times the peer's paths were taken down",
                    ["dev", "peer"]).add_metric(labels, a["downs"])
            state = gauge("mrc_peer_paths", "The peer's paths in each state", ["dev", "peer", "state"])
            for s in STATES:
                state.add_metric([*labels, s], a["states"].get(s, 0))
        if not self.per_path:
            return
        for r in rows:
            labels = [device, r["prefix"], str(r["path_id"])]
            counter("mrc_path_tx_packets", "Packets sent on the path", ["dev", "peer", "path"]) \
                .add_metric(labels, r["tx_packets"])
            counter("mrc_path_tx_bytes", "Bytes sent on the path", ["dev", "peer", "path"]) \
                .add_metric(labels, r["tx_bytes"])
            counter("mrc_path_downs", "Times the path was taken down", ["dev", "peer", "path"]) \
                .add_metric(labels, r["downs"])
            counter("mrc_path_ce_reports", "The peer's reports that said the path was CE-marked",
                    ["dev", "peer", "path"]).add_metric(labels, r["ce_reports"])
            gauge("mrc_path_up", "1 when the path is up, else 0",
                  ["dev", "peer", "path"]).add_metric(labels, 1 if r["state"] == "up" else 0)
            state = gauge("mrc_path_state", "The path's state (1 for the state it is in)",
                          ["dev", "peer", "path", "state"])
            for s in STATES:
                state.add_metric([*labels, s], 1 if r["state"] == s else 0)

    def _received(self, device, att, counter, gauge, histogram):
        """Per sender SID (paths summed, histograms merged); the
        receiver's LRUs' use (what they evicted: mrc_rx_sender_new or
        mrc_rx_path_new minus these)."""
        rx = stats.received(att)
        reorder = {r["from"]: r for r in stats.reorder(att)}
        for name, held, m in (("senders", len(reorder), "rx_peers"), ("paths", len(rx), "rx_paths")):
            gauge(f"mrc_rx_{name}_held", f"Receive state: {name} held (of mrc_rx_{name}_max)",
                  ["dev"]).add_metric([device], held)
            gauge(f"mrc_rx_{name}_max", f"Receive state: {name} the LRU holds at most",
                  ["dev"]).add_metric([device], att.maps[m].max_entries)
        what = (("packets", "rx_packets", "Packets received"), ("bytes", "rx_bytes", "Bytes received"),
                ("lost", "lost", "Sequence gaps (packets lost)"),
                ("late", "late", "Packets that arrived after a later one of the same path"),
                ("ce", "ce", "Packets that arrived CE-marked (outer ECN)"),
                ("trimmed", "trimmed", "Packets that arrived trimmed by a switch (not lost, not delivered)"))
        per_sender: dict[str, dict] = {}
        for r in rx:
            a = per_sender.setdefault(r["from"], {"hist": [0] * len(r["qdelay_hist"]), "sum": 0,
                                                  **{field: 0 for _, field, _ in what}})
            for _, field, _ in what:
                a[field] += r[field]
            a["sum"] += r["qdelay_sum_us"]
            a["hist"] = [x + y for x, y in zip(a["hist"], r["qdelay_hist"])]
        for sid in sorted(set(per_sender) | set(reorder)):
            labels = [device, sid]
            a = per_sender.get(sid)
            if a:
                for name, field, doc in what[1:]:
                    counter(f"mrc_peer_rx_{name}", f"{doc} from the sender (all its paths)",
                            ["dev", "sid"]).add_metric(labels, a[field])
                _histogram(histogram("mrc_peer_queueing_delay_seconds",
                                     "One-way delay above each path's minimum, per packet received "
                                     "from the sender", ["dev", "sid"]), labels, a["hist"], 1_000_000, a["sum"])
            r = reorder.get(sid)
            if r:
                counter("mrc_peer_rx_packets", "Packets received from the sender (all paths)",
                        ["dev", "sid"]).add_metric(labels, r["packets"])
                counter("mrc_peer_rx_reordered", "Packets from the sender that arrived after a later one",
                        ["dev", "sid"]).add_metric(labels, r["reordered"])
                _histogram(histogram("mrc_peer_reorder_distance_packets",
                                     "How far behind the highest sequence seen a reordered packet arrived",
                                     ["dev", "sid"]), labels, r["reorder_hist"], 1, r["reorder_sum"])
        if not self.per_path:
            return
        for r in rx:
            labels = [device, r["from"], str(r["path_id"])]
            for name, field, doc in what:
                counter(f"mrc_path_rx_{name}", f"{doc} on the path", ["dev", "sid", "path"]) \
                    .add_metric(labels, r[field])
            _histogram(histogram("mrc_path_queueing_delay_seconds",
                                 "One-way delay above the path's minimum, per packet received",
                                 ["dev", "sid", "path"]), labels, r["qdelay_hist"], 1_000_000,
                       r["qdelay_sum_us"])


    def _roce(self, device, att, counter):
        """RoCEv2 (lib/roce.h): per peer, and per path with per_path."""
        what = (("tx_packets", "RoCE packets sent"),
                ("tx_retrans", "RoCE requests sent again (go-back-N retransmissions)"),
                ("naks_seq", "NAKs (PSN sequence error) received for RoCE QPs"),
                ("rx_packets", "RoCE requests received"),
                ("rx_ahead", "RoCE requests that arrived ahead of the PSN expected"),
                ("rx_behind", "RoCE requests that arrived behind the PSN expected"))
        rows = roce.paths(att)
        per_peer: dict[str, dict] = {}
        for r in rows:
            a = per_peer.setdefault(r["peer"], dict.fromkeys((f for f, _ in what), 0))
            for f, _ in what:
                a[f] += r[f]
        for peer, a in sorted(per_peer.items()):
            for f, doc in what:
                counter(f"mrc_peer_roce_{f}", f"{doc} (all paths)", ["dev", "peer"]).add_metric([device, peer], a[f])
        if not self.per_path:
            return
        for r in rows:
            labels = [device, r["peer"], str(r["path_id"]), r["side"]]
            for f, doc in what:
                counter(f"mrc_path_roce_{f}", doc, ["dev", "peer", "path", "side"]).add_metric(labels, r[f])


def registry(per_path: bool = False) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MrcCollector(per_path))
    return reg
