"""The daemon's handle on a session worker process (the protocol is :mod:`.commands`).

``SessionWorkerHandle.start(spec)`` spawns ``python -m graphfeed.server.worker.process``
with one end of a private socket pair; :meth:`SessionWorkerHandle.call` sends a command of
:mod:`.commands` and waits (bounded) for its typed reply.  Messages are pickled with the
standard pickler (tensors travel by value, no shared-memory handles): the daemon sends
``(msg_id, command)``, the worker answers ``(msg_id, reply or WorkerError)``.  The worker
dies with the daemon: it exits when the pipe closes and asks the kernel for SIGKILL when
its parent dies.

The worker's stdout and stderr (Python warnings, torch's C++ log lines, a failed join) come
back through a pipe, one call of ``output(line)`` per line, so the daemon can re-emit them
as its own structured log lines (``log_format: json`` keeps every line JSON).  Without
``output`` they are copied to the daemon's stderr as they are.
"""
from __future__ import annotations

import collections
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import IO, Callable

from graphfeed.server.worker.commands import START_ID, Command, GroupSpec, Started, Stop, WorkerError, WorkerGone

START_TIMEOUT = 120.0   # seconds for the worker to import torch and map its partition
DISCARD_WAIT = 10.0     # seconds a killed worker that never got a group may take to be reaped


# Environment variables a session worker never needs: the daemon's own credentials (its bearer token,
# TLS key) and anything named like a secret.  A worker reads partition files and talks torch RPC.
CREDENTIAL_ENV = frozenset({"GRAPHFEED_TOKEN", "GRAPHFEED_TOKEN_FILE", "GRAPHFEED_TLS_KEY", "GRAPHFEED_TLS_CERT",
                            "GRAPHFEED_TLS_CLIENT_CA"})
CREDENTIAL_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")


def is_credential(name: str) -> bool:
    upper = name.upper()
    return upper in CREDENTIAL_ENV or any(word in upper for word in CREDENTIAL_WORDS)


def worker_environment() -> dict[str, str]:
    """The daemon's environment without credentials (:func:`is_credential`), with torch's huge-page
    allocations on unless set otherwise.

    Batches are tens to hundreds of MB of fresh memory each; with 4 KiB pages the page
    faults cost more than the copies (medium graph, 1 server: worker + trainer CPU per
    epoch 10.3 s -> 7.5 s with ``THP_MEM_ALLOC_ENABLE=1``).  torch reads the variable once,
    at its first allocation, so it has to be in the environment the process starts with.
    """
    env = {k: v for k, v in os.environ.items() if not is_credential(k)}
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # c10 warnings (TensorPipe's "pipe closed", ...) off
    env.setdefault("PYTHONUNBUFFERED", "1")          # lines reach the daemon's relay as they are written
    return env


def _copy_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _relay(stream: IO[bytes], output: Callable[[str], None]) -> None:
    """Hand every line the worker writes to ``output`` until the worker closes its end."""
    with stream:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.strip():
                output(line)


class SpawnedWorker:
    """A session worker process told nothing yet: it imports torch and graphfeed, then waits for its
    :class:`GroupSpec` (:meth:`begin`).  A daemon may keep one ready (``warm_workers``) so that an ``OpenGroup``
    costs no process start; what it prints goes to ``output(line)`` (:attr:`group` names its group once begun)."""

    def __init__(self, proc: subprocess.Popen, conn: Connection):
        self.proc, self.pid, self._conn = proc, proc.pid, conn
        self.group: str | None = None

    @classmethod
    def spawn(cls, output: Callable[[str], None] | None = None) -> "SpawnedWorker":
        """Start the process (returns at once: it imports meanwhile); WorkerError if it cannot be spawned."""
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "graphfeed.server.worker.process", "--fd",
                                     str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=worker_environment())
        except OSError as exc:
            ours.close()
            raise WorkerError(f"cannot spawn a session worker: {exc}") from None
        finally:
            theirs.close()
        assert proc.stdout is not None
        threading.Thread(target=_relay, args=(proc.stdout, output or _copy_to_stderr), daemon=True,
                         name=f"worker-{proc.pid}-output").start()
        return cls(proc, Connection(ours.detach()))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def begin(self, spec: GroupSpec, start_timeout: float = START_TIMEOUT) -> "SessionWorkerHandle":
        """Hand the worker its group and wait until it mapped its partition; WorkerError (the worker killed) if it
        cannot start within ``start_timeout`` s."""
        self.group = spec.group_id
        handle = SessionWorkerHandle(self.proc, self._conn, spec)
        try:
            try:
                handle._conn.send_bytes(pickle.dumps(spec))
            except (OSError, ValueError) as exc:
                raise handle._gone(f"cannot hand worker pid {self.pid} its group: {exc} ({handle._exit_text()})") \
                    from None
            started = handle._expect(START_ID, Started, start_timeout, "start")
            handle.endpoint = started.endpoint   # the worker's data-path listener ("" for a path without one)
        except WorkerError:
            handle._kill()
            raise
        return handle

    def discard(self) -> None:
        """End a worker that never got a group (it holds nothing: SIGKILL at once, so a drain running on the
        daemon's event loop never waits for a worker still importing)."""
        self._conn.close()
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait(DISCARD_WAIT)


