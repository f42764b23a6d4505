"""The epoch contract: which batches exist in an epoch and which rank gets which.

Both sides compute the same plan: the client (to know ``len(loader)`` and which server
to pull each batch from) and every server (to produce the batches of the seeds it owns).
The plan depends only on the number of input nodes each partition owns, so the
client never needs the node ids.

Rules (see docs/concepts.md, "Epoch contract"):

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
  next multiple of ``W`` batches -- :func:`plan_epoch` raises ``ValueError``).
* ``drop_last`` drops what PyG drops (a ``DistributedSampler`` per rank, then the DataLoader's
  ``drop_last``): every batch is full and every rank gets ``floor(ceil(T / W) / batch_size)``
  batches, so at most ``batch_size - 1`` seeds per rank are not seen in an epoch (a different
  subset each epoch when shuffling).  The partial chunks (each part's remainder) are **packed**:
  their seeds, part after part, are cut into full batches whose seeds lie on several parts
  (``BatchSpec.packed``; produced by the part holding most of them, which samples the others'
  seeds through their servers), and the seeds left over (fewer than ``batch_size``) are dropped.
  Then the last ``B mod W`` of the ``B`` batches of the order are dropped -- unless at most
  ``W - 1`` more seeds complete one more batch per rank, which are then taken again from the
  first batches (as ``DistributedSampler`` pads its input to a multiple of ``W``).  An epoch left
  without any batch raises ``ValueError``.

``pack_partial`` (a loader's default; not with ``ordered=False`` given by name, which keeps every batch on one
part, nor where a batch reads what only its part holds: hard negatives, stored seed times): without
``drop_last`` too, the partial chunks (each part's remainder) are packed as ``drop_last`` packs them, and
the seeds left over make the last batch of the order (the one smaller batch, as PyG's); with one partial
chunk or none the plan is the one above (it has PyG's count already).  An epoch then has
PyG's ``ceil(T / batch_size)`` batches (not ``sum over parts of ceil(T_p / batch_size)``), and with ``W``
ranks each rank PyG's ``ceil(ceil(T / W) / batch_size)`` (splitting, as above, where ``W`` does not divide
them); at most ``P`` batches take seeds of several parts.

``ordered`` (a loader's ``ordered=True``, never shuffled): the input is one list -- every part's
seeds in the order the loader was given them -- cut into chunks of ``batch_size`` in that order,
so the epoch delivers the input in order (rank ``r`` its batches ``r, r + W, ...``).  A batch's
seeds may then lie on several partitions: batch ``i`` is produced by part ``i mod P`` (its
server samples the other parts' seeds through their servers, as it does every remote hop), and
``start``/``stop`` are positions in the whole input.  The rest of the rules hold unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from graphfeed.core.seeding import batch_seed, stream_seed
from graphfeed.core.spec import LoaderSpec, check_loader_args

Piece = tuple[int, int, int]   # (part, start, stop): seeds ``order[start:stop]`` of part ``part``'s input list


@dataclass(frozen=True)
class BatchSpec:
    """One batch of an epoch: seeds ``order[start:stop]`` of partition ``part``'s input list, or for a
    packed batch (``drop_last``, ``pack_partial``) the seeds of every piece of ``packed`` in turn (``part`` produces it;
    ``start`` and ``stop`` are then 0)."""

    index: int   # position in the epoch's global order
    part: int
    start: int
    stop: int
    seed: int    # the batch's sampling seed
    packed: tuple[Piece, ...] = ()

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """``(part, start, stop)`` of every run of the batch's seeds, in seed order."""
        return self.packed or ((self.part, self.start, self.stop),)

    @property
    def size(self) -> int:
        return sum(e - s for _, s, e in self.pieces)


def plan_epoch(counts: Sequence[int], batch_size: int, world_size: int, *, seed: int, epoch: int,
               shuffle: bool, drop_last: bool, ordered: bool = False, pack_partial: bool = False) -> list[BatchSpec]:
    """The global batch order of one epoch (all ranks), ``len`` a multiple of ``world_size``; ``pack_partial``:
    the parts' partial chunks are packed (module doc), so there are PyG's ``ceil(T / batch_size)`` batches."""
    check_loader_args(batch_size, world_size, 0)
    total = sum(counts)
    if total < world_size and not drop_last:
        raise ValueError(f"{total} input node(s) cannot be spread over {world_size} ranks: "
                         f"every rank needs at least one batch; use fewer ranks or more input nodes")
    if ordered:   # one list, in input order; batch i produced by part i mod P
        chunks = [(i % len(counts), s, min(s + batch_size, total))
                  for i, s in enumerate(range(0, total, batch_size))]
    else:
        chunks = [(p, s, min(s + batch_size, n)) for p, n in enumerate(counts) for s in range(0, n, batch_size)]
    if drop_last:
        return _drop_last_plan(chunks, batch_size, world_size, len(counts), seed=seed, epoch=epoch, shuffle=shuffle,
                               ordered=ordered)
    if pack_partial and not ordered and sum(e - s < batch_size for _, s, e in chunks) > 1:   # else: as PyG's already
        return _packed_plan(chunks, batch_size, world_size, len(counts), seed=seed, epoch=epoch, shuffle=shuffle)
    if shuffle and chunks:
        chunks = _shuffled(chunks, seed, epoch)
    chunks = _split_until_divisible(chunks, world_size)
    return [BatchSpec(i, p, s, e, batch_seed(seed, epoch, i)) for i, (p, s, e) in enumerate(chunks)]


