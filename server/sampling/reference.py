"""Pure-torch reference sampler: the fallback and the test oracle for the native ops.

Vectorized over the frontier (no Python loop per node).  Selection rule, which the
native kernels reproduce exactly:

* fanout ``-1`` or ``deg <= fanout`` without replacement: every neighbor, in list order;
* without replacement, ``deg > k``: Robert Floyd's algorithm -- for ``i in 0..k-1``,
  ``j = deg - k + i``, ``t = draw(i) mod (j + 1)``; take ``t`` unless already taken,
  else ``j`` -- then the ``k`` positions in ascending order;
* with replacement: ``k`` positions ``draw(i) mod deg`` in draw order (none if deg = 0).
"""
from __future__ import annotations

import torch

from . import rng
from .types import OneHop


def segment_arange(counts: torch.Tensor) -> torch.Tensor:
    """``[0..c0-1, 0..c1-1, ...]`` for counts ``[c0, c1, ...]``."""
    total = int(counts.sum())
    if total == 0:
        return torch.empty(0, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(starts, counts)


def _floyd(deg: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """``[m, k]`` distinct positions in ``[0, deg)`` for rows with ``deg > k``, ascending."""
    m = deg.numel()
    chosen = torch.empty((m, k), dtype=torch.int64)
    for i in range(k):
        j = deg - k + i
        t = rng.draws(keys, i) % (j + 1)
        taken = (chosen[:, :i] == t.unsqueeze(1)).any(dim=1) if i else torch.zeros(m, dtype=torch.bool)
        chosen[:, i] = torch.where(taken, j, t)
    return torch.sort(chosen, dim=1).values


def sample_positions(deg: torch.Tensor, keys: torch.Tensor, fanout: int, replace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-node sampled positions into each neighbor list: ``(counts[n], positions[sum])``."""
    if fanout < 0:
        return deg.clone(), segment_arange(deg)
    if replace:
        counts = torch.where(deg > 0, fanout, 0)
        owner = torch.repeat_interleave(torch.arange(deg.numel()), counts)
        draw_idx = segment_arange(counts)
        return counts, rng.draws(keys[owner], draw_idx) % deg[owner]
    counts = torch.clamp(deg, max=fanout)
    positions = torch.empty(int(counts.sum()), dtype=torch.int64)
    offsets = torch.cumsum(counts, 0) - counts
    small = deg <= fanout
    if bool(small.any()):
        c = counts[small]
        positions[torch.repeat_interleave(offsets[small], c) + segment_arange(c)] = segment_arange(c)
    big = ~small
    if bool(big.any()):
        chosen = _floyd(deg[big], keys[big], fanout)
        dst = offsets[big].unsqueeze(1) + torch.arange(fanout)
        positions[dst.reshape(-1)] = chosen.reshape(-1)
    return counts, positions


def one_hop(indptr: torch.Tensor, indices: torch.Tensor, eid: torch.Tensor, local_nodes: torch.Tensor,
            gids: torch.Tensor, fanout: int, replace: bool, seed: int, hop: int) -> OneHop:
    """Sample one hop for ``local_nodes`` (rows of the CSC/CSR) whose global ids are ``gids``."""
    start = indptr[local_nodes]
    deg = indptr[local_nodes + 1] - start
    keys = rng.node_keys(rng.hop_base(seed, hop), gids)
    counts, pos = sample_positions(deg, keys, fanout, replace)
    edge_pos = torch.repeat_interleave(start, counts) + pos
    return OneHop(counts, indices[edge_pos].to(torch.int64), eid[edge_pos].to(torch.int64))
