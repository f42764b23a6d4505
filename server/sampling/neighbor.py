"""Multi-hop neighbor sampling driver: hops, relabelling, and splitting a frontier by owner.

The driver is independent of where a hop's neighbors come from: ``one_hop_fn(gids,
fanout, hop)`` may read one local CSC, or split the frontier over the parts of a
:class:`graphfeed.server.sampling.graph.PartitionedGraph` (in this process or on peer
workers).  Because every random choice is keyed by ``(seed, hop, node id)`` (see
:mod:`graphfeed.server.sampling.rng`), all of these give identical samples.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.reference import segment_arange
from graphfeed.server.sampling.types import OneHop, SampledSubgraph

OneHopFn = Callable[[torch.Tensor, int, int], OneHop]


def sample_subgraph(seeds: torch.Tensor, spec: SamplingSpec, one_hop_fn: OneHopFn) -> SampledSubgraph:
    """Sample ``len(spec.num_neighbors)`` hops from ``seeds`` (global ids, distinct)."""
    seeds = seeds.to(torch.int64)
    batch = seeds.numel()
    nodes, rows, cols, eids = [seeds], [], [], []
    frontier, frontier_local = seeds, torch.arange(batch)
    num_nodes, num_edges = [batch], []
    total = batch
    for hop, fanout in enumerate(spec.num_neighbors):
        res = one_hop_fn(frontier, fanout, hop) if frontier.numel() else _empty_hop()
        nbr_local, new_gids = dispatch.relabel(*_known(nodes), res.neighbors, total)
        seed_side = torch.repeat_interleave(frontier_local, res.counts)
        rows.append(nbr_local if spec.direction == "in" else seed_side)
        cols.append(seed_side if spec.direction == "in" else nbr_local)
        eids.append(res.eids)
        new_local = torch.arange(total, total + new_gids.numel())
        total += new_gids.numel()
        nodes.append(new_gids)
        num_nodes.append(new_gids.numel())
        num_edges.append(res.neighbors.numel())
        frontier, frontier_local = new_gids, new_local
    return SampledSubgraph(torch.cat(nodes), torch.cat(rows), torch.cat(cols), torch.cat(eids),
                           batch, num_nodes, num_edges)


def _known(nodes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The nodes seen so far as ``(global ids, local ids)``; a node's local id is its position.

    Sorted by global id only for the implementation that searches them (the native relabel
    hashes them, and sorting cost it ~18% of a server's sampling time).
    """
    gids = torch.cat(nodes)
    if dispatch.relabel_needs_sorted_known():
        return torch.sort(gids)
    return gids, torch.arange(gids.numel())


def _empty_hop() -> OneHop:
    e = torch.empty(0, dtype=torch.int64)
    return OneHop(e, e, e)


def stitch(n: int, pieces: Sequence[tuple[torch.Tensor, OneHop]]) -> OneHop:
    """Merge per-owner results back into frontier order.

    ``pieces`` holds ``(positions into the frontier, result for those nodes)``.
    """
    counts = torch.zeros(n, dtype=torch.int64)
    for pos, res in pieces:
        counts[pos] = res.counts
    offsets = torch.cumsum(counts, 0) - counts
    total = int(counts.sum())
    neighbors = torch.empty(total, dtype=torch.int64)
    edge_ids = torch.empty(total, dtype=torch.int64)
    for pos, res in pieces:
        dst = torch.repeat_interleave(offsets[pos], res.counts) + segment_arange(res.counts)
        neighbors[dst] = res.neighbors
        edge_ids[dst] = res.eids
    return OneHop(counts, neighbors, edge_ids)
