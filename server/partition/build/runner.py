"""Where the bounded partitioner's chunk tasks run: in this process, or on a Dask cluster.

A stage is a list of independent tasks ``fn(job, item)`` (``fn`` a module-level function, ``job`` a
picklable description shared by every task of the run, ``item`` small).  :class:`InProcess` runs
them one after the other; :class:`DaskRunner` submits them to a ``dask.distributed`` cluster (a
scheduler address, or a ``LocalCluster`` it starts) and gathers the results in item order.  Either
way a failed task raises in the caller with the item named, and a progress bar counts finished tasks.
"""
from __future__ import annotations

import logging
import os
import signal
from typing import Callable, Iterable, Sequence

Progress = Callable[[Iterable, str], Iterable]
CONNECT_TIMEOUT_S = 30
# Fault injection for the resume tests: SIGKILL this process after that many finished tasks.
KILL_AFTER_ENV = "GRAPHFEED_PARTITION_KILL_AFTER_TASKS"
_finished = [0]


class TaskError(RuntimeError):
    """A chunk task failed; the message names the stage, the item and the cause."""


def _fault_injection() -> None:
    limit = os.environ.get(KILL_AFTER_ENV)
    _finished[0] += 1
    if limit and _finished[0] >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


def _no_progress(iterable, desc):
    return iterable


class InProcess:
    """Runs every task here, in item order."""

    name = "in-process"

    def __init__(self, progress: Progress | None = None):
        self.progress = progress or _no_progress

    def map(self, fn: Callable, job, items: Sequence, desc: str, combine: Callable | None = None) -> list:
        """``[fn(job, item) for item in items]``; with ``combine``, each result is handed to it instead of kept."""
        out = []
        for item in self.progress(items, desc):
            result = fn(job, item)
            if combine is None:
                out.append(result)
            else:
                combine(result)
            _fault_injection()
        return out

    def close(self) -> None:
        pass


class DaskRunner:
    """Runs tasks on a ``dask.distributed`` cluster: ``scheduler`` (``tcp://HOST:8786``), or a ``LocalCluster``
    of ``workers`` single-threaded processes when ``scheduler`` is None.  Every worker must be able to
    import graphfeed and read and write the scratch and output folders (shared storage)."""

    def __init__(self, scheduler: str | None = None, workers: int = 2, progress: Progress | None = None,
                 memory_limit: int | None = None):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError as exc:
            raise TaskError("--scheduler/--workers need dask.distributed: pip install 'graphfeed[partition]'") from exc
        self.progress = progress or _no_progress
        self.cluster = None
        if scheduler is None:
            # silence_logs: the workers' shutdown chatter (heartbeats to a scheduler already closed) is
            # noise; a task's own error reaches the caller through its future.
            self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        dashboard_address=None, memory_limit=memory_limit or "auto",
                                        silence_logs=logging.CRITICAL)
            self.name = f"a local Dask cluster of {workers} worker(s)"
            address: object = self.cluster
        else:
            self.name, address = f"the Dask cluster at {scheduler}", scheduler
        try:
            self.client = Client(address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self.close()
            raise TaskError(f"cannot reach the Dask scheduler at {scheduler} within {CONNECT_TIMEOUT_S} s ({exc}); "
                            f"start it with `dask scheduler` (and workers with `dask worker {scheduler}`)") from exc
        self._job_key: object = None
        self._job_future = None

    def _scattered(self, job):
        if self._job_key is not job:   # one copy of the job on every worker, not one per task
            self._job_future = self.client.scatter(job, broadcast=True, hash=False)
            self._job_key = job
        return self._job_future

    def map(self, fn: Callable, job, items: Sequence, desc: str, combine: Callable | None = None) -> list:
        """As :meth:`InProcess.map`; results arrive in completion order (``combine`` must not care)."""
        from dask.distributed import as_completed

        if not items:
            return []
        job_future = self._scattered(job)
        futures = [self.client.submit(fn, job_future, item, pure=False) for item in items]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(items)
        bar = iter(self.progress(range(len(items)), desc))
        for future in as_completed(futures):
            if future.status == "error":
                exc = future.exception()
                for f in futures:
                    f.cancel()
                raise TaskError(f"{desc}: task {items[index[future.key]]!r} failed on {self.name}: {exc}") from exc
            if combine is None:
                results[index[future.key]] = future.result()
            else:
                combine(future.result())
            future.release()
            next(bar, None)
        return results

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
