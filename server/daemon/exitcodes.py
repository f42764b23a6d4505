"""Exit codes of ``graphfeed serve`` -- the one place they are defined.

Operators rely on them: the systemd unit restarts on ``UNEXPECTED`` and ``BIND``
but not on ``CONFIG`` or ``PARTITION`` (restarting cannot fix a bad file).
"""
from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0            # clean shutdown (drained after SIGTERM/SIGINT), or --check-config passed
    UNEXPECTED = 1    # a bug or an unforeseen failure (the log has the traceback)
    USAGE = 2         # bad command-line arguments
    CONFIG = 3        # the configuration is invalid (unknown key, wrong type or range)
    PARTITION = 4     # the partition folder cannot be loaded
    BIND = 5          # the control port cannot be bound (in use, bad address)
    FORCED = 130      # a second SIGINT/SIGTERM during the drain: workers killed, no drain


class StartupError(Exception):
    """A startup failure: printed as one line (no traceback), the process exits with ``code``."""

    def __init__(self, code: ExitCode, message: str):
        super().__init__(message)
        self.code = code
