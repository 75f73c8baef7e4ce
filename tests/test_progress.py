"""Progress with the time left (`fabric up`, `fabric attach`, `bench`) and
shell completion of fabric node names (issue 21 item 10)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import mrcctl
from mrc_ebpf.cli.progress import Progress, left_text


class Tty(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_line_on_a_terminal_redraws_in_place_and_estimates_time_left():
    out, clock = Tty(), Clock()
    with Progress("fabric up", stream=out, clock=clock) as p:
        p(0, 10, "0/10 namespaces")
        clock.now += 4
        p(2, 10, "2/10 namespaces")          # 2 s each: 8 left -> 16 s
        p.log("a log line")
        clock.now += 56
        p(6, 10, "6/10 namespaces")          # 10 s each: 4 left -> 40 s
    text = out.getvalue()
    assert "\n" not in text.replace("a log line\n", "")     # one line, redrawn
    assert "\r\x1b[Kfabric up: 2/10 namespaces, ~16 s left" in text
    # the log line goes above, then the progress line comes back
    assert "\r\x1b[Ka log line\nfabric up: 2/10 namespaces, ~16 s left" in text
    assert "fabric up: 6/10 namespaces, ~40 s left" in text
    assert text.endswith("\r\x1b[K")                         # cleared at the end


def test_progress_off_a_terminal_is_silent_unless_asked():
    quiet, asked, clock = io.StringIO(), io.StringIO(), Clock()
    with Progress("bench", stream=quiet, clock=clock) as p:
        p(1, 4, "cost: flood none")
        p.log("[bench] a log line")
    assert quiet.getvalue() == "[bench] a log line\n"       # logs stay as they were
    with Progress("bench", enabled=True, stream=asked, clock=clock) as p:
        clock.now += 20
        p(1, 4, "cost: flood none")
    assert asked.getvalue() == "bench: cost: flood none, ~60 s left\n"
    p.restart()                     # the next scenario: its own pace
    clock.now += 2
    p(1, 3, "reorder: rr")
    assert asked.getvalue().endswith("bench: reorder: rr, ~4 s left\n")


def test_left_text_units():
    assert left_text(0.2) == "<1 s left"
    assert left_text(42) == "~42 s left"
    assert left_text(600) == "~10 min left"
    assert left_text(3 * 3600) == "~3.0 h left"


def complete(*words: str) -> list[str]:
    """Run mrcctl's completion as bash does through click: the words so
    far and the index of the one being completed."""
    env = {**os.environ, "_MRCCTL_COMPLETE": "bash_complete",
           "COMP_WORDS": " ".join(["mrcctl", *words]), "COMP_CWORD": str(len(words))}
    # the installed entry point, as a shell runs it (click names the
    # variable after the program: _MRCCTL_COMPLETE)
    r = subprocess.run([str(Path(sys.executable).parent / "mrcctl")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split(",", 1)[1] for line in r.stdout.splitlines() if "," in line]


@pytest.mark.root
def test_fabric_up_progress_and_node_completion():
    name = f"pg{os.getpid() % 10000}{int(time.time() * 1000) % 100}"
    try:
        up = mrcctl("fabric", "up", name, "-k", "2", "-l", "2", "-p", "2", "--progress", "-j")
        lines = up.stderr.splitlines()
        assert lines and all(line.startswith("fabric up: ") for line in lines), up.stderr
        assert any("namespaces" in line and "left" in line for line in lines)
        assert lines[-1] == "fabric up: routes 10/10 namespaces"     # 2 planes x 4 switches + 2 hosts
        assert len(up.stdout.splitlines()) == 1 and json.loads(up.stdout)["name"] == name
        # stderr not a terminal and no --progress: nothing on it
        shown = mrcctl("fabric", "show", name, "-j")
        assert shown.stderr == ""

        nodes = {h["name"] for h in json.loads(shown.stdout)["hosts"]} | \
                {s["name"] for s in json.loads(shown.stdout)["switches"]}
        assert sorted(complete("fabric", "exec", "-n", name, "")) == sorted(nodes)
        assert sorted(complete("fabric", "exec", "-n", name, "p1")) == \
            sorted(n for n in nodes if n.startswith("p1"))
        assert set(complete("fabric", "fail", "-n", name, "s1")) == {"s1", "s1-l1", "s1-l2"}
        attached = mrcctl("fabric", "attach", name, "--progress")
        lines = attached.stderr.splitlines()
        assert lines[0] == "fabric attach: 0/2 hosts attached", lines
        assert "fabric attach: 2/2 hosts attached" in lines[2]      # 2 attaches, weighted 20 each
        assert lines[-1] == "fabric attach: 2/2 hosts attached, paths 2/2 commands"
        assert all("left" in line for line in lines[1:-1])

        mrcctl("fabric", "fail", "-n", name, "s2-l1", "--mode", "blackhole")
        assert complete("fabric", "heal", "-n", name, "") == ["s2-l1"]
        assert complete("fabric", "exec", "-n", "nosuchfabric", "") == []
    finally:
        mrcctl("fabric", "down", name, check=False)
