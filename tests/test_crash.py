"""Changes survive kill -9: a command killed at a random point of its
writes leaves a log (datapath/journal.py) that `status` names (exit 1) and
that the next changing command rolls back first; the state is then byte for
byte what it was before the command or what the command makes (every
map's dump and the routes of ours, mrc_ebpf/lab/crash.py), and the command
works when run again.  A few kills per verb here; scripts/crash_kills.py
does many (docs/ops.md has its numbers)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import mrcctl
from mrc_ebpf.lab import crash, procs

pytestmark = pytest.mark.root

KILLS = 3


@pytest.mark.parametrize("verb", ["path bulk", "path add", "apply", "replace"])
def test_killed_change_is_before_or_after(interop, tmp_path, verb):
    net = interop
    crash.setup(net)
    # every kill aimed at the writes (the script also kills early ones)
    results = crash.run(net, tmp_path, verb, KILLS, seed=31, anywhere_p=0, most=3 * KILLS)
    summary = crash.summary(results)
    print(verb, summary)
    # some kills landed while it wrote (else this tested nothing)
    assert summary["mid_change"] >= 1, results
    if verb == "path bulk":     # every round's peers, each with its route
        status = json.loads(mrcctl("status", "-j", netns=net.A).stdout)[0]
        assert status["templated_peers"] == (len(results) + 1) * crash.BULK_PEERS
        routes = net.t.exec(net.A, ["ip", "-6", "route", "show", "proto", "mrc"]).stdout
        assert len(routes.splitlines()) == (len(results) + 1) * crash.BULK_PEERS


def routes_logged(log) -> bool:
    try:
        return b'"op":"routes"' in log.read_bytes()
    except FileNotFoundError:
        return False


def test_the_rerun_itself_rolls_back_and_completes(interop, tmp_path):
    """Without gc: the operator's case (a killed `path bulk` rerun used to
    say "0 peers added" and install no route)."""
    net = interop
    crash.setup(net)
    log = crash.log_file(net.A)
    args = crash.bulk_args(net, tmp_path, 0, n=2000)
    # killed once its routes' undo step is logged (after the maps' steps:
    # all its peers are in the maps, its routes going in)
    p = subprocess.Popen([*procs.MRCCTL, "--netns", net.A, *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while p.poll() is None and not routes_logged(log) and time.monotonic() < deadline:
        time.sleep(0.0005)
    p.kill()
    p.wait()
    if not routes_logged(log):
        pytest.skip("the command finished before it could be killed")
    status = mrcctl("status", netns=net.A, check=False)
    assert status.returncode == 1 and "HALF-DONE" in status.stdout and "path bulk" in status.stdout
    rerun = mrcctl(*args, "-j", netns=net.A)
    assert "rolled back" in rerun.stderr
    out = json.loads(rerun.stdout)
    assert out["added"] == 2000 and out["routes"] == 2000, out
    assert not log.exists()
    assert mrcctl("status", netns=net.A).returncode == 0
