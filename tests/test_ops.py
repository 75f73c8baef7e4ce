"""Operations verbs on a real sprayed Diamond: the Prometheus exporter
(its page against `mrcctl stats -j` read at the same moment) and
`mrcctl decode` (a tcpdump capture against the maps' per-path counts)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import MRCCTL, ROOT, mrcctl
from mrc_ebpf.datapath.source import C

pytestmark = pytest.mark.root


def _samples(page: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of a Prometheus text page."""
    out = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _scrape(topo, ns, port) -> str:
    code = ("import sys, urllib.request\n"
            f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{port}/metrics', timeout=10)"
            ".read().decode())")
    return topo.exec(ns, [sys.executable, "-c", code]).stdout


def _start_exporter(topo, ns, port):
    proc = topo.popen(ns, [*MRCCTL, "exporter", "--listen", f"127.0.0.1:{port}"], cwd=ROOT,
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "serving metrics" not in line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"exporter did not start: {line}{proc.stderr.read()}")
    return proc


def _families(page: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(page)}


def _check_histograms(page: str) -> int:
    """Every histogram is a real one to the parser: buckets cumulative with
    clean `le` bounds, ending in +Inf, `_count` equal to +Inf, and one
    `_sum` that the buckets bound: each observation in bucket (lo, le]
    adds more than lo and at most le (the datapath's own sum, kept beside
    the buckets, checked against them)."""
    import re
    n = 0
    for f in text_string_to_metric_families(page):
        if f.type != "histogram":
            continue
        series: dict[tuple, list] = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            series.setdefault(key, []).append(s)
        for key, samples in series.items():
            buckets = [s for s in samples if s.name.endswith("_bucket")]
            counts = [s.value for s in samples if s.name.endswith("_count")]
            assert buckets[-1].labels["le"] == "+Inf" and counts == [buckets[-1].value], (f.name, key)
            values = [b.value for b in buckets]
            assert values == sorted(values), (f.name, key)
            (total,) = [s.value for s in samples if s.name.endswith("_sum")]
            bounds = [float(b.labels["le"]) for b in buckets[:-1]]
            lo = hi = 0.0
            for i, b in enumerate(buckets):
                k = b.value - (buckets[i - 1].value if i else 0)
                # bucket i holds [2^(i-1), 2^i - 1]: its lower bound is the
                # previous bound plus one unit (1 us or 1 packet)
                unit = 1e-6 if f.name.endswith("_seconds") else 1
                lo += k * ((bounds[i - 1] + unit) if i else 0)
                if k:
                    hi += k * (bounds[i] if i < len(bounds) else float("inf"))
            assert lo * (1 - 1e-9) <= total <= hi * (1 + 1e-9), (f.name, key, lo, total, hi)
            for b in buckets[:-1]:
                le = b.labels["le"]
                # the bound as written is the shortest text of 2^i - 1 (us or packets)
                assert re.fullmatch(r"\d+(\.\d+)?(e-\d\d)?", le), le
                scaled = float(le) * (1e6 if f.name.endswith("_seconds") else 1)
                assert round(scaled) + 1 & round(scaled) == 0 and len(le) <= 8, le
            n += 1
    return n


def _traffic_and_a_down(spray):
    """Traffic both ways over all four paths, and a down of path 1 (R2's
    far link down: a real black hole) so that events exist."""
    assert spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6],
                        check=False).returncode == 0
    spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "down"])
    spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6], check=False)
    spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "up"])
    spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6], check=False)
    time.sleep(0.3)         # traffic stopped: the maps hold still


