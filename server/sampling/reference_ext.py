"""Pure-torch references for weighted and temporal one-hop sampling (oracles of the native ops).

Both reuse the counter-based RNG of :mod:`.rng`: node ``v``'s draws at a hop are keyed by
``(seed, hop, v)``, so results are independent of frontier order and thread count.

Weighted (``weight`` >= 0 per edge, zero-weight neighbors are never sampled):

* fanout ``-1``, or no replacement and at most ``fanout`` positive-weight neighbors:
  every positive-weight neighbor, in list order;
* no replacement otherwise (exponential race, the Efraimidis-Spirakis scheme): neighbor at
  list position ``j`` gets the key ``-log(u_j) / w_j`` with
  ``u_j = ((draw(j) >> 10) + 1) / 2**53`` in (0, 1]; the ``fanout`` smallest keys win
  (ties to the lower position); the winners are returned in list order;
* with replacement: ``fanout`` draws by inverse CDF: ``t_q = (draw(q) >> 10) / 2**53 * W``
  over the row's running float64 sum ``c`` (total ``W``); the pick is the first position
  with ``c > t_q`` (the last positive-weight one should rounding reach ``W``).

Temporal (``edge_time`` per edge, ``seed_time`` per frontier node; pass
``node_time[indices]`` as ``edge_time`` for node-time semantics): only edges with
``edge_time <= seed_time`` are eligible; the uniform rule of :mod:`.reference` applies to
each row's list of eligible edges.  Strategy ``"last"`` (:func:`last_one_hop`, PyG's
``temporal_strategy="last"``) draws nothing: each row keeps its ``fanout`` most recent eligible
edges (latest time first, a later list position first among equal times), in list order.
"""
from __future__ import annotations

import torch

from graphfeed.server.sampling import rng
from graphfeed.server.sampling.reference import sample_positions, segment_arange
from graphfeed.server.sampling.types import OneHop

_INV_2_53 = 1.0 / float(1 << 53)


def _row_edges(indptr: torch.Tensor, local_nodes: torch.Tensor):
    """Per candidate edge of the frontier rows: owner row index, position in row, edge index."""
    start = indptr[local_nodes]
    deg = indptr[local_nodes + 1] - start
    owner = torch.repeat_interleave(torch.arange(local_nodes.numel()), deg)
    j = segment_arange(deg)
    return deg, owner, j, start[owner] + j


def _segment_sum(owner: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64).index_add_(0, owner, values.to(torch.int64))


def _exponential_race(keys, owner, j, w, big_row, fanout: int, n: int) -> torch.Tensor:
    """Mask of the candidate edges winning the race in rows ``big_row`` (positive weights only)."""
    cand = big_row[owner] & (w > 0)
    idx = torch.nonzero(cand).flatten()
    u = ((rng.draws(keys[owner[idx]], j[idx]) >> 10) + 1).to(torch.float64) * _INV_2_53
    race = -torch.log(u) / w[idx]
    order = torch.argsort(race, stable=True)
    order = order[torch.argsort(owner[idx][order], stable=True)]   # by (row, key, position)
    rank = segment_arange(_segment_sum(owner[idx], torch.ones_like(idx), n))
    win = torch.zeros_like(cand)
    win[idx[order[rank < fanout]]] = True
    return win


def _inverse_cdf(keys, deg, owner, j, w, rows, fanout: int) -> torch.Tensor:
    """``[len(rows), fanout]`` positions drawn with replacement in rows ``rows`` (local row indices)."""
    m = rows.numel()
    if m == 0:
        return torch.empty((0, fanout), dtype=torch.int64)
    sel = torch.isin(owner, rows)
    slot = torch.searchsorted(rows, owner[sel])
    padded = torch.zeros((m, int(deg[rows].max())), dtype=torch.float64)
    padded[slot, j[sel]] = w[sel]
    cum = padded.cumsum(1)                                  # sequential float64 sums, as the kernel
    total = cum[torch.arange(m), deg[rows] - 1]
    q = torch.arange(fanout)
    u = (rng.draws(keys[rows].unsqueeze(1), q.unsqueeze(0)) >> 10).to(torch.float64) * _INV_2_53
    pos = torch.searchsorted(cum, u * total.unsqueeze(1), right=True)
    last = torch.zeros(m, dtype=torch.int64).scatter_reduce_(0, slot, torch.where(w[sel] > 0, j[sel], 0), "amax")
    return torch.where(pos >= deg[rows].unsqueeze(1), last.unsqueeze(1), pos)


