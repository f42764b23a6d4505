"""The daemon's handle on a session worker process (see the service interface in DESIGN.md).

``SessionWorkerHandle.start(spec)`` spawns ``python -m graphfeed.server.worker.process``
with one end of a private socket pair; :meth:`SessionWorkerHandle.call` sends a command and
waits (bounded) for its answer.  Messages are pickled with the standard pickler (tensors
travel by value, no shared-memory handles).  The worker dies with the daemon: it exits when
the pipe closes and asks the kernel for SIGKILL when its parent dies.
"""
from __future__ import annotations

import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

START_TIMEOUT = 120.0   # seconds for the worker to import torch and map its partition


@dataclass(frozen=True)
class GroupSpec:
    group_id: str
    rendezvous: str          # "host:port" of the trainer's store
    world_size: int
    rank: int                # 1 + part_id
    part_id: int
    partition_root: str      # the partition folder (META.json inside)
    data_address: str = "127.0.0.1"   # interface TensorPipe binds to
    rpc_timeout: float = 60.0
    num_producers: int = 2           # batches produced concurrently per worker
    buffer_batches: int = 8          # per session, produced-but-not-pulled
    buffer_bytes: int = 256 << 20    # per session
    join_timeout: float = 60.0       # give up joining the RPC group after this


class WorkerError(Exception):
    """The worker refused or failed a command.  ``kind``: invalid | not_found | precondition | internal."""

    def __init__(self, message: str, kind: str = "internal"):
        super().__init__(message)
        self.kind = kind


class WorkerGone(WorkerError):
    """The worker process died or did not answer in time."""

    def __init__(self, message: str):
        super().__init__(message, "gone")


def worker_environment() -> dict[str, str]:
    """The daemon's environment, with torch's huge-page allocations on unless set otherwise.

    Batches are tens to hundreds of MB of fresh memory each; with 4 KiB pages the page
    faults cost more than the copies (medium graph, 1 server: worker + trainer CPU per
    epoch 10.3 s -> 7.5 s with ``THP_MEM_ALLOC_ENABLE=1``).  torch reads the variable once,
    at its first allocation, so it has to be in the environment the process starts with.
    """
    env = dict(os.environ)
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    return env


class SessionWorkerHandle:
    def __init__(self, proc: subprocess.Popen, conn: Connection, spec: GroupSpec):
        self.proc, self.spec = proc, spec
        self.pid = proc.pid
        self._conn = conn
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._broken: str | None = None

    @classmethod
    def start(cls, spec: GroupSpec, start_timeout: float = START_TIMEOUT) -> "SessionWorkerHandle":
        """Spawn the worker, wait until it mapped its partition; WorkerError if it cannot start."""
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "graphfeed.server.worker.process", "--fd",
                                     str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                    env=worker_environment())
        except OSError as exc:
            ours.close()
            raise WorkerError(f"cannot spawn a session worker: {exc}") from None
        finally:
            theirs.close()
        handle = cls(proc, Connection(ours.detach()), spec)
        try:
            handle._conn.send_bytes(pickle.dumps(spec))
            handle._expect("start", start_timeout)
        except WorkerError:
            handle._kill()
            raise
        return handle

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exitcode(self) -> int | None:
        return self.proc.poll()

    def call(self, command: str, timeout: float = 30.0, **kwargs):
        """Send ``command`` and return its result (thread-safe; calls are answered in order)."""
        with self._lock:
            if self._broken:
                raise WorkerGone(self._broken)
            msg_id = next(self._ids)
            try:
                self._conn.send_bytes(pickle.dumps((msg_id, command, kwargs)))
            except (OSError, ValueError) as exc:
                raise self._gone(f"cannot send {command!r}: {exc}") from None
            return self._expect(msg_id, timeout, command)

    def _expect(self, msg_id, timeout: float, command: str = "start"):
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                ready = remaining > 0 and self._conn.poll(remaining)
                if not ready:
                    raise self._gone(f"worker pid {self.pid} did not answer {command!r} within {timeout:g} s")
                got_id, status, value = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as exc:
                raise self._gone(f"worker pid {self.pid} died during {command!r} ({self._exit_text()}; {exc})") \
                    from None
            if got_id != msg_id:
                continue  # the late answer of a call that timed out
            if status == "ok":
                return value
            kind, message = value
            raise WorkerError(message, kind)

    def _gone(self, message: str) -> WorkerGone:
        self._broken = message  # a timed-out pipe is out of step: later calls fail fast
        return WorkerGone(message)

    def _exit_text(self) -> str:
        try:
            code = self.proc.wait(1.0)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"exit code {code}" if code >= 0 else f"killed by signal {signal.Signals(-code).name}"

    def stop(self, grace: float = 5.0) -> int | None:
        """Ask the worker to leave its group and exit; SIGKILL after ``grace`` s.  Returns the exit code."""
        if self.alive() and not self._broken:
            try:
                self.call("stop", timeout=grace)
            except WorkerError:
                pass
        try:
            code = self.proc.wait(max(0.1, grace))
        except subprocess.TimeoutExpired:
            code = self._kill()
        self._conn.close()
        self._broken = f"worker pid {self.pid} was stopped ({self._exit_text()})"
        return code

    def _kill(self) -> int | None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            return self.proc.wait(10)
        except subprocess.TimeoutExpired:
            return None

    def __repr__(self) -> str:
        return f"SessionWorkerHandle(pid={self.pid}, group={self.spec.group_id!r}, part={self.spec.part_id})"

