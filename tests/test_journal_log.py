"""The change log's file format (datapath/journal.py), without root: a line
cut short by a kill is a step whose write never began and is ignored; a
file that is not a log is not taken for one; steps carry bytes intact."""
from __future__ import annotations

import base64
import json

import pytest

from mrc_ebpf.datapath import journal
from mrc_ebpf.errors import MrcError


def _log(tmp_path, lines: list[bytes]):
    path = tmp_path / "ns1.log"
    path.write_bytes(b"".join(lines))
    return path


HEADER = json.dumps({"op": "begin", "boot": "b", "pid": 7, "command": "mrcctl path bulk f",
                     "time": 0}).encode() + b"\n"


def test_a_torn_last_line_is_ignored(tmp_path):
    step = json.dumps({"op": "gso", "device": "a0", "segs": 65535}).encode()
    header, steps = journal.read(_log(tmp_path, [HEADER, step + b"\n", step[:9]]))
    assert header["pid"] == 7 and steps == [json.loads(step)]
    # torn inside the header: no log at all (nothing was written yet)
    assert journal.read(_log(tmp_path, [HEADER[:20]])) == (None, [])


def test_other_files_are_not_logs(tmp_path):
    assert journal.read(tmp_path / "missing.log") == (None, [])
    other = json.dumps({"op": "gso", "device": "a0", "segs": 1}).encode() + b"\n"
    assert journal.read(_log(tmp_path, [other])) == (None, [])
    with pytest.raises(MrcError, match="unreadable change log"):
        journal.read(_log(tmp_path, [HEADER, b"{not json\n"]))


def test_map_steps_keep_their_bytes_and_order(tmp_path):
    log = journal.Log(None)          # in memory only
    j = journal.Journal(log)
    j.record_map("/x/peers", delete=b"\x00\xff" * 10)
    j.record_map("/x/peer_by_sid", keys=b"k" * 16, values=b"\x01\x00\x00\x00")
    j.record_routes([("fd00:2::/64", [(3, "fd00:1::1", 1400, (("rto_min", "5ms"),))])])
    ops = [s["op"] for s in log.steps]
    assert ops == ["map", "map", "routes"]
    assert base64.b64decode(log.steps[0]["delete"]) == b"\x00\xff" * 10
    assert base64.b64decode(log.steps[1]["values"]) == b"\x01\x00\x00\x00"
    # as logged to disk: JSON lines that read back equal
    path = tmp_path / "ns2.log"
    path.write_text(HEADER.decode() + "".join(json.dumps(s) + "\n" for s in log.steps))
    assert journal.read(path)[1] == json.loads(json.dumps(log.steps))


def test_fail_write_counts_batches_element_by_element(monkeypatch):
    monkeypatch.setenv("MRC_FAIL_WRITE", "5")
    j = journal.Journal()
    assert j.reserve(3, "a") is None
    assert j.reserve(4, "b") == 1        # the 5th write is the 2nd of this batch