def _shuffled(items: list, seed: int, epoch: int) -> list:
    g = torch.Generator().manual_seed(stream_seed(seed, epoch, -1))
    return [items[i] for i in torch.randperm(len(items), generator=g).tolist()]


def _drop_last_plan(chunks: list[Piece], batch_size: int, world_size: int, num_parts: int, *, seed: int,
                    epoch: int, shuffle: bool, ordered: bool) -> list[BatchSpec]:
    """The ``drop_last`` plan (module doc): full chunks, packed remainders, PyG's padding, ``W`` equal shares."""
    total = sum(e - s for _, s, e in chunks)
    batches: list[tuple[Piece, ...]] = [(c,) for c in chunks if c[2] - c[1] == batch_size]
    packed, left = _pack([c for c in chunks if c[2] - c[1] < batch_size], batch_size)
    batches += packed
    need = -len(batches) % world_size
    if batches and need and need * batch_size - _seeds_in(left) <= world_size - 1:   # DistributedSampler's padding
        padded, rest = _pack(left + _first_seeds(batches, need * batch_size - _seeds_in(left)), batch_size)
        assert not rest and len(padded) == need
        batches += padded
    if shuffle and batches:
        batches = _shuffled(batches, seed, epoch)
    batches = batches[:len(batches) - len(batches) % world_size]
    if not batches:
        raise ValueError(f"drop_last=True leaves no batch: {total} input node(s) do not fill one batch of "
                         f"{batch_size} per rank for {world_size} rank(s); use a smaller batch_size, fewer ranks "
                         f"or drop_last=False")
    return _specs(batches, num_parts, seed=seed, epoch=epoch, ordered=ordered)


