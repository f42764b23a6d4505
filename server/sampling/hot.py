"""Which of a part's nodes are hottest: the one ranking of every feature cache.

Neighbourhood sampling reaches a node about as often as edges lead into it, so a part ranks its nodes
of one type by in-degree (summed over the edge types that end at the type, from the CSC topology;
out-degree from CSR when the part stores no CSC), highest first, ties by id.  The GPU feature cache
(:mod:`.gpu`) keeps the top of this ranking on the device and the trainers' hot-feature cache asks for
it by rank (:mod:`graphfeed.server.worker.hot_rows`); one function, so the two caches hold the same rows.
"""
from __future__ import annotations

import torch

from graphfeed.server.partition.format.store import Partition


def in_degree(part: Partition, ntype: str) -> torch.Tensor:
    """Edges into each of ``part``'s ``ntype`` nodes (int64, by local position; out-degree without CSC)."""
    degree = torch.zeros(part.nodes(ntype).num_nodes, dtype=torch.int64)
    kind, end = ("csc", 2) if "csc" in part.meta.topologies else ("csr", 0)
    for etype in part.edge_types:
        if etype[end] == ntype:
            indptr = part.edges(etype).topology(kind).indptr.to(torch.int64)
            degree += indptr[1:] - indptr[:-1]
    return degree


def hottest(part: Partition, ntype: str) -> torch.Tensor:
    """Local positions of ``part``'s ``ntype`` nodes by :func:`in_degree`, highest first; a stable sort, so
    ties keep id order and every call gives the same ranking."""
    return torch.sort(-in_degree(part, ntype), stable=True).indices
