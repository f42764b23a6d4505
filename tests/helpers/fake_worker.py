"""A stand-in session worker for daemon tests: a real child process (``sleep``) behind the handle API.

Lets the daemon's group/session/lease/drain logic be tested in a real ``graphfeed serve``
process without torch RPC.  Run as a script it is ``graphfeed serve`` with this factory:

    python tests/helpers/fake_worker.py --partition DIR --part 0 --port 0

Commands go through the real dispatcher (:func:`graphfeed.server.worker.commands.execute`),
so errors are classified as in a real worker.  ``OpenSession`` answers the number of input
nodes of the split this part owns (or of the node ids given), ``StartEpoch`` 3 batches,
``Stats`` one row per open session.  By the session's ``kind``: ``"invalid"`` is refused
with :class:`BadRequest`; ``"crash"`` raises a plain ``ValueError`` inside the worker (an
internal failure); ``"hang"`` never answers (times out as :class:`WorkerGone`).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from graphfeed.server.partition.format.store import Partition
from graphfeed.server.worker.commands import (
    BadRequest,
    CloseSession,
    Command,
    EpochStarted,
    Metrics,
    MetricsSnapshot,
    NotFound,
    OpenSession,
    ServedCounts,
    SessionClosed,
    SessionOpened,
    SessionRow,
    SessionRows,
    StartEpoch,
    Stats,
    Stop,
    Stopped,
    WorkerError,
    WorkerGone,
    execute,
)

FAKE_EPOCH_BATCHES = 3


class FakeSessionWorker:
    """The worker side: one method per command, as :class:`graphfeed.server.worker.process.SessionWorker`."""

    def __init__(self, spec):
        self.part = Partition(spec.partition_root, spec.part_id)
        self.sessions: dict[str, dict] = {}

    def open_session(self, cmd: OpenSession) -> SessionOpened:
        if cmd.spec.kind == "invalid":
            raise BadRequest("the worker refused this session")
        if cmd.spec.kind == "crash":
            raise ValueError("a tensor had the wrong shape")  # e.g. from torch: not the request's fault
        n = int(self.part.input_nodes(cmd.spec.input).numel())
        self.sessions[cmd.session_id] = dict(kind=cmd.spec.kind, epoch=-1)
        return SessionOpened(n)

    def start_epoch(self, cmd: StartEpoch) -> EpochStarted:
        self._session(cmd.session_id)["epoch"] = cmd.epoch
        return EpochStarted(FAKE_EPOCH_BATCHES)

    def close_session(self, cmd: CloseSession) -> SessionClosed:
        self._session(cmd.session_id)
        del self.sessions[cmd.session_id]
        return SessionClosed()

    def stats(self, cmd: Stats) -> SessionRows:
        return SessionRows(tuple(SessionRow(sid, "", s["kind"], s["epoch"], ServedCounts())
                                 for sid, s in self.sessions.items()))

    def metrics(self, cmd: Metrics) -> MetricsSnapshot:
        return MetricsSnapshot({})

    def stop(self, cmd: Stop) -> Stopped:
        return Stopped()

    def _session(self, session_id: str) -> dict:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise NotFound(f"unknown session {session_id!r}") from None


class FakeWorkerHandle:
    def __init__(self, spec):
        self.spec = spec
        self._proc = subprocess.Popen(["sleep", "600"])
        self.pid = self._proc.pid
        self._worker = FakeSessionWorker(spec)
        self._lock = threading.Lock()

    @classmethod
    def start(cls, spec, start_timeout: float = 0.0) -> "FakeWorkerHandle":
        return cls(spec)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def exitcode(self) -> int | None:
        return self._proc.poll()

    def call(self, command: Command, timeout: float = 30.0):
        if not self.alive():
            raise WorkerGone(f"worker pid {self.pid} exited with code {self.exitcode()}")
        if isinstance(command, OpenSession) and command.spec.kind == "hang":
            time.sleep(timeout)
            raise WorkerGone(f"worker pid {self.pid} did not answer within {timeout} s")
        with self._lock:
            answer = execute(self._worker, command)
        if isinstance(answer, WorkerError):
            raise answer
        return answer

    def stop(self, grace: float = 5.0) -> int | None:
        self._proc.terminate()
        try:
            return self._proc.wait(grace)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return self._proc.wait()


if __name__ == "__main__":
    from graphfeed.cli.main import main
    from graphfeed.server.daemon import app

    app.default_factory = FakeWorkerHandle.start  # the daemon's factory when none is passed
    sys.exit(main(["serve", *sys.argv[1:]]))