def _packed_plan(chunks: list[Piece], batch_size: int, world_size: int, num_parts: int, *, seed: int, epoch: int,
                 shuffle: bool) -> list[BatchSpec]:
    """The ``pack_partial`` plan without ``drop_last`` (module doc): the full chunks and the partial ones packed
    into full batches (shuffled), then the seeds left over as the last batch (as PyG's last batch is the
    partial one), then split until ``W`` divides their number."""
    batches: list[tuple[Piece, ...]] = [(c,) for c in chunks if c[2] - c[1] == batch_size]
    packed, left = _pack([c for c in chunks if c[2] - c[1] < batch_size], batch_size)
    batches += packed
    if shuffle and batches:
        batches = _shuffled(batches, seed, epoch)
    batches += [tuple(left)] if left else []
    total = sum(_seeds_in(b) for b in batches)
    wanted = -(-len(batches) // world_size) * world_size
    if wanted > total:  # splitting would have to create empty batches
        raise ValueError(f"{total} input node(s) in {len(batches)} batch(es) cannot be split into a multiple of "
                         f"{world_size} non-empty batches (every rank needs the same number of batches and no "
                         f"node may repeat); use drop_last=True, a larger batch_size or fewer ranks")
    while len(batches) % world_size:
        i = max(range(len(batches)), key=lambda j: _seeds_in(batches[j]))
        halves, rest = _pack(batches[i], (_seeds_in(batches[i]) + 1) // 2)   # the first half takes the odd seed
        batches[i:i + 1] = [*halves, *([tuple(rest)] if rest else [])]
    return _specs(batches, num_parts, seed=seed, epoch=epoch, ordered=False)


def _specs(batches: Sequence[tuple[Piece, ...]], num_parts: int, *, seed: int, epoch: int,
           ordered: bool) -> list[BatchSpec]:
    """The plan's records of ``batches`` (each its pieces, in order): one piece is a plain batch of its part,
    several a packed batch produced where most of its seeds are (or, ``ordered``, by part ``i mod P``)."""
    plan = []
    for i, pieces in enumerate(batches):
        s = batch_seed(seed, epoch, i)
        if ordered:   # batch i produced by part i mod P, as every ordered batch
            p = i % num_parts
            plan.append(BatchSpec(i, p, 0, 0, s, pieces) if len(pieces) > 1 else BatchSpec(i, p, *pieces[0][1:], s))
        elif len(pieces) == 1:
            plan.append(BatchSpec(i, *pieces[0], s))
        else:         # produced where most of its seeds are (the first such part)
            plan.append(BatchSpec(i, max(pieces, key=lambda c: c[2] - c[1])[0], 0, 0, s, tuple(pieces)))
    return plan


def _seeds_in(pieces: Sequence[Piece]) -> int:
    return sum(e - s for _, s, e in pieces)


def _pack(pieces: Sequence[Piece], batch_size: int) -> tuple[list[tuple[Piece, ...]], list[Piece]]:
    """``pieces``' seeds, in order, cut into batches of ``batch_size`` (a piece may be split between two);
    returns the full batches and the pieces left over (fewer than ``batch_size`` seeds)."""
    batches: list[tuple[Piece, ...]] = []
    current: list[Piece] = []
    room = batch_size
    for p, s, e in pieces:
        while s < e:
            take = min(room, e - s)
            current.append((p, s, s + take))
            s, room = s + take, room - take
            if room == 0:
                batches.append(tuple(current))
                current, room = [], batch_size
    return batches, current


def _first_seeds(batches: Sequence[tuple[Piece, ...]], count: int) -> list[Piece]:
    """Pieces of the first ``count`` seeds of ``batches`` (cycling when they hold fewer, as PyG's padding)."""
    out: list[Piece] = []
    while count > 0:
        for p, s, e in (piece for batch in batches for piece in batch):
            take = min(count, e - s)
            out.append((p, s, s + take))
            count -= take
            if count == 0:
                break
    return out


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


def input_positions(counts: Sequence[int], part: int, given: torch.Tensor | None = None) -> torch.Tensor:
    """Positions in the loader's input of part ``part``'s input nodes, in the part's input order.

    ``given``: the positions the part resolved (input given as ids: each id's position in
    that tensor, as PyG's ``input_id``).  Otherwise (a split, or every node) the input is the
    parts' lists one after another in part order, so part ``p``'s nodes are at
    ``sum(counts[:p]) + 0, 1, ...``.  ValueError when ``given`` disagrees with ``counts[part]``.
    """
    if given is not None:
        if given.numel() != counts[part]:
            raise ValueError(f"part {part} has {counts[part]} input nodes but {given.numel()} input positions")
        return given
    return torch.arange(counts[part], dtype=torch.int64) + int(sum(counts[:part]))


def partition_order(gids: torch.Tensor, *, seed: int, epoch: int, part: int, shuffle: bool) -> torch.Tensor:
    """Partition ``part``'s input nodes in the epoch's order (the list batches slice)."""
    if not shuffle:
        return gids
    g = torch.Generator().manual_seed(stream_seed(seed, epoch, part))
    return gids[torch.randperm(gids.numel(), generator=g)]


class EpochPlan:
    """One rank's epoch of one loader: plan -> rank -> order -> slice, in one place.

    ``entries`` are the rank's batches in delivery order (``seq`` = position).  The local
    loader, the session workers and the remote loader all build this from the same
    :class:`LoaderSpec` and per-part input counts, so they agree on every batch.
    """

    def __init__(self, spec: LoaderSpec, counts: Sequence[int], epoch: int):
        self.spec, self.epoch = spec, int(epoch)
        plan = plan_epoch(counts, spec.batch_size, spec.world_size, seed=spec.seed, epoch=self.epoch,
                          shuffle=spec.shuffle, drop_last=spec.drop_last, ordered=spec.ordered,
                          pack_partial=spec.pack_partial)
        self.entries = rank_batches(plan, spec.rank, spec.world_size)

    def __len__(self) -> int:
        return len(self.entries)

    def owned_by(self, part: int) -> list[tuple[int, BatchSpec]]:
        """``(seq, entry)`` of the batches whose seeds part ``part`` owns, in order."""
        return [(seq, e) for seq, e in enumerate(self.entries) if e.part == part]

    def order(self, part: int, inputs: torch.Tensor) -> torch.Tensor:
        """Part ``part``'s input nodes in this epoch's order (what its batches slice); for an ordered
        loader ``inputs`` is the whole input, in order, for every part."""
        return partition_order(inputs, seed=self.spec.seed, epoch=self.epoch, part=part, shuffle=self.spec.shuffle)

    @staticmethod
    def seeds(order: torch.Tensor, entry: BatchSpec) -> torch.Tensor:
        """The seeds of batch ``entry`` from its part's :meth:`order` (ValueError for a packed batch:
        :meth:`batch_seeds`)."""
        if entry.packed:
            raise ValueError(f"batch {entry.index} holds seeds of several parts: use EpochPlan.batch_seeds")
        return order[entry.start:entry.stop]

    @staticmethod
    def batch_seeds(orders: Mapping[int, torch.Tensor] | Sequence[torch.Tensor], entry: BatchSpec) -> torch.Tensor:
        """The seeds of batch ``entry`` from the :meth:`order` of each part it takes seeds of (``orders[p]``)."""
        if not entry.packed:
            return orders[entry.part][entry.start:entry.stop]
        return torch.cat([orders[p][s:e] for p, s, e in entry.packed])
