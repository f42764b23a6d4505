"""Prometheus metrics of one ``graphfeed serve`` daemon: every metric name, in one place.

:data:`METRICS` is the contract with dashboards and alert rules (``deploy/`` checks its
Grafana dashboard against :func:`series_names`).  Names are the ones PromQL uses:
counters end in ``_total``; a histogram ``X`` is queried as ``X_bucket``/``X_sum``/``X_count``.

Labels are bounded on purpose (never a session or group id; per-session figures are in
``graphfeed status`` / GetStats):

- ``kind``  the session's kind, folded into :data:`SESSION_KINDS` (anything else is ``other``);
- ``stage`` one of :data:`STAGES`;
- ``peer``  ``part<N>``, N < the graph's number of parts; ``call`` one of :data:`REMOTE_CALLS`;
- error ``kind``: a gRPC status name (lower case) or one of :data:`WORKER_ERROR_KINDS`.

Client-side names (the trainer's own endpoint, :mod:`graphfeed.client.metrics`) are in
:data:`graphfeed.core.metric_names.CLIENT_METRICS`, the one list client and server both read.
"""
from __future__ import annotations

import asyncio
import platform
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from graphfeed.core.metric_names import LATENCY_BUCKETS, MetricSpec
from graphfeed.server.worker.commands import Metrics, ServedCounts
from graphfeed.transport.secure.gate import LISTENER_KINDS

PREFIX = "graphfeed_"

SESSION_KINDS = ("train", "val", "test", "nodes", "other")
STAGES = ("local_sample", "remote_sample", "feature_gather", "encode", "batch")
REMOTE_CALLS = ("one_hop", "gather")
# data_path_refused: connections to a worker's secure data-path listener that failed the group handshake (or a
# frame's MAC): outsiders without the trainer group's key (graphfeed.transport.secure)
WORKER_ERROR_KINDS = ("produce", "remote", "worker_gone", "metrics_timeout", "data_path_refused")

