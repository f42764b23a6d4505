"""Access counts for the hotness-aware partitioner (``graphfeed partition --method hotness``).

GraphLearn-for-PyTorch's idea: before partitioning, sample the training seeds' neighbourhoods
with the fanouts the loader will use, over the whole graph, and count how often each node is
accessed.  A node's count is the number of batches whose sampled node set holds it (its own seed
batch included).  The partitioner then balances each part's total count, not only its node count.

The whole graph is one in-memory part (:func:`graphfeed.server.partition.build.builder.whole_topology`),
sampled by :func:`graphfeed.server.sampling.graph.sample_topology` (the fused native op when
loaded).  Batches and their RNG seeds follow the epoch contract's helpers, so the counts are
deterministic for a given ``seed``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from graphfeed.core.seeding import batch_seed, stream_seed
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.build.builder import whole_topology
from graphfeed.server.partition.format.store import Topology
from graphfeed.server.partition.inputs.graph import GraphInput
from graphfeed.server.sampling.graph import sample_topology

MAX_EPOCHS = 10   # bounds the pre-sampling's time: each epoch costs about one local training epoch of sampling


@dataclass(frozen=True)
class AccessSampling:
    """How to pre-sample: the loader's fanouts (one list, ``-1`` = all) and batch size, and how many epochs."""

    num_neighbors: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    epochs: int = 1

    def __post_init__(self):
        object.__setattr__(self, "num_neighbors", tuple(int(f) for f in self.num_neighbors))
        if not self.num_neighbors or any(f < -1 for f in self.num_neighbors):
            raise ValueError(f"--num-neighbors must be one or more fanouts >= -1 (e.g. 15,10,5), "
                             f"got {list(self.num_neighbors)}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if not 1 <= self.epochs <= MAX_EPOCHS:
            raise ValueError(f"--hotness-epochs must be between 1 and {MAX_EPOCHS}, got {self.epochs}")

    def settings(self) -> dict:
        """What META.json records (``method_settings``) and the up-to-date check compares."""
        return {"num_neighbors": list(self.num_neighbors), "batch_size": self.batch_size, "epochs": self.epochs}


def count_accesses(graph: GraphInput, how: AccessSampling, seed: int = 0,
                   progress: Callable[[Iterable, str], Iterable] | None = None) -> np.ndarray:
    """Access count of every node (int64 [N], input ids): over ``how.epochs`` shuffled epochs of the
    ``train`` split in batches of ``how.batch_size``, +1 for every node a batch samples (in-edges).

    ValueError (one line, naming the fix) for a typed graph or a graph without training nodes.
    """
    if not graph.is_homogeneous:
        raise ValueError("--method hotness needs a homogeneous graph (typed graphs: use --method metis)")
    train = torch.from_numpy(np.asarray(graph.splits.get("train", np.empty(0)), dtype=np.int64))
    if train.numel() == 0:
        raise ValueError("--method hotness counts accesses from the training nodes, and the graph has none "
                         "(no train_idx); use --method metis")
    topo = Topology(*(torch.from_numpy(a) for a in whole_topology(graph, "csc")))
    spec = SamplingSpec(num_neighbors=how.num_neighbors)
    counts = torch.zeros(graph.num_nodes, dtype=torch.int64)
    for epoch, batches in _epochs(train, how, seed):
        for index, seeds in (progress or _as_is)(batches, f"counting accesses, epoch {epoch + 1}/{how.epochs}"):
            nodes = sample_topology(topo, 0, seeds, spec, batch_seed(seed, epoch, index)).nodes
            counts[nodes] += 1   # a batch's sampled nodes are distinct
    return counts.numpy()


def _epochs(train: torch.Tensor, how: AccessSampling, seed: int):
    """``(epoch, [(batch index, seed ids), ...])`` for every epoch: the training nodes shuffled, then cut."""
    for epoch in range(how.epochs):
        g = torch.Generator().manual_seed(stream_seed(seed, epoch, 0))
        order = train[torch.randperm(train.numel(), generator=g)]
        yield epoch, list(enumerate(order.split(how.batch_size)))


def _as_is(iterable, desc):
    return iterable
