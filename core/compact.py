"""The compact wire form of a batch: fewer bytes for its integer fields, the same batch after unpacking.

A session worker packs a batch (:func:`pack`) once, where it leaves the worker over a network
transport (``rpc_api``'s ``pull`` / ``sample`` / ``sample_seeds`` answers, under torch RPC and on the
secure data path alike), and the trainer unpacks it (:func:`unpack`) once, where it arrives (the
batch channel, PyG's sampler).  Unpacking gives back the batch that was packed bit for bit: the same
keys in the same order, dtypes, shapes and values.  Two cuts, both exact:

* **Narrow integers.**  Every integer tensor (int16, int32, int64) whose values fit a narrower integer
  dtype travels as the narrowest of ``uint8, int8, int16, int32`` that holds its ``[min, max]``, and is
  widened back on arrival: ``edge_index``, ``e_id``, ``n_id``, ``batch``, ``input_id``, ``x_cached``,
  ``emb_gid``, ``edge_label_index``, ..., and integer labels ``y`` (a 47-class ``y`` is one byte a node).
  A tensor whose values need its full width travels as it is.  Bool and floating tensors are untouched.
* **Index sets as bitmasks.**  A 1-D integer tensor whose values strictly increase from 0 or more --
  ``x_cached``, the positions of the rows the trainer's feature cache fills -- travels as one bit per
  value ``0 .. max`` when that is fewer bytes than its narrowed values, and is rebuilt with ``nonzero``.
* **Sorted columns as counts.**  The sampler emits a hop's edges grouped by destination, so an
  ``edge_index``'s column (destination local ids) is non-decreasing; it then travels as the number of
  edges of each destination ``0 .. max`` (CSC style, narrowed: a fanout below 256 is one byte a
  destination) beside the row, and is rebuilt with ``repeat_interleave``.  An unsorted column is
  narrowed instead.

Both ends cost a pass or two over the index tensors (``aminmax``, a copy; ``bincount`` /
``repeat_interleave`` for the column): about a millisecond per million edges, against the bytes
they save on a link.  The same-host shared-memory channel does not pack: there no byte crosses a
link, and widening would make the trainer allocate what it now reads in place (see
docs/ARCHITECTURE.md).  :func:`unpack` passes a plain batch dict through, so a channel may mix both.

:class:`PackedBatch` is a frozen record (the secure data path's codec rebuilds it through its
constructor, which checks its shape); :func:`unpack` checks what it rebuilds (counts that sum to the
row's length) and raises :class:`~graphfeed.core.batch.BatchSchemaError` otherwise.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from graphfeed.core.batch import TYPE_SEP, BatchSchemaError

FORMAT_VERSION = 1
MIN_NUMEL = 16   # smaller integer tensors travel as they are (meta, per-hop counts): nothing to save

#: integer dtypes a packed tensor may be widened back to, by name
WIDE: dict[str, torch.dtype] = {"int16": torch.int16, "int32": torch.int32, "int64": torch.int64}
_NARROW = (torch.uint8, torch.int8, torch.int16, torch.int32)   # narrowest first
_EDGE_INDEX = "edge_index" + TYPE_SEP


@dataclass(frozen=True)
class PackedBatch:
    """A batch in its compact wire form.

    ``tensors``: the batch's keys in order, each tensor as it travels; ``widen``: key -> the dtype name
    (of :data:`WIDE`) the key's tensor is widened back to; ``counts``: ``edge_index`` key -> its
    column as per-destination edge counts (``tensors[key]`` is then the row, ``[E]``); ``bitsets``: the
    keys whose tensor is a bitmask of the values (uint8, value ``8 * i + j`` is bit ``j`` of byte ``i``).
    ValueError when the fields do not fit together (another version's packing, or a tampered frame)."""

    tensors: dict
    widen: dict
    counts: dict
    bitsets: tuple = ()
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.version != FORMAT_VERSION:
            raise ValueError(f"packed batch format {self.version} is not this graphfeed's {FORMAT_VERSION}: install "
                             f"the same graphfeed version on servers and trainers")
        for what, table in (("tensors", self.tensors), ("counts", self.counts)):
            if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                      for k, v in table.items()):
                raise ValueError(f"a packed batch's {what} must map keys to tensors")
        if not isinstance(self.widen, dict) or not all(isinstance(k, str) and v in WIDE
                                                       for k, v in self.widen.items()):
            raise ValueError(f"a packed batch's widen must map keys to one of {sorted(WIDE)}")
        stray = sorted((set(self.widen) | set(self.counts)) - set(self.tensors))
        if stray:
            raise ValueError(f"a packed batch names key(s) {stray[:3]} it does not carry")
        if not all(k in self.widen and k.startswith(_EDGE_INDEX) for k in self.counts):
            raise ValueError("a packed batch carries per-destination counts for a key that is not an edge_index")
        if not isinstance(self.bitsets, tuple) or not all(
                k in self.widen and k not in self.counts and self.tensors[k].dtype == torch.uint8
                and self.tensors[k].dim() == 1 for k in self.bitsets):
            raise ValueError("a packed batch's bitsets must name its 1-D uint8 tensors to widen")

    def nbytes(self) -> int:
        """Bytes of the tensors as they travel."""
        return sum(t.numel() * t.element_size() for table in (self.tensors, self.counts) for t in table.values())