METRICS: dict[str, MetricSpec] = {
    # ---- the process -----------------------------------------------------------------------------
    "graphfeed_build_info": MetricSpec("gauge", "Always 1; labels carry the graphfeed, Python and torch versions "
                                       "and whether the native sampling ops run (native=\"false\": the pure-torch "
                                       "fallback, about 3x slower).", ("version", "python", "torch", "native")),
    "graphfeed_start_time_seconds": MetricSpec("gauge", "Unix time the daemon started serving."),
    "graphfeed_uptime_seconds": MetricSpec("gauge", "Seconds since the daemon started serving."),
    "graphfeed_draining": MetricSpec("gauge", "1 while the daemon drains (SIGTERM, SIGINT or a Drain call), else 0."),
    # ---- the partition ---------------------------------------------------------------------------
    "graphfeed_partition_info": MetricSpec("gauge", "Always 1; labels name the graph and the part served.",
                                           ("graph", "part", "num_parts")),
    "graphfeed_partition_nodes": MetricSpec("gauge", "Nodes owned by this part."),
    "graphfeed_partition_edges": MetricSpec("gauge", "Edges stored in this part (its topologies' columns)."),
    "graphfeed_partition_mapped_bytes": MetricSpec("gauge", "Bytes of the part's memory-mapped array files."),
    # ---- groups and sessions (state computed at scrape time) -------------------------------------
    "graphfeed_groups_open": MetricSpec("gauge", "Trainer groups (session worker processes) open now."),
    "graphfeed_groups_opened_total": MetricSpec("counter", "Trainer groups opened."),
    "graphfeed_groups_reaped_total": MetricSpec("counter", "Trainer groups reaped (lease lapsed or worker died)."),
    "graphfeed_sessions_open": MetricSpec("gauge", "Sessions (loaders) open now.", ("kind",)),
    "graphfeed_sessions_opened_total": MetricSpec("counter", "Sessions opened."),
    "graphfeed_sessions_closed_total": MetricSpec("counter", "Sessions closed by their trainer (or by a drain)."),
    "graphfeed_sessions_reaped_total": MetricSpec("counter", "Sessions removed because their group was reaped."),
    # ---- the data path (merged from the session workers) -----------------------------------------
    "graphfeed_batches_produced_total": MetricSpec("counter", "Batches produced by session workers.", ("kind",)),
    "graphfeed_batches_served_total": MetricSpec("counter", "Batches handed to trainers.", ("kind",)),
    "graphfeed_bytes_served_total": MetricSpec("counter", "Tensor bytes of the batches handed to trainers.",
                                               ("kind",)),
    "graphfeed_buffered_batches": MetricSpec("gauge", "Produced batches waiting for their pull.", ("kind",)),
    "graphfeed_buffered_bytes": MetricSpec("gauge", "Tensor bytes of the batches waiting for their pull.",
                                           ("kind",)),
    "graphfeed_buffer_limit_batches": MetricSpec("gauge", "Bound on buffered batches, per session."),
    "graphfeed_buffer_limit_bytes": MetricSpec("gauge", "Bound on buffered bytes, per session (soft by one batch)."),
    "graphfeed_stage_seconds": MetricSpec("histogram", "Seconds per sampling stage of a batch: local_sample and "
                                          "remote_sample per hop, feature_gather, encode, batch (the whole batch).",
                                          ("stage",)),
    "graphfeed_remote_calls_total": MetricSpec("counter", "Calls to peer session workers.", ("peer", "call")),
    "graphfeed_remote_call_errors_total": MetricSpec("counter", "Failed calls to peer session workers.",
                                                     ("peer", "call")),
    "graphfeed_remote_call_seconds": MetricSpec("histogram", "Latency of calls to peer session workers.",
                                                ("peer", "call")),
    "graphfeed_gpu_feature_cache_rows_total": MetricSpec("counter", "Feature rows a GPU worker (device: cuda) read "
                                                         "from its GPU feature cache (result=\"hit\") or from pinned "
                                                         "host memory (\"miss\"); hit rate = hit / (hit + miss).",
                                                         ("result",)),
    "graphfeed_data_path_listener_total": MetricSpec("counter", "Connections to the session workers' secure "
                                                     "data listeners by what became of them: accepted, "
                                                     "authenticated, refused_cap / refused_source (closed at once: "
                                                     "data_handshakes / data_handshakes_per_source in set-up), "
                                                     "refused_connections (data_connections open), "
                                                     "handshake_timeout, handshake_failed, frame_refused; and "
                                                     "accept_error / thread_error (accepting paused, then resumed).",
                                                     ("kind",)),
    "graphfeed_data_path_saturated": MetricSpec("gauge", "1 while a session worker's data listener has every set-up "
                                                "slot taken (data_handshakes): new connections are closed at once."),
    # ---- learnable embedding tables (graphfeed.server.embedding), summed over the trainer groups ---------
    "graphfeed_embedding_rows": MetricSpec("gauge", "Rows of embedding tables this part holds, per table name "
                                           "(summed over the open trainer groups).", ("table",)),
    "graphfeed_embedding_bytes": MetricSpec("gauge", "Bytes of embedding tables this part holds, rows and "
                                            "optimizer state, per table name (summed over the open groups).",
                                            ("table",)),
    "graphfeed_embedding_pushes_total": MetricSpec("counter", "Sparse optimizer steps applied to this part's rows "
                                                   "(pushes/s = rate of this).", ("table",)),
    "graphfeed_embedding_rows_applied_total": MetricSpec("counter", "Distinct rows updated by those steps "
                                                         "(rows applied/s = rate of this).", ("table",)),
    # ---- errors and the scrape itself ------------------------------------------------------------
    "graphfeed_errors_total": MetricSpec("counter", "Errors by kind: refused requests by gRPC status name, "
                                         "worker-side failures (produce, remote, worker_gone, metrics_timeout).",
                                         ("kind",)),
    "graphfeed_worker_snapshot_age_seconds": MetricSpec("gauge", "Age of the oldest session-worker figures this "
                                                        "scrape used (figures are cached; 0 when no worker)."),
}

METRIC_NAMES: tuple[str, ...] = tuple(METRICS)

