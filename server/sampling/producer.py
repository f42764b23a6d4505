"""Turning one planned batch into its wire form: sample, gather features, encode.

Shared by the local loader and the server's session workers, so both produce the
same bytes for the same batch.  Every batch is encoded by :func:`graphfeed.core.batch.encode_typed`
(a homogeneous graph is its one-type case).  :func:`planned_batches` walks a rank's whole epoch
when every part's input nodes are in this process (the local loader, ``bench sample``);
:func:`produce_online` is one batch for arbitrary seeds outside any epoch (``Client.sample``).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, Mapping, Protocol, Sequence

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.epoch import BatchSpec, EpochPlan
from graphfeed.core.seeding import batch_seed
from graphfeed.core.spec import EdgeType, SamplingSpec, check_sample_ids
from graphfeed.server.sampling.source import Rows
from graphfeed.server.sampling.types import SampledSubgraph, TypedSubgraph

if TYPE_CHECKING:
    from graphfeed.server.sampling.graph import PartitionedGraph


class SamplingGraph(Protocol):
    """What a batch producer needs: typed multi-hop sampling, a feature lookup by node type and global id,
    and the edge features of a homogeneous sample (None when the graph has none)."""

    node_types: list[str]
    edge_types: list[EdgeType]
    is_homogeneous: bool

    def sample_typed(self, seeds: Mapping[str, torch.Tensor], spec: SamplingSpec, seed: int,
                     input_type: str | None = None, subgraphs: Mapping[str, torch.Tensor] | None = None,
                     subgraph_time: torch.Tensor | None = None,
                     exclude: Mapping[EdgeType, torch.Tensor] | None = None) -> TypedSubgraph: ...

    def gather_typed(self, ntype: str, gids: torch.Tensor, dtype: torch.dtype | None = None) -> Rows: ...

    def edge_attr(self, sub: SampledSubgraph, spec: SamplingSpec) -> torch.Tensor | None: ...

    def quant_scales(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]: ...


def produce_batch(graph: SamplingGraph, seeds: torch.Tensor | Mapping[str, torch.Tensor], spec: SamplingSpec,
                  plan_entry: BatchSpec, epoch: int, seq: int, *, input_type: str, input_id: torch.Tensor,
                  stage: Callable[[str], ContextManager] | None = None,
                  feature_dtype: torch.dtype | None = None,
                  extra: Mapping[str, torch.Tensor] | None = None,
                  subgraphs: Mapping[str, torch.Tensor] | None = None,
                  seed_time: torch.Tensor | None = None,
                  exclude: Mapping[EdgeType, torch.Tensor] | None = None,
                  node_extra: Callable[[str, torch.Tensor], Mapping[str, torch.Tensor]] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Batch ``seq`` of ``epoch`` (plan entry ``plan_entry``, seeds ``seeds`` of node type ``input_type``,
    at positions ``input_id`` of the loader's input) sampled as ``spec`` (a loader's
    :attr:`LoaderSpec.sampling`) and encoded, its floating-point features cast to ``feature_dtype``
    (a loader's :attr:`LoaderSpec.feature_torch_dtype`; None = as stored).

    The one producer of node and link batches: a link batch (:func:`graphfeed.server.sampling.link.produce_link_batch`)
    passes its endpoints as ``seeds`` (per node type when they are of several types, distinct global ids),
    its seed edges' positions as ``input_id`` and its labelled edges as ``extra`` (batch fields of
    :data:`graphfeed.core.batch.BATCH_FIELDS`).
    With ``spec.disjoint`` every seed is its own subgraph unless ``subgraphs`` (per seed node type, each
    seed's subgraph: a link batch's seed edges) says otherwise; ``seed_time`` (``spec.temporal``) is
    each subgraph's seed time (:func:`node_seed_time` for a node batch).  ``exclude`` (a link batch's
    ``exclude_seed_edges``): per edge type, ``[2, n]`` global ``(src, dst)`` pairs no sampled edge may join.
    ``feature_dtype=torch.int8`` quantizes ``x`` with the partition's scales (:meth:`SamplingGraph.quant_scales`).
    ``stage(name)``, when given, is entered around the ``"encode"`` step (the workers' metrics).
    ``node_extra(ntype, gids)``, when given, adds node fields of a type's batch nodes (global ids ``gids``): a
    loader's embedding rows (``emb``, ``emb_gid``; empty mapping for a type without a table).
    """
    typed_seeds = seeds if isinstance(seeds, Mapping) else {input_type: seeds}
    if spec.disjoint and subgraphs is None:
        subgraphs = {input_type: torch.arange(typed_seeds[input_type].numel())}
    sub = graph.sample_typed(typed_seeds, spec, plan_entry.seed, input_type, subgraphs, seed_time,
                             **({} if exclude is None else {"exclude": exclude}))
    if seed_time is not None and extra is None:   # a node batch carries PyG's seed_time
        extra = {"seed_time": seed_time}
    nodes = {t: _node_fields(graph, sub, t, feature_dtype) for t in graph.node_types}
    if node_extra is not None:
        for t, fields in nodes.items():
            fields.update(node_extra(t, sub.nodes.get(t, torch.empty(0, dtype=torch.int64))))
    edge_attr = graph.edge_attr(sub.homogeneous(), spec) if graph.is_homogeneous else None
    with stage("encode") if stage is not None else nullcontext():
        edges = {e: _edge_fields(sub, e) for e in sub.row}
        if edge_attr is not None:   # edge features: the default edge type's (homogeneous graphs)
            edges[graph.edge_types[0]]["edge_attr"] = edge_attr
        wire = batch_codec.encode_typed(nodes=nodes, edges=edges, input_type=input_type,
                                        batch_size=sub.batch_size, epoch=epoch, seq=seq, index=plan_entry.index,
                                        input_id=input_id, extra=extra)
        if feature_dtype == torch.int8:
            wire = batch_codec.quantize_features(wire, graph.quant_scales())
        # a GPU graph's batch is encoded on its device and leaves it in one copy
        return batch_codec.to_host(batch_codec.cast_features(wire, feature_dtype))


