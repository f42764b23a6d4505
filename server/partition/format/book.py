"""Range partition book: part k owns renumbered ids ``[bounds[k], bounds[k+1])``.

O(P) memory on every process; owner lookup is a binary search over the P boundaries.
"""
from __future__ import annotations

from typing import Sequence

import torch


class RangePartitionBook:
    def __init__(self, bounds: Sequence[int]):
        b = torch.as_tensor(list(bounds), dtype=torch.int64)
        if b.numel() < 2 or b[0].item() != 0 or bool((b[1:] < b[:-1]).any()):
            raise ValueError(f"partition bounds must start at 0 and be non-decreasing, got {list(bounds)}")
        self.bounds = b

    @property
    def num_parts(self) -> int:
        return self.bounds.numel() - 1

    @property
    def num_nodes(self) -> int:
        return int(self.bounds[-1])

    def range(self, part: int) -> tuple[int, int]:
        return int(self.bounds[part]), int(self.bounds[part + 1])

    def owner(self, gids: torch.Tensor) -> torch.Tensor:
        """Owning part of each global id (ids must be in ``[0, num_nodes)``)."""
        bounds = self.bounds if gids.device.type == "cpu" else self.bounds.to(gids.device)
        return torch.searchsorted(bounds, gids, right=True) - 1

    def split(self, gids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """``[(part, positions into gids)]`` for every part that owns some of ``gids`` (positions ascending,
        on ``gids``' device)."""
        if self.num_parts == 1:
            return [(0, torch.arange(gids.numel(), device=gids.device))]
        owner = self.owner(gids)
        if self.num_parts <= _MASK_SPLIT_PARTS:   # a pass per part beats a stable sort for a few parts
            pieces = [(part, torch.nonzero(owner == part).view(-1)) for part in range(self.num_parts)]
            return [(part, pos) for part, pos in pieces if pos.numel()]
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=self.num_parts).tolist()
        out, start = [], 0
        for part, c in enumerate(counts):
            if c:
                out.append((part, order[start:start + c]))
            start += c
        return out


_MASK_SPLIT_PARTS = 4
