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
:data:`CLIENT_METRICS`; the client cannot import this module (it never imports the server),
so a test checks both lists agree.
"""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "graphfeed_"

SESSION_KINDS = ("train", "val", "test", "nodes", "other")
STAGES = ("local_sample", "remote_sample", "feature_gather", "encode", "batch")
REMOTE_CALLS = ("one_hop", "gather")
WORKER_ERROR_KINDS = ("produce", "remote", "worker_gone", "metrics_timeout")

# Seconds; shared by the workers (which count observations into these buckets) and the daemon.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class MetricSpec:
    type: str                 # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...] = ()


METRICS: dict[str, MetricSpec] = {
    # ---- the process -----------------------------------------------------------------------------
    "graphfeed_build_info": MetricSpec("gauge", "Always 1; labels carry the graphfeed, Python and torch versions.",
                                       ("version", "python", "torch")),
    "graphfeed_start_time_seconds": MetricSpec("gauge", "Unix time the daemon started serving."),
    "graphfeed_uptime_seconds": MetricSpec("gauge", "Seconds since the daemon started serving."),
    "graphfeed_draining": MetricSpec("gauge", "1 while the daemon drains (SIGTERM received), else 0."),
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
    # ---- errors and the scrape itself ------------------------------------------------------------
    "graphfeed_errors_total": MetricSpec("counter", "Errors by kind: refused requests by gRPC status name, "
                                         "worker-side failures (produce, remote, worker_gone, metrics_timeout).",
                                         ("kind",)),
    "graphfeed_worker_snapshot_age_seconds": MetricSpec("gauge", "Age of the oldest session-worker figures this "
                                                        "scrape used (figures are cached; 0 when no worker)."),
}

CLIENT_METRICS: dict[str, MetricSpec] = {
    "graphfeed_client_batches_total": MetricSpec("counter", "Batches the loader yielded to the trainer.",
                                                 ("loader",)),
    "graphfeed_client_wait_seconds_total": MetricSpec("counter", "Seconds the trainer waited for its next batch.",
                                                      ("loader",)),
    "graphfeed_client_wall_seconds_total": MetricSpec("counter", "Seconds of iteration (wait + training step).",
                                                      ("loader",)),
    "graphfeed_client_data_stall_ratio": MetricSpec("gauge", "wait seconds / wall seconds of the current epoch.",
                                                    ("loader",)),
    "graphfeed_client_batches_per_second": MetricSpec("gauge", "Batches per wall second of the current epoch.",
                                                      ("loader",)),
}

METRIC_NAMES: tuple[str, ...] = tuple(METRICS)
CLIENT_METRIC_NAMES: tuple[str, ...] = tuple(CLIENT_METRICS)


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