class SessionWorkerHandle:
    def __init__(self, proc: subprocess.Popen, conn: Connection, spec: GroupSpec):
        self.proc, self.spec = proc, spec
        self.pid = proc.pid
        self._conn = conn
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._broken: str | None = None
        self.endpoint = ""

    @classmethod
    def start(cls, spec: GroupSpec, start_timeout: float = START_TIMEOUT,
              output: Callable[[str], None] | None = None) -> "SessionWorkerHandle":
        """Spawn the worker, wait until it mapped its partition; WorkerError if it cannot start.

        ``output(line)`` receives each line the worker prints (default: copied to stderr).
        """
        return SpawnedWorker.spawn(output).begin(spec, start_timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exitcode(self) -> int | None:
        return self.proc.poll()

    def call(self, command: Command, timeout: float = 30.0):
        """Send ``command`` and return its reply, of type ``command.reply`` (thread-safe; calls are
        answered in order).  Raises the worker's :class:`WorkerError`, or :class:`WorkerGone`."""
        if not isinstance(command, Command):
            raise TypeError(f"a worker command is one of graphfeed.server.worker.commands, got {command!r}")
        with self._lock:
            if self._broken:
                raise WorkerGone(self._broken)
            msg_id = next(self._ids)
            try:
                self._conn.send_bytes(pickle.dumps((msg_id, command)))
            except (OSError, ValueError) as exc:
                raise self._gone(f"cannot send {command.name}: {exc}") from None
            return self._expect(msg_id, command.reply, timeout, command.name)

    def _expect(self, msg_id, reply_type: type, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                ready = remaining > 0 and self._conn.poll(remaining)
                if not ready:
                    raise self._gone(f"worker pid {self.pid} did not answer {what} within {timeout:g} s")
                got_id, answer = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as exc:
                raise self._gone(f"worker pid {self.pid} died during {what} ({self._exit_text()}; {exc})") \
                    from None
            if got_id != msg_id:
                continue  # the late answer of a call that timed out
            if isinstance(answer, WorkerError):
                raise answer
            if not isinstance(answer, reply_type):
                raise WorkerError(f"worker pid {self.pid} answered {what} with {type(answer).__name__}, "
                                  f"expected {reply_type.__name__}; the daemon and the worker come from "
                                  f"different graphfeed versions")
            return answer

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
                self.call(Stop(), timeout=grace)
            except WorkerError:
                pass
        code: int | None
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



class WarmWorkers:
    """Up to ``count`` session workers spawned ahead of their groups (the daemon's ``warm_workers``), so an
    ``OpenGroup`` waits for a worker to map its part and listen, not for a process to start and import torch.

    :meth:`take` hands out the oldest live one; the daemon calls :meth:`fill` once that one has started (its
    successor's imports would otherwise compete with that start for the CPUs).  Thread-safe."""

    def __init__(self, count: int, spawn: Callable[[], SpawnedWorker]):
        self.count, self._spawn = count, spawn
        self._ready: collections.deque[SpawnedWorker] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False

    def fill(self) -> None:
        """Spawn workers until ``count`` wait (a spawn that fails is tried again at the next fill)."""
        with self._lock:
            while not self._closed and len(self._ready) < self.count:
                try:
                    self._ready.append(self._spawn())
                except WorkerError:
                    return

    def take(self) -> SpawnedWorker | None:
        """The oldest warm worker still alive (one that died meanwhile is dropped), or None."""
        with self._lock:
            while self._ready:
                worker = self._ready.popleft()
                if worker.alive():
                    return worker
                worker.discard()
        return None

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._ready]

    def close(self) -> None:
        """Discard every warm worker; later fills spawn none."""
        with self._lock:
            self._closed = True
            ready, self._ready = list(self._ready), collections.deque()
        for worker in ready:
            worker.discard()