# prometheus_client's standard process collector (Linux), registered beside ours on the endpoint.
PROCESS_SERIES = frozenset({"process_cpu_seconds_total", "process_resident_memory_bytes",
                            "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                            "process_start_time_seconds"})


def series_names(specs: dict[str, MetricSpec] | None = None) -> set[str]:
    """Every sample name the endpoint can expose (histograms as ``_bucket``/``_sum``/``_count``)."""
    out: set[str] = set()
    for name, spec in (METRICS if specs is None else specs).items():
        if spec.type == "histogram":
            out.update({f"{name}_bucket", f"{name}_sum", f"{name}_count"})
        else:
            out.add(name)
    return out


def session_kind(kind: str) -> str:
    """The bounded label value for a session's free-form ``kind``."""
    return kind if kind in SESSION_KINDS else "other"


# =================================================================================================
# The daemon's endpoint: worker figures cached per group, one Collector, an HTTP server.
# =================================================================================================

SCRAPE_REFRESH_WAIT = 0.3     # seconds a scrape waits for fresh worker figures before using the cache
FINAL_FETCH_TIMEOUT = 2.0     # seconds for a stopping worker's last figures


def served_metric(key: str) -> str:
    """The metric of a :class:`ServedCounts` field: ``graphfeed_<key>_total`` for a counter, ``graphfeed_<key>`` for
    a gauge."""
    return f"graphfeed_{key}" if key in ServedCounts.GAUGES else f"graphfeed_{key}_total"


def _add_hist(into: dict, h: dict) -> None:
    if not into:
        into.update(counts=[0] * len(h["counts"]), sum=0.0, count=0)
    into["counts"] = [a + b for a, b in zip(into["counts"], h["counts"])]
    into["sum"] += h["sum"]
    into["count"] += h["count"]


def empty_figures() -> dict:
    return {"kinds": {}, "stages": {}, "remote": {}, "remote_errors": {}, "errors": {}, "gpu_cache": {},
            "embeddings": {}, "listener": {}, "listener_saturated": 0}


EMBEDDING_GAUGES, EMBEDDING_COUNTERS = ("rows", "bytes"), ("pushes", "rows_applied")


def merge_figures(total: dict, snap: dict, *, gauges: bool = True) -> dict:
    """Add worker snapshot ``snap`` into ``total`` (kinds folded to :func:`session_kind`)."""
    for kind, counts in (snap.get("kinds") or {}).items():
        label = session_kind(kind)
        total["kinds"][label] = total["kinds"].get(label, ServedCounts()) + (counts if gauges else counts.cumulative())
    for section in ("stages", "remote"):
        for key, h in (snap.get(section) or {}).items():
            _add_hist(total[section].setdefault(key, {}), h)
    for section in ("remote_errors", "errors", "gpu_cache", "listener"):
        for key, n in (snap.get(section) or {}).items():
            total[section][key] = total[section].get(key, 0) + int(n)
    if gauges:   # 1 while any open group's listener is saturated; a stopped one's is not
        total["listener_saturated"] = max(total["listener_saturated"], int(snap.get("listener_saturated") or 0))
    for table, figures in (snap.get("embeddings") or {}).items():   # a stopped group's tables hold no rows
        into = total["embeddings"].setdefault(table, dict.fromkeys(EMBEDDING_GAUGES + EMBEDDING_COUNTERS, 0))
        for key in EMBEDDING_COUNTERS + (EMBEDDING_GAUGES if gauges else ()):
            into[key] += int(figures.get(key, 0))
    return total


class WorkerFigures:
    """The last metrics snapshot of every open group's worker, plus the totals of stopped ones.

    Updated on the daemon's event loop; read by the scrape thread under ``_lock``.  A worker's
    figures are cumulative, so the scrape adds the stopped workers' last figures and counters
    never go back when a group closes or is reaped.
    """

    def __init__(self, registry, call_timeout: float):
        self.registry = registry
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._latest: dict[int, tuple[float, dict]] = {}    # id(group) -> (monotonic time, snapshot)
        self._retired = empty_figures()
        self._inflight: dict[int, asyncio.Task] = {}
        self.fetch_failures = 0

    async def refresh(self) -> None:
        """Ask every open group's worker for its figures (one call in flight per worker)."""
        for group in list(self.registry.groups.values()):
            key = id(group)
            if key not in self._inflight:
                task = asyncio.get_running_loop().create_task(self._fetch(group))
                self._inflight[key] = task
                task.add_done_callback(self._forget(key))
        if self._inflight:
            await asyncio.wait(set(self._inflight.values()))

    def _forget(self, key: int):
        def done(_task: asyncio.Task) -> None:
            self._inflight.pop(key, None)
        return done

    async def _fetch(self, group) -> None:
        snap = await self._call_metrics(group, self.call_timeout)
        if snap is not None and self.registry.groups.get(group.group_id) is group:
            with self._lock:
                self._latest[id(group)] = (time.monotonic(), snap)

    async def _call_metrics(self, group, timeout: float) -> dict | None:
        try:
            reply = await asyncio.wait_for(asyncio.to_thread(group.handle.call, Metrics(), timeout=timeout),
                                           timeout + 1.0)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001 -- a worker without figures is no failure here
            self.fetch_failures += 1
            return None
        return reply.figures

    async def retire(self, group) -> None:
        """Fold a stopping group's last figures into the totals (a final fetch if its worker still runs)."""
        final = None
        if group.handle.alive():
            final = await self._call_metrics(group, FINAL_FETCH_TIMEOUT)
        with self._lock:
            _, cached = self._latest.pop(id(group), (0.0, None))
            last = final if final is not None else cached
            if last is not None:
                merge_figures(self._retired, last, gauges=False)

    def merged(self) -> tuple[dict, float]:
        """Figures of every worker, open and stopped; and the age in seconds of the oldest snapshot used."""
        now = time.monotonic()
        with self._lock:
            total = merge_figures(empty_figures(), self._retired, gauges=False)
            latest = list(self._latest.values())
        for _, snap in latest:
            merge_figures(total, snap)
        age = max((now - t for t, _ in latest), default=0.0)
        return total, age


def partition_figures(served) -> dict[str, int]:
    """Nodes, stored edges and mapped bytes of the served part (computed once at startup)."""
    from graphfeed.server.partition.format.store import Partition

    part = Partition(served.root, served.part_id, served.meta)
    edges = int(part.topology(served.meta.topologies[0]).indices.numel())
    folder = Path(part.paths.part(served.part_id))
    mapped = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.suffix == ".npy")
    return {"nodes": int(served.num_local_nodes), "edges": edges, "mapped_bytes": int(mapped)}


def build_labels() -> dict[str, str]:
    from importlib import metadata

    try:
        version = metadata.version("graphfeed")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "unknown"
    return {"version": version, "python": platform.python_version(), "torch": torch_version}


def _family(name: str, spec: MetricSpec | None = None):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    spec = spec or METRICS[name]
    cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}[spec.type]
    return cls(name, spec.help, labels=list(spec.labels))


