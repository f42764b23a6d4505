"""Typed records at the sampler's boundary."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
