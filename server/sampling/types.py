"""Typed records at the sampler's boundary.

:class:`OneHop` and :class:`NodeRows` also cross the peer RPC between session workers (a peer's
answer to ``one_hop`` / ``gather``), so they stay frozen records of tensors (and None): nothing a
plain-record codec could not carry.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

from graphfeed.core.columns import BATCH_COLUMNS
from graphfeed.core.spec import EdgeType


@dataclass(frozen=True)
class OneHop:
    """Neighbors sampled for a frontier, grouped per frontier node in frontier order."""

    counts: torch.Tensor      # int64 [n]: neighbors sampled for each frontier node
    neighbors: torch.Tensor   # int64 [sum(counts)]: their global ids
    eids: torch.Tensor        # int64 [sum(counts)]: original edge ids


@dataclass(frozen=True)
class NodeRows:
    """Rows of some nodes of one type, each named as the batch schema's node field it becomes
    (:data:`graphfeed.core.batch.BATCH_FIELDS`): ``x`` features, ``y`` labels (None for a type without
    them), ``n_id`` original ids; all aligned with the nodes asked for.  There is one field per stored
    column with a batch field (:data:`graphfeed.core.columns.NODE_COLUMNS`), checked at import."""

    x: torch.Tensor | None
    y: torch.Tensor | None
    n_id: torch.Tensor

    # field -> the part's node store column (NodeStore.column) it is read from
    COLUMNS: ClassVar[dict[str, str]] = BATCH_COLUMNS

    @classmethod
    def read(cls, store, read: Callable[[torch.Tensor], torch.Tensor]) -> NodeRows:
        """Every field read from ``store`` (a node store) by ``read(column)`` (None where it has no such column)."""
        columns = {name: store.column(column) for name, column in cls.COLUMNS.items()}
        rows: dict[str, Any] = {name: None if t is None else read(t) for name, t in columns.items()}
        return cls(**rows)

    def items(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        """``(field name, tensor or None)`` of every field, in declaration order."""
        return ((f.name, getattr(self, f.name)) for f in fields(self))

    def with_fields(self, **tensors) -> NodeRows:
        """A copy with some fields replaced."""
        return replace(self, **tensors)

    def in_transport_dtype(self, dtype: torch.dtype | None) -> NodeRows:
        """These rows as a peer sends them for a batch whose features travel as ``dtype`` (a loader's
        ``feature_dtype``): floating-point ``x`` cast to a floating ``dtype``, the rest as stored.

        The batch is cast to ``dtype`` at the end (:func:`graphfeed.core.batch.cast_features`), and a value
        cast to a narrower float, widened back and cast again is the value cast once: the batch is the same,
        with fewer bytes on the wire.  A non-float ``dtype`` (a quantized transport) leaves the rows as
        stored, since a quantization need not survive that round trip."""
        x = self.x
        if dtype is None or not dtype.is_floating_point or x is None or not x.is_floating_point() \
                or x.dtype == dtype:
            return self
        return replace(self, x=x.to(dtype))


NODE_ROW_FIELDS = tuple(f.name for f in fields(NodeRows))
if set(NODE_ROW_FIELDS) != set(BATCH_COLUMNS):
    raise TypeError(f"NodeRows has the fields {NODE_ROW_FIELDS}, the stored columns' batch fields are "
                    f"{tuple(BATCH_COLUMNS)}: give NodeRows one field per batch field (graphfeed.core.columns)")


@dataclass
class SampledSubgraph:
    """A multi-hop sample relabelled to local ids (PyG layout).

    ``nodes`` are global ids, seeds first then each hop's new nodes in order of
    first appearance; ``row``/``col`` index into ``nodes`` and give each sampled
    edge in its true direction (``row`` = source); ``eids`` are original edge ids.
    """

    nodes: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    eids: torch.Tensor
    batch_size: int
    num_sampled_nodes: list[int] = field(default_factory=list)
    num_sampled_edges: list[int] = field(default_factory=list)

    @property
    def edge_index(self) -> torch.Tensor:
        return torch.stack([self.row, self.col])


@dataclass
class TypedSubgraph:
    """A multi-hop sample of a typed graph relabelled to per-type local ids (PyG's hetero layout).

    Node ids are per node type.  ``nodes[t]`` holds the global ids of type ``t``: its seeds
    first, then the nodes first seen at hop 0, 1, ... (within a hop, in order of first
    appearance over the edge types in sorted order); a node's local id is its position there.
    For each edge type ``e = (src, rel, dst)``, ``row[e]`` indexes ``nodes[src]`` and
    ``col[e]`` indexes ``nodes[dst]`` (every edge in its true direction, whichever way it was
    sampled) and ``eids[e]`` are the original edge ids of relation ``e``, hop by hop.

    ``num_sampled_nodes[t]`` has ``hops + 1`` entries (entry 0: the seeds of ``t``) and
    ``num_sampled_edges[e]`` has ``hops`` entries; they add up to the tensors' lengths.  Every
    node type the sampled edge types name and every sampled edge type has an entry, empty when
    nothing of it was sampled.  ``batch_size`` is the number of seeds of
    ``input_type``.  ``subgraph[t]`` (disjoint sampling only, else None) is the subgraph of each node
    of type ``t`` (PyG's ``batch`` vector); a global id may then appear once per subgraph.
    """

    nodes: dict[str, torch.Tensor]
    row: dict[EdgeType, torch.Tensor]
    col: dict[EdgeType, torch.Tensor]
    eids: dict[EdgeType, torch.Tensor]
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[EdgeType, list[int]]
    batch_size: int
    input_type: str
    subgraph: dict[str, torch.Tensor] | None = None

    @classmethod
    def of_homogeneous(cls, sub: SampledSubgraph, ntype: str, etype: EdgeType) -> TypedSubgraph:
        """``sub`` (a sample of a one-type graph) as the one-type case of this record (no copy)."""
        return cls({ntype: sub.nodes}, {etype: sub.row}, {etype: sub.col}, {etype: sub.eids},
                   {ntype: list(sub.num_sampled_nodes)}, {etype: list(sub.num_sampled_edges)}, sub.batch_size, ntype)

    def edge_index(self, etype: EdgeType) -> torch.Tensor:
        """``[2, n]`` local (row = source, col = destination) ids of the sampled edges of ``etype``."""
        return torch.stack([self.row[etype], self.col[etype]])

    def homogeneous(self) -> SampledSubgraph:
        """This sample as a :class:`SampledSubgraph` (the same tensors, no copy); ValueError unless it
        has exactly one node type and one edge type."""
        if len(self.nodes) != 1 or len(self.row) != 1:
            raise ValueError(f"only a sample with one node type and one edge type is homogeneous, this one has "
                             f"node types {sorted(self.nodes)} and edge types {sorted(self.row)}")
        (ntype,), (etype,) = self.nodes, self.row
        return SampledSubgraph(self.nodes[ntype], self.row[etype], self.col[etype], self.eids[etype],
                               self.batch_size, self.num_sampled_nodes[ntype], self.num_sampled_edges[etype])
