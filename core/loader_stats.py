"""Wait and wall time of a loader's epochs, as ``loader.stats()`` reports them (both loaders).

Every loader keeps a :class:`LoaderStats`; :mod:`graphfeed.client.metrics` describes the figures and
exposes every loader's of this process for Prometheus (:data:`LOADERS`)::

    {"epoch": 3, "batches": 120, "wait_seconds": 1.9, "wall_seconds": 30.2,
     "data_stall_ratio": 0.063, "batches_per_second": 3.97, "batches_by_server": [61, 59], "resumes": 0,
     "total": {"batches": ..., "wait_seconds": ..., "wall_seconds": ...}}
"""
from __future__ import annotations

import threading
import time
import weakref

from graphfeed.core.metric_names import LATENCY_BUCKETS

LOADERS: "weakref.WeakSet[LoaderStats]" = weakref.WeakSet()   # every loader's stats in this process


class LoaderStats:
    """Wait and wall time of one loader's epochs (updated by the iterating thread)."""

    def __init__(self, name: str, num_servers: int, clock=time.perf_counter):
        self.name, self.clock = name, clock
        self._lock = threading.Lock()
        self.epoch = -1
        self._epoch_start: float | None = None
        self._epoch_end: float | None = None
        self._asked: float | None = None
        self.batches = 0
        self.wait = 0.0
        self.by_server = [0] * num_servers
        self.resumes = 0   # epochs resumed at the cursor after a server restart (cumulative)
        self.wait_counts = [0] * (len(LATENCY_BUCKETS) + 1)   # per-batch waits per bucket (last: +Inf)
        self.wait_sum = 0.0
        self._done = {"batches": 0, "wait_seconds": 0.0, "wall_seconds": 0.0}
        LOADERS.add(self)

    def start_epoch(self, epoch: int) -> None:
        """The trainer called ``iter()``: the epoch's clock starts and it waits for the first batch."""
        with self._lock:
            self._fold()
            now = self.clock()
            self.epoch, self._epoch_start, self._epoch_end, self._asked = epoch, now, None, now
            self.batches, self.wait = 0, 0.0
            self.by_server = [0] * len(self.by_server)

    def resumed(self) -> None:
        """The running epoch resumed at its cursor after the client re-formed its group."""
        with self._lock:
            self.resumes += 1

    def asked(self) -> None:
        """The trainer asked for the next batch."""
        self._asked = self.clock()

    def delivered(self, server: int) -> None:
        now = self.clock()
        with self._lock:
            if self._asked is not None:
                waited = now - self._asked
                self.wait += waited
                self.wait_sum += waited
                self.wait_counts[wait_bucket(waited)] += 1
                self._asked = None
            self.batches += 1
            self.by_server[server] += 1

    def end_epoch(self) -> None:
        with self._lock:
            if self._epoch_end is None and self._epoch_start is not None:
                self._epoch_end = self.clock()
            self._asked = None

    def _fold(self) -> None:
        """Add the finished epoch into the totals (called with the lock held)."""
        if self._epoch_start is None:
            return
        self._done["batches"] += self.batches
        self._done["wait_seconds"] += self.wait
        self._done["wall_seconds"] += self._wall()
        self._epoch_start = None

    def _wall(self) -> float:
        if self._epoch_start is None:
            return 0.0
        end = self._epoch_end if self._epoch_end is not None else self.clock()
        return max(0.0, end - self._epoch_start)

    def snapshot(self) -> dict:
        with self._lock:
            wall = self._wall()
            # the wait of a batch still being awaited counts: a stalled trainer shows up at once
            wait = self.wait + (self.clock() - self._asked if self._asked is not None else 0.0)
            return {
                "epoch": self.epoch, "batches": self.batches, "wait_seconds": wait, "wall_seconds": wall,
                "data_stall_ratio": wait / wall if wall > 0 else 0.0,
                "batches_per_second": self.batches / wall if wall > 0 else 0.0,
                "batches_by_server": list(self.by_server), "resumes": self.resumes,
                "total": {"batches": self._done["batches"] + self.batches,
                          "wait_seconds": self._done["wait_seconds"] + wait,
                          "wall_seconds": self._done["wall_seconds"] + wall},
            }


def wait_bucket(seconds: float) -> int:
    """Index of the first latency bucket whose upper bound holds ``seconds`` (the last one is +Inf)."""
    for i, bound in enumerate(LATENCY_BUCKETS):
        if seconds <= bound:
            return i
    return len(LATENCY_BUCKETS)
