"""A progress line with an estimate of the time left, for verbs that run
for minutes (`fabric up`, `fabric attach`, `bench`).

On a terminal it is one line on stderr, redrawn in place (log lines
printed meanwhile go above it) and cleared at the end.  Elsewhere (a log
file, a pipe, a test) nothing is shown unless --progress asks, and then
each update is a line of its own.  stdout (the result, -j's JSON) is
never touched.  The work reports (done, total, text) through a plain
callable, so the layers below the CLI need nothing from here.
"""
from __future__ import annotations

import shutil
import sys
import time

import click


def progress_option(f):
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="A progress line with the time left on stderr (default: when "
                             "stderr is a terminal).")(f)


def left_text(seconds: float) -> str:
    if seconds < 1:
        return "<1 s left"
    if seconds < 90:
        return f"~{seconds:.0f} s left"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min left"
    return f"~{seconds / 3600:.1f} h left"


class Progress:
    """progress(done, total, text) and log(msg); a context manager that
    clears its line at the end."""

    def __init__(self, label: str, enabled: bool | None = None, stream=None,
                 clock=time.monotonic):
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = _isatty(self.stream)
        self.enabled = self.tty if enabled is None else enabled
        self.clock = clock
        self.started = clock()
        self.line = ""

    def __call__(self, done: int, total: int, text: str) -> None:
        if not self.enabled:
            return
        line = f"{self.label}: {text}"
        if total and 0 < done < total:
            elapsed = self.clock() - self.started
            line += f", {left_text(elapsed / done * (total - done))}"
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.line = line[:width]
            self.stream.write("\r\x1b[K" + self.line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def restart(self) -> None:
        """A new stretch of work (bench all: the next scenario): the pace starts again."""
        self.started = self.clock()

    def log(self, msg: str) -> None:
        """A line of its own, above the progress line."""
        if self.tty and self.line:
            self.stream.write("\r\x1b[K" + msg + "\n" + self.line)
        else:
            self.stream.write(msg + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.line:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.line = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
