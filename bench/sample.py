"""Sampling throughput measurements (``graphfeed bench sample``; ``bench remote`` reuses the definitions).

Definitions (keep them stable: later issues report against them):

* one **epoch** is one pass over the input nodes (``train`` by default; on a typed graph those
  of the label type, and seeds are of that type), shuffled, cut into
  batches by :func:`graphfeed.core.epoch.plan_epoch` exactly as the loaders do (one rank);
* ``seeds_per_s`` = input nodes of the epoch / wall time of the epoch;
* ``batches_per_s`` = batches of the epoch / wall time;
* ``sampled_edges_per_s`` = sum over the epoch's batches of ``edge_index.size(1)`` (over every
  edge type) / wall time;
* the reported value of each rate is the median over the measured epochs, after one
  unmeasured warm-up epoch (page cache, allocator, lazy imports), with the min and max;
* with ``features`` every batch goes through the full :func:`produce_batch` path (sample,
  then gather ``x``/``y``/original ids of every sampled node, then encode); without, only
  the multi-hop sampling runs;
* ``cpu_s_per_epoch`` is the median CPU time (user + system, all threads) spent per measured
  epoch -- steadier than the rates on a shared machine;
* ``peak_rss_mb`` is the process's peak resident set (``ru_maxrss``), memory-mapped
  partition pages that were touched included.

With ``device="cuda"`` (``--device cuda``; any number of parts) the same epochs run on a GPU,
every part a :class:`graphfeed.server.sampling.gpu.GpuSource` (what a GPU daemon's workers
sample with): the multi-hop driver over the CUDA kernels, and with ``features`` the rows of
every sampled node read through the GPU feature cache (``gpu_cache_mb`` of the highest-degree
rows in device memory, shared by the parts, the rest from pinned host memory), the batch
encoded on the device and copied to the host once; each batch ends with a device synchronize,
so the wall time counts the GPU's work.  ``cpu_s_per_epoch`` is then the host's share only;
``gpu_peak_mb`` is torch's peak device allocation.

Link mode (``link``, ``--link``): the epoch is one pass over the seed *edges* of the link split
``input`` names (stored by ``graphfeed partition --link-split``), cut as the link loaders cut it;
``seeds_per_s`` counts seed edges (not their endpoints); each batch draws ``neg_ratio`` binary
negatives per seed edge (strict; 0 = none) and runs the full link batch path
(:func:`produce_link_batch`: negatives, sampling of every endpoint, gather, encode), so a link
result always has ``features`` true.
"""
from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.constants import DIRECTIONS, MAX_BATCH_SIZE, SPLITS
from graphfeed.core.epoch import EpochPlan, input_positions
from graphfeed.core.spec import LinkInput, LoaderSpec, NegativeSampling, NodeInput, SamplingSpec
from graphfeed.server.loader.local import part_inputs
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.link import LinkSeeds, produce_link_batch
from graphfeed.server.sampling.producer import planned_batches, produce_batch

RATES = ("seeds_per_s", "batches_per_s", "sampled_edges_per_s")
INPUTS = SPLITS + ("all",)


@dataclass(frozen=True)
class SampleBenchConfig:
    """What ``bench sample`` measures; validated on construction."""

    graph: str
    num_neighbors: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    features: bool = False
    threads: int | None = None     # torch intra-op threads; None keeps torch's default
    epochs: int = 3                # measured epochs (after one warm-up epoch)
    input: str = "train"           # a split name or "all"
    seed: int = 0
    replace: bool = False
    direction: str = "in"
    device: str = "cpu"            # "cuda": sample on a GPU (one-part partitions)
    gpu_cache_mb: int = 1024       # with device="cuda": feature rows kept in GPU memory
    link: bool = False             # seeds are the edges of the link split ``input``
    neg_ratio: float = 1.0         # link mode: binary negatives per seed edge (0 = none)
    loader: LoaderSpec = field(init=False, repr=False)   # what every epoch runs (workload_spec)

    def __post_init__(self):
        loader = workload_spec(self)
        if self.link:
            object.__setattr__(self, "features", True)   # a link batch is always produced in full
        object.__setattr__(self, "loader", loader)
        object.__setattr__(self, "num_neighbors", loader.sampling.num_neighbors)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and self.link:
            raise ValueError("--link runs on the CPU only (GPU sampling covers node batches for now): "
                             "drop --device cuda")
        if self.gpu_cache_mb < 0:
            raise ValueError(f"--gpu-cache-mb must be >= 0, got {self.gpu_cache_mb}")
        if not os.path.isdir(self.graph):
            raise FileNotFoundError(f"--graph {self.graph}: no such partition folder; "
                                    f"create one with `graphfeed partition ... --output {self.graph}`")


