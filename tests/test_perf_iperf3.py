"""mrc-perf as a drop-in for iperf3: its flags (-O -n -w -f -4 -6
--get-server-output --logfile -V --version), a -J whose keys cover
iperf3's for the same test, UDP paced from the first interval, and
iperf3's control protocol both ways (mrc-perf -c against iperf3 -s,
iperf3 -c against mrc-perf -s), with real iperf3 in namespaces as the
witness."""
from __future__ import annotations

import json
import subprocess
import time

import jsonschema
import pytest

from conftest import ROOT
from mrc_ebpf.perf.iperf_json import read_result
from mrc_ebpf.perf.units import fmt_rate
from mrc_ebpf.lab.topology import timeout_scale
from test_perf import (PERF, SCHEMA, Line, Server, _cli, _one_line_error, iperf3_client,
                       iperf3_server, perf_client, perf_server)

root = pytest.mark.root


def key_paths(doc, prefix="") -> set[str]:
    """Every key path of a JSON document; list items merged ([])."""
    out = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(f"{prefix}/{k}")
            out |= key_paths(v, f"{prefix}/{k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= key_paths(v, prefix + "[]")
    return out


class JsonServer(Server):
    """A -J server (silent until its test ends): ready once it listens;
    its document is on stdout when it exits (-1)."""

    def __init__(self, topo, ns, cmd, log, port=5201):
        self.log = log
        self.proc = topo.popen(ns, cmd, stdout=log.open("w"), stderr=subprocess.PIPE, cwd=ROOT)
        give_up = time.monotonic() + 20 * timeout_scale()
        while f":{port} " not in topo.exec(ns, ["ss", "-Hltn"]).stdout:
            if self.proc.poll() is not None or time.monotonic() > give_up:
                self.stop()
                raise AssertionError(f"server did not start: {self.proc.stderr.read()}")
            time.sleep(0.05)

    def doc(self) -> dict:
        self.proc.wait(timeout=30 * timeout_scale())
        return json.loads(self.log.read_text())


def iperf3_json_server(topo, ns, tmp_path, name="iperf3-s"):
    return JsonServer(topo, ns, ["iperf3", "-s", "-1", "-J"], tmp_path / f"{name}.json")


def perf_json_server(topo, ns, tmp_path, *args, name="perf-s"):
    return JsonServer(topo, ns, [*PERF, "-s", "-1", "-J", *args], tmp_path / f"{name}.json")


# ------------------------------------------------------------ no network

def test_rate_format_units_like_iperf3():
    assert fmt_rate(5_086_000_000, "m") == "5086 Mbits/sec"
    assert fmt_rate(20e6, "k") == "20000 Kbits/sec"
    assert fmt_rate(8 * 2**20, "M") == "1.00 MBytes/sec"
    assert fmt_rate(3.3e9, "g") == "3.30 Gbits/sec"
    assert fmt_rate(3.3e9, None) == "3.30 Gbits/sec"


def test_new_flags_bad_input_one_line():
    _one_line_error(_cli("-c", "fd00:99::1", "-f", "x"), "bad format 'x': one of k m g t K M G T")
    _one_line_error(_cli("-c", "fd00:99::1", "-4", "-6"), "give -4 or -6, not both")
    _one_line_error(_cli("-c", "fd00:99::1", "--bidir", "-R"), "give -R or --bidir, not both")
    _one_line_error(_cli("-c", "fd00:99::1", "-w", "big"), "bad window 'big'")
    _one_line_error(_cli("-c", "fd00:99::1", "-n", "lots"), "bad number of bytes 'lots'")
    _one_line_error(_cli("-c", "fd00:99::1", "-O", "-1"), "bad omit")
    # click's own checks come as one line too
    _one_line_error(_cli("-c", "fd00:99::1", "-O", "soon"), "Invalid value for '-O'")
    _one_line_error(_cli("-c", "fd00:99::1", "--no-such-flag"), "No such option")
    _one_line_error(_cli("-s", "-O", "2"), "-O is a client option")
    _one_line_error(_cli("-c", "fd00:99::1", "--logfile", "/nonexistent/dir/log"),
                    "cannot open log file /nonexistent/dir/log")
    # -6 with an IPv4 literal: nothing to connect to
    _one_line_error(_cli("-c", "198.18.0.1", "-6"), "cannot resolve 198.18.0.1 as IPv6 (-6)")
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("mrc-perf ")


# ------------------------------------------------------------ namespaces

@root
def test_json_keys_cover_iperf3s(topo, tmp_path):
    """For the same tests, every key path iperf3 -J writes (client side)
    is in mrc-perf's -J too, which still passes its schema."""
    net = Line(topo)
    for n, args in enumerate((["-t", "1", "-P", "2"], ["-t", "1", "-R"],
                              ["-u", "-b", "10M", "-t", "1"], ["-u", "-b", "10M", "-t", "1", "-R"])):
        with perf_server(topo, net.B, tmp_path, "--no-mrc", name=f"keys{n}"):
            ours = perf_client(topo, net.A, net.B6, "--no-mrc", *args)
        with iperf3_server(topo, net.B, tmp_path):
            theirs = iperf3_client(topo, net.A, net.B6, *args)
        missing = key_paths(theirs) - key_paths(ours)
        assert not missing, (args, sorted(missing))
        cpu = ours["end"]["cpu_utilization_percent"]
        assert cpu["host_total"] == pytest.approx(cpu["host_user"] + cpu["host_system"])
        assert cpu["host_total"] > 0 and cpu["remote_total"] > 0
        assert len(ours["start"]["cookie"]) == 36 and ours["start"]["cookie"].startswith("mrcperf")
        if "-u" not in args:
            stream = ours["intervals"][0]["streams"][0]
            if "-R" not in args:            # the sender's TCP_INFO
                assert stream["pmtu"] == 1500 and stream["snd_wnd"] > 0 and stream["rtt"] > 0
            assert ours["start"]["tcp_mss_default"] == theirs["start"]["tcp_mss_default"]
            # the kernel's defaults, as iperf3 reads them
            for key in ("sndbuf_actual", "rcvbuf_actual", "sock_bufsize"):
                assert ours["start"][key] == theirs["start"][key], key


@root
def test_window_bytes_omit(topo, tmp_path):
    net = Line(topo)
    # -w: both buffers set on the data sockets, the kernel's doubling as iperf3 sees it
    with perf_server(topo, net.B, tmp_path, "--no-mrc", name="w"):
        ours = perf_client(topo, net.A, net.B6, "--no-mrc", "-t", "1", "-w", "256K")
    with iperf3_server(topo, net.B, tmp_path):
        theirs = iperf3_client(topo, net.A, net.B6, "-t", "1", "-w", "256K")
    for key in ("sock_bufsize", "sndbuf_actual", "rcvbuf_actual"):
        assert ours["start"][key] == theirs["start"][key], key
    assert ours["start"]["sock_bufsize"] == 262144 and ours["mrc"]["test"]["window"] == 262144

    # -n: exactly that many bytes over two streams, however long it takes
    with perf_server(topo, net.B, tmp_path, "--no-mrc", name="n"):
        doc = perf_client(topo, net.A, net.B6, "--no-mrc", "-n", "3M", "-P", "2")
    assert doc["end"]["sum_sent"]["bytes"] == 3 << 20 == doc["end"]["sum_received"]["bytes"]
    assert doc["start"]["test_start"]["bytes"] == 3 << 20
    assert doc["start"]["test_start"]["duration"] == 0         # as iperf3 -n writes it
    assert [s["sender"]["bytes"] for s in doc["end"]["streams"]] == [3 << 19, 3 << 19]
    with perf_server(topo, net.B, tmp_path, "--no-mrc", name="nu"):
        doc = perf_client(topo, net.A, net.B6, "--no-mrc", "-u", "-b", "50M", "-l", "1000", "-n", "100K")
    assert doc["end"]["sum_sent"]["packets"] == 103        # ceil(102400 / 1000)

    # -O: the first second's intervals are marked omitted, the rest start at 0
    # again and add up to the summary, as iperf3's do
    with perf_server(topo, net.B, tmp_path, "--no-mrc", name="o"):
        doc = perf_client(topo, net.A, net.B6, "--no-mrc", "-O", "1", "-t", "1", "-i", "0.5")
    omitted = [i for i in doc["intervals"] if i["sum"]["omitted"]]
    counted = [i for i in doc["intervals"] if not i["sum"]["omitted"]]
    assert len(omitted) == 2 and len(counted) == 2 and doc["intervals"][:2] == omitted
    assert all(s["omitted"] for i in omitted for s in i["streams"])
    assert counted[0]["sum"]["start"] == 0 and counted[0]["sum"]["end"] == counted[1]["sum"]["start"]
    sent = doc["end"]["sum_sent"]
    assert sum(i["sum"]["bytes"] for i in counted) == sent["bytes"]
    assert sent["start"] == 0 and sent["end"] == counted[-1]["sum"]["end"]
    assert doc["start"]["test_start"]["omit"] == 1


@root
def test_udp_rate_from_the_first_interval(topo, tmp_path):
    """-u -b 20M: the first interval already carries the asked rate, at
    the sender and (measured by the receiver) at the other end."""
    net = Line(topo)
    with perf_server(topo, net.B, tmp_path, "--no-mrc"):
        doc = perf_client(topo, net.A, net.B6, "--no-mrc", "-u", "-b", "20M", "-t", "2")
    sent = doc["intervals"][0]["sum"]["bits_per_second"]
    received = doc["mrc"]["remote"]["intervals"][0]["sum"]["bits_per_second"]
    print(f"first interval: sent {sent / 1e6:.2f}, received {received / 1e6:.2f} Mbit/s")
    assert abs(sent / 20e6 - 1) < 0.05
    assert abs(received / 20e6 - 1) < 0.1


@root
def test_mrc_perf_client_against_iperf3_server(topo, tmp_path):
    """iperf3 -s -J's own report is the witness of what crossed."""
    net = Line(topo)
    with iperf3_json_server(topo, net.B, tmp_path, "tcp") as server:
        ours = perf_client(topo, net.A, net.B6, "--no-mrc", "-t", "1", "-P", "2")
        theirs = server.doc()
    assert "error" not in theirs and "error" not in ours
    assert ours["end"]["sum_received"]["bytes"] == theirs["end"]["sum_received"]["bytes"] > 0
    assert ours["end"]["sum_sent"]["bytes"] >= ours["end"]["sum_received"]["bytes"]
    assert [s["receiver"]["bytes"] for s in ours["end"]["streams"]] == \
        [s["receiver"]["bytes"] for s in theirs["end"]["streams"]]
    assert theirs["start"]["test_start"]["num_streams"] == 2
    assert ours["end"]["cpu_utilization_percent"]["remote_total"] == \
        pytest.approx(theirs["end"]["cpu_utilization_percent"]["host_total"])
    assert ours["mrc"]["remote"]["intervals"] == []      # iperf3's protocol has none to give

    with iperf3_json_server(topo, net.B, tmp_path, "udp") as server:
        ours = perf_client(topo, net.A, net.B6, "--no-mrc", "-u", "-b", "10M", "-t", "1", "-R")
        theirs = server.doc()
    # the iperf3 server sent; its count of datagrams is ours to judge loss by
    assert ours["end"]["sum_sent"]["packets"] == theirs["end"]["sum_sent"]["packets"] > 0
    received = ours["end"]["sum_received"]
    assert received["packets"] == ours["end"]["sum_sent"]["packets"]
    assert 0 <= received["lost_packets"] < 0.05 * received["packets"]
    assert received["bytes"] > 0 and ours["intervals"][0]["sum"]["packets"] > 0

    # --bidir: what the iperf3 server received of ours, and sent us, are its own figures
    with iperf3_json_server(topo, net.B, tmp_path, "bidir") as server:
        ours = perf_client(topo, net.A, net.B6, "--no-mrc", "-t", "1", "--bidir")
        theirs = server.doc()
    for key in ("sum_received", "sum_sent_bidir_reverse"):
        assert ours["end"][key]["bytes"] == theirs["end"][key]["bytes"] > 0, key
    assert ours["end"]["sum_received_bidir_reverse"]["bytes"] > 0


@root
def test_iperf3_client_against_mrc_perf_server(topo, tmp_path):
    """iperf3 -c against mrc-perf -s -J: iperf3 reads the server's
    results, and both ends' reports agree."""
    net = Line(topo)
    for n, args in enumerate((["-t", "1", "-P", "2"], ["-t", "1", "-R"],
                              ["-u", "-b", "20M", "-t", "1"], ["-t", "1", "--bidir"])):
        with perf_json_server(topo, net.B, tmp_path, "--no-mrc", name=f"srv{n}") as server:
            theirs = iperf3_client(topo, net.A, net.B6, *args)
            ours = server.doc()
        jsonschema.validate(ours, SCHEMA)
        assert "error" not in theirs, theirs.get("error")
        assert read_result(theirs)["received_bytes"] == read_result(ours)["received_bytes"] > 0
        assert read_result(theirs)["sent_bytes"] == read_result(ours)["sent_bytes"]
        assert len(theirs["end"]["streams"]) == len(ours["end"]["streams"]) == \
            theirs["start"]["test_start"]["num_streams"] * (2 if "--bidir" in args else 1)
        if "-u" in args:
            assert theirs["end"]["sum_received"]["lost_packets"] == 0
            assert theirs["end"]["sum_received"]["packets"] == ours["end"]["sum_received"]["packets"]
        assert ours["start"]["cookie"] == theirs["start"]["cookie"]
        if "--bidir" in args:
            for key in ("sum_sent_bidir_reverse", "sum_received_bidir_reverse"):
                assert theirs["end"][key]["bytes"] == ours["end"][key]["bytes"] > 0, key
        if n == 0:      # the server's -J covers iperf3 -s -J's keys too
            with iperf3_json_server(topo, net.B, tmp_path, "srv-ref") as server:
                iperf3_client(topo, net.A, net.B6, *args)
                reference = server.doc()
            missing = key_paths(reference) - key_paths(ours)
            assert not missing, sorted(missing)

    # --get-server-output: iperf3 prints the mrc-perf server's own document
    with perf_json_server(topo, net.B, tmp_path, "--no-mrc", name="gso"):
        theirs = iperf3_client(topo, net.A, net.B6, "-t", "1", "--get-server-output")
    out = theirs["server_output_json"]
    assert out["end"]["sum_received"]["bytes"] == theirs["end"]["sum_received"]["bytes"]
    assert out["mrc"]["role"] == "server"


@root
def test_server_output_logfile_verbose(topo, tmp_path):
    net = Line(topo)
    log = tmp_path / "client.log"
    with perf_server(topo, net.B, tmp_path, "--no-mrc", name="text"):
        result = subprocess.run(["ip", "netns", "exec", net.A, *PERF, "-c", net.B6, "--no-mrc", "-t", "1",
                                 "-V", "-f", "m", "--get-server-output", "--logfile", str(log)],
                                capture_output=True, text=True, cwd=ROOT, timeout=60 * timeout_scale())
    assert result.returncode == 0 and result.stdout == "", result.stderr
    text = log.read_text()
    assert "Cookie: mrcperf" in text and "CPU Utilization: local/sender" in text
    assert "Mbits/sec" in text and "Gbits/sec" not in text.split("Server output:")[0]
    assert "Server output:" in text and "Accepted connection from" in text.split("Server output:")[1]

    with perf_json_server(topo, net.B, tmp_path, "--no-mrc", name="json"):
        doc = perf_client(topo, net.A, net.B4, "--no-mrc", "-t", "1", "-4", "--get-server-output")
    assert doc["server_output_json"]["end"]["sum_received"]["bytes"] == doc["end"]["sum_received"]["bytes"]
    assert doc["start"]["connecting_to"]["host"] == net.B4

    # -4 on the server: IPv6 clients are refused
    with perf_server(topo, net.B, tmp_path, "--no-mrc", "-4", name="v4"):
        refused = subprocess.run(["ip", "netns", "exec", net.A, *PERF, "-c", net.B6, "-t", "1"],
                                 capture_output=True, text=True, cwd=ROOT, timeout=30)
        _one_line_error(refused, "Connection refused")
        doc = perf_client(topo, net.A, net.B4, "--no-mrc", "-t", "1")
    assert doc["end"]["sum_received"]["bytes"] > 0


@root
def test_bidir(topo, tmp_path):
    """--bidir: -P streams each way at once; iperf3's layout (sum /
    sum_bidir_reverse per interval, *_bidir_reverse at the end), its keys
    covered, each half's intervals adding up to its summary."""
    net = Line(topo)
    for n, args in enumerate((["-t", "1", "--bidir"], ["-u", "-b", "10M", "-t", "1", "--bidir", "-P", "2"])):
        with perf_server(topo, net.B, tmp_path, "--no-mrc", name=f"bidir{n}"):
            ours = perf_client(topo, net.A, net.B6, "--no-mrc", *args)
        with iperf3_server(topo, net.B, tmp_path):
            theirs = iperf3_client(topo, net.A, net.B6, *args)
        missing = key_paths(theirs) - key_paths(ours)
        assert not missing, (args, sorted(missing))
        p = ours["start"]["test_start"]["num_streams"]
        end = ours["end"]
        assert len(end["streams"]) == len(theirs["end"]["streams"]) == 2 * p
        assert len(ours["start"]["connected"]) == 2 * p
        for half, sent, received in (("sum", "sum_sent", "sum_received"),
                                     ("sum_bidir_reverse", "sum_sent_bidir_reverse",
                                      "sum_received_bidir_reverse")):
            assert 0 < end[received]["bytes"] <= end[sent]["bytes"]
            # the client sends the first half, receives the second
            first = half == "sum"
            assert all(i[half]["sender"] is first for i in ours["intervals"])
            mine = end[sent] if first else end[received]
            assert sum(i[half]["bytes"] for i in ours["intervals"]) == mine["bytes"]
        for rep in ours["intervals"]:
            assert [s["sender"] for s in rep["streams"]] == [True] * p + [False] * p
        if "-u" in args:
            assert end["sum_received"]["lost_packets"] == end["sum_received_bidir_reverse"]["lost_packets"] == 0
