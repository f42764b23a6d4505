"""A graphfeed wire batch as PyG's sampler output (``SamplerOutput`` / ``HeteroSamplerOutput``).

The sampler returns ids and edges; the batch's feature rows travel beside them (:class:`BatchRows`), so
the loader's ``filter_fn`` takes them from the feature store without another call
(:class:`graphfeed.pyg.stores.GraphfeedFeatureStore`).  Node ids are original ids (a batch's ``n_id``),
edge ids original edge ids (``e_id``); ``row`` indexes the source type's nodes, ``col`` the destination's.
``metadata`` is what PyG's ``NodeLoader`` / ``LinkLoader`` read: ``(input_id, seed_time)`` for nodes,
``(input_id, edge_label_index, edge_label, edge_label_time)`` for binary or no negatives,
``(input_id, src_index, dst_pos_index, dst_neg_index, seed_time)`` for triplets -- followed by the
batch's :class:`BatchRows`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch_geometric.sampler import HeteroSamplerOutput, SamplerOutput

from graphfeed.core import batch as batch_codec
from graphfeed.core.batch import EdgeType
from graphfeed.core.columns import ROW_FIELDS  # the node fields the feature store serves: stored rows


@dataclass(frozen=True)
class BatchRows:
    """The stored rows of one batch's nodes: ``rows[node type][attr]``, aligned with ``nodes[node type]``
    (the sampler output's ``node`` tensors, by identity: the feature store matches a request's index to them)."""

    nodes: Mapping[str, torch.Tensor]
    rows: Mapping[str, Mapping[str, torch.Tensor]]
    #: ``edge_attr`` of the sampled edges per edge type where the graph has edge features (aligned with ``edge``):
    #: PyG's ``filter_fn`` joins no edge features, so a script reads them here (``out.metadata[-1]``)
    edge_rows: Mapping[EdgeType, torch.Tensor] = dataclasses.field(default_factory=dict)


def to_sampler_output(wire: Mapping[str, torch.Tensor], neg_mode: str | None, link: bool
                      ) -> tuple[SamplerOutput | HeteroSamplerOutput, BatchRows]:
    """PyG's output of a wire batch and its rows; ``link``: a link batch, ``neg_mode`` its negatives'
    mode (``"binary"``, ``"triplet"`` or None).  Int8 rows (``feature_dtype="int8"``) are handed over
    dequantized (float32), as graphfeed's loaders give them."""
    wire = batch_codec.dequantize_features(wire)
    lay = batch_codec.layout(wire)
    nodes = {t: wire[batch_codec.node_key("n_id", t)] for t in lay.node_types}
    rows = {t: {name: wire[batch_codec.node_key(name, t)] for name in ROW_FIELDS
                if batch_codec.node_key(name, t) in wire} for t in lay.node_types}
    edge_rows = {e: wire[batch_codec.edge_key("edge_attr", e)] for e in lay.edge_types
                 if batch_codec.edge_key("edge_attr", e) in wire}
    batch_rows = BatchRows(nodes, rows, edge_rows)
    metadata = (*_metadata(wire, neg_mode, link), batch_rows)
    edges = {e: wire[batch_codec.edge_key("edge_index", e)] for e in lay.edge_types}
    e_ids = {e: wire[batch_codec.edge_key("e_id", e)] for e in lay.edge_types}
    counts_n = {t: wire[batch_codec.node_key("num_sampled_nodes", t)].tolist() for t in lay.node_types}
    counts_e = {e: wire[batch_codec.edge_key("num_sampled_edges", e)].tolist() for e in lay.edge_types}
    subgraph = {t: wire[batch_codec.node_key("batch", t)] for t in lay.node_types
                if batch_codec.node_key("batch", t) in wire}
    if lay.is_homogeneous:
        (t,), (e,) = lay.node_types, lay.edge_types
        out: SamplerOutput | HeteroSamplerOutput = SamplerOutput(
            node=nodes[t], row=edges[e][0], col=edges[e][1], edge=e_ids[e], batch=subgraph.get(t),
            num_sampled_nodes=counts_n[t], num_sampled_edges=counts_e[e], metadata=metadata)
    else:
        out = HeteroSamplerOutput(
            node=nodes, row={e: edges[e][0] for e in edges}, col={e: edges[e][1] for e in edges}, edge=e_ids,
            batch=subgraph or None, num_sampled_nodes=counts_n, num_sampled_edges=counts_e, metadata=metadata)
    return out, batch_rows


def _metadata(wire: Mapping[str, torch.Tensor], neg_mode: str | None, link: bool) -> tuple:
    input_id = wire["input_id"]
    if not link:
        return input_id, wire.get("seed_time")
    if neg_mode == "triplet":
        return input_id, wire["src_index"], wire["dst_pos_index"], wire["dst_neg_index"], wire.get("seed_time")
    return input_id, wire["edge_label_index"], wire["edge_label"], wire.get("edge_label_time")


def edge_type_of(etype: EdgeType | None, edge_types: list[EdgeType]) -> EdgeType:
    """``etype`` as one of the graph's edge types (None: the homogeneous graph's one); ValueError naming them."""
    if etype is None:
        if len(edge_types) != 1:
            raise ValueError(f"name the edge type: the graph has {', '.join(map(str, edge_types))}")
        return edge_types[0]
    etype = tuple(etype)  # type: ignore[assignment]
    if etype not in edge_types:
        raise ValueError(f"edge type {etype} is not one of the graph's: {', '.join(map(str, edge_types))}")
    return etype
