"""The epoch contract: which batches exist in an epoch and which rank gets which.

Both sides compute the same plan: the client (to know ``len(loader)`` and which server
to pull each batch from) and every server (to produce the batches of the seeds it owns).
The plan depends only on the number of input nodes each partition owns, so the
client never needs the node ids.

Rules (see README "Epoch contract"):

* A batch's seeds all belong to one partition (its server produces it: locality).
* Partition ``p``'s input nodes are shuffled with a generator seeded by
  ``(seed, epoch, p)`` (when ``shuffle``) and cut into chunks of ``batch_size``.
* The batch order is shuffled with ``(seed, epoch)`` (when ``shuffle``), else it is
  partition by partition.
* Every rank gets the same number of batches: rank ``r`` takes batches
  ``r, r + W, r + 2W, ...``.  Without ``drop_last``, every input node is a seed exactly
  once per epoch: when the number of batches is not a multiple of ``W``, the largest
  batches are split in two (so some batches are smaller than ``batch_size``; none is
  larger, and nothing is repeated; when that is impossible -- fewer input nodes than the
  next multiple of ``W`` batches -- :func:`plan_epoch` raises ``ValueError``).  With
  ``drop_last``, partial batches are dropped and then the last ``T mod W`` batches of the
  order, so every batch is full and some nodes
  are not seen in that epoch (a different subset each epoch when shuffling); an epoch
  left without any batch raises ``ValueError``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

from graphfeed.core.constants import MAX_BATCH_SIZE
from graphfeed.core.seeding import batch_seed, stream_seed


@dataclass(frozen=True)
class BatchSpec:
    """One batch of an epoch: seeds ``order[start:stop]`` of partition ``part``'s input list."""

    index: int   # position in the epoch's global order
    part: int
    start: int
    stop: int
    seed: int    # the batch's sampling seed

    @property
    def size(self) -> int:
        return self.stop - self.start


def check_loader_args(batch_size: int, world_size: int, rank: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be an integer in 1..{MAX_BATCH_SIZE}, got {batch_size!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not valid for world_size {world_size} (need 0 <= rank < world_size)")


def check_input_ids(input_nodes) -> torch.Tensor:
    """``input_nodes`` given as ids, as a flat int64 tensor; raises ``ValueError`` unless they are
    integer ids without repeats (each input node is a seed once per epoch)."""
    ids = torch.as_tensor(input_nodes).reshape(-1)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        # a bool mask would otherwise be read as the ids 0 and 1
        raise ValueError(f"input_nodes must hold integer node ids, got dtype {ids.dtype}; "
                         f"for a mask pass mask.nonzero().view(-1)")
    ids = ids.to(torch.int64)
    uniq = torch.unique(ids)
    if uniq.numel() != ids.numel():
        raise ValueError(f"input_nodes holds {ids.numel() - uniq.numel()} repeated id(s); "
                         f"pass each node once (e.g. torch.unique(ids))")
    return ids


def plan_epoch(counts: Sequence[int], batch_size: int, world_size: int, *, seed: int, epoch: int,
               shuffle: bool, drop_last: bool) -> list[BatchSpec]:
    """The global batch order of one epoch (all ranks), ``len`` a multiple of ``world_size``."""
    check_loader_args(batch_size, world_size, 0)
    total = sum(counts)
    if total < world_size and not drop_last:
        raise ValueError(f"{total} input node(s) cannot be spread over {world_size} ranks: "
                         f"every rank needs at least one batch; use fewer ranks or more input nodes")
    chunks = [(p, s, min(s + batch_size, n)) for p, n in enumerate(counts) for s in range(0, n, batch_size)]
    if drop_last:
        chunks = [c for c in chunks if c[2] - c[1] == batch_size]
    if shuffle and chunks:
        g = torch.Generator().manual_seed(stream_seed(seed, epoch, -1))
        chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=g).tolist()]
    if drop_last:
        chunks = chunks[:len(chunks) - len(chunks) % world_size]
        if not chunks:
            raise ValueError(f"drop_last=True leaves no batch: {total} input node(s) do not fill one batch of "
                             f"{batch_size} per rank for {world_size} rank(s) (full batches only count within "
                             f"a partition); use a smaller batch_size, fewer ranks or drop_last=False")
    else:
        chunks = _split_until_divisible(chunks, world_size)
    return [BatchSpec(i, p, s, e, batch_seed(seed, epoch, i)) for i, (p, s, e) in enumerate(chunks)]


def _split_until_divisible(chunks: list[tuple[int, int, int]], world_size: int) -> list[tuple[int, int, int]]:
    total = sum(e - s for _, s, e in chunks)
    wanted = -(-len(chunks) // world_size) * world_size
    if wanted > total:  # splitting would have to create empty batches
        raise ValueError(f"{total} input node(s) in {len(chunks)} batch(es) cannot be split into a multiple of "
                         f"{world_size} non-empty batches (every rank needs the same number of batches and no "
                         f"node may repeat); use drop_last=True, a larger batch_size or fewer ranks")
    chunks = list(chunks)
    while len(chunks) % world_size:
        i = max(range(len(chunks)), key=lambda j: chunks[j][2] - chunks[j][1])
        p, s, e = chunks[i]
        mid = s + (e - s + 1) // 2
        chunks[i:i + 1] = [(p, s, mid), (p, mid, e)]
    return chunks


def rank_batches(plan: Sequence[BatchSpec], rank: int, world_size: int) -> list[BatchSpec]:
    """The batches rank ``rank`` receives, in delivery order; ``seq`` is the list position."""
    return list(plan[rank::world_size])


def partition_order(gids: torch.Tensor, *, seed: int, epoch: int, part: int, shuffle: bool) -> torch.Tensor:
    """Partition ``part``'s input nodes in the epoch's order (the list batches slice)."""
    if not shuffle:
        return gids
    g = torch.Generator().manual_seed(stream_seed(seed, epoch, part))
    return gids[torch.randperm(gids.numel(), generator=g)]
