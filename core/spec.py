"""The records of what a loader asks for, passed whole between every layer.

* :class:`SamplingSpec` -- how to sample a batch's neighborhood (fanouts, replacement,
  direction).  Sampling options (per-edge-type fanouts, weights, time, disjoint) are fields
  here.
* :class:`NodeInput` -- which seeds an epoch covers (a split, explicit ids, or every node).
  Other seed kinds (typed nodes, link seeds with negatives) are records beside it.
* :class:`LoaderSpec` -- one loader: the two above plus the epoch contract's arguments
  (batch size, shuffle, drop_last, seed, rank, world size) and a metrics label.

Records are frozen and validated on construction, so a spec that exists is a valid one.
They cross the control plane through :mod:`graphfeed.proto.convert` (the one protobuf
conversion) and torch RPC / the worker pipe as themselves (pickled).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from graphfeed.core.constants import DIRECTIONS, MAX_BATCH_SIZE, MAX_FANOUT, MAX_WORLD_SIZE, SPLITS

MAX_KIND_LENGTH = 256
SEED_LIMIT = 1 << 64          # seeds travel as uint64


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample: per-hop fanouts (``-1`` = all neighbors), replacement, direction.

    ``direction="in"`` samples in-edges (PyG's default: messages flow from sampled
    neighbors to the seeds); ``"out"`` samples out-edges.
    """

    num_neighbors: tuple[int, ...]
    replace: bool = False
    direction: str = "in"

    def __post_init__(self):
        object.__setattr__(self, "num_neighbors", tuple(int(k) for k in self.num_neighbors))
        if not self.num_neighbors:
            raise ValueError("num_neighbors is empty: give one fanout per hop, e.g. [15, 10, 5]")
        bad = [k for k in self.num_neighbors if k < -1 or k == 0 or k > MAX_FANOUT]
        if bad:
            raise ValueError(f"num_neighbors {list(self.num_neighbors)} has invalid fanout(s) {bad}: "
                             f"each hop's fanout must be -1 (all neighbors) or 1..{MAX_FANOUT}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'in' or 'out', got {self.direction!r}")

    @property
    def topology(self) -> str:
        return "csc" if self.direction == "in" else "csr"


def check_loader_args(batch_size: int, world_size: int, rank: int) -> None:
    """ValueError unless ``batch_size`` and ``(rank, world_size)`` are valid for the epoch contract."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
            or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be an integer in 1..{MAX_BATCH_SIZE}, got {batch_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not valid for world_size {world_size} "
                         f"(need 0 <= rank < world_size <= {MAX_WORLD_SIZE})")


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


def fanouts(num_neighbors) -> tuple[int, ...]:
    """``num_neighbors`` as a tuple of per-hop fanouts (ValueError for a scalar or a string)."""
    if isinstance(num_neighbors, (int, str)) or not hasattr(num_neighbors, "__iter__"):
        raise ValueError(f"num_neighbors must be a list of per-hop fanouts, e.g. [15, 10], got {num_neighbors!r}")
    return tuple(int(k) for k in num_neighbors)


@dataclass(frozen=True, eq=False)
class NodeInput:
    """The seed nodes of a loader: ``split`` (a stored split's name), or ``ids`` (original node
    ids, distinct, int64), or neither (every node of the graph, in the servers' id order)."""

    split: str | None = None
    ids: torch.Tensor | None = None

    def __post_init__(self):
        if self.split is not None and self.ids is not None:
            raise ValueError("give input nodes as a split name or as ids, not both")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}: use one of {', '.join(SPLITS)} or a tensor of ids")
        if self.ids is not None:
            object.__setattr__(self, "ids", check_input_ids(self.ids))

    @classmethod
    def of(cls, input_nodes) -> "NodeInput":
        """From what a user passes as ``input_nodes``: a split name, a tensor/list of ids, or None."""
        if isinstance(input_nodes, NodeInput):
            return input_nodes
        if input_nodes is None:
            return cls()
        if isinstance(input_nodes, str):
            return cls(split=input_nodes)
        return cls(ids=input_nodes)

    @property
    def label(self) -> str:
        """The default metrics label of a loader over these seeds."""
        return self.split or "nodes"

    def describe(self) -> str:
        if self.split is not None:
            return self.split
        return "all nodes" if self.ids is None else f"{self.ids.numel()} node ids"

    def __eq__(self, other) -> bool:
        if not isinstance(other, NodeInput):
            return NotImplemented
        if self.split != other.split or (self.ids is None) != (other.ids is None):
            return False
        return self.ids is None or other.ids is None or torch.equal(self.ids, other.ids)

    def __hash__(self) -> int:
        return hash((self.split, None if self.ids is None else self.ids.numel()))


@dataclass(frozen=True)
class LoaderSpec:
    """Everything a loader asks for.  The batches of an epoch are a function of this record,
    the epoch number and the partition (see :mod:`graphfeed.core.epoch`)."""

    sampling: SamplingSpec
    input: NodeInput = field(default_factory=NodeInput)
    batch_size: int = 1
    shuffle: bool = False
    drop_last: bool = False
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    kind: str = ""        # metrics label ("train", "val", ...); "" = the input's label

    def __post_init__(self):
        check_loader_args(self.batch_size, self.world_size, self.rank)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) \
                or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in 0..2**64-1, got {self.seed!r}")
        if len(self.kind) > MAX_KIND_LENGTH:
            raise ValueError(f"kind is longer than {MAX_KIND_LENGTH} characters")
        for name in ("shuffle", "drop_last"):
            object.__setattr__(self, name, bool(getattr(self, name)))
        for name in ("batch_size", "seed", "rank", "world_size"):
            object.__setattr__(self, name, int(getattr(self, name)))
        if not self.kind:
            object.__setattr__(self, "kind", self.input.label)

    @classmethod
    def of(cls, input_nodes, num_neighbors, *, batch_size: int = 1, shuffle: bool = False,
           drop_last: bool = False, replace: bool = False, direction: str = "in", seed: int = 0,
           rank: int | None = None, world_size: int | None = None, kind: str = "") -> LoaderSpec:
        """From PyG ``NeighborLoader``-style arguments; ``rank``/``world_size`` default to
        ``torch.distributed``'s (:func:`resolve_rank`)."""
        rank, world_size = resolve_rank(rank, world_size)
        sampling = SamplingSpec(fanouts(num_neighbors), replace=replace, direction=direction)
        return cls(sampling, NodeInput.of(input_nodes), batch_size=batch_size, shuffle=shuffle,
                   drop_last=drop_last, seed=seed, rank=rank, world_size=world_size, kind=kind)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit values, else ``torch.distributed``'s, else ``(0, 1)``."""
    import torch.distributed as dist

    if (rank is None or world_size is None) and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    return int(0 if rank is None else rank), int(1 if world_size is None else world_size)

