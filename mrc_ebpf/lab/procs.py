"""The lab's process harness: commands in (or out of) network namespaces.

One place for what the fabric, the bench, the test topologies and the
tests all do: run a command (optionally inside a namespace) with a
one-line error, start one in the background and always end it again (by
its pid: its own session, so the `ip netns exec` child goes too), run a
few at once, and drive `mrcctl -j`, whose errors come back as JSON
(`{"error": ...}`), not as text to parse.

Commands run from the checkout's root so `python -m mrc_ebpf...` finds the
package whether or not it is installed.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mrc_ebpf.errors import MrcError

ROOT = Path(__file__).resolve().parent.parent.parent
PY = sys.executable
MRCCTL = [PY, "-m", "mrc_ebpf.cli.mrcctl"]


class CommandError(MrcError):
    """A command the lab ran failed (its message is one line)."""


def timeout_scale() -> float:
    """Slower machines (a VM under software emulation) stretch timeouts."""
    return float(os.environ.get("MRC_TIMEOUT_SCALE", "1"))


def in_netns(ns: str | None, cmd: list[str]) -> list[str]:
    """CMD as run inside namespace NS (as is without one)."""
    return ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)


def _what(cmd: list[str], ns: str | None) -> str:
    what = " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else "")
    return f"{what} in {ns}" if ns else what


def _one_line(r: subprocess.CompletedProcess) -> str:
    return " ".join((r.stderr or "").split())[:300] or f"exit {r.returncode}"


def run(cmd: list[str], ns: str | None = None, input: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run CMD (in NS), output captured; with `check`, a failure raises
    CommandError with the command and its stderr on one line."""
    r = subprocess.run(in_netns(ns, cmd), input=input, capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout * timeout_scale())
    if check and r.returncode != 0:
        raise CommandError(f"{_what(cmd, ns)}: {_one_line(r)}")
    return r


def batch(cmd: list[str], lines: list[str], what: str, timeout: float = 300) -> None:
    """Feed LINES to `CMD -batch -` (ip, tc): many changes for one process."""
    if lines:
        r = run([*cmd, "-batch", "-"], input="\n".join(lines) + "\n", check=False, timeout=timeout)
        if r.returncode != 0:
            raise CommandError(f"{what}: {_one_line(r)}")


def popen(cmd: list[str], ns: str | None = None, **kw) -> subprocess.Popen:
    """Start CMD (in NS) in its own session, so `end` reaches what it starts."""
    kw.setdefault("cwd", ROOT)
    return subprocess.Popen(in_netns(ns, cmd), start_new_session=True, **kw)


def end(p: subprocess.Popen, timeout: float = 10) -> None:
    """End a process popen started (its whole session, by its pid)."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        p.communicate(timeout=timeout)


class Procs:
    """Processes started through it are ended when it closes (with-block)."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def popen(self, ns: str | None, cmd: list[str], **kw) -> subprocess.Popen:
        p = popen(cmd, ns, **kw)
        self.procs.append(p)
        return p

    def end(self, p: subprocess.Popen) -> None:
        end(p)
        if p in self.procs:
            self.procs.remove(p)

    def wait(self, p: subprocess.Popen, timeout: float) -> tuple[str, str]:
        """Its output once it exits (ended if it outlives `timeout`)."""
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            self.end(p)
        return out, err

    def close(self) -> None:
        for p in list(self.procs):
            self.end(p)


def run_parallel(jobs: list[list[str]], limit: int = 8, timeout: float = 300,
                 finished=None) -> list[subprocess.CompletedProcess]:
    """Run commands a few at a time; results in order."""
    return [r[0] for r in run_sequences([[cmd] for cmd in jobs], limit, timeout, stop=False,
                                        finished=finished)]


def run_sequences(jobs: list[list[list[str]]], limit: int = 2, timeout: float = 300,
                  stop: bool = True, finished=None) -> list[list[subprocess.CompletedProcess]]:
    """Each job is a list of commands run in order; jobs run side by side,
    at most `limit` at once.  With `stop`, a job stops at its first failed
    command (the results show it); others go on.  finished(result), if
    given, is called as each command ends (for progress)."""
    results: list[list] = [[] for _ in jobs]
    cursors = [0] * len(jobs)
    running: dict[int, subprocess.Popen] = {}

    def left(i: int) -> bool:
        failed = stop and results[i] and results[i][-1].returncode != 0
        return cursors[i] < len(jobs[i]) and not failed

    try:
        while any(left(i) for i in range(len(jobs))) or running:
            for i in range(len(jobs)):
                if i not in running and left(i) and len(running) < limit:
                    running[i] = subprocess.Popen(jobs[i][cursors[i]], stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True, cwd=ROOT)
            i = next(iter(running))
            proc = running.pop(i)
            out, err = proc.communicate(timeout=timeout * timeout_scale())
            results[i].append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
            cursors[i] += 1
            if finished:
                finished(results[i][-1])
    finally:
        for proc in running.values():
            proc.kill()
            proc.wait()
    return results


# ---- mrcctl -j ---------------------------------------------------------------

def mrcctl_cmd(ns: str | None, *args: str) -> list[str]:
    """`mrcctl -j [--netns NS] ARGS...` as a command line."""
    return [*MRCCTL, "-j", *(["--netns", ns] if ns else []), *args]


def mrcctl_result(r: subprocess.CompletedProcess, what: str = ""):
    """What an `mrcctl -j` run printed, or MrcError with the error it
    reported (as JSON on stdout; mrcctl's own message, nothing parsed)."""
    try:
        doc = json.loads(r.stdout) if r.stdout.strip() else None
    except ValueError:
        doc = None
    if r.returncode == 0:
        return doc
    error = doc.get("error") if isinstance(doc, dict) else None
    where = what or _what(list(r.args)[len(MRCCTL) + 1:], None)
    raise MrcError(f"{where}: {error or _one_line(r)}")


def mrcctl(ns: str | None, *args: str, what: str = "", timeout: float = 120):
    """Run `mrcctl -j ARGS` in NS: its JSON, or MrcError with its error."""
    return mrcctl_result(run(mrcctl_cmd(ns, *args), check=False, timeout=timeout), what)
