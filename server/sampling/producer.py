"""Turning one planned batch into its wire form: sample, gather features, encode.

Shared by the local loader and the server's session workers, so both produce the
same bytes for the same batch.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Protocol, Sequence

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.epoch import BatchSpec

from graphfeed.server.partition.book import RangePartitionBook
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling.types import SampledSubgraph


class SamplingGraph(Protocol):
    """What a batch producer needs: multi-hop sampling and a feature lookup by global id."""

    def sample(self, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph: ...

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def produce_batch(graph: SamplingGraph, seeds: torch.Tensor, spec: SamplingSpec, plan_entry: BatchSpec,
                  epoch: int, seq: int, *, stage: Callable[[str], ContextManager] | None = None
                  ) -> dict[str, torch.Tensor]:
    """``stage(name)``, when given, is entered around the ``"encode"`` step (the workers' metrics)."""
    sub = graph.sample(seeds, spec, plan_entry.seed)
    x, y, orig = graph.gather(sub.nodes)
    with stage("encode") if stage is not None else nullcontext():
        return batch_codec.encode(x=x, y=y, edge_index=sub.edge_index, n_id=orig, e_id=sub.eids,
                                  num_sampled_nodes=sub.num_sampled_nodes,
                                  num_sampled_edges=sub.num_sampled_edges, batch_size=sub.batch_size,
                                  epoch=epoch, seq=seq, index=plan_entry.index)


def group_by_part(book: RangePartitionBook, gids: torch.Tensor) -> list[torch.Tensor]:
    """Input nodes per partition, keeping the given order within each partition."""
    out = [torch.empty(0, dtype=torch.int64) for _ in range(book.num_parts)]
    for p, pos in book.split(gids):
        out[p] = gids[pos]
    return out


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit values, else ``torch.distributed``'s, else ``(0, 1)``."""
    import torch.distributed as dist

    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank, world_size = (0 if rank is None else rank), (1 if world_size is None else world_size)
    return int(rank), int(world_size)


def fanouts(num_neighbors: Sequence[int]) -> tuple[int, ...]:
    if isinstance(num_neighbors, (int, str)) or not hasattr(num_neighbors, "__iter__"):
        raise ValueError(f"num_neighbors must be a list of per-hop fanouts, e.g. [15, 10], got {num_neighbors!r}")
    return tuple(int(k) for k in num_neighbors)
