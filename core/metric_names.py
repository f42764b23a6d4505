"""Metric names both sides expose: the trainer's loader figures and the latency buckets.

The daemon's own metrics are in :mod:`graphfeed.server.daemon.metrics`; the trainer's
(:mod:`graphfeed.client.metrics`) are declared here so the client need not import the server.
"""
from __future__ import annotations

from dataclasses import dataclass

# Seconds; shared by the workers (which count observations into these buckets) and the daemon.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class MetricSpec:
    type: str                 # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...] = ()


CLIENT_METRICS: dict[str, MetricSpec] = {
    "graphfeed_client_batches_total": MetricSpec("counter", "Batches the loader yielded to the trainer.",
                                                 ("loader",)),
    "graphfeed_client_wait_seconds_total": MetricSpec("counter", "Seconds the trainer waited for its next batch.",
                                                      ("loader",)),
    "graphfeed_client_wall_seconds_total": MetricSpec("counter", "Seconds of iteration (wait + training step).",
                                                      ("loader",)),
    "graphfeed_client_batch_wait_seconds": MetricSpec("histogram", "Seconds the trainer waited for each batch.",
                                                      ("loader",)),
    "graphfeed_client_resumes_total": MetricSpec("counter", "Epochs the loader resumed at its cursor after the "
                                                            "client re-formed its group (a server restarted).",
                                                 ("loader",)),
    "graphfeed_client_failovers_total": MetricSpec("counter", "Times a part moved to another of its replicas (the "
                                                              "server this trainer used for it was lost).",
                                                   ("part",)),
}
# Ratios are derived in PromQL from the counters, so they aggregate over trainers and time windows:
#   data-stall ratio  sum(rate(graphfeed_client_wait_seconds_total[5m]))
#                       / sum(rate(graphfeed_client_wall_seconds_total[5m]))
#   batches/s         sum(rate(graphfeed_client_batches_total[5m]))
CLIENT_METRIC_NAMES: tuple[str, ...] = tuple(CLIENT_METRICS)