def weighted_one_hop(indptr: torch.Tensor, indices: torch.Tensor, eid: torch.Tensor, weight: torch.Tensor,
                     local_nodes: torch.Tensor, gids: torch.Tensor, fanout: int, replace: bool, seed: int,
                     hop: int) -> OneHop:
    """Weighted one hop (rule in the module docstring); raises ValueError on a negative/NaN weight."""
    n = local_nodes.numel()
    deg, owner, j, epos = _row_edges(indptr, local_nodes)
    w = weight[epos].to(torch.float64)
    if bool((~(w >= 0)).any()):
        raise ValueError("edge weights must be >= 0 and not NaN")
    npos = _segment_sum(owner, w > 0, n)
    keys = rng.node_keys(rng.hop_base(seed, hop), gids)
    if replace and fanout >= 0:
        rows = torch.nonzero(npos > 0).flatten()
        pos = _inverse_cdf(keys, deg, owner, j, w, rows, fanout)
        counts = torch.where(npos > 0, fanout, 0)
        edge = (indptr[local_nodes[rows]].unsqueeze(1) + pos).reshape(-1)
        return OneHop(counts, indices[edge].to(torch.int64), eid[edge].to(torch.int64))
    small = npos <= fanout if fanout >= 0 else torch.ones(n, dtype=torch.bool)
    take = small[owner] & (w > 0)
    if fanout >= 0:
        take |= _exponential_race(keys, owner, j, w, ~small, fanout, n)
    edge = epos[take]
    return OneHop(_segment_sum(owner, take, n), indices[edge].to(torch.int64), eid[edge].to(torch.int64))


def temporal_one_hop(indptr: torch.Tensor, indices: torch.Tensor, eid: torch.Tensor, edge_time: torch.Tensor,
                     local_nodes: torch.Tensor, gids: torch.Tensor, seed_time: torch.Tensor, fanout: int,
                     replace: bool, seed: int, hop: int) -> OneHop:
    """Temporal one hop: the uniform rule over each row's edges with ``edge_time <= seed_time``."""
    n = local_nodes.numel()
    _, owner, _, epos = _row_edges(indptr, local_nodes)
    ok = edge_time[epos] <= seed_time[owner]
    elig_deg = _segment_sum(owner, ok, n)
    elig = epos[ok]
    keys = rng.node_keys(rng.hop_base(seed, hop), gids)
    counts, pos = sample_positions(elig_deg, keys, fanout, replace)
    first = torch.cumsum(elig_deg, 0) - elig_deg
    edge = elig[torch.repeat_interleave(first, counts) + pos]
    return OneHop(counts, indices[edge].to(torch.int64), eid[edge].to(torch.int64))


def last_one_hop(indptr: torch.Tensor, indices: torch.Tensor, eid: torch.Tensor, edge_time: torch.Tensor,
                 local_nodes: torch.Tensor, seed_time: torch.Tensor, fanout: int) -> OneHop:
    """Temporal one hop, strategy ``"last"`` (rule in the module docstring; ``fanout`` -1: every eligible edge)."""
    n = local_nodes.numel()
    _, owner, j, epos = _row_edges(indptr, local_nodes)
    ok = edge_time[epos] <= seed_time[owner]
    owner, j, epos = owner[ok], j[ok], epos[ok]
    if fanout >= 0 and epos.numel():
        # rank within the row by (time desc, position desc): sort by position, then stably by time, then by row
        order = torch.argsort(j, descending=True, stable=True)
        order = order[torch.argsort(edge_time[epos[order]], descending=True, stable=True)]
        order = order[torch.argsort(owner[order], stable=True)]
        rank = torch.empty_like(order)
        rank[order] = segment_arange(_segment_sum(owner, torch.ones_like(owner), n))
        keep = rank < fanout
        owner, epos = owner[keep], epos[keep]
    return OneHop(_segment_sum(owner, torch.ones_like(owner), n), indices[epos].to(torch.int64),
                  eid[epos].to(torch.int64))
