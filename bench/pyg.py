"""PyG's own loader over graphfeed's stores against graphfeed's loader (``graphfeed bench pyg``).

Both run in this process against the same servers and the same ``input_count`` input nodes of the label
type (a seeded random choice, so a homogeneous and a typed graph are measured alike): graphfeed's
``client.neighbor_loader(..., shuffle=True)`` and PyG's ``NeighborLoader((fs, gs), ..., shuffle=True)``
over :class:`~graphfeed.pyg.GraphfeedFeatureStore` / :class:`~graphfeed.pyg.GraphfeedGraphStore` (the
sampler PyG picks there, :class:`~graphfeed.pyg.GraphfeedSampler`, with ``pyg_prefetch`` batches ahead per
server; 0: one synchronous call per batch, the figure before batches ahead).  After one warm-up epoch of
each, ``rounds`` rounds each time one epoch of both, the order alternating (a shared machine's load drifts);
``seeds_per_s`` is seeds / wall time of an epoch as the training loop sees it (``step_ms``: a simulated
step per batch, a sleep, as a step on a GPU leaves the trainer's CPU free).  Reported: each path's median,
min and max, the per-round ratios PyG / graphfeed and their median (``ratio``), and the load average around
the run.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from graphfeed.bench.remote import check_servers, through_servers


@dataclass(frozen=True)
class PygBenchConfig:
    """What ``bench pyg`` measures: ``servers`` is an int N (start N daemons over ``graph``, which has N parts)
    or a sequence of ``host:port`` of running servers."""

    servers: int | tuple[str, ...]
    graph: str | None = None
    num_neighbors: tuple[int, ...] = (10, 5)
    batch_size: int = 512
    input_count: int = 20_480
    rounds: int = 3
    pyg_prefetch: int = 4
    step_ms: float = 0.0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "servers", check_servers(self.servers, self.graph))
        for name in ("batch_size", "input_count", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.pyg_prefetch < 0 or self.step_ms < 0:
            raise ValueError(f"--pyg-prefetch and --step-ms must be >= 0, got {self.pyg_prefetch}, {self.step_ms}")


def epoch_seeds_per_s(loader, input_type: str | None, step_ms: float) -> float:
    """Seeds per second of one epoch of ``loader`` (``batch_size`` of the input type's store)."""
    seeds, t0 = 0, time.perf_counter()
    for batch in loader:
        if step_ms:
            time.sleep(step_ms / 1000.0)   # the step of a trainer whose model runs elsewhere (a GPU): CPU left free
        seeds += int((batch if input_type is None else batch[input_type]).batch_size)
    return seeds / (time.perf_counter() - t0)


def figures(values: Sequence[float]) -> dict:
    return {"median": round(statistics.median(values)), "min": round(min(values)), "max": round(max(values))}


def loaders(client, cfg: PygBenchConfig) -> tuple[dict[str, Callable[[], object]], str | None]:
    """Makers of both loaders over the same input (fresh each epoch, as a script's loop re-iterates one)."""
    from torch_geometric.loader import NeighborLoader

    from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore

    label = client.label_type
    typed = not (list(client.node_types) == [label] and len(client.edge_types) == 1)
    total = client.num_nodes_of(label)
    ids = torch.randperm(total, generator=torch.Generator().manual_seed(cfg.seed))[:cfg.input_count]
    inputs = (label, ids) if typed else ids
    fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
    fanouts = list(cfg.num_neighbors)
    ours = client.neighbor_loader(input_nodes=inputs, num_neighbors=fanouts, batch_size=cfg.batch_size,
                                  shuffle=True, seed=cfg.seed)
    pyg = NeighborLoader((fs, gs), num_neighbors=fanouts, input_nodes=inputs, batch_size=cfg.batch_size,
                         shuffle=True)
    pyg.node_sampler.prefetch = cfg.pyg_prefetch
    return {"graphfeed": lambda: ours, "pyg": lambda: pyg}, (label if typed else None)


def measure(addresses: Sequence[str], cfg: PygBenchConfig) -> dict:
    import graphfeed.client as gf

    with gf.connect(list(addresses)) as client:
        makers, input_type = loaders(client, cfg)
        for make in makers.values():                    # warm-up: sessions, caches, page cache
            epoch_seeds_per_s(make(), input_type, cfg.step_ms)
        got: dict[str, list[float]] = {name: [] for name in makers}
        for r in range(cfg.rounds):
            for name in (list(makers) if r % 2 == 0 else list(reversed(makers))):
                got[name].append(epoch_seeds_per_s(makers[name](), input_type, cfg.step_ms))
        ratios = [p / g for p, g in zip(got["pyg"], got["graphfeed"])]
        return {"seeds_per_s": {name: figures(v) for name, v in got.items()},
                "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
                "typed": input_type is not None, "input_type": input_type or client.label_type,
                "num_parts": client.num_parts}


def bench_pyg(cfg: PygBenchConfig) -> dict:
    """Measure both paths; returns the JSON-ready result (see the module doc)."""
    load_before = os.getloadavg()
    result = through_servers(cfg.servers, cfg.graph, "pyg", lambda addresses: measure(addresses, cfg))
    result.update({
        "servers": cfg.servers if isinstance(cfg.servers, int) else len(cfg.servers),
        "graph": None if cfg.graph is None else os.fspath(cfg.graph), "num_neighbors": list(cfg.num_neighbors),
        "batch_size": cfg.batch_size, "input_count": cfg.input_count, "rounds": cfg.rounds,
        "pyg_prefetch": cfg.pyg_prefetch, "step_ms": cfg.step_ms, "cpus": os.cpu_count(),
        "load_avg_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    })
    return result
