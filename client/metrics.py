"""Trainer-side figures of a loader: how long the trainer waited for data, and throughput.

Every loader (the remote ones, and the in-process ones of this process too) keeps a
:class:`~graphfeed.core.loader_stats.LoaderStats`; read it with ``loader.stats()``::

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

from graphfeed.client.replicas import FAILOVERS
from graphfeed.core.loader_stats import LOADERS, LoaderStats
from graphfeed.core.metric_names import CLIENT_METRICS, LATENCY_BUCKETS


class _LoaderCollector:
    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        families = {name: (CounterMetricFamily if spec.type == "counter" else HistogramMetricFamily)(
            name, spec.help, labels=list(spec.labels)) for name, spec in CLIENT_METRICS.items()}
        per_name: dict[str, list[LoaderStats]] = {}
        for stats in list(LOADERS):
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
        for part, moves in sorted(FAILOVERS.items()):
            families["graphfeed_client_failovers_total"].add_metric([str(part)], moves)
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