def pack(batch: Mapping[str, torch.Tensor]) -> PackedBatch:
    """The compact wire form of the wire batch ``batch`` (see the module doc); ``batch`` is not changed."""
    tensors: dict[str, torch.Tensor] = {}
    widen: dict[str, str] = {}
    counts: dict[str, torch.Tensor] = {}
    bitsets: list[str] = []
    for key, t in batch.items():
        if key.startswith(_EDGE_INDEX):
            column = _column_counts(t)
            if column is not None:
                first = t[0]
                row = _narrow(first)
                tensors[key], counts[key] = row.clone() if row is first else row, column   # not a view of [2, E]
                widen[key] = _name(t.dtype)
                continue
        small = _narrow(t)
        bits = _bitmask(t, small.numel() * small.element_size())
        if bits is not None:
            small = bits
            bitsets.append(key)
        if small is not t:
            widen[key] = _name(t.dtype)
        tensors[key] = small
    return PackedBatch(tensors, widen, counts, tuple(bitsets))


def unpack(value: PackedBatch | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch dict of a :class:`PackedBatch` (a plain batch dict as it is).  BatchSchemaError when the
    packed counts do not fit its rows (a version mismatch or a damaged frame)."""
    if not isinstance(value, PackedBatch):
        return value
    out: dict[str, torch.Tensor] = {}
    for key, t in value.tensors.items():
        dtype = WIDE.get(value.widen.get(key, ""))
        if key in value.counts:
            out[key] = _edge_index(key, t, value.counts[key], dtype or torch.int64)
        elif key in value.bitsets:
            out[key] = _members(t).to(dtype or torch.int64)
        elif dtype is not None:
            out[key] = t.to(dtype)
        else:
            out[key] = t
    return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _narrow(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the narrowest integer dtype holding its values (``t`` itself when none is narrower)."""
    if t.dtype not in (torch.int16, torch.int32, torch.int64) or t.numel() < MIN_NUMEL:
        return t
    lo, hi = (int(v) for v in torch.aminmax(t))
    for dtype in _NARROW:
        info = torch.iinfo(dtype)
        if info.bits >= torch.iinfo(t.dtype).bits:
            return t
        if info.min <= lo and hi <= info.max:
            return t.to(dtype)
    return t


def _column_counts(edge_index: torch.Tensor) -> torch.Tensor | None:
    """The per-destination edge counts of ``edge_index``'s column, narrowed, when the column is sorted and
    they are fewer bytes than the narrowed column; None otherwise."""
    if (edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.size(1) < MIN_NUMEL
            or edge_index.dtype not in (torch.int32, torch.int64)):
        return None
    col = edge_index[1]
    if int(col[0]) < 0 or not bool((col[1:] >= col[:-1]).all()):
        return None
    column = _narrow(torch.bincount(col))
    narrowed_bytes = col.numel() * (2 if int(col[-1]) <= torch.iinfo(torch.int16).max else 4)
    return column if column.numel() * column.element_size() < narrowed_bytes else None


def _edge_index(key: str, row: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[2, E]`` of ``dtype`` from the row ``[E]`` and the column's per-destination ``counts``."""
    if row.dim() != 1 or counts.dim() != 1 or counts.dtype.is_floating_point or counts.dtype == torch.bool:
        raise BatchSchemaError(f"{key}: a packed edge_index needs a 1-D row and 1-D integer counts, got shapes "
                               f"{list(row.shape)} and {list(counts.shape)}; install the same graphfeed version on "
                               f"servers and trainers")
    if counts.numel() and (int(counts.min()) < 0 or int(counts.sum()) != row.numel()):
        raise BatchSchemaError(f"{key}: the packed column's counts sum to {int(counts.sum())} for {row.numel()} "
                               f"edges; install the same graphfeed version on servers and trainers")
    if not counts.numel() and row.numel():
        raise BatchSchemaError(f"{key}: a packed edge_index of {row.numel()} edges has no column counts")
    out = torch.empty((2, row.numel()), dtype=dtype)
    out[0].copy_(row)
    if row.numel():
        out[1].copy_(_column(counts.to(torch.int64), row.numel()))
    return out


def _column(counts: torch.Tensor, num_edges: int) -> torch.Tensor:
    """The sorted column ``[num_edges]`` (int64) whose value ``d`` occurs ``counts[d]`` times: a running sum of
    steps placed where each destination's edges end (faster here than ``repeat_interleave``)."""
    ends = torch.cumsum(counts[:-1], 0)
    steps = torch.zeros(num_edges + 1, dtype=torch.int64)
    steps.index_add_(0, ends, torch.ones_like(ends))
    return torch.cumsum(steps[:num_edges], 0)


_BITS = torch.arange(8, dtype=torch.uint8)


def _bitmask(t: torch.Tensor, narrowed_bytes: int) -> torch.Tensor | None:
    """The bitmask of ``t``'s values when they strictly increase from 0 or more and it is fewer bytes than
    ``narrowed_bytes``; None otherwise."""
    if t.dim() != 1 or t.numel() < MIN_NUMEL or t.dtype not in (torch.int16, torch.int32, torch.int64):
        return None
    size = (int(t[-1]) + 8) // 8
    if int(t[0]) < 0 or size >= narrowed_bytes or not bool((t[1:] > t[:-1]).all()):
        return None
    flags = torch.zeros(size * 8, dtype=torch.uint8)
    flags[t] = 1
    return (flags.view(size, 8) << _BITS).sum(1, dtype=torch.uint8)


def _members(bits: torch.Tensor) -> torch.Tensor:
    """The values (sorted, int64) whose bits are set in the bitmask ``bits``."""
    return ((bits.unsqueeze(1) >> _BITS) & 1).view(-1).nonzero().view(-1)
