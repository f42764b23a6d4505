"""The trainer's hot-feature cache: rows the servers leave out of a batch and the client fills in.

A loader with ``feature_cache_mb`` holds the feature rows of the most sampled nodes of one node type
(the highest in-degree nodes of every part, fetched once when the loader opens).  Its session learns
the cached original ids (:class:`CachedIds`, ``OpenSessionRequest.feature_cache``); the worker drops
those rows from ``x`` and lists their positions in ``x_cached`` (:func:`drop_cached_rows`), and the
client puts them back (:meth:`FeatureCache.fill`) before :func:`graphfeed.core.batch.to_pyg`, so the
trainer's batch is tensor-equal to an uncached one.  The cache holds the rows in the loader's
``feature_dtype`` (the same cast the worker applies), so bf16/fp16 batches stay equal too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphfeed.core.batch import node_key

MB = 1 << 20


@dataclass(frozen=True, eq=False)
class CachedIds:
    """The cached nodes: original ids of node type ``node_type``, sorted and distinct (int64)."""

    node_type: str
    ids: torch.Tensor

    def __post_init__(self):
        ids = torch.as_tensor(self.ids, dtype=torch.int64).reshape(-1)
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("feature_cache: node_ids must be sorted and distinct (the client sends them sorted)")
        if not self.node_type:
            raise ValueError("feature_cache: node_type is empty: name the cached node type")
        object.__setattr__(self, "ids", ids)

    def positions(self, n_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hit, slot)``: which of the original ids ``n_id`` are cached, and each one's row in the cache
        (``slot`` is meaningful where ``hit``)."""
        if self.ids.numel() == 0 or n_id.numel() == 0:
            return torch.zeros(n_id.numel(), dtype=torch.bool), torch.zeros(n_id.numel(), dtype=torch.int64)
        slot = torch.searchsorted(self.ids, n_id).clamp_(max=self.ids.numel() - 1)
        return self.ids.index_select(0, slot) == n_id, slot


def drop_cached_rows(batch: dict[str, torch.Tensor], cached: CachedIds | None) -> dict[str, torch.Tensor]:
    """The server's half: ``batch`` (wire form, in place) without the ``x`` rows of the cached nodes,
    their positions in ``x_cached``.  A batch whose cached type has no ``x`` is left as it is."""
    if cached is None:
        return batch
    xkey = node_key("x", cached.node_type)
    x = batch.get(xkey)
    if x is None:
        return batch
    hit, _ = cached.positions(batch[node_key("n_id", cached.node_type)])
    batch[node_key("x_cached", cached.node_type)] = hit.nonzero().view(-1)
    batch[xkey] = x.index_select(0, (~hit).nonzero().view(-1))
    return batch


class FeatureCache:
    """The client's half: one ``[K, F]`` tensor ``rows`` (in the loader's feature dtype, in the order the
    servers sent them) and the sorted id index ``cached``: ``rows[row_of[i]]`` is the row of original id
    ``cached.ids[i]``."""

    def __init__(self, cached: CachedIds, rows: torch.Tensor, row_of: torch.Tensor):
        if rows.dim() != 2 or rows.size(0) != cached.ids.numel() or row_of.numel() != rows.size(0):
            raise ValueError(f"feature cache: {cached.ids.numel()} ids and {row_of.numel()} row indices for rows "
                             f"of shape {list(rows.shape)}")
        self.cached, self.rows, self.row_of = cached, rows, row_of

    @classmethod
    def of(cls, node_type: str, ids: torch.Tensor, rows: torch.Tensor) -> FeatureCache:
        """The cache of ``rows[i]`` = the row of original id ``ids[i]`` (distinct ids, any order)."""
        ids, row_of = torch.sort(torch.as_tensor(ids, dtype=torch.int64))
        if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("feature cache: the servers sent some node twice")
        return cls(CachedIds(node_type, ids), rows, row_of)

    @property
    def num_rows(self) -> int:
        return int(self.rows.size(0))

    @property
    def row_bytes(self) -> int:
        return int(self.rows.size(1)) * self.rows.element_size()

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def fill(self, batch: dict[str, torch.Tensor]) -> int:
        """Put the rows a server left out back into ``batch`` (in place) and drop ``x_cached``; returns the
        rows filled.  ValueError when the batch lists a node that the cache does not hold (client and
        server disagree on the cached set)."""
        where = batch.pop(node_key("x_cached", self.cached.node_type), None)
        if where is None:
            return 0
        xkey = node_key("x", self.cached.node_type)
        n_id = batch[node_key("n_id", self.cached.node_type)]
        hit, slot = self.cached.positions(n_id.index_select(0, where))
        if not bool(hit.all()):
            raise ValueError(f"the server left out {int((~hit).sum())} x row(s) of nodes the feature cache does "
                             f"not hold: client and server disagree on the cached set")
        sent = batch[xkey]
        x = torch.empty((n_id.numel(), self.rows.size(1)), dtype=sent.dtype)
        kept = torch.ones(n_id.numel(), dtype=torch.bool)
        kept[where] = False
        # index_copy_ with index tensors: a boolean-mask assignment of the same rows is several times slower
        x.index_copy_(0, kept.nonzero().view(-1), sent)
        x.index_copy_(0, where, self.rows.index_select(0, self.row_of.index_select(0, slot)).to(sent.dtype))
        batch[xkey] = x
        return int(where.numel())
