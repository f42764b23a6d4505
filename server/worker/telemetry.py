"""What a session worker measures, kept as cumulative figures the daemon merges at scrape time.

The worker process has no HTTP endpoint: the daemon asks for :meth:`WorkerTelemetry.snapshot`
over the worker's pipe (command ``metrics``) and exposes the merged figures on its own
``/metrics`` (one scrape per server).  Every figure is cumulative since the worker started,
so the daemon can keep the last snapshot of a stopped worker and counters never go back.

Thread-safe: producer threads and torch RPC callback threads record concurrently.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

from graphfeed.core.metric_names import LATENCY_BUCKETS


class Histogram:
    """Observation counts per bucket of :data:`LATENCY_BUCKETS` (+Inf last), sum and count."""

    __slots__ = ("counts", "sum", "count")

    def __init__(self):
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def to_dict(self) -> dict:
        return {"counts": list(self.counts), "sum": self.sum, "count": self.count}


class WorkerTelemetry:
    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self._lock = threading.Lock()
        self._stages: dict[str, Histogram] = {}
        self._remote: dict[tuple[str, str], Histogram] = {}
        self._remote_errors: Counter = Counter()
        self._errors: Counter = Counter()

    def observe_stage(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._stages.setdefault(stage, Histogram()).observe(seconds)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        t0 = self.clock()
        try:
            yield
        finally:
            self.observe_stage(stage, self.clock() - t0)

    def observe_remote(self, peer: int, call: str, seconds: float, ok: bool) -> None:
        key = (f"part{peer}", call)
        with self._lock:
            self._remote.setdefault(key, Histogram()).observe(seconds)
            if not ok:
                self._remote_errors[key] += 1

    def count_error(self, kind: str) -> None:
        with self._lock:
            self._errors[kind] += 1

    def snapshot(self) -> dict:
        """Plain, picklable cumulative figures: ``stages``, ``remote``, ``remote_errors``, ``errors``."""
        with self._lock:
            return {
                "stages": {k: h.to_dict() for k, h in self._stages.items()},
                "remote": {k: h.to_dict() for k, h in self._remote.items()},
                "remote_errors": dict(self._remote_errors),
                "errors": dict(self._errors),
            }
