"""Trainer-side figures of a loader: how long the trainer waited for data, and throughput.

Every :class:`graphfeed.client.RemoteNeighborLoader` keeps a :class:`LoaderStats`; read it
with ``loader.stats()``::

    {"epoch": 3, "batches": 120, "wait_seconds": 1.9, "wall_seconds": 30.2,
     "data_stall_ratio": 0.063, "batches_per_second": 3.97, "batches_by_server": [61, 59], "resumes": 0,
     "total": {"batches": ..., "wait_seconds": ..., "wall_seconds": ...}}

The top-level figures cover the current (or last) epoch; ``total`` every epoch so far.
*wait* is the time from the trainer asking for the next batch (``next()`` on the iterator,
or ``iter()`` for the first) until the loader hands it over; *wall* the time since the
epoch's ``iter()``.  ``data_stall_ratio`` = wait / wall: 0 means the trainer never waited
for data, 1 that it did nothing else.

:func:`start_metrics_server` exposes the same figures for Prometheus on the trainer
(its own registry; ``prometheus_client`` is imported only then) as counters and a
histogram of per-batch waits, which Prometheus can sum over trainers; the ratios are
derived in PromQL (``rate(wait_seconds_total) / rate(wall_seconds_total)``), never
precomputed here.  The names match
:data:`graphfeed.core.metric_names.CLIENT_METRICS`, which the daemon's metrics module lists too.
"""
from __future__ import annotations

import threading
import time
import weakref

from graphfeed.core.metric_names import CLIENT_METRICS, LATENCY_BUCKETS

_LOADERS: "weakref.WeakSet[LoaderStats]" = weakref.WeakSet()


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
        _LOADERS.add(self)

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
                self.wait_counts[_bucket(waited)] += 1
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


def _bucket(seconds: float) -> int:
    """Index of the first latency bucket whose upper bound holds ``seconds`` (the last one is +Inf)."""
    for i, bound in enumerate(LATENCY_BUCKETS):
        if seconds <= bound:
            return i
    return len(LATENCY_BUCKETS)


class _LoaderCollector:
    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        families = {name: (CounterMetricFamily if spec.type == "counter" else HistogramMetricFamily)(
            name, spec.help, labels=list(spec.labels)) for name, spec in CLIENT_METRICS.items()}
        per_name: dict[str, list[LoaderStats]] = {}
        for stats in list(_LOADERS):
            per_name.setdefault(stats.name, []).append(stats)
        for name, loaders in sorted(per_name.items()):
            # loaders of one kind (e.g. two "val" loaders) share a series: labels stay bounded
            snaps = [s.snapshot() for s in loaders]
            for metric, key in (("batches_total", "batches"), ("wait_seconds_total", "wait_seconds"),
                                ("wall_seconds_total", "wall_seconds")):
                families[f"graphfeed_client_{metric}"].add_metric([name], sum(s["total"][key] for s in snaps))
            families["graphfeed_client_resumes_total"].add_metric([name], sum(s["resumes"] for s in snaps))
            counts = [sum(s.wait_counts[i] for s in loaders) for i in range(len(LATENCY_BUCKETS) + 1)]
            running, buckets = 0, []
            for bound, n in zip([repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"], counts):
                running += n
                buckets.append((bound, running))
            families["graphfeed_client_batch_wait_seconds"].add_metric([name], buckets,
                                                                       sum(s.wait_sum for s in loaders))
        return list(families.values())


class MetricsServer:
    """The trainer's Prometheus endpoint (see :func:`start_metrics_server`)."""

    def __init__(self, server, thread, registry):
        self._server, self._thread, self.registry = server, thread, registry
        self.port = int(server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def start_metrics_server(port: int = 0, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve every loader's figures of this process on ``http://addr:port/metrics`` (0 = any free port).

    Returns a :class:`MetricsServer` (``.port`` is the bound port; ``.close()`` stops it).
    Needs ``prometheus_client`` (``pip install prometheus-client``); raises ImportError saying so.
    """
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise ImportError("graphfeed.client.start_metrics_server needs prometheus_client: "
                          "pip install prometheus-client") from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_LoaderCollector())
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread, registry)
