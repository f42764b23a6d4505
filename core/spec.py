"""The records of what a loader asks for: how to sample (:class:`SamplingSpec`)."""
from __future__ import annotations

from dataclasses import dataclass

from graphfeed.core.constants import DIRECTIONS, MAX_FANOUT



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
