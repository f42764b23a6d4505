"""The graph ``graphfeed partition`` partitions: one record for homogeneous and typed graphs.

A typed graph has node types (each with ``num_nodes`` nodes, original ids ``0..num_nodes-1``,
optional features ``x`` and labels ``y``) and edge types ``(src, rel, dst)`` whose
``edge_index`` row 0 holds source-type ids and row 1 destination-type ids. The splits
(``train``/``val``/``test`` original ids) live on one node type, the *label type*.

A homogeneous graph is the one-type case: node type ``_N``, edge type ``("_N", "to", "_N")``.
``GraphInput(edge_index, x, y, splits, ...)`` builds it and ``graph.x``, ``graph.y``,
``graph.edge_index``, ``graph.edge_attr`` read it back; ``GraphInput.typed(...)`` builds a
typed graph, read through ``graph.nodes[ntype]`` and ``graph.edges[etype]``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from graphfeed.core.columns import INPUT_COLUMNS, OTHER_INPUT_COLUMNS, TIME
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE
from graphfeed.server.partition.inputs.arrays import label_classes

EdgeType = tuple[str, str, str]
T = TypeVar("T")


class NodeTypeInput:
    """One node type: ``num_nodes`` nodes and its stored columns (:data:`graphfeed.core.columns.NODE_COLUMNS`) by
    name, absent ones left out: ``x`` [num_nodes, F] and ``y`` [num_nodes, ...] when present, ``time`` int64
    [num_nodes] node timestamps (temporal sampling, ``time_attr="time"``), any other column by keyword."""

    def __init__(self, num_nodes: int, x: np.ndarray | None = None, y: np.ndarray | None = None,
                 time: np.ndarray | None = None, **columns: np.ndarray | None):
        self.num_nodes = num_nodes
        given = {"x": x, "y": y, TIME: time, **columns}
        self.columns: dict[str, np.ndarray] = {name: a for name, a in given.items() if a is not None}

    def column(self, name: str) -> np.ndarray | None:
        return self.columns.get(name)

    @property
    def x(self) -> np.ndarray | None:
        return self.columns.get("x")

    @property
    def y(self) -> np.ndarray | None:
        return self.columns.get("y")

    @property
    def time(self) -> np.ndarray | None:
        return self.columns.get(TIME)

    @property
    def num_classes(self) -> int:
        return label_classes(self.y)


@dataclass
class EdgeTypeInput:
    """One edge type: ``edge_index`` int64 [2, E] (row 0 = source-type ids), ``edge_attr`` [E, ...] or None,
    ``edge_weight`` [E] (sampling weights, ``weight_attr="edge_weight"``) or None."""

    edge_index: np.ndarray
    edge_attr: np.ndarray | None = None
    edge_weight: np.ndarray | None = None
    edge_time: np.ndarray | None = None   # int64 [E] edge timestamps (temporal sampling, time_attr="edge_time")
    hard_neg_dst: np.ndarray | None = None   # int64 [E, k] hard-negative destinations, -1 padding (hard_negatives)

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


class TypedView:
    """The typed view of a graph whose ``nodes`` (type -> something with ``num_nodes``) and ``edges``
    (``(src, rel, dst)`` -> something with ``num_edges``) are in memory (:class:`GraphInput`) or in chunk files
    (``chunked.ChunkedGraph``)."""

    nodes: dict[str, Any]
    edges: dict[EdgeType, Any]

    @property
    def node_types(self) -> list[str]:
        return list(self.nodes)

    @property
    def edge_types(self) -> list[EdgeType]:
        return list(self.edges)

    @property
    def is_homogeneous(self) -> bool:
        return self.node_types == [DEFAULT_NODE_TYPE] and self.edge_types == [DEFAULT_EDGE_TYPE]

    @property
    def num_nodes(self) -> int:
        """Nodes of every type (the size of the homogeneous view)."""
        return sum(t.num_nodes for t in self.nodes.values())

    @property
    def num_edges(self) -> int:
        return sum(t.num_edges for t in self.edges.values())

    def node_offsets(self) -> dict[str, int]:
        """First id of each node type in the homogeneous view (types stacked in ``node_types`` order)."""
        out, start = {}, 0
        for ntype, t in self.nodes.items():
            out[ntype] = start
            start += t.num_nodes
        return out


class _OnlyType(Generic[T]):
    """``graph.NAME`` of a graph with one node type (``of="node"``) or one edge type (``of="edge"``): that type's
    ``NAME`` (ValueError naming the types when there are several)."""

    def __init__(self, of: str) -> None:
        self.of = of

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, graph: GraphInput, owner: type | None = None) -> T:
        return getattr(graph._only(getattr(graph, f"{self.of}s"), self.of), self.name)


class GraphInput(TypedView):
    """A graph to partition (see the module docstring); original ids are per-type row positions."""

    def __init__(self, edge_index: np.ndarray, x: np.ndarray | None, y: np.ndarray | None,
                 splits: dict[str, np.ndarray],
                 edge_attr: np.ndarray | None = None, name: str = "", fingerprint: str = "", num_classes: int = 0,
                 edge_weight: np.ndarray | None = None, node_time: np.ndarray | None = None,
                 edge_time: np.ndarray | None = None, node_columns: dict[str, np.ndarray | None] | None = None,
                 num_nodes: int | None = None):
        """The homogeneous graph: ``x`` [N, F] or None (featureless: ``num_nodes`` gives N), ``y`` [N, ...] or None
        (unlabelled), ``edge_index`` [2, E],
        ``splits`` of node ids; optional sampling weights ``edge_weight`` [E] and timestamps ``node_time`` [N]
        and ``edge_time`` [E] (int64); ``node_columns``: other stored node columns by name."""
        given = {name: a for name, a in (node_columns or {}).items() if a is not None}
        count = int(x.shape[0]) if x is not None else num_nodes
        if count is None:
            raise ValueError("a featureless graph (x=None) needs num_nodes")
        node = NodeTypeInput(count, x, y, **{TIME: node_time, **given})
        self._set({DEFAULT_NODE_TYPE: node},
                  {DEFAULT_EDGE_TYPE: EdgeTypeInput(edge_index, edge_attr, edge_weight, edge_time)},
                  splits, DEFAULT_NODE_TYPE, name, fingerprint, num_classes)

    @classmethod
    def typed(cls, nodes: dict[str, NodeTypeInput], edges: dict[EdgeType, EdgeTypeInput],
              splits: dict[str, np.ndarray], label_type: str, *, name: str = "", fingerprint: str = "",
              num_classes: int = 0) -> "GraphInput":
        """A typed graph; ``splits`` are ids of ``label_type`` nodes (not validated here: see ``typed_inputs``).

        Node and edge types are kept sorted by name, so the same graph read from any input format
        stacks its types in the same order (and partitions identically).
        """
        graph = cls.__new__(cls)
        graph._set({k: nodes[k] for k in sorted(nodes)}, {tuple(k): edges[k] for k in sorted(edges)}, splits,
                   label_type, name, fingerprint, num_classes)
        return graph

    def _set(self, nodes, edges, splits, label_type, name, fingerprint, num_classes) -> None:
        self.nodes: dict[str, NodeTypeInput] = nodes
        self.edges: dict[EdgeType, EdgeTypeInput] = edges
        self.splits: dict[str, np.ndarray] = splits
        self.label_type: str = label_type
        self.name: str = name
        self.fingerprint: str = fingerprint
        self.num_classes: int = num_classes or nodes[label_type].num_classes
        self.dropped: list[str] = []   # what the input carried that is not stored (the reader fills it in)

    # ---- the homogeneous accessors (one node type / one edge type)

    def _only(self, table: dict, what: str):
        if len(table) != 1:
            raise ValueError(f"graph {self.name or '(unnamed)'} has {len(table)} {what} types "
                             f"({', '.join(map(str, table))}); read graph.{what}s[type] instead")
        return next(iter(table.values()))

    x: _OnlyType[np.ndarray | None] = _OnlyType("node")
    y: _OnlyType[np.ndarray | None] = _OnlyType("node")
    edge_index: _OnlyType[np.ndarray] = _OnlyType("edge")
    edge_attr: _OnlyType[np.ndarray | None] = _OnlyType("edge")
    edge_weight: _OnlyType[np.ndarray | None] = _OnlyType("edge")


# ----------------------------------------------------------------------------- fingerprint

_HASH_CHUNK = 1 << 26  # bytes hashed per update: bounds the temporary copy of a non-contiguous array


def _hash_array(h, label: str, array: np.ndarray) -> None:
    h.update(f"{label}:{array.dtype.str}:{list(array.shape)};".encode())
    if array.ndim == 0 or array.size == 0:
        return
    # Chunks of rows: bounded temporary copies when the array is not contiguous (a transposed tensor).
    rows = max(1, _HASH_CHUNK // max(1, array[:1].nbytes))
    for start in range(0, array.shape[0], rows):
        h.update(np.ascontiguousarray(array[start:start + rows]))


def fingerprint(graph: GraphInput) -> str:
    """sha256 over every array's dtype, shape and bytes (edges, features, labels, splits, edge features),
    and for a typed graph every type's name and node count and the label type.

    Hashing everything costs about a second per GB and makes "same input" exact: a changed
    feature value or split gives a different fingerprint, so an old partition is never reused.
    A homogeneous graph hashes as it always has (its partitions stay up to date).
    """
    if graph.is_homogeneous and graph.x is not None and graph.y is not None:
        return _homogeneous_fingerprint(graph)
    h = hashlib.sha256(b"graphfeed-input-typed-v1;")
    for ntype in sorted(graph.nodes):
        t = graph.nodes[ntype]
        h.update(f"node:{ntype}:{t.num_nodes};".encode())
        for column in INPUT_COLUMNS:
            array = t.column(column.name)
            if array is not None:
                _hash_array(h, f"{ntype}.{column.name}", array)
    for etype in sorted(graph.edges):
        e, label = graph.edges[etype], "__".join(etype)
        _hash_array(h, f"{label}.edge_index", e.edge_index)
        if e.edge_attr is not None:
            _hash_array(h, f"{label}.edge_attr", e.edge_attr)
        if e.edge_weight is not None:
            _hash_array(h, f"{label}.edge_weight", e.edge_weight)
        if e.edge_time is not None:       # graphs without times hash as before
            _hash_array(h, f"{label}.edge_time", e.edge_time)
    h.update(f"label_type:{graph.label_type};".encode())
    for split in sorted(graph.splits):
        _hash_array(h, f"split:{split}", graph.splits[split])
    return h.hexdigest()


def _homogeneous_fingerprint(graph: GraphInput) -> str:
    node = graph.nodes[DEFAULT_NODE_TYPE]
    assert node.x is not None and node.y is not None  # checked by the caller
    h = hashlib.sha256(b"graphfeed-input-v1;")
    _hash_array(h, "edge_index", graph.edge_index)
    _hash_array(h, "x", node.x)
    _hash_array(h, "y", node.y)
    for split in sorted(graph.splits):
        _hash_array(h, f"split:{split}", graph.splits[split])
    if graph.edge_attr is not None:
        _hash_array(h, "edge_attr", graph.edge_attr)
    if graph.edge_weight is not None:
        _hash_array(h, "edge_weight", graph.edge_weight)
    optional = [(c.file, node.column(c.name)) for c in OTHER_INPUT_COLUMNS]
    for name, array in (*optional, ("edge_time", graph.edges[DEFAULT_EDGE_TYPE].edge_time)):
        if array is not None:     # graphs without times (or other columns) hash as before
            _hash_array(h, name, array)
    return h.hexdigest()
