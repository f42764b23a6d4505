"""A stand-in session worker for daemon tests: a real child process (``sleep``) behind the handle API.

Lets the daemon's group/session/lease/drain logic be tested in a real ``graphfeed serve``
process without torch RPC.  Run as a script it is ``graphfeed serve`` with this factory:

    python tests/fake_worker.py --partition DIR --part 0 --port 0

Behaviour of ``call``: ``open_session`` returns the number of input nodes of the split
this part owns (or of the node ids given), ``start_epoch`` returns 3, ``stats`` one row
per open session; a session whose ``kind`` is ``"invalid"`` is refused with
``WorkerError(kind="invalid")``; ``kind == "hang"`` never answers (times out as WorkerGone).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from graphfeed.server.daemon import worker_api
from graphfeed.server.partition.store import Partition

FAKE_EPOCH_BATCHES = 3


class FakeWorkerError(worker_api.WorkerError):
    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


class FakeWorkerHandle:
    def __init__(self, spec):
        self.spec = spec
        self._proc = subprocess.Popen(["sleep", "600"])
        self.pid = self._proc.pid
        self._part = Partition(spec.partition_root, spec.part_id)
        self._sessions: dict[str, dict] = {}
        self._lock = threading.Lock()

    @classmethod
    def start(cls, spec) -> "FakeWorkerHandle":
        return cls(spec)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def exitcode(self) -> int | None:
        return self._proc.poll()

    def call(self, command: str, timeout: float = 30.0, **kw):
        if not self.alive():
            raise worker_api.WorkerGone(f"worker pid {self.pid} exited with code {self.exitcode()}")
        with self._lock:
            if command == "open_session":
                if kw["kind"] == "invalid":
                    raise FakeWorkerError("the worker refused this session", "invalid")
                if kw["kind"] == "hang":
                    time.sleep(timeout)
                    raise worker_api.WorkerGone(f"worker pid {self.pid} did not answer within {timeout} s")
                if kw["split"] is not None:
                    n = int(self._part.split(kw["split"]).numel())
                else:
                    n = int(self._part.to_global(kw["node_ids"])[0].sum())
                self._sessions[kw["session_id"]] = dict(kind=kw["kind"], epoch=-1)
                return n
            if command == "start_epoch":
                self._sessions[kw["session_id"]]["epoch"] = kw["epoch"]
                return FAKE_EPOCH_BATCHES
            if command == "close_session":
                self._sessions.pop(kw["session_id"], None)
                return None
            if command == "stats":
                return [dict(session_id=sid, kind=s["kind"], epoch=s["epoch"], batches_produced=0)
                        for sid, s in self._sessions.items()]
        raise FakeWorkerError(f"unknown command {command!r}", "invalid")

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
