"""PyG's ``FeatureStore`` and ``GraphStore`` over a connected graphfeed cluster (the data stays on the servers).

:class:`GraphfeedFeatureStore` reads stored node rows (``x``, ``y``: every per-node field the servers
keep) by ``(node type, attribute, original ids)``: rows of the batch :class:`~graphfeed.pyg.sampler.GraphfeedSampler`
just pulled are served from that batch (no call), any other index with one ``node_rows`` call per server
for all attributes of a node type at once.  :class:`GraphfeedGraphStore` lists the graph's edge types
(with their node counts, as PyG's loaders ask) and pulls one edge type's edges (``coo``, original ids)
only when asked, refusing in one line a type with more than ``max_edges`` edges.  Both are read-only.
A homogeneous graph's attributes have group ``None`` and its edge type is ``("_N", "to", "_N")``.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, FeatureStore, GraphStore, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from graphfeed.core.constants import DEFAULT_NODE_TYPE
from graphfeed.pyg.calls import on_every_part
from graphfeed.pyg.convert import BatchRows, edge_type_of

if TYPE_CHECKING:
    from graphfeed.client.client import Client

DEFAULT_MAX_EDGES = 50_000_000   # edges of one type a graph store pulls into the trainer by default
MAX_WHOLE_TYPE_ROWS = 10_000_000  # rows an index-less read (a whole node type) may ask for
KEPT_BATCHES = 8                 # batches whose rows the feature store keeps (the loader reads the newest)


def _same_args(args: tuple) -> Callable[[int], tuple]:
    """The arguments of a call made alike on every part."""
    return lambda part: args


class GraphfeedFeatureStore(FeatureStore):
    """Node features of the servers of ``client`` by ``(group, attr, index)`` (see the module doc)."""

    def __init__(self, client: Client):
        super().__init__()
        self.client = client
        self.homogeneous = list(client.node_types) == [client.label_type] and len(client.edge_types) == 1
        self._recent: deque[BatchRows] = deque(maxlen=KEPT_BATCHES)
        self._lock = threading.Lock()
        self._schema: dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]] | None = None

    # ---- the sampler's batches -------------------------------------------------------------------

    def offer(self, rows: BatchRows) -> None:
        """Keep a just-sampled batch's rows: a request indexed by one of its ``node`` tensors is served from it."""
        with self._lock:
            self._recent.append(rows)

    def _from_batch(self, ntype: str, index) -> dict[str, torch.Tensor] | None:
        if not isinstance(index, torch.Tensor):
            return None
        with self._lock:
            recent = list(self._recent)
        for rows in reversed(recent):
            if rows.nodes.get(ntype) is index:
                return dict(rows.rows.get(ntype, {}))
        return None

    # ---- PyG's contract ------------------------------------------------------------------------

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=self._group(t), attr_name=a) for t, attrs in self.schema().items() for a in attrs]

    def _get_tensor(self, attr: TensorAttr):
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[Any]:
        out: list[Any] = [None] * len(attrs)
        wanted: dict[str, list[int]] = {}   # node type -> positions in attrs still to read from the servers
        for i, attr in enumerate(attrs):
            ntype = self._ntype(attr.group_name)
            self._check_attr(ntype, attr.attr_name)
            got = self._from_batch(ntype, attr.index)
            if got is not None and attr.attr_name in got:
                out[i] = got[attr.attr_name]
            else:
                wanted.setdefault(ntype, []).append(i)
        for ntype, positions in wanted.items():
            self._read(ntype, [attrs[i] for i in positions], positions, out)
        return out

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        ntype = self._ntype(attr.group_name)
        self._check_attr(ntype, attr.attr_name)
        return (self.client.num_nodes_of(ntype), *self.schema()[ntype][attr.attr_name][0])

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise TypeError("a GraphfeedFeatureStore is read-only: the features live in the servers' partition "
                        "(re-run `graphfeed partition` to change them)")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._put_tensor(None, attr)

    # ---- reads from the servers ------------------------------------------------------------------

    def schema(self) -> dict[str, dict[str, tuple[tuple[int, ...], torch.dtype]]]:
        """``{node type: {attr: (row shape, dtype)}}`` of the stored rows (asked of part 0 once)."""
        if self._schema is None:
            empty = torch.empty(0, dtype=torch.int64)
            schema = {}
            for ntype in self.client.node_types:
                _, rows = on_every_part(self.client, "node_rows", _same_args((ntype, empty)))[0]
                schema[ntype] = {a: (tuple(t.shape[1:]), t.dtype) for a, t in rows.items()}
            self._schema = schema
        return self._schema

    def _read(self, ntype: str, attrs: list[TensorAttr], positions: list[int], out: list[Any]) -> None:
        """Every attr of ``attrs`` (one node type) with one ``node_rows`` call per server for the union of ids."""
        indexes = [self._ids(ntype, a.index) for a in attrs]
        ids, inverse = torch.unique(torch.cat(indexes), return_inverse=True)
        columns = {a.attr_name for a in attrs}
        table = {a: torch.empty((ids.numel(), *shape), dtype=dtype)
                 for a, (shape, dtype) in self.schema()[ntype].items() if a in columns}
        found = torch.zeros(ids.numel(), dtype=torch.bool)
        for mask, rows in on_every_part(self.client, "node_rows", _same_args((ntype, ids))):
            found |= mask
            for a in table:
                table[a][mask] = rows[a]
        if not bool(found.all()):
            bad = int(ids[~found][0])
            raise IndexError(f"node id {bad} of type {ntype!r} is not in the graph: original ids are "
                             f"0..{self.client.num_nodes_of(ntype) - 1}")
        for i, piece, a in zip(positions, inverse.split([x.numel() for x in indexes]), attrs):
            out[i] = table[a.attr_name].index_select(0, piece)

    def _ids(self, ntype: str, index) -> torch.Tensor:
        """A TensorAttr index (None / all, slice, int, array, tensor) as original ids of ``ntype``."""
        n = self.client.num_nodes_of(ntype)
        if index is None or (isinstance(index, slice) and index == slice(None)):
            if n > MAX_WHOLE_TYPE_ROWS:
                raise ValueError(f"node type {ntype!r} has {n} nodes, more than the {MAX_WHOLE_TYPE_ROWS} rows a "
                                 f"whole-type read may pull: pass an index")
            return torch.arange(n)
        if isinstance(index, slice):
            return torch.arange(n)[index]
        if isinstance(index, int):
            return torch.tensor([index])
        if isinstance(index, np.ndarray):
            index = torch.from_numpy(index)
        if not isinstance(index, torch.Tensor) or index.dtype.is_floating_point:
            raise ValueError(f"index must be original node ids (a tensor, array, slice or int), got "
                             f"{type(index).__name__}")
        if index.dtype == torch.bool:
            return index.nonzero().view(-1)
        return index.to(torch.int64).reshape(-1)

    # ---- names -------------------------------------------------------------------------------------

    def _group(self, ntype: str) -> str | None:
        return None if self.homogeneous else ntype

    def _ntype(self, group) -> str:
        if group is None or (self.homogeneous and group in ("", DEFAULT_NODE_TYPE)):
            if not self.homogeneous:
                raise KeyError(f"name the node type (group): the graph has {', '.join(self.client.node_types)}")
            return self.client.label_type
        if group not in self.client.node_types:
            raise KeyError(f"node type {group!r} is not in the graph: its node types are "
                           f"{', '.join(self.client.node_types)}")
        return str(group)

    def _check_attr(self, ntype: str, attr: str) -> None:
        if attr not in self.schema()[ntype]:
            stored = sorted(self.schema()[ntype]) or "nothing"
            raise KeyError(f"node type {ntype!r} stores no {attr!r}; it stores {stored}")


