"""`mrcctl monitor`: every reader gets every event (issue 31).

Events come from real failover on the sprayed Diamond: the lab's fault
program drops half of the packets on every router's link towards B, with
fast timers, so paths go down and come back up by the thousand (about
2,500 events a second here).  The witness is the datapath's own event
sequence numbers and its log, read by `stats --events -j`."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MRCCTL, ROOT, UDP_SEND, mrcctl
from mrc_ebpf.datapath import bpfsys, layout
from mrc_ebpf.datapath.source import C
from mrc_ebpf.lab import faults

pytestmark = pytest.mark.root

# fast failover so that a second of traffic makes thousands of events
FAST = ("--ack-timeout-us", "200", "--probe-us", "50", "--reorder-max-us", "0")
LOG = C["MRC_EVENTS"]       # the event log's slots


def _log(net) -> list[dict]:
    return json.loads(mrcctl("stats", "--events", "-j", netns=net.A).stdout)["events"]


def _flap(net, events: int, pps=20000, routers=4, limit_s=20.0) -> None:
    """Half the packets lost on ROUTERS' links towards B while UDP runs,
    until EVENTS more events were filed (how fast they come depends on how
    busy the machine is).  The count is read from A's pinned `event_seq`
    (the bpffs is the host's): cheaper than a command per look."""
    pins = Path(json.loads(mrcctl("status", "-j", netns=net.A).stdout)[0]["pins"])
    seq = bpfsys.PinnedMap(str(pins / "event_seq"), layout.Index, layout.u64)
    filed = lambda: seq.lookup(layout.Index(0)).value      # noqa: E731
    first = filed()
    holes = [(r, "rup") for r in net.R[:routers]]
    for h in holes:
        faults.inject(*h, "loss", 0.5)
    sender = net.t.popen(net.A, [*UDP_SEND, net.B6, "9", str(int(pps * limit_s)), f"--pps={pps}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while filed() - first < events and sender.poll() is None:
            time.sleep(0.05)
    finally:
        sender.kill()
        sender.wait()
        seq.close()
        for h in holes:
            faults.heal(*h)


class Reader:
    """`mrcctl monitor -j` in A, its lines in a file (a pipe left unread
    would block it)."""

    def __init__(self, net, path):
        self.path = path
        self.out = open(path, "w")
        self.proc = net.t.popen(net.A, [*MRCCTL, "monitor", "-j"], cwd=ROOT, stdout=self.out,
                                stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        m = re.search(r"monitoring path events on a0 \(from seq (\d+)\)", line)
        if not m:
            self.stop()
            raise AssertionError(f"monitor did not start: {line}")
        self.start = int(m.group(1))

    def stop(self) -> tuple[list[dict], str]:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        err = self.proc.communicate(timeout=20)[1]
        self.out.close()
        assert self.proc.returncode == 0, err
        return [json.loads(line) for line in self.path.read_text().splitlines()], err


def _wait_caught_up(readers, last: int, timeout=20.0):
    """Until every reader has written the event LAST (or timeout)."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if all(f'"seq":{last},' in r.path.read_text() for r in readers):
            return
        time.sleep(0.2)


def test_two_monitors_each_see_every_event(spray, tmp_path):
    """Two readers at once: each prints every event filed while it ran,
    in order, none twice, none lost, the same rows as the log holds."""
    spray.attach("rr", *FAST)
    readers = [Reader(spray, tmp_path / f"m{i}.jsonl") for i in range(2)]
    try:
        # slower than the lag test's flapping: readers on a busy machine
        # must not fall a whole log behind here
        _flap(spray, 2 * LOG, pps=10000, routers=2)
        log = _log(spray)
        last = log[-1]["seq"]
        _wait_caught_up(readers, last)
    finally:
        got = [r.stop() for r in readers]
    seqs = []
    for r, (rows, err) in zip(readers, got):
        assert not [x for x in rows if x["type"] == "lost"], err
        s = [x["seq"] for x in rows]
        # everything from the seq it started at to the last one filed (or
        # a straggler after it: a packet in flight when the loss stopped)
        assert s == list(range(r.start, s[-1] + 1)) and s[-1] >= last, (r.start, last, len(s))
        seqs.append(s)
    common = set(seqs[0]) & set(seqs[1])
    assert common == set(range(max(s[0] for s in seqs), min(s[-1] for s in seqs) + 1))
    assert len(common) > LOG
    # both print the same events, and the ones the log still holds as it does
    by_seq = [{x["seq"]: (x["ns"], x["type"], x["path_id"], x["peer_id"]) for x in rows}
              for rows, _ in got]
    assert {s: by_seq[0][s] for s in common} == {s: by_seq[1][s] for s in common}
    for e in log:
        if e["seq"] in common:
            assert by_seq[0][e["seq"]] == (e["ns"], e["type"], e["path_id"], e["peer_id"]), e
    print(f"two monitors: {len(common)} events each, {last - log[0]['seq'] + 1} in the log's window")


def test_lagging_monitor_says_what_it_lost(spray, tmp_path):
    """A reader stopped (SIGSTOP) while more than the log's length of
    events are filed: once it runs again it prints a `lost` line for the
    events written over, then the rest; lost + shown are exactly the events
    filed, and a reader that kept up meanwhile saw them all."""
    spray.attach("rr", *FAST)
    slow = Reader(spray, tmp_path / "slow.jsonl")
    fast = Reader(spray, tmp_path / "fast.jsonl")
    try:
        slow.proc.send_signal(signal.SIGSTOP)
        _flap(spray, 3 * LOG)
        last = _log(spray)[-1]["seq"]
        assert last - slow.start + 1 > 2 * LOG, "too few events to lag"
        slow.proc.send_signal(signal.SIGCONT)
        _wait_caught_up([slow, fast], last)
    finally:
        (slow_rows, slow_err), (fast_rows, _) = slow.stop(), fast.stop()
    lost = [x for x in slow_rows if x["type"] == "lost"]
    shown = [x["seq"] for x in slow_rows if x["type"] != "lost"]
    assert lost and lost[0]["first_seq"] == slow.start, lost
    covered = sorted([s for x in lost for s in range(x["first_seq"], x["last_seq"] + 1)] + shown)
    assert covered == list(range(slow.start, covered[-1] + 1))   # each event once: lost or shown
    assert covered[-1] >= last
    assert all(x["lost"] == x["last_seq"] - x["first_seq"] + 1 for x in lost)
    n_lost = sum(x["lost"] for x in lost)
    assert n_lost >= covered[-1] - slow.start + 1 - LOG          # what the log no longer held
    assert f"{len(shown)} events shown, {n_lost} lost" in slow_err, slow_err
    fast_seqs = [x["seq"] for x in fast_rows]
    assert fast_seqs == list(range(fast.start, fast_seqs[-1] + 1)) and fast_seqs[-1] >= last
    print(f"lagging monitor: {n_lost} lost, {len(shown)} shown of {last - slow.start + 1}")