def workload_spec(cfg) -> LoaderSpec:
    """The loader every epoch of a benchmark runs, from the workload fields ``bench sample`` and
    ``bench remote`` share (``num_neighbors``, ``batch_size``, ``epochs``, ``input``, ``seed``,
    ``replace``, ``direction``, ``link``, ``neg_ratio``): one rank, shuffled, partial batches kept;
    ``input="all"`` is every node; with ``link`` the seeds are link split ``input``'s edges.
    ValueError naming the command-line flag for a bad field.
    """
    if isinstance(cfg.batch_size, bool) or not isinstance(cfg.batch_size, int) \
            or not 1 <= cfg.batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"--batch-size must be an integer in 1..{MAX_BATCH_SIZE}, got {cfg.batch_size!r}")
    if cfg.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, got {cfg.epochs}")
    if cfg.input not in INPUTS:
        raise ValueError(f"--input must be one of {', '.join(INPUTS)}, got {cfg.input!r}")
    if cfg.direction not in DIRECTIONS:
        raise ValueError(f"--direction must be one of {', '.join(DIRECTIONS)}, got {cfg.direction!r}")
    try:
        sampling = SamplingSpec(cfg.num_neighbors, replace=cfg.replace, direction=cfg.direction)
    except ValueError as exc:
        raise ValueError(f"--num-neighbors {','.join(map(str, cfg.num_neighbors))}: {exc}") from None
    node_input = _link_input(cfg) if cfg.link else NodeInput() if cfg.input == "all" else NodeInput(split=cfg.input)
    try:
        return LoaderSpec(sampling, node_input, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    except ValueError as exc:
        raise ValueError(f"--seed {cfg.seed}: {exc}") from None


def _link_input(cfg) -> LinkInput:
    if cfg.input == "all":
        raise ValueError("--input all is not a link split: with --link give train, val or test (the link splits "
                         "of `graphfeed partition --link-split`)")
    if isinstance(cfg.neg_ratio, bool) or not 0 <= cfg.neg_ratio <= 1024:
        raise ValueError(f"--neg-ratio must be a number in 0..1024 (binary negatives per seed edge), got "
                         f"{cfg.neg_ratio!r}")
    neg = NegativeSampling("binary", cfg.neg_ratio) if cfg.neg_ratio > 0 else None
    return LinkInput(None, None, neg, split=cfg.input)


@dataclass(frozen=True)
class EpochStats:
    seconds: float
    seeds: int
    batches: int
    edges: int
    cpu_s: float = 0.0   # CPU seconds (user + system) the epoch cost

    def rates(self) -> dict[str, float]:
        s = max(self.seconds, 1e-9)
        return {"seeds_per_s": self.seeds / s, "batches_per_s": self.batches / s,
                "sampled_edges_per_s": self.edges / s}


def run_epoch(graph: PartitionedGraph, inputs: list[torch.Tensor], cfg: SampleBenchConfig, epoch: int,
              clock: Callable[[], float] = time.perf_counter) -> EpochStats:
    """One pass of ``cfg.loader`` over ``inputs`` (each part's input nodes), batches as the loaders plan them."""
    t0, cpu0 = clock(), time.process_time()
    counts = [t.numel() for t in inputs]
    plan = EpochPlan(cfg.loader, counts, epoch)
    sampling, ntype = cfg.loader.sampling, cfg.loader.input.type_or(graph.label_type)
    positions = [input_positions(counts, p) for p in range(len(inputs))]
    link_input = cfg.loader.input
    link = LinkSeeds(link_input).resolve(graph, torch.cat(inputs)) if isinstance(link_input, LinkInput) else None
    seeds = edges = 0
    for seq, entry, batch_seeds, input_id in planned_batches(plan, inputs, positions):
        if link is not None:    # batch_seeds are seed-edge positions
            edges += batch_codec.num_edges(produce_link_batch(graph, link, batch_seeds, sampling, entry, epoch, seq))
        elif cfg.features:
            edges += batch_codec.num_edges(produce_batch(graph, batch_seeds, sampling, entry, epoch, seq,
                                                         input_type=ntype, input_id=input_id))
        else:
            sub = graph.sample_typed({ntype: batch_seeds}, sampling, entry.seed, ntype)
            edges += sum(row.numel() for row in sub.row.values())
        seeds += batch_seeds.numel()
        if graph.device.type == "cuda":   # the wall time counts the GPU's work
            torch.cuda.synchronize(graph.device)
    return EpochStats(clock() - t0, seeds, len(plan), edges, time.process_time() - cpu0)


def _gpu_graph(parts, cfg: SampleBenchConfig) -> tuple[PartitionedGraph, dict]:
    """Every part on the GPU (:class:`~graphfeed.server.sampling.gpu.GpuSource`, what a GPU daemon's workers
    sample with), ``gpu_cache_mb`` of feature rows shared among them; and the result's device fields."""
    from graphfeed.server.sampling.gpu import GpuSource

    share = (cfg.gpu_cache_mb << 20) // max(1, len(parts))
    sources = [GpuSource(p, "cuda", cache_bytes=share) for p in parts]
    graph = PartitionedGraph(sources)
    return graph, {"device": "cuda", "gpu": torch.cuda.get_device_name(sources[0].device),
                   "gpu_cached_rows": sum(s.cached_rows for s in sources), "gpu_cache_mb": cfg.gpu_cache_mb,
                   "gpu_topology": sources[0].placement}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def summarize(epochs: list[EpochStats]) -> dict:
    """Median rates over ``epochs`` with their min and max (the JSON fields of ``bench``)."""
    rates = [e.rates() | {"epoch_s": e.seconds} for e in epochs]
    keys = RATES + ("epoch_s",)
    digits = {"epoch_s": 4}

    def pick(f) -> dict:
        return {k: round(f(r[k] for r in rates), digits.get(k, 1)) for k in keys}

    out = pick(statistics.median)
    out["min"], out["max"] = pick(min), pick(max)
    out["seeds_per_epoch"] = epochs[0].seeds
    out["batches_per_epoch"] = epochs[0].batches
    out["sampled_edges_per_epoch"] = statistics.median(e.edges for e in epochs)
    out["cpu_s_per_epoch"] = round(statistics.median(e.cpu_s for e in epochs), 3)
    return out


def bench_sample(cfg: SampleBenchConfig) -> dict:
    """Measure the in-process sampler on ``cfg.graph``; returns the JSON-ready result."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    parts = open_parts(cfg.graph)[1]
    graph = PartitionedGraph.in_process(parts)
    inputs = part_inputs(graph.parts, cfg.loader.input)
    device_fields: dict = {"device": cfg.device}
    if cfg.device == "cuda":
        graph, device_fields = _gpu_graph(parts, cfg)

    def epoch_fn(e: int) -> EpochStats:
        return run_epoch(graph, inputs, cfg, e)

    epoch_fn(0)                                                  # warm-up, not reported
    measured = [epoch_fn(e) for e in range(1, cfg.epochs + 1)]
    result = summarize(measured)
    if cfg.device == "cuda":
        device_fields["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    result.update(device_fields)
    result.update({
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "implementation": dispatch.IMPLEMENTATION,
        "sampler": dispatch.describe(),
        "threads": torch.get_num_threads(),
        "graph": os.fspath(cfg.graph),
        "num_parts": graph.num_parts,
        "input_type": cfg.loader.input.type_or(graph.label_type),
        "features": cfg.features,
        **workload_fields(cfg),
    })
    return result


def workload_fields(cfg) -> dict:
    """The workload settings a bench result reports (``bench sample`` and ``bench remote`` alike)."""
    return {"num_neighbors": list(cfg.num_neighbors), "batch_size": cfg.batch_size, "epochs": cfg.epochs,
            "warmup_epochs": 1, "input": cfg.input, "seed": cfg.seed, "replace": cfg.replace,
            "direction": cfg.direction, "link": cfg.link, "neg_ratio": cfg.neg_ratio if cfg.link else None}

