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

from graphfeed.server.sampling import rng
from graphfeed.server.sampling.types import OneHop


def segment_arange(counts: torch.Tensor) -> torch.Tensor:
    """``[0..c0-1, 0..c1-1, ...]`` for counts ``[c0, c1, ...]``."""
    total = int(counts.sum())
    if total == 0:
        return torch.empty(0, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(starts, counts)


def _floyd(deg: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """``[m, k]`` distinct positions in ``[0, deg)`` for rows with ``deg > k``, ascending."""
    steps = torch.arange(k, dtype=torch.int64)
    j = deg.unsqueeze(1) - k + steps                       # [m, k]
    # All k draws of every row at once.  Draws are >= 0, so fmod is the same as the modulo.
    t = torch.fmod(rng.draws(keys.unsqueeze(1), steps), j + 1)
    chosen = t.clone()
    # Step i depends on the choices before it; only this membership test stays sequential.
    for i in range(1, k):
        taken = (chosen[:, :i] == t[:, i:i + 1]).any(dim=1)
        chosen[:, i] = torch.where(taken, j[:, i], t[:, i])
    return torch.sort(chosen, dim=1).values


def sample_positions(deg: torch.Tensor, keys: torch.Tensor, fanout: int,
                     replace: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-node sampled positions into each neighbor list: ``(counts[n], positions[sum])``."""
    if fanout < 0:
        return deg.clone(), segment_arange(deg)
    if replace:
        has = deg > 0
        counts = torch.where(has, fanout, 0)
        d = deg[has].unsqueeze(1)   # [m, 1]: k draws per row with neighbors, in draw order
        return counts, torch.fmod(rng.draws(keys[has].unsqueeze(1), torch.arange(fanout)), d).reshape(-1)
    counts = torch.clamp(deg, max=fanout)
    # Rows with deg <= fanout take 0..deg-1; rows with more neighbors are overwritten below.
    positions = segment_arange(counts)
    big = deg > fanout
    if bool(big.any()):
        offsets = torch.cumsum(counts, 0) - counts
        chosen = _floyd(deg[big], keys[big], fanout)
        dst = offsets[big].unsqueeze(1) + torch.arange(fanout)
        positions[dst.reshape(-1)] = chosen.reshape(-1)
    return counts, positions


def one_hop(indptr: torch.Tensor, indices: torch.Tensor, eid: torch.Tensor, local_nodes: torch.Tensor,
            gids: torch.Tensor, fanout: int, replace: bool, seed: int, hop: int) -> OneHop:
    """Sample one hop for ``local_nodes`` (rows of the CSC/CSR) whose global ids are ``gids``."""
    # index_select, not advanced indexing: several times faster on large index tensors.
    start = indptr.index_select(0, local_nodes)
    deg = indptr.index_select(0, local_nodes + 1) - start
    keys = rng.node_keys(rng.hop_base(seed, hop), gids)
    counts, pos = sample_positions(deg, keys, fanout, replace)
    edge_pos = torch.repeat_interleave(start, counts) + pos
    return OneHop(counts, indices.index_select(0, edge_pos).to(torch.int64),
                  eid.index_select(0, edge_pos).to(torch.int64))