class GraphfeedGraphStore(GraphStore):
    """The edge types of the servers of ``client``, and one type's edges on request (see the module doc)."""

    def __init__(self, client: Client, *, max_edges: int = DEFAULT_MAX_EDGES):
        super().__init__()
        if isinstance(max_edges, bool) or not isinstance(max_edges, int) or max_edges < 0:
            raise ValueError(f"max_edges must be a non-negative integer, got {max_edges!r}")
        self.client, self.max_edges = client, max_edges

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        n = self.client.num_nodes_of
        return [EdgeAttr(tuple(e), EdgeLayout.COO, is_sorted=False, size=(n(e[0]), n(e[2])))
                for e in self.client.edge_types]

    def _get_edge_index(self, edge_attr: EdgeAttr):
        if EdgeLayout(edge_attr.layout) != EdgeLayout.COO:
            raise ValueError(f"layout {EdgeLayout(edge_attr.layout).value!r} is not offered: a GraphfeedGraphStore "
                             f"gives 'coo' (convert it with torch_geometric.utils if needed)")
        etype = edge_type_of(edge_attr.edge_type, [tuple(e) for e in self.client.edge_types])  # type: ignore[misc]
        answers = on_every_part(self.client, "part_edges", _same_args((etype, self.max_edges)))
        original = self._original_ids(etype, answers)
        src = torch.cat([original[etype[0]][a["src"]] for a in answers])
        dst = torch.cat([original[etype[2]][a["dst"]] for a in answers])
        return src, dst

    def _original_ids(self, etype, answers) -> dict[str, torch.Tensor]:
        """Global id -> original id of both end types, from every part's own nodes."""
        out = {}
        for ntype in {etype[0], etype[2]}:
            table = torch.full((self.client.num_nodes_of(ntype),), -1, dtype=torch.int64)
            for a in answers:
                start, orig = a["orig"][ntype]
                table[start:start + orig.numel()] = orig
            out[ntype] = table
        return out

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        raise TypeError("a GraphfeedGraphStore is read-only: the topology lives in the servers' partition")

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return self._put_edge_index(None, edge_attr)
