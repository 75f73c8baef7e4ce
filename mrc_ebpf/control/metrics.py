"""Prometheus metrics of the attachments in this network namespace.

Read from the pinned maps at each scrape (nothing is sampled in between),
so a scrape shows the same numbers `mrcctl stats -j` would at that moment.

* `mrc_<counter>_total{dev}`: each datapath counter (enum mrc_counter).
* per path, labels dev, peer (the peer prefix when sending, the sender's
  SID when receiving), path (its id): `mrc_path_tx_{packets,bytes}_total`,
  `mrc_path_downs_total`, `mrc_path_rx_{packets,bytes,lost,late}_total`;
  per sender `mrc_peer_rx_{packets,reordered}_total`.
* histograms from the datapath's log2 buckets: one-way queueing delay per
  path received (`mrc_path_queueing_delay_seconds`) and reorder distance
  per sender (`mrc_peer_reorder_distance_packets`); the buckets' upper
  bounds are 2^i - 1 (us or packets); the maps keep no sum, so there is no
  `_sum` nor `_count` (histogram_quantile does not need them; the +Inf
  bucket is the count).
* `mrc_path_up` (1 up, else 0) and `mrc_path_state{state}` (up, assumed-bad, denied, unknown, skip);
  `mrc_path_ce_reports_total` (sent: the peer's reports of CE marks) and
  `mrc_path_rx_ce_total` (received CE-marked).
* `mrc_events_total{dev,kind}`: path events (down, up, fail-open, late),
  counted by this process as it reads the datapath's event log; events
  that scrolled out of the log between two scrapes (more than MRC_EVENTS)
  are counted in `mrc_events_missed_total`.
"""
from __future__ import annotations

import threading

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.registry import CollectorRegistry

from mrc_ebpf.control import events, paths, stats
from mrc_ebpf.datapath import loader, pins
from mrc_ebpf.errors import MrcError

STATES = ("up", "assumed-bad", "denied", "unknown", "skip")     # MRC's path states (path list)


def _buckets(hist: list[int], scale: float) -> list[tuple[str, float]]:
    """Cumulative buckets with upper bounds 2^i - 1 (times scale); the
    last of the datapath's buckets holds everything above, so it is +Inf."""
    out, seen = [], 0
    for i, n in enumerate(hist[:-1]):
        seen += n
        out.append((repr(stats.bucket_upper(i) * scale), seen))
    out.append(("+Inf", seen + hist[-1]))
    return out


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
    def __init__(self):
        self.tally = EventTally()

    def describe(self):
        return []

    def collect(self):
        up = GaugeMetricFamily("mrc_attached", "1 when the attachment's pinned state could be read",
                               labels=["dev"])
        families: dict[str, object] = {}

        def counter(name, doc, labels):
            if name not in families:
                families[name] = CounterMetricFamily(name, doc, labels=labels)
            return families[name]

        def gauge(name, doc, labels):
            if name not in families:
                families[name] = GaugeMetricFamily(name, doc, labels=labels)
            return families[name]

        def histogram(name, doc, labels):
            if name not in families:
                families[name] = HistogramMetricFamily(name, doc, labels=labels)
            return families[name]

        for device in pins.attached_devices():
            try:
                att = loader.Attachment.open(device)
            except MrcError:
                up.add_metric([device], 0)
                continue
            with att:
                up.add_metric([device], 1)
                self._one(device, att, counter, gauge, histogram)
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

    def _one(self, device, att, counter, gauge, histogram):
        for name, value in att.counters().items():
            counter(f"mrc_{name}", f"Datapath counter {name} (enum mrc_counter), summed over CPUs",
                    ["dev"]).add_metric([device], value)
        for r in paths.list_paths(att):
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
        for r in stats.received(att):
            labels = [device, r["from"], str(r["path_id"])]
            for what, doc in (("packets", "Packets received on the path"),
                              ("bytes", "Bytes received on the path"),
                              ("lost", "Sequence gaps on the path (packets lost)"),
                              ("late", "Packets that arrived after a later one of the path"),
                              ("ce", "Packets that arrived CE-marked (outer ECN) on the path")):
                counter(f"mrc_path_rx_{what}", doc, ["dev", "peer", "path"]) \
                    .add_metric(labels, r[f"rx_{what}"] if what in ("packets", "bytes") else r[what])
            histogram("mrc_path_queueing_delay_seconds",
                      "One-way delay above the path's minimum, per packet received",
                      ["dev", "peer", "path"]).add_metric(labels, _buckets(r["qdelay_hist"], 1e-6), None)
        for r in stats.reorder(att):
            labels = [device, r["from"]]
            counter("mrc_peer_rx_packets", "Packets received from the sender (all paths)",
                    ["dev", "peer"]).add_metric(labels, r["packets"])
            counter("mrc_peer_rx_reordered", "Packets from the sender that arrived after a later one",
                    ["dev", "peer"]).add_metric(labels, r["reordered"])
            histogram("mrc_peer_reorder_distance_packets",
                      "How far behind the highest sequence seen a reordered packet arrived",
                      ["dev", "peer"]).add_metric(labels, _buckets(r["reorder_hist"], 1), None)
        self.tally.update(device, events.read(att))


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MrcCollector())
    return reg
