"""One batch for a seed record outside any epoch, with the batch seed given by the caller.

What PyG's samplers are asked for (:mod:`graphfeed.pyg`): ``sample_from_nodes`` / ``sample_from_edges``
hand over the seeds of one batch -- a :class:`~graphfeed.core.spec.NodeInput` (original ids of one node
type) or a :class:`~graphfeed.core.spec.LinkInput` (seed edges with their labels and negative sampling)
-- and their positions in the loader's input.  The batch is made by the producers the epochs use
(:func:`produce_batch`, :func:`produce_link_batch`) with the batch seed the caller names, so the
same seeds at the same positions with :func:`graphfeed.core.seeding.batch_seed` ``(seed, epoch, i)``
give batch ``i`` of that epoch of a graphfeed loader over the same input, bit for bit.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ContextManager

import torch

from graphfeed.core.constants import MAX_BATCH_SIZE
from graphfeed.core.epoch import BatchSpec
from graphfeed.core.spec import LinkInput, NodeInput, SamplingSpec, check_sample_ids
from graphfeed.server.sampling.link import LinkSeeds, produce_link_batch
from graphfeed.server.sampling.producer import produce_batch

if TYPE_CHECKING:
    from graphfeed.server.sampling.graph import PartitionedGraph


def produce_for_seeds(graph: PartitionedGraph, seeds: NodeInput | LinkInput, positions: torch.Tensor,
                      spec: SamplingSpec, batch_seed: int, *, stage: Callable[[str], ContextManager] | None = None,
                      feature_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The wire batch of ``seeds`` (one batch's seed nodes or seed edges, original ids) at input positions
    ``positions`` (one per seed node / seed edge: ``input_id``, and what keys a seed edge's negatives),
    sampled as ``spec`` with batch seed ``batch_seed`` (epoch 0, seq 0 in its meta).

    ValueError (one line) for positions that do not match the seeds, ids outside the graph, repeated seed
    nodes, a link split instead of seed edges, or seed times (temporal sampling is not offered here)."""
    positions = _positions(positions)
    if isinstance(seeds, LinkInput):
        return _link_batch(graph, seeds, positions, spec, batch_seed, stage, feature_dtype)
    if not isinstance(seeds, NodeInput) or seeds.ids is None:
        raise ValueError("seeds must be a NodeInput with ids or a LinkInput with edge_label_index")
    if seeds.time is not None or spec.temporal:
        raise ValueError("temporal sampling (input_time, time_attr) is not offered for ad-hoc seeds: use "
                         "graphfeed's own loaders for temporal sampling")
    ntype = seeds.node_type or graph.label_type
    what = "node" if graph.is_homogeneous else f"{ntype!r} node"
    ids = check_sample_ids(seeds.ids, graph.num_nodes_of(ntype), what)
    if positions.numel() != ids.numel():
        raise ValueError(f"positions has {positions.numel()} entries for {ids.numel()} seed nodes: give one input "
                         f"position per seed")
    gids = graph.to_global(ids, ntype)
    entry = BatchSpec(index=0, part=-1, start=0, stop=ids.numel(), seed=int(batch_seed))
    return produce_batch(graph, gids, spec, entry, 0, 0, input_type=ntype, input_id=positions, stage=stage,
                         feature_dtype=feature_dtype)


def _link_batch(graph: PartitionedGraph, link: LinkInput, positions: torch.Tensor, spec: SamplingSpec,
                batch_seed: int, stage, feature_dtype) -> dict[str, torch.Tensor]:
    if link.index is None:
        raise ValueError("a link split or every edge of a type cannot be sampled ad hoc: give the batch's seed edges "
                         "as edge_label_index")
    if link.time is not None or spec.temporal:
        raise ValueError("temporal sampling (edge_label_time, time_attr) is not offered for ad-hoc seed edges: "
                         "use graphfeed's own link loaders for temporal sampling")
    if link.edge_type is not None and link.edge_type not in graph.edge_types:
        raise ValueError(f"edge type {link.edge_type} is not one of the graph's: "
                         f"{', '.join(map(str, graph.edge_types))}")
    b = link.num_edges
    if positions.numel() != b:
        raise ValueError(f"positions has {positions.numel()} entries for {b} seed edges: give one input position "
                         f"per seed edge")
    if b == 0:
        raise ValueError("edge_label_index is empty: give at least one seed edge")
    index = torch.arange(b)
    resolved = LinkSeeds(link).resolve(graph, index)
    entry = BatchSpec(index=0, part=-1, start=0, stop=b, seed=int(batch_seed))
    return produce_link_batch(graph, resolved, index, spec, entry, 0, 0, feature_dtype, stage, keys=positions)


def _positions(positions) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.dtype.is_floating_point \
            or positions.dtype == torch.bool:
        raise ValueError("positions must be a 1-D integer tensor: each seed's position in the loader's input")
    if positions.numel() > MAX_BATCH_SIZE:
        raise ValueError(f"a batch of {positions.numel()} seeds is more than the {MAX_BATCH_SIZE} a batch may have: "
                         f"pass a smaller batch_size")
    positions = positions.to(torch.int64)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0 (input positions), got {int(positions.min())}")
    return positions
