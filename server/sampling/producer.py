"""Turning one planned batch into its wire form: sample, gather features, encode.

Shared by the local loader and the server's session workers, so both produce the
same bytes for the same batch.  :func:`planned_batches` walks a rank's whole epoch when
every part's input nodes are in this process (the local loader, ``bench sample``).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager, Iterator, Protocol, Sequence

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.epoch import BatchSpec, EpochPlan
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling.types import SampledSubgraph


class SamplingGraph(Protocol):
    """What a batch producer needs: multi-hop sampling and a feature lookup by global id."""

    def sample(self, seeds: torch.Tensor, spec: SamplingSpec, seed: int) -> SampledSubgraph: ...

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def produce_batch(graph: SamplingGraph, seeds: torch.Tensor, spec: SamplingSpec, plan_entry: BatchSpec,
                  epoch: int, seq: int, *, stage: Callable[[str], ContextManager] | None = None,
                  feature_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Batch ``seq`` of ``epoch`` (plan entry ``plan_entry``, seeds ``seeds``) sampled as ``spec``
    (a loader's :attr:`LoaderSpec.sampling`) and encoded, its floating-point features cast to
    ``feature_dtype`` (a loader's :attr:`LoaderSpec.feature_torch_dtype`; None = as stored).

    ``stage(name)``, when given, is entered around the ``"encode"`` step (the workers' metrics).
    """
    sub = graph.sample(seeds, spec, plan_entry.seed)
    x, y, orig = graph.gather(sub.nodes)
    with stage("encode") if stage is not None else nullcontext():
        wire = batch_codec.encode(x=x, y=y, edge_index=sub.edge_index, n_id=orig, e_id=sub.eids,
                                  num_sampled_nodes=sub.num_sampled_nodes,
                                  num_sampled_edges=sub.num_sampled_edges, batch_size=sub.batch_size,
                                  epoch=epoch, seq=seq, index=plan_entry.index)
        return batch_codec.cast_features(wire, feature_dtype)


def planned_batches(plan: EpochPlan, inputs: Sequence[torch.Tensor],
                    start: int = 0) -> Iterator[tuple[int, BatchSpec, torch.Tensor]]:
    """``(seq, entry, seeds)`` of the batches of ``plan`` at positions ``>= start``, in delivery order,
    where ``inputs[p]`` are part ``p``'s input nodes (global ids, :meth:`Partition.input_nodes`)."""
    orders = [plan.order(part, ids) for part, ids in enumerate(inputs)]
    for seq, entry in enumerate(plan.entries):
        if seq >= start:
            yield seq, entry, plan.seeds(orders[entry.part], entry)
