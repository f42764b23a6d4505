"""The feature rows a trainer's hot-feature cache asks this part for (:func:`graphfeed.server.worker.rpc_api.hot_rows`).

A part ranks its nodes of one type by in-degree (summed over the edge types that end at the type, from
the CSC topology; out-degree from CSR when the part stores no CSC), highest first, ties by global id:
the nodes that neighbourhood sampling reaches most often.  The ranking is computed once per type.
"""
from __future__ import annotations

import threading

import torch


class HotRows:
    """Ranked feature rows of one part (``part``: a :class:`graphfeed.server.partition.format.store.Partition`)."""

    def __init__(self, part):
        self.part = part
        self._order: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def order(self, ntype: str) -> torch.Tensor:
        """Local positions of the part's ``ntype`` nodes, hottest first."""
        with self._lock:
            if ntype not in self._order:
                degree = self._degree(ntype)
                # stable sort of -degree: ties keep id order, so every call gives the same ranking
                self._order[ntype] = torch.sort(-degree, stable=True).indices
            return self._order[ntype]

    def _degree(self, ntype: str) -> torch.Tensor:
        part = self.part
        degree = torch.zeros(part.nodes(ntype).num_nodes, dtype=torch.int64)
        kind, end = ("csc", 2) if "csc" in part.meta.topologies else ("csr", 0)
        for etype in part.edge_types:
            if etype[end] == ntype:
                indptr = part.edges(etype).topology(kind).indptr.to(torch.int64)
                degree += indptr[1:] - indptr[:-1]
        return degree

    def rows(self, ntype: str, start: int, count: int, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(original ids, x rows)`` of the nodes ranked ``start .. start + count - 1`` (fewer at the end),
        floating-point rows cast to ``dtype`` (None = as stored); ValueError for an unknown type, a type
        without features, or a negative range."""
        if ntype not in self.part.node_types:
            raise ValueError(f"hot_rows: node type {ntype!r} is not one of {self.part.node_types}")
        store = self.part.nodes(ntype)
        if store.x is None:
            raise ValueError(f"hot_rows: node type {ntype!r} has no features to cache")
        if start < 0 or count < 0:
            raise ValueError(f"hot_rows: start = {start}, count = {count}: give non-negative numbers")
        picked = self.order(ntype)[start:start + count]
        x = store.x.index_select(0, picked)
        if dtype is not None and x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        return store.orig_id.index_select(0, picked).to(torch.int64), x
