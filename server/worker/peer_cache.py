"""Other parts' hottest rows, replicated onto this part (a daemon's ``peer_cache_bytes``).

A batch of this part's seeds reaches many nodes of the other parts, and the same ones again and again:
the nodes its own edges point at.  A session worker therefore keeps a copy of the feature rows (every
:class:`~graphfeed.server.sampling.types.NodeRows` field) of the other parts' nodes that most of this
part's edges reach -- GraphLearn-for-PyTorch's ``cache_ratio`` of remote features, sized in bytes --
and asks peers only for the rest (:class:`graphfeed.server.worker.peers.RemoteSource`).

The rows are ranked by *halo degree*: how many of this part's stored edges (CSC: in-edges of its nodes;
CSR when it stores no CSC) have the node at their other end.  It is computed from this part's own
topology, so no peer is asked for a ranking, and it ranks by what this part's first hop reaches, which
a global degree does not (the partitioner stores per-part access totals only, no per-node counts).
Ties go to the lower global id, so every worker of a partition picks the same rows.

The copies are the peer's stored rows, read once through its ``gather`` when the group forms: a batch
is the same with or without them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from graphfeed.server.partition.format.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.types import NodeRows

CHUNK_BYTES = 16 << 20   # rows per peer gather while filling: one bounded message at a time


@dataclass(frozen=True)
class RowCache:
    """Rows of some nodes of one type that another part owns: ``gids`` sorted, ``rows`` aligned with them."""

    gids: torch.Tensor
    rows: NodeRows

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.rows.items() if t is not None)

    def find(self, gids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hit, index)``: which of ``gids`` are held, and for those, their row in :attr:`rows`."""
        if self.gids.numel() == 0:
            return torch.zeros(gids.numel(), dtype=torch.bool), torch.empty(0, dtype=torch.int64)
        pos = torch.searchsorted(self.gids, gids).clamp_(max=self.gids.numel() - 1)
        hit = self.gids.index_select(0, pos) == gids
        return hit, pos[hit]

    def assemble(self, n: int, hit: torch.Tensor, index: torch.Tensor, missed: NodeRows | None) -> NodeRows:
        """Rows of ``n`` nodes: held ones (``hit``) from here, the others from ``missed`` (the peer's answer
        for them, in order; ``x`` possibly in a narrower transport dtype, widened back exactly)."""
        hit_pos, miss_pos = hit.nonzero().reshape(-1), (~hit).nonzero().reshape(-1)
        out: dict[str, Any] = {}
        for name, held in self.rows.items():
            if held is None:
                out[name] = None
                continue
            dst = dispatch.empty_rows(held, n)
            dispatch.gather_rows_to(held, index, dst, hit_pos)
            src = None if missed is None else getattr(missed, name)
            if miss_pos.numel() and src is not None:
                dispatch.gather_rows_to(src.to(dst.dtype), None, dst, miss_pos)
            out[name] = dst
        return NodeRows(**out)


def row_bytes(part: Partition, ntype: str) -> int:
    """Bytes of one node's :class:`NodeRows` of ``ntype`` as stored (0 when the type has no features)."""
    store = part.nodes(ntype)
    if store.x is None:
        return 0
    columns = (store.column(c) for c in NodeRows.COLUMNS.values())
    return sum(c[:1].numel() * c.element_size() for c in columns if c is not None)


def halo_degree(part: Partition, ntype: str) -> torch.Tensor:
    """int64 [nodes of ``ntype`` in the graph]: how many of this part's stored edges end at each node."""
    kind, far = ("csc", 0) if "csc" in part.meta.topologies else ("csr", 2)
    counts = torch.zeros(part.nodes(ntype).book.num_nodes, dtype=torch.int64)
    for etype in part.edge_types:
        if etype[far] == ntype:
            indices = part.edges(etype).topology(kind).indices
            counts += torch.bincount(indices.to(torch.int64), minlength=counts.numel())
    return counts


def pick(part: Partition, budget_bytes: int, remote_parts: Iterable[int]) -> dict[str, torch.Tensor]:
    """Per node type, the global ids (sorted) of the rows of parts ``remote_parts`` to replicate: the
    highest halo degree first across all types, as many as fit ``budget_bytes``; only nodes some edge of
    this part reaches."""
    remote = set(remote_parts)
    ranked: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []   # (degree, type index, gid)
    types = [t for t in part.node_types if row_bytes(part, t)]
    for k, ntype in enumerate(types):
        degree = halo_degree(part, ntype)
        book = part.nodes(ntype).book
        for p in range(part.meta.num_parts):
            if p not in remote:
                lo, hi = book.range(p)
                degree[lo:hi] = 0
        gids = degree.nonzero().reshape(-1)
        ranked.append((degree[gids], torch.full_like(gids, k), gids))
    if not ranked or budget_bytes <= 0:
        return {}
    degree, kind, gids = (torch.cat(c) for c in zip(*ranked))
    order = torch.sort(-degree, stable=True).indices    # ties: type order, then global id
    size = torch.tensor([row_bytes(part, t) for t in types], dtype=torch.int64)
    fits = size.index_select(0, kind.index_select(0, order)).cumsum(0) <= budget_bytes
    chosen = order[fits]
    return {t: torch.sort(gids[chosen[kind.index_select(0, chosen) == k]]).values for k, t in enumerate(types)
            if bool((kind.index_select(0, chosen) == k).any())}


def fill(part: Partition, chosen: dict[str, torch.Tensor],
         gather: Callable[[int, str, torch.Tensor], NodeRows]) -> dict[int, dict[str, RowCache]]:
    """The caches of ``chosen`` rows per owning part and type, read with ``gather(part, ntype, gids)``
    (a peer's ``gather``) in chunks of about :data:`CHUNK_BYTES`.  Raises what ``gather`` raises."""
    out: dict[int, dict[str, RowCache]] = {}
    for ntype, gids in chosen.items():
        step = max(1, CHUNK_BYTES // max(1, row_bytes(part, ntype)))
        for p, pos in part.nodes(ntype).book.split(gids):
            mine = gids[pos]
            pieces = [gather(p, ntype, mine[i:i + step]) for i in range(0, mine.numel(), step)]
            rows: dict[str, Any] = {name: None if first is None else torch.cat([getattr(r, name) for r in pieces])
                    for name, first in pieces[0].items()}
            out.setdefault(p, {})[ntype] = RowCache(mine, NodeRows(**rows))
    return out
