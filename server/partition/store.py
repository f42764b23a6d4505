"""Opening a partition folder: memory-mapped arrays of one part, or of all of them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import torch

from graphfeed.core.constants import SPLITS
from graphfeed.core.spec import NodeInput
from graphfeed.server.partition.book import RangePartitionBook
from graphfeed.server.partition.format import (
    DEFAULT_EDGE_TYPE,
    DEFAULT_NODE_TYPE,
    PartitionFormatError,
    PartitionMeta,
    PartitionPaths,
    load_array,
    read_meta,
)


@dataclass(frozen=True)
class Topology:
    """Compressed adjacency of one part's owned nodes (CSC: in-edges, CSR: out-edges).

    ``indptr[i]:indptr[i+1]`` are the edges of the part's i-th owned node; ``indices``
    holds the other endpoint's global id and ``eid`` the original edge id.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    eid: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1


def _tensor(path) -> torch.Tensor:
    return torch.from_numpy(load_array(path))


class Partition:
    """One part of a partitioned graph, memory-mapped (nothing is read until used)."""

    def __init__(self, root: str | os.PathLike, part_id: int, meta: PartitionMeta | None = None,
                 ntype: str = DEFAULT_NODE_TYPE, etype=DEFAULT_EDGE_TYPE):
        self.paths = PartitionPaths(root)
        self.meta = meta if meta is not None else read_meta(root)
        if not 0 <= part_id < self.meta.num_parts:
            raise PartitionFormatError(
                f"part {part_id} does not exist: {root} has parts 0..{self.meta.num_parts - 1}")
        self.part_id = part_id
        self.ntype, self.etype = ntype, tuple(etype)
        self.book = RangePartitionBook(self.meta.node_ranges[ntype])
        self.start, self.stop = self.book.range(part_id)

    @property
    def num_nodes(self) -> int:
        return self.stop - self.start

    def topology(self, kind: str = "csc") -> Topology:
        if kind not in self.meta.topologies:
            raise PartitionFormatError(
                f"{self.paths.root} was partitioned without {kind.upper()} topology "
                f"(needed for {'out' if kind == 'csr' else 'in'}-edge sampling); "
                f"re-run `graphfeed partition --topology {kind}` or `--topology both`")
        return self._topologies[kind]

    @cached_property
    def _topologies(self) -> dict[str, Topology]:
        out = {}
        for kind in self.meta.topologies:
            indptr, indices, eid = (_tensor(self.paths.edge_file(self.part_id, kind, name, self.etype))
                                    for name in ("indptr", "indices", "eid"))
            topo = Topology(indptr, indices, eid)
            if topo.num_nodes != self.num_nodes:
                raise PartitionFormatError(
                    f"{self.paths.edge_dir(self.part_id, self.etype)}: {kind} indptr covers {topo.num_nodes} nodes, "
                    f"the part owns {self.num_nodes}; the folder is corrupt, re-run `graphfeed partition`")
            out[kind] = topo
        return out

    @cached_property
    def x(self) -> torch.Tensor:
        return _tensor(self.paths.node_file(self.part_id, "x", self.ntype))

    @cached_property
    def y(self) -> torch.Tensor:
        return _tensor(self.paths.node_file(self.part_id, "y", self.ntype))

    @cached_property
    def orig_id(self) -> torch.Tensor:
        return _tensor(self.paths.node_file(self.part_id, "orig_id", self.ntype))

    def split(self, name: str) -> torch.Tensor:
        """Global ids of this part's nodes in split ``name`` (sorted)."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}: use one of {', '.join(SPLITS)} or pass a tensor of node ids")
        return _tensor(self.paths.split_file(self.part_id, name, self.ntype))

    @cached_property
    def _orig_lookup(self) -> tuple[torch.Tensor, torch.Tensor]:
        sorted_orig, perm = torch.sort(self.orig_id)
        return sorted_orig, perm

    def to_global(self, orig_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask, gids)``: which of ``orig_ids`` this part owns, and their global ids."""
        sorted_orig, perm = self._orig_lookup
        if sorted_orig.numel() == 0:
            return torch.zeros(orig_ids.numel(), dtype=torch.bool), torch.empty(0, dtype=torch.int64)
        pos = torch.searchsorted(sorted_orig, orig_ids).clamp(max=sorted_orig.numel() - 1)
        mask = sorted_orig[pos] == orig_ids
        return mask, perm[pos[mask]] + self.start

    def input_nodes(self, node_input: NodeInput) -> torch.Tensor:
        """Global ids of the seeds ``node_input`` names that this part owns, in input order
        (a split's stored order; ``ids``' given order; every node in id order)."""
        if node_input.split is not None:
            return self.split(node_input.split).clone()
        if node_input.ids is None:
            return torch.arange(self.start, self.stop)
        ids = node_input.ids
        n = self.book.num_nodes
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ValueError(f"node ids out of range: original node ids are 0..{n - 1}")
        return self.to_global(ids)[1]


def open_parts(root: str | os.PathLike) -> tuple[PartitionMeta, list[Partition]]:
    meta = read_meta(root)
    return meta, [Partition(root, k, meta) for k in range(meta.num_parts)]


def resolve_original_ids(parts: list[Partition], orig_ids: torch.Tensor) -> torch.Tensor:
    """Global ids of ``orig_ids`` (original node ids), in the same order; raises on unknown ids."""
    orig_ids = torch.as_tensor(orig_ids, dtype=torch.int64).reshape(-1)
    gids = torch.full_like(orig_ids, -1)
    for part in parts:
        mask, g = part.to_global(orig_ids)
        gids[mask] = g
    missing = gids < 0
    if bool(missing.any()):
        bad = orig_ids[missing][:5].tolist()
        raise ValueError(f"{int(missing.sum())} input node id(s) are not in the graph (e.g. {bad}); "
                         f"pass original node ids in 0..{sum(p.num_nodes for p in parts) - 1}")
    return gids
