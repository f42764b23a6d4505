"""Online sampling latency (``graphfeed bench online``): ``Client.sample`` as a serving path sees it.

For each request size (seeds per call, default 1, 64 and 1024, capped at the graph's nodes) it
sends ``warmup`` calls (not reported) and then ``requests`` calls one after another from one
thread, each for a fresh set of distinct random node ids (any parts; drawn from ``seed``), and
reports the wall-clock latency of a whole call -- the client's id check, the worker's sampling,
its remote hops and feature reads on the other parts, the answer over torch RPC and the
conversion to PyG ``Data`` -- as ``p50_ms``, ``p99_ms``, ``mean_ms`` and ``max_ms``
(nearest-rank percentiles).  The calls go round robin over the servers.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from graphfeed.bench.remote import check_servers, through_servers

DEFAULT_SIZES = (1, 64, 1024)


@dataclass(frozen=True)
class OnlineBenchConfig:
    """What ``bench online`` measures: ``servers`` is an int N (start N daemons over ``graph``, which
    has N parts) or a sequence of ``host:port`` of running servers."""

    servers: int | tuple[str, ...]
    graph: str | None = None
    num_neighbors: tuple[int, ...] = (15, 10, 5)
    sizes: tuple[int, ...] = DEFAULT_SIZES
    requests: int = 200
    warmup: int = 10
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "servers", check_servers(self.servers, self.graph))
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"--sizes must be positive seed counts, got {list(self.sizes)}")
        if self.requests < 1 or self.warmup < 0:
            raise ValueError(f"--requests must be >= 1 and --warmup >= 0, got {self.requests} and {self.warmup}")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latencies(client, size: int, cfg: OnlineBenchConfig, generator: torch.Generator) -> list[float]:
    """Seconds per ``client.sample`` call of ``size`` random distinct nodes (after the warm-up calls)."""
    out = []
    for i in range(cfg.warmup + cfg.requests):
        ids = torch.randperm(client.num_nodes, generator=generator)[:size]
        t0 = time.perf_counter()
        batch = client.sample(ids, list(cfg.num_neighbors), seed=i)
        dt = time.perf_counter() - t0
        if batch.batch_size != size:
            raise RuntimeError(f"a sample of {size} nodes came back with batch_size {batch.batch_size}")
        if i >= cfg.warmup:
            out.append(dt)
    return out


def summary(seconds: Sequence[float]) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"requests": len(ms), "p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
            "mean_ms": round(statistics.fmean(ms), 3), "max_ms": round(max(ms), 3)}


def measure(addresses: Sequence[str], cfg: OnlineBenchConfig) -> dict:
    import graphfeed.client as gf

    generator = torch.Generator().manual_seed(cfg.seed)
    with gf.connect(list(addresses)) as client:
        sizes = sorted({min(s, client.num_nodes) for s in cfg.sizes})
        result = {str(size): summary(latencies(client, size, cfg, generator)) for size in sizes}
        return {"latency": result, "num_parts": client.num_parts, "num_nodes": client.num_nodes}


def bench_online(cfg: OnlineBenchConfig) -> dict:
    """Measure online sampling latency; returns the JSON-ready result (see the module doc)."""
    from graphfeed.server.sampling import dispatch

    result = through_servers(cfg.servers, cfg.graph, "online", lambda addresses: measure(addresses, cfg))
    result.update({
        "implementation": dispatch.IMPLEMENTATION,
        "servers": cfg.servers if isinstance(cfg.servers, int) else len(cfg.servers),
        "graph": None if cfg.graph is None else os.fspath(cfg.graph),
        "num_neighbors": list(cfg.num_neighbors), "warmup": cfg.warmup, "seed": cfg.seed,
    })
    return result
