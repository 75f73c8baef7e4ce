"""All or nothing: an undo log of one command's changes to an attachment.

While a journal is open on an attachment (loader.Attachment.change), every
map write records how to put back what it overwrote, and every route
change records the routes it replaces; a failure anywhere rolls them back
newest first, so `path list`, the spray lists, the routes and the maps are
exactly as before the command.

MRC_FAIL_WRITE=N makes the Nth write of a command fail before it is made
(a fail point for tests: they run a command with N = 1, 2, ... and check
that each failure leaves everything as it was).
"""
from __future__ import annotations

import os

from mrc_ebpf.errors import MrcError


class InjectedFailure(MrcError):
    pass


class Journal:
    def __init__(self):
        self._undo: list = []
        self.writes = 0
        text = os.environ.get("MRC_FAIL_WRITE", "")
        self._fail_at = int(text) if text.isdigit() else 0

    def before_write(self, what: str) -> None:
        """Called before each change: counts it, and fails it on request."""
        self.writes += 1
        if self.writes == self._fail_at:
            raise InjectedFailure(f"failure injected at write {self.writes} ({what}) by MRC_FAIL_WRITE")

    def reserve(self, count: int, what: str) -> int | None:
        """COUNT writes made in one batch: counts them, and returns the
        index among them of the one to fail on request (the caller writes
        those before it, then raises), else None."""
        start = self.writes
        self.writes += count
        if start < self._fail_at <= self.writes:
            self.writes = self._fail_at
            return self._fail_at - start - 1
        return None

    def record(self, undo) -> None:
        self._undo.append(undo)

    def rollback(self) -> list[str]:
        """Undo everything, newest first; returns what could not be undone."""
        problems = []
        while self._undo:
            step = self._undo.pop()
            try:
                step()
            except Exception as e:  # keep undoing the rest; report what stuck
                problems.append(str(e))
        return problems
