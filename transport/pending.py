"""A result that arrives later -- a batch, or the error that replaced it -- in no transport's terms.

:class:`Pending` is what both halves of the data path hand around: a session worker's
:class:`~graphfeed.server.worker.buffer.BatchBuffer` answers a pull with one (completed when
the batch is put, or at once), and a trainer's :class:`~graphfeed.transport.channel.BatchChannel`
answers a request with one.  Each transport adapts it at its own edge (torch RPC: a
``torch.futures.Future`` on the worker, see ``graphfeed.server.worker.rpc_api.pull``).

Completion is push based: callbacks run in the thread that completes it, after its lock is
released, so no thread is parked per request and a callback may do slow work (serialize and
send a batch).  A result is set exactly once.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class Pending:
    """One value or one error, set once; waited for (:meth:`result`) or pushed (:meth:`add_done_callback`)."""

    __slots__ = ("_lock", "_done", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Pending"], None]] = []

    @classmethod
    def completed(cls, value: Any) -> "Pending":
        """A pending result that already holds ``value``."""
        pending = cls()
        pending.set_result(value)
        return pending

    @classmethod
    def failed(cls, error: BaseException) -> "Pending":
        """A pending result that already holds ``error``."""
        pending = cls()
        pending.set_exception(error)
        return pending

    # ---- completing -----------------------------------------------------------------------------

    def set_result(self, value: Any) -> None:
        """Complete with ``value`` and run the callbacks in this thread."""
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        """Complete with ``error`` (raised by :meth:`result`) and run the callbacks in this thread."""
        if not isinstance(error, BaseException):
            raise TypeError(f"set_exception takes an exception, got {type(error).__name__}")
        self._settle(None, error)

    def try_set_result(self, value: Any) -> bool:
        """:meth:`set_result` unless already complete (then nothing happens); whether this call completed it.
        For results that race (a batch and a failure pushed by the group): the first one wins."""
        return self._settle(value, None, once=False)

    def try_set_exception(self, error: BaseException) -> bool:
        """:meth:`set_exception` unless already complete (then nothing happens); whether this call completed it."""
        if not isinstance(error, BaseException):
            raise TypeError(f"try_set_exception takes an exception, got {type(error).__name__}")
        return self._settle(None, error, once=False)

    def _settle(self, value: Any, error: BaseException | None, once: bool = True) -> bool:
        with self._lock:
            if self._done.is_set():
                if not once:
                    return False
                raise RuntimeError("this pending result is already complete: a result is set exactly once")
            self._value, self._error = value, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._run(fn)
        return True

    def add_done_callback(self, fn: Callable[["Pending"], None]) -> None:
        """Call ``fn(self)`` once complete: at once (in this thread) if it already is."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        self._run(fn)

    def then(self, fn: Callable[[Any], Any]) -> "Pending":
        """A new Pending that completes with ``fn(value)`` once this one has its value (in the completing
        thread), or with this one's error -- or ``fn``'s."""
        out = Pending()

        def settle(p: Pending) -> None:
            try:
                out.set_result(fn(p.result()))
            except Exception as exc:  # noqa: BLE001 -- the error goes to whoever waits on ``out``
                out.set_exception(exc)

        self.add_done_callback(settle)
        return out

    def _run(self, fn: Callable[["Pending"], None]) -> None:
        try:
            fn(self)
        except Exception:  # noqa: BLE001 -- one failing callback must not stop the completing thread
            log.exception("a callback of a pending batch failed")

    # ---- waiting --------------------------------------------------------------------------------

    def done(self) -> bool:
        """True once the value or the error is in."""
        return self._done.is_set()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for completion; True if complete."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The value; raises the error it completed with, or TimeoutError after ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the pending result did not complete within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._value

    wait = result   # torch.futures.Future's spelling, for callers written against one
