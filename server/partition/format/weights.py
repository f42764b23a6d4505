"""Checked sampling weights of one part's edges: a loader's ``weight_attr`` read from the edge type's stored
``edge_weight`` or one ``edge_attr`` column, refused (one line naming the fix) when the column is missing, a weight
is negative, NaN or infinite, or a node with edges has only zero weights."""
from __future__ import annotations

from typing import Protocol

import torch

from graphfeed.core.spec import EDGE_WEIGHT, weight_column
from graphfeed.server.partition.format.layout import PartitionMeta, edge_type_dirname


class WeightedEdges(Protocol):
    """What the checks read of one edge type of one part (a :class:`.store.EdgeStore`)."""

    meta: PartitionMeta
    etype: tuple[str, str, str]

    @property
    def typed_label(self) -> str: ...

    def edge_weight(self, kind: str = "csc") -> torch.Tensor | None: ...

    def edge_attr(self, kind: str = "csc") -> torch.Tensor | None: ...

    def topology(self, kind: str = "csc"): ...


class EdgeWeights:
    """Checked edge weights of one part's topologies, per ``(kind, weight_attr)`` (made once each)."""

    def __init__(self, store: WeightedEdges):
        self.store = store
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def get(self, kind: str, weight_attr: str) -> torch.Tensor:
        """float64 weights aligned with ``topology(kind).indices``; ValueError (naming ``weight_attr``
        and the fix) when the graph has no such column, a weight is negative or NaN, or a node with
        edges has only zero weights."""
        key = (kind, weight_attr)
        if key not in self._cache:
            self._cache[key] = self._load(kind, weight_attr)
        return self._cache[key]

    def _load(self, kind: str, weight_attr: str) -> torch.Tensor:
        w = self._stored(kind) if weight_attr == EDGE_WEIGHT else self._column(kind, weight_attr)
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            source = "edge_weight" if weight_attr == EDGE_WEIGHT else "edge_attr column"
            raise ValueError(f"weight_attr={weight_attr!r}: edge weights{self.store.typed_label} must be finite and "
                             f">= 0 (found negative, NaN or infinite ones); fix the {source}")
        self._check_nodes(kind, weight_attr, w)
        return w

    def _stored(self, kind: str) -> torch.Tensor:
        w = self.store.edge_weight(kind)
        if w is None:
            raise self._missing(EDGE_WEIGHT, "edge weights", "edge_weight",
                                "edge_weight.npy ([E]) in the input folder (or Data.edge_weight)")
        return w.to(torch.float64)

    def _column(self, kind: str, weight_attr: str) -> torch.Tensor:
        attr, column = self.store.edge_attr(kind), weight_column(weight_attr)
        if attr is None:
            raise self._missing(weight_attr, "edge features", "edge_attr", "edge_attr.npy", " holding the weights")
        cols = 1 if attr.dim() == 1 else int(attr.shape[1]) if attr.dim() == 2 else -1
        if column is None and cols != 1 or column is not None and not 0 <= column < cols:
            raise ValueError(f"weight_attr={weight_attr!r}: the edge features{self.store.typed_label} have shape "
                             f"{list(attr.shape[1:])}; name one column as 'edge_attr:K' with K in "
                             f"0..{max(cols, 1) - 1}")
        return (attr if attr.dim() == 1 else attr[:, column or 0]).to(torch.float64)

    def _missing(self, weight_attr: str, what: str, name: str, homogeneous_input: str, holding: str = "") -> ValueError:
        """The error for weights read from an edge column the graph lacks: ``what`` it lacks, the column's input
        ``name`` on a typed graph, the input to give on a homogeneous one."""
        if self.store.meta.is_homogeneous:
            return ValueError(f"weight_attr={weight_attr!r}: the graph has no {what}; partition it with "
                              f"{homogeneous_input}{holding}, or drop weight_attr")
        etype = self.store.etype
        return ValueError(f"weight_attr={weight_attr!r}: edge type {etype} has no {what}; partition the graph with "
                          f"{edge_type_dirname(etype)}/{name}.npy (data[{etype}].{name}){holding}, or give this "
                          f"edge type fanout 0, or drop weight_attr")

    def _check_nodes(self, kind: str, weight_attr: str, w: torch.Tensor) -> None:
        indptr = self.store.topology(kind).indptr.to(torch.int64)
        deg = indptr[1:] - indptr[:-1]
        sums = torch.zeros(deg.numel(), dtype=torch.float64).index_add_(
            0, torch.repeat_interleave(torch.arange(deg.numel()), deg), w)
        dead = ((deg > 0) & (sums == 0)).nonzero().view(-1)
        if dead.numel():
            side = "in" if kind == "csc" else "out"
            raise ValueError(f"weight_attr={weight_attr!r}: {dead.numel()} node(s) have {side}-edges"
                             f"{self.store.typed_label} whose weights are all zero (they could never be sampled); "
                             f"give them a positive weight or drop weight_attr")
