"""The one exception type users see: its message is the whole story."""


class MrcError(Exception):
    """A failure with a one-line, user-facing message (no traceback)."""
