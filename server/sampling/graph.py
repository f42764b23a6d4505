"""Sampling over partitions held in this process."""
from __future__ import annotations

from typing import Sequence

import torch

from graphfeed.server.partition.book import RangePartitionBook
from graphfeed.server.partition.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.neighbor import sample_subgraph, stitch
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling.types import OneHop, SampledSubgraph


def sample_part(part: Partition, gids: torch.Tensor, spec: SamplingSpec, fanout: int, seed: int, hop: int) -> OneHop:
    """One hop for nodes ``gids`` that ``part`` owns."""
    topo = part.topology(spec.topology)
    return dispatch.one_hop(topo, gids - part.start, gids, fanout, spec.replace, seed, hop)


class LocalGraph:
    """All partitions of a graph in one process: the local loader's and the bench's sampler."""

    def __init__(self, parts: Sequence[Partition]):
        self.parts = list(parts)
        self.book = RangePartitionBook(self.parts[0].meta.node_ranges[self.parts[0].ntype])

    def sample(self, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph:
        if self.book.num_parts == 1:  # one topology holds every node: the fused multi-hop sampler
            part = self.parts[0]
            return dispatch.sample_local(part.topology(spec.topology), part.start, seeds, spec, seed)

        def one_hop(gids: torch.Tensor, fanout: int, hop: int) -> OneHop:
            pieces = [(pos, sample_part(self.parts[p], gids[pos], spec, fanout, seed, hop))
                      for p, pos in self.book.split(gids)]
            return stitch(gids.numel(), pieces)

        return sample_subgraph(seeds, spec, one_hop)

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x, y, original ids)`` of the nodes ``gids``."""
        if self.book.num_parts == 1:  # one part: gather straight from its arrays, no second copy
            part = self.parts[0]
            local = gids - part.start
            return (dispatch.gather_rows(part.x, local), dispatch.gather_rows(part.y, local),
                    dispatch.gather_rows(part.orig_id, local))
        first = self.parts[0]
        x = torch.empty((gids.numel(),) + tuple(first.x.shape[1:]), dtype=first.x.dtype)
        y = torch.empty((gids.numel(),) + tuple(first.y.shape[1:]), dtype=first.y.dtype)
        orig = torch.empty(gids.numel(), dtype=torch.int64)
        for p, pos in self.book.split(gids):
            part = self.parts[p]
            local = gids[pos] - part.start
            x.index_copy_(0, pos, part.x.index_select(0, local))
            y.index_copy_(0, pos, part.y.index_select(0, local))
            orig.index_copy_(0, pos, part.orig_id.index_select(0, local))
        return x, y, orig
