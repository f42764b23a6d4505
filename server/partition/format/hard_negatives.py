"""Per-edge hard negatives: destinations known not to be linked to an edge's source, stored with the part.

Input: ``hard_neg_dst.npy`` [E, k] beside ``edge_index.npy`` (on a typed folder in the edge type's folder),
row ``i`` the original destination-type ids of edge ``i``'s hard negatives, ``-1`` padding (checked by
:func:`graphfeed.server.partition.inputs.arrays.check_hard_neg_dst`).  Stored (the
in-memory partition path, :func:`write_hard_negatives`) per part and edge type: the input edges whose source
the part owns and that have at least one hard negative, as global ``src``/``dst`` ids sorted by ``(src,
dst)`` and their ``list`` [M, k] of global destination ids (``-1`` padding).  Edges repeated in the input
(the same ``(src, dst)``) keep the first one's list.  Held-out link split edges keep theirs (the lists are
of the input edges, not of the stored topology), so a ``val``/``test`` seed edge draws its hard negatives too.

A link loader's ``num_hard_negatives`` looks a seed edge up by its endpoints (:class:`HardNegatives`) on the
part that owns its source: the part that produces its batch.
"""
from __future__ import annotations

import numpy as np
import torch

from graphfeed.server.partition.format.layout import PartitionPaths, load_array, save_array


def write_hard_negatives(paths: PartitionPaths, etype, edge_index: np.ndarray, hard: np.ndarray,
                         src_new: np.ndarray, dst_new: np.ndarray, src_ranges: np.ndarray) -> int:
    """Store ``hard`` (checked, original ids) of the edges ``edge_index`` in every part (see the module doc);
    ``src_new``/``dst_new`` map original to global ids of the source / destination type, ``src_ranges`` the
    parts' source id ranges.  Returns the number of edges stored with a list."""
    keep = (hard >= 0).any(axis=1)
    src, dst = src_new[edge_index[0, keep]], dst_new[edge_index[1, keep]]
    lists = np.where(hard[keep] >= 0, dst_new[np.maximum(hard[keep], 0)], -1)
    order = np.lexsort((np.arange(src.size), dst, src))     # by (src, dst), input order within a pair
    src, dst, lists = src[order], dst[order], lists[order]
    first = np.ones(src.size, dtype=bool)
    first[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    src, dst, lists = src[first], dst[first], lists[first]
    bounds = np.searchsorted(src, src_ranges)
    for k in range(src_ranges.size - 1):
        lo, hi = bounds[k], bounds[k + 1]
        save_array(paths.hard_neg_file(k, "src", etype), src[lo:hi])
        save_array(paths.hard_neg_file(k, "dst", etype), dst[lo:hi])
        save_array(paths.hard_neg_file(k, "list", etype), lists[lo:hi])
    return int(src.size)


class HardNegatives:
    """One part's stored hard negatives of one edge type (global ids), looked up by seed edge."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, lists: torch.Tensor, num_dst: int):
        self.lists = lists.to(torch.int64)
        self.num_dst = int(num_dst)
        self.keys = src.to(torch.int64) * self.num_dst + dst.to(torch.int64)   # ascending: sorted by (src, dst)

    @classmethod
    def load(cls, paths: PartitionPaths, k: int, etype, num_dst: int) -> HardNegatives | None:
        """Part ``k``'s lists of ``etype`` (None when the partition stores none)."""
        files = [paths.hard_neg_file(k, name, etype) for name in ("src", "dst", "list")]
        if not all(f.is_file() for f in files):
            return None
        src, dst, lists = (torch.from_numpy(load_array(f)) for f in files)
        return cls(src, dst, lists, num_dst)

    @property
    def width(self) -> int:
        """``k``: the most hard negatives one edge may have."""
        return int(self.lists.size(1)) if self.lists.dim() == 2 else 0

    def lookup(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """int64 [n, k]: the hard-negative destinations (global ids, -1 padding) of each seed edge ``(src[i],
        dst[i])`` (global ids); a row of -1 for an edge without a list."""
        out = torch.full((src.numel(), self.width), -1, dtype=torch.int64)
        if self.keys.numel() == 0 or src.numel() == 0:
            return out
        keys = src.to(torch.int64) * self.num_dst + dst.to(torch.int64)
        pos = torch.searchsorted(self.keys, keys).clamp(max=self.keys.numel() - 1)
        found = self.keys.index_select(0, pos) == keys
        out[found] = self.lists.index_select(0, pos[found])
        return out
