"""Structured log lines on stderr: one event per line, JSON or logfmt.

    log.info("group_open", group="g1", peer="ipv4:10.0.0.5:41234", worker_pid=1234)

logfmt:  ``ts=2025-01-01T12:00:00.123Z level=info event=group_open group=g1 peer=ipv4:... worker_pid=1234``
json:    ``{"ts": "...", "level": "info", "event": "group_open", "group": "g1", ...}``

Events are per group/session open/close/reap and per error; nothing per batch at INFO.
"""
from __future__ import annotations

import json
import logging
import sys
import time
import warnings

LOGGER_NAME = "graphfeed.daemon"


def _timestamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def _logfmt_value(v) -> str:
    s = "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
    if s == "" or any(c in s for c in ' ="\\\n\t'):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
    return s


class _Formatter(logging.Formatter):
    def __init__(self, fmt: str):
        super().__init__()
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": _timestamp(record.created), "level": record.levelname.lower(), "event": record.getMessage()}
        fields.update(getattr(record, "fields", {}))
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        if self.fmt == "json":
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


class EventLogger:
    """``logger.info(event, **fields)``: one structured line per call."""

    def __init__(self, logger: logging.Logger):
        self._logger = logger

    def _log(self, level: int, event: str, fields: dict, exc_info=None) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, extra={"fields": fields}, exc_info=exc_info)

    def debug(self, event: str, **fields) -> None:
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, exc_info=None, **fields) -> None:
        self._log(logging.ERROR, event, fields, exc_info=exc_info)


def configure(log_format: str = "logfmt", level: str = "info", stream=None) -> EventLogger:
    """Install one stderr handler on the daemon's logger (idempotent: replaces the previous one)."""
    logger = logging.getLogger(LOGGER_NAME)
    for h in list(logger.handlers):
        if getattr(h, "_graphfeed", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler._graphfeed = True  # type: ignore[attr-defined]
    handler.setFormatter(_Formatter(log_format))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    event_log = EventLogger(logger)
    capture_warnings(event_log)
    return event_log


def capture_warnings(log: EventLogger) -> None:
    """Python warnings (torch's, the sampler's) become ``python_warning`` lines of ``log``, so a JSON log
    stays JSON; each distinct warning still appears once per place, as Python's default filter decides."""

    def show(message, category, filename, lineno, file=None, line=None):
        log.warning("python_warning", category=category.__name__, message=str(message), where=f"{filename}:{lineno}")

    warnings.showwarning = show

def get() -> EventLogger:
    return EventLogger(logging.getLogger(LOGGER_NAME))
