"""Typed records at the sampler's boundary."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

DIRECTIONS = ("in", "out")
MAX_FANOUT = 1 << 20


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


@dataclass
class OneHop:
    """Neighbors sampled for a frontier, grouped per frontier node in frontier order."""

    counts: torch.Tensor      # int64 [n]: neighbors sampled for each frontier node
    neighbors: torch.Tensor   # int64 [sum(counts)]: their global ids
    eids: torch.Tensor        # int64 [sum(counts)]: original edge ids


@dataclass
class SampledSubgraph:
    """A multi-hop sample relabelled to local ids (PyG layout).

    ``nodes`` are global ids, seeds first then each hop's new nodes in order of
    first appearance; ``row``/``col`` index into ``nodes`` and give each sampled
    edge in its true direction (``row`` = source); ``eids`` are original edge ids.
    """

    nodes: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    eids: torch.Tensor
    batch_size: int
    num_sampled_nodes: list[int] = field(default_factory=list)
    num_sampled_edges: list[int] = field(default_factory=list)

    @property
    def edge_index(self) -> torch.Tensor:
        return torch.stack([self.row, self.col])