def _hist_buckets(h: dict) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, n in zip(list(LATENCY_BUCKETS) + [float("inf")], h["counts"]):
        running += n
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return out


def _copy(mapping) -> dict:
    """A copy of a dict the event loop may be changing (the scrape runs in another thread)."""
    for _ in range(10):
        try:
            return dict(mapping)
        except RuntimeError:  # changed size during the copy: try again
            continue
    return {}


class ServerCollector:
    """Builds every :data:`METRICS` family at scrape time from the daemon's live state."""

    def __init__(self, daemon, figures: WorkerFigures, partition: dict[str, int], loop: asyncio.AbstractEventLoop):
        self.daemon, self.figures, self.partition, self.loop = daemon, figures, partition, loop
        self.build = build_labels()
        self.native = "true" if getattr(daemon, "implementation", "") == "native" else "false"
        self.started_unix = time.time()
        self.started = time.monotonic()

    def describe(self) -> list:
        return []  # families are built at scrape time; nothing to check at registration

    def _refresh(self) -> None:
        """Fresh worker figures if they come quickly; the cached ones otherwise (never blocks sampling)."""
        if self.loop.is_closed():
            return
        fut = asyncio.run_coroutine_threadsafe(self.figures.refresh(), self.loop)
        try:
            fut.result(SCRAPE_REFRESH_WAIT)
        except Exception:  # noqa: BLE001 -- timeout or loop shutting down: the cache answers
            pass

    def collect(self) -> Iterable[Any]:
        self._refresh()
        figures, age = self.figures.merged()
        yield from self._process()
        yield from self._sessions()
        yield from self._data_path(figures)
        yield from self._listener(figures)
        yield from self._latency(figures)
        yield from self._embeddings(figures)
        yield from self._errors(figures, age)

    def _process(self):
        d, c = self.daemon, self.daemon.config
        f = _family("graphfeed_build_info")
        f.add_metric([self.build["version"], self.build["python"], self.build["torch"], self.native], 1)
        yield f
        yield self._single("graphfeed_start_time_seconds", self.started_unix)
        yield self._single("graphfeed_uptime_seconds", time.monotonic() - self.started)
        yield self._single("graphfeed_draining", 1 if d.draining else 0)
        meta = d.served.meta
        f = _family("graphfeed_partition_info")
        f.add_metric([meta.graph_name, str(c.part), str(meta.num_parts)], 1)
        yield f
        for key in ("nodes", "edges", "mapped_bytes"):
            yield self._single(f"graphfeed_partition_{key}", self.partition[key])
        yield self._single("graphfeed_buffer_limit_batches", c.buffer_batches)
        yield self._single("graphfeed_buffer_limit_bytes", c.buffer_bytes)

    def _sessions(self):
        reg = self.daemon.registry
        yield self._single("graphfeed_groups_open", len(_copy(reg.groups)))
        yield self._single("graphfeed_groups_opened_total", reg.groups_opened_total)
        yield self._single("graphfeed_groups_reaped_total", reg.groups_reaped_total)
        open_by_kind = dict.fromkeys(SESSION_KINDS, 0)
        for s in _copy(reg.sessions).values():
            open_by_kind[session_kind(s.kind)] += 1
        f = _family("graphfeed_sessions_open")
        for kind, n in open_by_kind.items():
            f.add_metric([kind], n)
        yield f
        yield self._single("graphfeed_sessions_opened_total", reg.sessions_opened_total)
        yield self._single("graphfeed_sessions_closed_total", reg.sessions_closed_total)
        yield self._single("graphfeed_sessions_reaped_total", reg.sessions_reaped_total)

    def _data_path(self, figures: dict):
        kinds = figures["kinds"]
        for key in ServedCounts.names():   # graphfeed_<key>_total (cumulative) or graphfeed_<key> (gauge)
            f = _family(served_metric(key))
            for kind in SESSION_KINDS:  # every kind always present: a fixed, small series set
                f.add_metric([kind], getattr(kinds.get(kind, ServedCounts()), key))
            yield f

    def _listener(self, figures: dict):
        f = _family("graphfeed_data_path_listener_total")
        for kind in LISTENER_KINDS:   # every kind always present (0 too), so an alert on its rate has a series
            f.add_metric([kind], figures["listener"].get(kind, 0))
        yield f
        yield self._single("graphfeed_data_path_saturated", figures["listener_saturated"])

    def _latency(self, figures: dict):
        f = _family("graphfeed_stage_seconds")
        for stage in STAGES:
            h = figures["stages"].get(stage)
            if h:
                f.add_metric([stage], _hist_buckets(h), h["sum"])
        yield f
        calls, errors, hist = (_family("graphfeed_remote_calls_total"), _family("graphfeed_remote_call_errors_total"),
                               _family("graphfeed_remote_call_seconds"))
        for (peer, call), h in sorted(figures["remote"].items()):
            calls.add_metric([peer, call], h["count"])
            errors.add_metric([peer, call], figures["remote_errors"].get((peer, call), 0))
            hist.add_metric([peer, call], _hist_buckets(h), h["sum"])
        yield from (calls, errors, hist)

    def _embeddings(self, figures: dict):
        tables = sorted(figures.get("embeddings", {}).items())
        for key in EMBEDDING_GAUGES + EMBEDDING_COUNTERS:
            name = f"graphfeed_embedding_{key}" + ("_total" if key in EMBEDDING_COUNTERS else "")
            f = _family(name)
            for table, values in tables:
                f.add_metric([table], values[key])
            yield f

    def _errors(self, figures: dict, age: float):
        counts = dict(figures["errors"])
        counts.setdefault("data_path_refused", 0)   # exposed at 0 too, so an alert on its rate has a series
        control = getattr(self.daemon, "control", None)
        for kind, n in _copy(getattr(control, "errors", {})).items():
            counts[kind] = counts.get(kind, 0) + n
        cache = _family("graphfeed_gpu_feature_cache_rows_total")
        for result, n in sorted(figures.get("gpu_cache", {}).items()):
            cache.add_metric([result], n)
        yield cache
        f = _family("graphfeed_errors_total")
        for kind, n in sorted(counts.items()):
            f.add_metric([kind], n)
        if self.figures.fetch_failures:
            f.add_metric(["metrics_timeout"], self.figures.fetch_failures)
        yield f
        yield self._single("graphfeed_worker_snapshot_age_seconds", age)

    @staticmethod
    def _single(name: str, value: float):
        f = _family(name)
        f.add_metric([], value)
        return f


class MetricsEndpoint:
    """The daemon's ``/metrics``: an explicit registry (no process-global one) on its own HTTP thread."""

    def __init__(self, daemon, figures: WorkerFigures, loop: asyncio.AbstractEventLoop):
        from prometheus_client import CollectorRegistry, ProcessCollector

        self.figures = figures
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = ServerCollector(daemon, self.figures, partition_figures(daemon.served), loop)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)   # process_cpu_seconds_total, RSS, open fds, ...
        self._server: Any = None   # prometheus_client's WSGI server and its thread, once started
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self, host: str, port: int) -> int:
        """Serve on ``host:port`` (0 = any free port); returns the bound port.  OSError if it cannot bind."""
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
