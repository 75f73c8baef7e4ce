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


def test_exporter_matches_stats(spray):
    spray.attach("rr")
    # traffic both ways over all four paths, and a down/up of path 1 (R2's
    # far link down: a real black hole) so that events exist
    assert spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6],
                        check=False).returncode == 0
    spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "down"])
    spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6], check=False)
    spray.t.exec(spray.R[1], ["ip", "link", "set", "rdown", "up"])
    spray.t.exec(spray.A, ["ping", "-c", "40", "-i", "0.01", "-W", "1", spray.B6], check=False)
    time.sleep(0.3)         # traffic stopped: the maps hold still

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

    for r in by_path["sent"]:
        labels = tuple(sorted({"dev": "a0", "peer": r["prefix"], "path": str(r["path_id"])}.items()))
        assert samples[("mrc_path_tx_packets_total", labels)] == r["tx_packets"]
        assert samples[("mrc_path_tx_bytes_total", labels)] == r["tx_bytes"]
        assert samples[("mrc_path_downs_total", labels)] == r["downs"]
        assert samples[("mrc_path_up", labels)] == (r["state"] == "up")
        state = tuple(sorted({**dict(labels), "state": r["state"]}.items()))
        assert samples[("mrc_path_state", state)] == 1
    assert len(by_path["sent"]) == 4 and sum(r["tx_packets"] for r in by_path["sent"]) > 0
    assert any(r["downs"] for r in by_path["sent"])        # the black hole was seen
    for r in by_path["received"]:
        labels = tuple(sorted({"dev": "a0", "peer": r["from"], "path": str(r["path_id"])}.items()))
        assert samples[("mrc_path_rx_packets_total", labels)] == r["rx_packets"]
        assert samples[("mrc_path_rx_lost_total", labels)] == r["lost"]
        inf = tuple(sorted({**dict(labels), "le": "+Inf"}.items()))
        assert samples[("mrc_path_queueing_delay_seconds_bucket", inf)] == sum(r["qdelay_hist"])
    assert by_path["received"]
    for r in by_path["reorder"]:
        labels = (("dev", "a0"), ("peer", r["from"]))
        assert samples[("mrc_peer_rx_reordered_total", labels)] == r["reordered"]

    kinds: dict[str, int] = {}
    for e in ev:
        kinds[e["type"]] = kinds.get(e["type"], 0) + 1
    assert kinds.get("down", 0) >= 1, ev
    for kind, n in kinds.items():
        assert samples[("mrc_events_total", (("dev", "a0"), ("kind", kind)))] == n


def test_exporter_bad_listen_one_line():
    r = mrcctl("exporter", "--listen", "nowhere", check=False)
    assert r.returncode == 1 and "bad --listen" in r.stderr and len(r.stderr.strip().splitlines()) == 1
