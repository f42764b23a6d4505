"""The daemon's view of a session worker: the one import point of ``graphfeed.server.worker.handle``.

The daemon only needs ``GroupSpec`` (what to start), a factory ``GroupSpec -> handle``
and the two error types.  A handle provides ``pid``, ``alive()``, ``exitcode()``,
``call(command, timeout=..., **kwargs)`` and ``stop(grace)`` (see the worker module).

While the worker module has not landed in a build, :data:`WORKER_IMPORT_ERROR` says why
and :func:`default_factory` raises :class:`WorkerUnavailable` (OpenGroup answers
UNAVAILABLE); tests inject a fake factory through ``Daemon(worker_factory=...)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

try:
    from graphfeed.server.worker.handle import GroupSpec, SessionWorkerHandle, WorkerError, WorkerGone
    WORKER_IMPORT_ERROR: str | None = None
except ImportError as _exc:  # the worker package is not part of this build (yet)
    SessionWorkerHandle = None  # type: ignore[assignment,misc]
    WORKER_IMPORT_ERROR = f"graphfeed.server.worker.handle cannot be imported ({_exc})"

    @dataclass(frozen=True)
    class GroupSpec:  # type: ignore[no-redef]  # same fields as the worker module's GroupSpec
        group_id: str
        rendezvous: str
        world_size: int
        rank: int
        part_id: int
        partition_root: str
        data_address: str = "127.0.0.1"
        rpc_timeout: float = 60.0
        num_producers: int = 2
        buffer_batches: int = 8
        buffer_bytes: int = 256 << 20
        join_timeout: float = 60.0

    class WorkerError(Exception):  # type: ignore[no-redef]
        kind = "error"

    class WorkerGone(WorkerError):  # type: ignore[no-redef]
        pass


class WorkerUnavailable(RuntimeError):
    """Session workers cannot be started in this build."""


WorkerFactory = Callable[[GroupSpec], Any]


def default_factory(spec: GroupSpec):
    if SessionWorkerHandle is None:
        raise WorkerUnavailable(f"session workers are not available: {WORKER_IMPORT_ERROR}")
    return SessionWorkerHandle.start(spec)
