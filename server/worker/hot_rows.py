"""The feature rows a trainer's hot-feature cache asks this part for (:func:`graphfeed.server.worker.rpc_api.hot_rows`).

A part ranks its nodes of one type by in-degree, highest first (:func:`graphfeed.server.sampling.hot.hottest`,
the GPU feature cache's ranking too): the nodes that neighbourhood sampling reaches most often.  The ranking
is computed once per type.
"""
from __future__ import annotations

import threading

import torch

from graphfeed.server.sampling.hot import hottest


class HotRows:
    """Ranked feature rows of one part (``part``: a :class:`graphfeed.server.partition.format.store.Partition`)."""

    def __init__(self, part):
        self.part = part
        self._order: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def order(self, ntype: str) -> torch.Tensor:
        """Local positions of the part's ``ntype`` nodes, hottest first (the GPU cache's ranking too)."""
        with self._lock:
            if ntype not in self._order:
                self._order[ntype] = hottest(self.part, ntype)
            return self._order[ntype]

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
