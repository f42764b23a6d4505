"""Single-process neighbor loader over a partition folder (all partitions in this process).

For small graphs, tests, and as the reference the remote loader must equal: for the same
arguments and seed it yields identical batches (same plan, same sampler, same encoder).
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.spec import check_input_ids, check_loader_args
from graphfeed.core.epoch import (partition_order, plan_epoch,
                                   rank_batches)

from graphfeed.server.partition.store import open_parts, resolve_original_ids
from graphfeed.server.sampling.graph import LocalGraph
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.loader.producer import fanouts, group_by_part, produce_batch, resolve_rank


class LocalNeighborLoader:
    """Iterate PyG ``Data`` mini-batches sampled from a partitioned graph.

    Arguments follow PyG's ``NeighborLoader``.  ``input_nodes`` is a split name
    (``"train"``, ``"val"``, ``"test"``), a tensor of original node ids, or ``None``
    (all nodes).  Each ``iter()`` is one epoch; epochs count from 0 and advance by one per
    ``iter()`` unless :meth:`set_epoch` is called (as with ``DistributedSampler``).
    ``rank``/``world_size`` default to ``torch.distributed``'s; every rank gets
    ``len(loader)`` batches (see :mod:`graphfeed.core.epoch` for ``drop_last``).
    """

    def __init__(self, data: str | os.PathLike | LocalGraph, num_neighbors: Sequence[int], *,
                 batch_size: int = 1, input_nodes: str | torch.Tensor | None = "train",
                 shuffle: bool = False, drop_last: bool = False, replace: bool = False,
                 direction: str = "in", seed: int = 0, rank: int | None = None,
                 world_size: int | None = None):
        self.graph = data if isinstance(data, LocalGraph) else LocalGraph(open_parts(data)[1])
        self.spec = SamplingSpec(fanouts(num_neighbors), replace=replace, direction=direction)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        check_loader_args(batch_size, self.world_size, self.rank)
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        self.inputs = self._resolve_inputs(input_nodes)
        self._epoch = 0

    def _resolve_inputs(self, input_nodes) -> list[torch.Tensor]:
        parts = self.graph.parts
        if input_nodes is None:
            return [torch.arange(p.start, p.stop) for p in parts]
        if isinstance(input_nodes, str):
            return [p.split(input_nodes).clone() for p in parts]
        gids = resolve_original_ids(parts, check_input_ids(input_nodes))
        return group_by_part(self.graph.book, gids)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def _plan(self, epoch: int):
        counts = [t.numel() for t in self.inputs]
        plan = plan_epoch(counts, self.batch_size, self.world_size, seed=self.seed, epoch=epoch,
                          shuffle=self.shuffle, drop_last=self.drop_last)
        return rank_batches(plan, self.rank, self.world_size)

    def __len__(self) -> int:
        return len(self._plan(self._epoch))

    def __iter__(self) -> Iterator:
        epoch = self._epoch
        self._epoch += 1
        orders = [partition_order(t, seed=self.seed, epoch=epoch, part=p, shuffle=self.shuffle)
                  for p, t in enumerate(self.inputs)]
        for seq, entry in enumerate(self._plan(epoch)):
            seeds = orders[entry.part][entry.start:entry.stop]
            yield batch_codec.to_pyg(produce_batch(self.graph, seeds, self.spec, entry, epoch, seq))