def produce_online(graph: SamplingGraph, seeds: torch.Tensor, spec: SamplingSpec, seed: int, *, input_type: str,
                   stage: Callable[[str], ContextManager] | None = None,
                   feature_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """One batch for ``seeds`` (distinct global ids of ``input_type``, any parts) outside any epoch.

    It is the batch an epoch would give for these seeds as batch 0 of epoch 0 with loader seed
    ``seed`` (batch seed :func:`batch_seed(seed, 0, 0) <graphfeed.core.seeding.batch_seed>`; ``epoch`` =
    ``seq`` = 0; ``input_id`` = positions ``0..n-1`` in ``seeds``).  So when every seed is on one part,
    it equals the first batch of a loader over ``input_nodes=seeds`` with ``batch_size >= n``,
    ``shuffle=False`` and that seed; the session workers and the in-process reference call this same
    function, so ``Client.sample`` equals it bit for bit.
    """
    n = int(seeds.numel())
    entry = BatchSpec(index=0, part=-1, start=0, stop=n, seed=batch_seed(seed, 0, 0))
    return produce_batch(graph, seeds, spec, entry, 0, 0, input_type=input_type,
                         input_id=torch.arange(n, dtype=torch.int64), stage=stage, feature_dtype=feature_dtype)


def sample_nodes(graph: PartitionedGraph, node_ids, spec: SamplingSpec, seed: int, *,
                 stage: Callable[[str], ContextManager] | None = None,
                 feature_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """:func:`produce_online` for original ids ``node_ids`` of the label type (the graph's nodes when
    homogeneous), resolved to global ids through every part (:meth:`PartitionedGraph.to_global`).

    ValueError (one line, naming the bad id and the valid range) for ids that are not a non-empty
    1-D tensor of distinct integers inside the graph (:func:`graphfeed.core.spec.check_sample_ids`).
    """
    what = "node" if graph.is_homogeneous else f"{graph.label_type!r} node"
    ids = check_sample_ids(node_ids, graph.book.num_nodes, what)
    gids = graph.to_global(ids)
    if bool((gids < 0).any()):   # cannot happen for a well-formed partition: every id in range has an owner
        i = int((gids < 0).nonzero()[0])
        raise ValueError(f"node_ids[{i}] = {int(ids[i])}: no part holds this {what}; is the partition complete?")
    return produce_online(graph, gids, spec, seed, input_type=graph.label_type, stage=stage,
                          feature_dtype=feature_dtype)


def _node_fields(graph: SamplingGraph, sub: TypedSubgraph, ntype: str, dtype: torch.dtype | None) -> dict:
    """One node type's batch fields: gathered rows of its sampled nodes (empty when none was sampled); peers
    may send their rows in the features' transport ``dtype``."""
    gids = sub.nodes.get(ntype, torch.empty(0, dtype=torch.int64))
    rows = graph.gather_typed(ntype, gids, dtype)
    counts = sub.num_sampled_nodes.get(ntype, [0] * (1 + max((len(c) for c in sub.num_sampled_edges.values()),
                                                            default=0)))
    batch = None if sub.subgraph is None else sub.subgraph.get(ntype, torch.empty(0, dtype=torch.int64))
    return {**dict(rows.items()), "num_sampled_nodes": counts, "batch": batch}


def node_seed_time(graph, node_input, spec: SamplingSpec, input_type: str, seeds: torch.Tensor,
                   input_id: torch.Tensor) -> torch.Tensor | None:
    """A node batch's seed times for temporal sampling (None otherwise): the loader's ``input_time`` at
    the seeds' input positions, else the seeds' own stored node times."""
    if not spec.temporal:
        return None
    if getattr(node_input, "time", None) is not None:
        return node_input.time.index_select(0, input_id)
    return graph.local_node_time(input_type, seeds)


def _edge_fields(sub: TypedSubgraph, etype: EdgeType) -> dict:
    return {"edge_index": sub.edge_index(etype), "e_id": sub.eids[etype],
            "num_sampled_edges": sub.num_sampled_edges[etype]}


def planned_batches(plan: EpochPlan, inputs: Sequence[torch.Tensor], positions: Sequence[torch.Tensor],
                    start: int = 0) -> Iterator[tuple[int, BatchSpec, torch.Tensor, torch.Tensor]]:
    """``(seq, entry, seeds, input_id)`` of the batches of ``plan`` at positions ``>= start``, in delivery
    order, where ``inputs[p]`` are part ``p``'s input nodes (global ids, :meth:`Partition.input_nodes`)
    and ``positions[p]`` their positions in the loader's input (:func:`graphfeed.core.epoch.input_positions`)."""
    orders = [plan.order(part, ids) for part, ids in enumerate(inputs)]
    position_orders = [plan.order(part, pos) for part, pos in enumerate(positions)]
    for seq, entry in enumerate(plan.entries):
        if seq >= start:
            yield seq, entry, plan.batch_seeds(orders, entry), plan.batch_seeds(position_orders, entry)