def test_exporter_matches_stats(spray):
    """The default page (per peer and per sender) read by prometheus_client's
    own parser equals `stats -j` read at the same moment, and a template
    peer that never carried traffic is on it."""
    spray.attach("rr")
    _traffic_and_a_down(spray)
    # a template peer: no traffic, no learnt state, yet a series
    mrcctl("path", "template", "add", "spines", "--via", "fc00:1:1::", "--via", "fc00:1:2::",
           netns=spray.A)
    mrcctl("path", "add", "fd00:77::/64", "--template", "spines", "--sid", "fc00:77::1", netns=spray.A)

    port = 20000 + os.getpid() % 20000
    proc = _start_exporter(spray.t, spray.A, port)
    try:
        page = _scrape(spray.t, spray.A, port)
        counters = json.loads(mrcctl("stats", "-j", netns=spray.A).stdout)["counters"]
        by_path = json.loads(mrcctl("stats", "--paths", "-j", netns=spray.A).stdout)
        ev = json.loads(mrcctl("stats", "--events", "-j", netns=spray.A).stdout)["events"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
    samples = _samples(page)
    dev = (("dev", "a0"),)
    assert samples[("mrc_attached", dev)] == 1
    for name, value in counters.items():
        assert samples[(f"mrc_{name}_total", dev)] == value, name
    assert counters["tx_encap"] > 0 and counters["rx_decap"] > 0
    assert not any(name.startswith("mrc_path_") for name, _ in samples)       # per path: opt-in

    def lab(**kv):
        return tuple(sorted({"dev": "a0", **kv}.items()))
    sent = [r for r in by_path["sent"] if r["prefix"] == "fd00:b::/64"]
    assert len(sent) == 4 and any(r["downs"] for r in sent)               # the black hole was seen
    peer = lab(peer="fd00:b::/64")
    assert samples[("mrc_peer_tx_packets_total", peer)] == sum(r["tx_packets"] for r in sent) > 0
    assert samples[("mrc_peer_tx_bytes_total", peer)] == sum(r["tx_bytes"] for r in sent)
    assert samples[("mrc_peer_path_downs_total", peer)] == sum(r["downs"] for r in sent)
    for state in ("up", "assumed-bad", "denied", "unknown"):
        assert samples[("mrc_peer_paths", lab(peer="fd00:b::/64", state=state))] == \
            sum(r["state"] == state for r in sent), state
    assert samples[("mrc_peer_info", lab(peer="fd00:b::/64", sid=spray.B_SID))] == 1
    # the template peer, before any traffic: its SID, two paths unknown, nothing sent
    tpl = lab(peer="fd00:77::/64")
    assert samples[("mrc_peer_info", lab(peer="fd00:77::/64", sid="fc00:77::1"))] == 1
    assert samples[("mrc_peer_paths", lab(peer="fd00:77::/64", state="unknown"))] == 2
    assert samples[("mrc_peer_tx_packets_total", tpl)] == 0

    # received: per sender SID (the label `sid`, never `peer`)
    senders = {r["from"] for r in by_path["received"]}
    assert senders == {spray.B_SID}
    for sid in senders:
        rows = [r for r in by_path["received"] if r["from"] == sid]
        s = lab(sid=sid)
        assert samples[("mrc_peer_rx_bytes_total", s)] == sum(r["rx_bytes"] for r in rows)
        assert samples[("mrc_peer_rx_lost_total", s)] == sum(r["lost"] for r in rows)
        assert samples[("mrc_peer_rx_late_total", s)] == sum(r["late"] for r in rows)
        merged = [sum(col) for col in zip(*(r["qdelay_hist"] for r in rows))]
        buckets = [v for (name, labels), v in samples.items()
                   if name == "mrc_peer_queueing_delay_seconds_bucket" and dict(labels)["sid"] == sid]
        assert sorted(buckets) == [sum(merged[:i + 1]) for i in range(len(merged))]
        assert samples[("mrc_peer_queueing_delay_seconds_count", s)] == sum(merged) > 0
        assert samples[("mrc_peer_queueing_delay_seconds_sum", s)] == \
            pytest.approx(sum(r["qdelay_sum_us"] for r in rows) / 1e6)
    for r in by_path["reorder"]:
        s = lab(sid=r["from"])
        assert samples[("mrc_peer_rx_packets_total", s)] == r["packets"]
        assert samples[("mrc_peer_rx_reordered_total", s)] == r["reordered"]
        assert samples[("mrc_peer_reorder_distance_packets_count", s)] == sum(r["reorder_hist"])
        assert samples[("mrc_peer_reorder_distance_packets_sum", s)] == r["reorder_sum"]
    # the receiver's LRUs (issue 28): held of their size; evicted = made - held
    assert samples[("mrc_rx_senders_held", dev)] == len(by_path["reorder"]) == 1
    assert samples[("mrc_rx_paths_held", dev)] == len(by_path["received"])
    assert samples[("mrc_rx_senders_max", dev)] == C["MRC_RX_MAX_SENDERS"]
    assert samples[("mrc_rx_paths_max", dev)] == C["MRC_RX_MAX_PATHS"]
    assert counters["rx_sender_new"] == 1 and counters["rx_path_new"] == len(by_path["received"])
    assert _check_histograms(page) == 2
    # `le` as an operator reads it: 15 us is 1.5e-05
    les = {dict(labels)["le"] for name, labels in samples if name.endswith("_seconds_bucket")}
    assert "1.5e-05" in les and "0.016383" in les and not any("999999" in le for le in les), les

    kinds: dict[str, int] = {}
    for e in ev:
        kinds[e["type"]] = kinds.get(e["type"], 0) + 1
    assert kinds.get("down", 0) >= 1, ev
    for kind, n in kinds.items():
        assert samples[("mrc_events_total", (("dev", "a0"), ("kind", kind)))] == n


def test_exporter_per_path_series(spray):
    """`exporter --per-path --once`: the per-path series, labels `peer`
    (prefix) on what was sent and `sid` (sender) on what was received,
    equal to `stats --paths -j`."""
    spray.attach("rr")
    _traffic_and_a_down(spray)
    page = mrcctl("exporter", "--per-path", "--once", netns=spray.A).stdout
    by_path = json.loads(mrcctl("stats", "--paths", "-j", netns=spray.A).stdout)
    samples = _samples(page)
    for r in by_path["sent"]:
        labels = tuple(sorted({"dev": "a0", "peer": r["prefix"], "path": str(r["path_id"])}.items()))
        assert samples[("mrc_path_tx_packets_total", labels)] == r["tx_packets"]
        assert samples[("mrc_path_tx_bytes_total", labels)] == r["tx_bytes"]
        assert samples[("mrc_path_downs_total", labels)] == r["downs"]
        assert samples[("mrc_path_ce_reports_total", labels)] == r["ce_reports"]
        assert samples[("mrc_path_up", labels)] == (r["state"] == "up")
        state = tuple(sorted({**dict(labels), "state": r["state"]}.items()))
        assert samples[("mrc_path_state", state)] == 1
    assert len(by_path["sent"]) == 4 and sum(r["tx_packets"] for r in by_path["sent"]) > 0
    for r in by_path["received"]:
        labels = tuple(sorted({"dev": "a0", "sid": r["from"], "path": str(r["path_id"])}.items()))
        assert samples[("mrc_path_rx_packets_total", labels)] == r["rx_packets"]
        assert samples[("mrc_path_rx_bytes_total", labels)] == r["rx_bytes"]
        assert samples[("mrc_path_rx_lost_total", labels)] == r["lost"]
        assert samples[("mrc_path_rx_late_total", labels)] == r["late"]
        assert samples[("mrc_path_queueing_delay_seconds_count", labels)] == sum(r["qdelay_hist"])
        assert samples[("mrc_path_queueing_delay_seconds_sum", labels)] == \
            pytest.approx(r["qdelay_sum_us"] / 1e6)
        assert samples[("mrc_path_rx_ce_total", labels)] == r["ce"]
        inf = tuple(sorted({**dict(labels), "le": "+Inf"}.items()))
        assert samples[("mrc_path_queueing_delay_seconds_bucket", inf)] == sum(r["qdelay_hist"])
    assert by_path["received"]
    # per peer and per sender are there too; 4 paths received + 2 per sender
    assert _check_histograms(page) == 2 + len(by_path["received"])
    assert not [name for name, labels in samples if dict(labels).get("peer", "").count(":") > 0
                and name.startswith(("mrc_path_rx", "mrc_peer_rx"))]


def test_exporter_bad_listen_one_line():
    r = mrcctl("exporter", "--listen", "nowhere", check=False)
    assert r.returncode == 1 and "bad --listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_decode_agrees_with_the_maps(spray, tmp_path):
    """tcpdump on L1's link to A sees every packet A sends and receives
    encapsulated (A's own XDP decapsulates before a capture on A would);
    `mrcctl decode` counts them per sender and path, and A's maps count
    the same: sent per path, and received per sender and path."""
    spray.attach("rr")
    pcap = tmp_path / "l1a.pcap"
    proc = spray.t.popen(spray.L1, ["tcpdump", "-i", "l1a", "-U", "--immediate-mode", "-n", "-w", str(pcap),
                                    "ip6"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert b"listening on" in proc.stderr.readline(), "tcpdump did not start"
        assert spray.t.exec(spray.A, ["ping", "-c", "30", "-i", "0.01", "-W", "1", spray.B6],
                            check=False).returncode == 0
        spray.udp(200, pps=1000)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    by_path = json.loads(mrcctl("stats", "--paths", "-j", netns=spray.A).stdout)
    out = subprocess.run([*MRCCTL, "decode", str(pcap), "-j"], capture_output=True, text=True, cwd="/",
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    packets, summary = lines[:-1], lines[-1]["summary"]
    decoded = {(s["src"], s["path_id"]): s["packets"] for s in summary}
    sent = {(spray.A_SID, r["path_id"]): r["tx_packets"] for r in by_path["sent"]}
    received = {(r["from"], r["path_id"]): r["rx_packets"] for r in by_path["received"]}
    assert sent and received and all(sent.values()) and all(received.values())
    assert {k: v for k, v in decoded.items() if k[0] == spray.A_SID} == sent
    assert {k: v for k, v in decoded.items() if k[0] == spray.B_SID} == received
    # each packet's view: the sequences of a path count up from 0 on the wire
    for (src, pid), n in decoded.items():
        seqs = [p["mrc"]["path_seq"] for p in packets if (p["mrc"]["src"], p["mrc"]["path_id"]) == (src, pid)]
        assert sorted(seqs) == list(range(min(seqs), min(seqs) + n))
    assert any(p["mrc"]["feedback"] for p in packets)       # B's replies carry feedback on A's paths


def test_decode_loads_in_plain_scapy(tmp_path):
    """The scapy layer on its own: a fresh interpreter with scapy and the
    layer, no bcc, dissects an MRC TLV built by scapy."""
    code = ("from scapy.all import IPv6, IPv6ExtHdrSegmentRouting, ICMPv6EchoRequest, raw\n"
            "from mrc_ebpf.datapath import wire\n"
            "p = IPv6(src='fc00:a::1', dst='fc00:1:1::')/IPv6ExtHdrSegmentRouting(addresses=['fc00:b::1',"
            "'fc00:1:1::'], segleft=1, tlv_objects=[wire.MrcTLV(path_id=3, path_seq=7)])/IPv6()/ICMPv6EchoRequest()\n"
            "v = wire.describe(IPv6(raw(p)))\n"
            "import sys; assert 'bcc' not in sys.modules\n"
            "print(v['path_id'], v['path_seq'], ','.join(v['segments']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "7", "fc00:1:1::,fc00:b::1"]


def test_decode_bad_file_one_line(tmp_path):
    bad = tmp_path / "not.pcap"
    bad.write_text("hello")
    for path in (bad, tmp_path / "missing.pcap"):
        r = subprocess.run([*MRCCTL, "decode", str(path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stderr.startswith("mrcctl: error: cannot read"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_monitor_reports_a_black_hole_within_100ms(spray):
    """`monitor -j` reads the datapath's event ring: a black-holed path's
    `down` line is read within 100 ms of the event's kernel timestamp,
    every line is JSON, and the lines are the events the log holds."""
    spray.attach("rr")
    assert spray.t.exec(spray.A, ["ping", "-c", "20", "-i", "0.01", "-W", "1", spray.B6],
                        check=False).returncode == 0
    before = {e["seq"] for e in json.loads(mrcctl("stats", "--events", "-j", netns=spray.A).stdout)["events"]}
    proc = spray.t.popen(spray.A, [*MRCCTL, "monitor", "-j", "--timeout", "60"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "monitoring path events on a0" in proc.stderr.readline()
        spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "down"])
        spray.t.exec(spray.A, ["ping", "-c", "50", "-i", "0.01", "-W", "1", spray.B6], check=False)
        spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "up"])
        spray.t.exec(spray.A, ["ping", "-c", "50", "-i", "0.01", "-W", "1", spray.B6], check=False)
        time.sleep(0.5)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]      # every line is JSON
    # path 1's down; a live path may go down too, first (1 run in 6):
    # its last send before the pause, a lone one, is acknowledged only by
    # B's next report, told once, which may ride B's own path 1 (dead too)
    # (docs/design/failover.md, "A lone unheard send")
    downs = [e for e in lines if e["type"] == "down" and e["path_id"] == 1]
    assert downs and downs[0]["prefix"] == "fd00:b::/64", lines
    for e in lines:
        assert 0 <= e["read_ns"] - e["ns"] < 100_000_000, e
    logged = json.loads(mrcctl("stats", "--events", "-j", netns=spray.A).stdout)["events"]
    assert [e["seq"] for e in lines] == [e["seq"] for e in logged if e["seq"] not in before]
    print(f"monitor: down read {(downs[0]['read_ns'] - downs[0]['ns']) / 1e6:.3f} ms after the event; "
          f"max over {len(lines)} events {max(e['read_ns'] - e['ns'] for e in lines) / 1e6:.3f} ms")


def _tmux(sock, *args):
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30)


def test_top_in_tmux_shows_what_stats_shows(spray):
    """`top` on a terminal (tmux): while traffic runs every path shows a
    rate; once it stops, its cumulative counts are those `stats -j` reads."""
    spray.attach("rr")
    sock = f"mrct{os.getpid()}"
    cmd = " ".join(["ip", "netns", "exec", spray.A, *MRCCTL, "top", "-d", "0.3"])
    assert _tmux(sock, "new-session", "-d", "-x", "200", "-y", "50", cmd).returncode == 0
    try:
        ping = spray.t.popen(spray.A, ["ping", "-c", "300", "-i", "0.01", "-q", spray.B6],
                             stdout=subprocess.DEVNULL)
        time.sleep(2)
        busy = _tmux(sock, "capture-pane", "-p").stdout
        ping.wait(timeout=30)
        time.sleep(1.5)                 # a few refreshes after the traffic stopped
        idle = _tmux(sock, "capture-pane", "-p").stdout
        rows = json.loads(mrcctl("path", "list", "-j", netns=spray.A).stdout)
    finally:
        _tmux(sock, "kill-server")

    def sent_rows(pane):
        out = {}
        for line in pane.splitlines():
            f = line.split()
            if len(f) >= 6 and f[0] == "fd00:b::/64":
                out[int(f[1])] = {"state": f[2], "pps": float(f[3]), "tx_packets": int(f[-3])}
        return out
    during, after = sent_rows(busy), sent_rows(idle)
    assert sorted(during) == [0, 1, 2, 3], busy
    assert all(r["pps"] > 0 and r["state"] == "up" for r in during.values()), busy
    assert {r["path_id"]: r["tx_packets"] for r in rows} == {k: r["tx_packets"] for k, r in after.items()}, idle
    assert all(r["pps"] == 0 for r in after.values()), idle
    assert "received" in idle and spray.B_SID in idle
