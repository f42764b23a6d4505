"""Access counts for the hotness-aware partitioner (``graphfeed partition --method hotness``).

GraphLearn-for-PyTorch's idea: sample a few epochs from the training nodes before partitioning
and count how often each node is touched (a node is touched once per batch whose sample holds
it: its features are read once for that batch).  METIS then balances these counts across the
parts as one more constraint (:func:`graphfeed.server.partition.metis.metis_parts`), so every
part serves about the same share of the feature reads and hop expansions while the edge cut
stays low.

The counts come from the one sampler graphfeed has: the graph is written once as a single
part into a temporary folder, and the batches are sampled as a loader would (the seeds
shuffled per epoch, the spec's fanouts).  Counts are in the ids of the graph's homogeneous
view (node types stacked, :meth:`GraphInput.node_offsets`), what the partitioner takes.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from graphfeed.core.spec import NodeInput, SamplingSpec
from graphfeed.server.partition.builder import partition_graph
from graphfeed.server.partition.graph_input import GraphInput
from graphfeed.server.partition.store import open_parts
from graphfeed.server.sampling.graph import PartitionedGraph


def access_counts(graph: GraphInput, spec: SamplingSpec, *, epochs: int = 2, batch_size: int = 1024,
                  seed: int = 0, scratch: str | Path | None = None) -> np.ndarray:
    """How often ``epochs`` epochs of ``spec``-sampled batches of ``batch_size`` training nodes touch each
    node: int64 [graph.num_nodes] in homogeneous-view ids (deterministic for a given ``seed``).

    ``scratch``: where the temporary one-part copy of the graph is written (default: the system's
    temporary folder); it is removed before this returns.  ValueError when the graph has no
    training nodes or ``epochs`` / ``batch_size`` are not positive.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if len(graph.splits.get("train", ())) == 0:
        raise ValueError("the hotness partitioner samples from the training nodes, and the graph has none: "
                         "give train_idx (or use --method metis)")
    folder = Path(tempfile.mkdtemp(prefix=".hotness-", dir=scratch))
    try:
        partition_graph(graph, 1, folder / "one", topologies=(spec.topology,), seed=seed)
        return _count(folder / "one", graph.node_offsets(), graph.num_nodes, spec, epochs, batch_size, seed)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _count(root: Path, offsets: dict[str, int], num_nodes: int, spec: SamplingSpec, epochs: int, batch_size: int,
           seed: int) -> np.ndarray:
    _, parts = open_parts(root)
    graph = PartitionedGraph.in_process(parts)
    part = parts[0]
    seeds = part.input_nodes(NodeInput(split="train"))
    counts = torch.zeros(num_nodes, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        order = seeds.index_select(0, torch.randperm(seeds.numel(), generator=gen))
        for b, batch in enumerate(order.split(batch_size)):
            sub = graph.sample_typed({graph.label_type: batch}, spec, seed * 1_000_003 + epoch * 65_537 + b,
                                     graph.label_type)
            for ntype, gids in sub.nodes.items():
                store = part.nodes(ntype)
                orig = store.orig_id.index_select(0, gids - store.start)
                counts.index_add_(0, orig + offsets[ntype], torch.ones_like(orig))
    return counts.numpy()
