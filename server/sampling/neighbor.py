"""Multi-hop neighbor sampling driver: hops, relabelling, and splitting a frontier by owner.

One driver, :func:`sample_typed`, samples typed (heterogeneous) graphs with PyG's semantics;
a homogeneous graph is its one-type case (:func:`sample_subgraph`).  The driver is
independent of where a hop's neighbors come from: ``one_hop_fn(etype, gids, fanout, rng_hop)``
may read one local CSC/CSR, or split the frontier over the parts of a
:class:`graphfeed.server.sampling.graph.PartitionedGraph` (in this process or on peer
workers) and :func:`stitch` the pieces.  Because every random choice is keyed by
``(seed, rng_hop, node id)`` (see :mod:`graphfeed.server.sampling.rng`), all of these give
identical samples.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.budget import WorkBudget
from graphfeed.server.sampling.typed_plan import EdgeFanouts, plan_typed
from graphfeed.server.sampling.types import EdgeType, OneHop, SampledSubgraph, TypedSubgraph

OneHopFn = Callable[[torch.Tensor, int, int], OneHop]                 # (frontier gids, fanout, hop)
# (etype, frontier gids, fanout, rng_hop[, seed_time]): seed_time (one per frontier node) only when temporal
TypedOneHopFn = Callable[..., OneHop]

SUBGRAPH_SHIFT = 40     # disjoint sampling keys a node by (subgraph << SUBGRAPH_SHIFT) + global id


def sample_subgraph(seeds: torch.Tensor, spec: SamplingSpec, one_hop_fn: OneHopFn) -> SampledSubgraph:
    """Sample the hops of ``spec`` (one fanout each) from ``seeds`` (global ids, distinct).

    The one-type case of :func:`sample_typed` (node type ``"_N"``, edge type ``("_N", "to", "_N")``),
    so ``one_hop_fn`` is called with ``hop`` as its RNG hop.  ``spec.fanouts_for`` turns PyG's
    ``num_neighbors`` (one list, or a dict per edge type) into the driver's per-edge-type fanouts.
    """
    def typed_hop(etype: EdgeType, gids: torch.Tensor, fanout: int, rng_hop: int) -> OneHop:
        return one_hop_fn(gids, fanout, rng_hop)

    fanouts = spec.fanouts_for((DEFAULT_EDGE_TYPE,))
    return sample_typed({DEFAULT_NODE_TYPE: seeds}, fanouts, spec.direction, typed_hop).homogeneous()


def sample_typed(seeds: Mapping[str, torch.Tensor], fanouts: EdgeFanouts, direction: str, one_hop_fn: TypedOneHopFn,
                 input_type: str | None = None, subgraphs: Mapping[str, torch.Tensor] | None = None,
                 subgraph_time: torch.Tensor | None = None,
                 num_nodes: Mapping[str, int] | None = None, budget: WorkBudget | None = None,
                 exclude: Mapping[EdgeType, torch.Tensor] | None = None) -> TypedSubgraph:
    """Sample a typed graph hop by hop from ``seeds`` (per node type: distinct global ids of that type).

    PyG's heterogeneous neighbor sampling: at hop ``h``, for each edge type ``e = (src, rel, dst)``
    of ``fanouts`` in sorted order with ``k = fanouts[e][h]`` (``0``: skip ``e`` at this hop,
    ``-1``: all neighbors), the frontier of type ``dst`` is expanded through ``e``'s in-edges and
    the neighbors are ``src`` nodes (``direction="in"``), or the frontier of ``src`` through its
    out-edges to ``dst`` nodes (``"out"``).  The frontier of a type at hop ``h`` is its nodes
    first seen at hop ``h - 1`` (its seeds at hop 0).  Local ids per type: see
    :class:`TypedSubgraph`.

    ``one_hop_fn(e, gids, k, rng_hop)`` samples ``e`` for the frontier ``gids`` (never empty) with
    ``rng_hop = h * len(fanouts) + (position of e in sorted order)``: one edge type gives
    ``rng_hop = h`` (the homogeneous sample), several draw independent streams.
    ``input_type`` (the type whose seed count is ``batch_size``) defaults to the only seeded type.

    Disjoint sampling (PyG's ``disjoint=True``): ``subgraphs[t][i]`` is the subgraph of seed ``i`` of
    type ``t``; each subgraph grows on its own (a node reached from two subgraphs is a node of
    each, so global ids repeat across them; seeds may repeat across subgraphs, not within one),
    and the result's :attr:`TypedSubgraph.subgraph` gives every node's subgraph.  A node's draws
    are keyed by its global id as always, so it samples the same neighbours in every subgraph
    that reaches it at the same hop (unless their times differ).  ``subgraph_time[s]`` (temporal
    sampling; needs ``subgraphs``) is subgraph ``s``'s seed time: every node of the subgraph is
    expanded with it (``one_hop_fn`` gets it as a fifth argument, one per frontier node).

    ``num_nodes`` (optional, ignored when disjoint; per node type, every global id is below it) lets
    each type keep one id map for all hops of the batch (:func:`dispatch.relabel_map`) instead of relabelling against
    every node seen so far at each hop; the sample is the same either way.
    ``budget`` (a session worker's caps): checked after every edge type of every hop, so a sample
    stops within one hop's work of ``budget.max_nodes`` / ``max_edges`` (:class:`BudgetExceeded`).
    ``exclude[e]`` ([2, n] global ``(src, dst)`` pairs; a link batch's ``exclude_seed_edges``): every sampled
    edge of ``e`` joining such a pair is dropped from its hop's draw before its neighbour joins the frontier,
    so no node enters the sample through it (its center keeps one neighbour fewer: the draw is not redone).
    Raises ValueError for bad fanouts, direction or seeds, naming the fix.
    """
    plan = plan_typed(seeds, fanouts, direction, input_type)
    etypes, num_hops, input_type = plan.etypes, plan.num_hops, plan.input_type
    device = seeds[input_type].device        # a CUDA topology's hops run on its device (dispatch.one_hop)
    if subgraph_time is not None and subgraphs is None:
        raise ValueError("subgraph_time needs subgraphs: temporal sampling is disjoint (one subgraph per seed)")
    bounds = num_nodes if num_nodes is not None and subgraphs is None else {}
    nodes = {t: _TypeNodes(seeds.get(t), device, None if subgraphs is None else subgraphs.get(t, _empty(device)),
                           bounds.get(t))
             for t in plan.node_types}
    edges = {e: _TypeEdges() for e in etypes}
    try:
        for hop in range(num_hops):
            for k, etype in enumerate(etypes):
                fanout, rng_hop = int(fanouts[etype][hop]), hop * len(etypes) + k
                _sample_edge_type(etype, fanout, rng_hop, direction == "in", nodes, edges[etype], one_hop_fn,
                                  subgraph_time, None if exclude is None else exclude.get(etype))
                if budget is not None:
                    budget.check_sample(sum(n.total for n in nodes.values()),
                                        sum(sum(e.counts) for e in edges.values()), hop)
            for typed in nodes.values():
                typed.end_hop()
    finally:
        for typed in nodes.values():
            typed.release_id_map()
    return TypedSubgraph(
        {t: n.gids() for t, n in nodes.items()},
        {e: _cat(s.rows, device) for e, s in edges.items()}, {e: _cat(s.cols, device) for e, s in edges.items()},
        {e: _cat(s.eids, device) for e, s in edges.items()},
        {t: n.counts for t, n in nodes.items()}, {e: s.counts for e, s in edges.items()},
        nodes[input_type].counts[0], input_type,
        None if subgraphs is None else {t: n.subgraphs() for t, n in nodes.items()})


# ---- the driver's parts -----------------------------------------------------------------------

def _sample_edge_type(etype: EdgeType, fanout: int, rng_hop: int, into_dst: bool, nodes: dict[str, _TypeNodes],
                      edges: _TypeEdges, one_hop_fn: TypedOneHopFn, subgraph_time: torch.Tensor | None,
                      excluded: torch.Tensor | None = None) -> None:
    """One hop of ``etype``: expand the frontier of its center type and record the sampled edges.

    ``into_dst``: direction "in" (the center is the destination type, the neighbors are sources).
    ``excluded``: [2, n] ``(src, dst)`` global id pairs whose edges are dropped (:func:`drop_pairs`).
    """
    src, _, dst = etype
    center, other = (nodes[dst], nodes[src]) if into_dst else (nodes[src], nodes[dst])
    gids, local = center.frontier
    if fanout == 0 or gids.numel() == 0:
        edges.counts.append(0)
        return
    subs = center.frontier_subgraphs()
    if subgraph_time is None or subs is None:
        res = one_hop_fn(etype, gids, fanout, rng_hop)
    else:
        res = one_hop_fn(etype, gids, fanout, rng_hop, subgraph_time.index_select(0, subs))
    if excluded is not None and excluded.numel():
        res = drop_pairs(res, gids, into_dst, excluded)
    nbr_subs = None if subs is None else torch.repeat_interleave(subs, res.counts)
    nbr_local = other.add(res.neighbors, nbr_subs)
    center_local = torch.repeat_interleave(local, res.counts)
    edges.add(nbr_local if into_dst else center_local, center_local if into_dst else nbr_local, res.eids)


def drop_pairs(res: OneHop, centers: torch.Tensor, into_dst: bool, pairs: torch.Tensor) -> OneHop:
    """``res`` (a hop of frontier ``centers``) without its edges whose ``(src, dst)`` global ids are a column of
    ``pairs`` ([2, n]); ``into_dst``: the centers are the edges' destinations.  ``res`` itself when none is."""
    if res.neighbors.numel() == 0:
        return res
    pairs = pairs.to(res.neighbors.device)
    center = torch.repeat_interleave(centers, res.counts, output_size=res.neighbors.numel())
    src, dst = (res.neighbors, center) if into_dst else (center, res.neighbors)
    m = 1 + max(int(dst.max()), int(pairs[1].max()))       # keys src * m + dst are distinct per pair
    keep = ~torch.isin(src * m + dst, pairs[0] * m + pairs[1])
    if bool(keep.all()):
        return res
    owner = torch.repeat_interleave(torch.arange(centers.numel(), device=keep.device), res.counts,
                                    output_size=keep.numel())
    counts = torch.bincount(owner[keep], minlength=centers.numel())
    return OneHop(counts, res.neighbors[keep], res.eids[keep])


class _TypeNodes:
    """The sampled nodes of one type: their keys in local-id order, and the frontier of the current hop.

    A node's key is its global id, or with disjoint subgraphs ``(subgraph << SUBGRAPH_SHIFT) + global id``
    (the same node in two subgraphs is two nodes).  ``num_nodes`` (not disjoint: keys are global ids
    below it) keeps one id map for all hops instead of relabelling against every node seen so far.
    """

    def __init__(self, seeds: torch.Tensor | None, device: torch.device, subgraphs: torch.Tensor | None = None,
                 num_nodes: int | None = None):
        seeds = _empty(device) if seeds is None else seeds.to(device=device, dtype=torch.int64)
        self.disjoint = subgraphs is not None
        keys = seeds if subgraphs is None else _keys(seeds, subgraphs.to(device=device, dtype=torch.int64))
        self.chunks = [keys]                  # the seeds, then the new nodes of each hop and edge type
        self.total = seeds.numel()
        # global id -> local id of every node seen so far, when the type's ids are bounded (else each
        # add relabels against all chunks)
        self.id_map = None if num_nodes is None or self.disjoint else dispatch.take_id_map(num_nodes, device)
        self._map_clean = True                # every entry the map holds is a node of self.chunks
        if self.id_map is not None:
            self.id_map.index_copy_(0, seeds, torch.arange(seeds.numel(), dtype=torch.int32, device=device))
        self.counts = [seeds.numel()]         # num_sampled_nodes
        self.frontier = (seeds, torch.arange(seeds.numel(), device=device))   # (global ids, local ids)
        self._frontier_keys = keys
        self._hop_first = 1                   # chunks[_hop_first:] are the nodes new in this hop

    def add(self, candidates: torch.Tensor, subgraphs: torch.Tensor | None = None) -> torch.Tensor:
        """Local ids of ``candidates`` (global ids of this type, of subgraphs ``subgraphs`` when disjoint);
        the unseen ones are numbered next."""
        keys = candidates if not self.disjoint else _keys(candidates, subgraphs)
        if self.id_map is not None:
            self._map_clean = False           # until the relabel returns its new nodes
            local, new = dispatch.relabel_map(self.id_map, keys, self.total)
            self._map_clean = True
        else:
            local, new = dispatch.relabel(*_known(self.chunks), keys, self.total)
        self.chunks.append(new)
        self.total += new.numel()
        return local

    def release_id_map(self) -> None:
        """Hand the id map back for the next batch (:func:`dispatch.give_id_map` clears the entries of this
        batch's nodes); a map a failed relabel may have left entries in is dropped instead."""
        if self.id_map is not None and self._map_clean:
            dispatch.give_id_map(self.id_map, self.chunks)
        self.id_map = None

    def end_hop(self) -> None:
        """The nodes first seen in this hop become the next hop's frontier."""
        hop_chunks = self.chunks[self._hop_first:]
        # One chunk (always so with one edge type): the relabel's own tensor, no copy needed.
        new = hop_chunks[0] if len(hop_chunks) == 1 else _cat(hop_chunks)
        self._hop_first = len(self.chunks)
        self.counts.append(new.numel())
        self._frontier_keys = new
        gids = new if not self.disjoint else new & ((1 << SUBGRAPH_SHIFT) - 1)
        self.frontier = (gids, torch.arange(self.total - new.numel(), self.total, device=new.device))

    def frontier_subgraphs(self) -> torch.Tensor | None:
        """The subgraph of every frontier node (None unless disjoint)."""
        return self._frontier_keys >> SUBGRAPH_SHIFT if self.disjoint else None

    def gids(self) -> torch.Tensor:
        keys = _cat(self.chunks)
        return keys if not self.disjoint else keys & ((1 << SUBGRAPH_SHIFT) - 1)

    def subgraphs(self) -> torch.Tensor:
        """The subgraph of every node, in local-id order (disjoint sampling)."""
        return _cat(self.chunks) >> SUBGRAPH_SHIFT


def _keys(gids: torch.Tensor, subgraphs) -> torch.Tensor:
    """Disjoint sampling's node keys ``(subgraph << SUBGRAPH_SHIFT) + global id``."""
    if gids.numel() and int(gids.max()) >= 1 << SUBGRAPH_SHIFT:
        raise ValueError(f"disjoint sampling needs node ids below 2**{SUBGRAPH_SHIFT}")
    return (subgraphs << SUBGRAPH_SHIFT) + gids


class _TypeEdges:
    """The sampled edges of one edge type, hop by hop."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []
        self.cols: list[torch.Tensor] = []
        self.eids: list[torch.Tensor] = []
        self.counts: list[int] = []           # num_sampled_edges

    def add(self, row: torch.Tensor, col: torch.Tensor, eids: torch.Tensor) -> None:
        self.rows.append(row)
        self.cols.append(col)
        self.eids.append(eids)
        self.counts.append(eids.numel())


def _empty(device: torch.device | None = None) -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64, device=device)


def _cat(chunks: list[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """One new tensor (never one of ``chunks``: results must not alias the caller's seeds or hop results)."""
    return torch.cat(chunks) if chunks else _empty(device)   # (no chunks: an edge type never sampled)


def _known(nodes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The nodes seen so far as ``(global ids, local ids)``; a node's local id is its position.

    Sorted by global id only for the implementation that searches them (the native relabel
    hashes them, and sorting cost it ~18% of a server's sampling time).
    """
    gids = torch.cat(nodes)
    if dispatch.relabel_needs_sorted_known():
        return torch.sort(gids)
    return gids, torch.arange(gids.numel(), device=gids.device)


def stitch(n: int, pieces: Sequence[tuple[torch.Tensor, OneHop]], device: torch.device | None = None) -> OneHop:
    """Merge per-owner results back into frontier order, on ``device`` (the frontier's; default the CPU).

    ``pieces`` holds ``(positions into the frontier, result for those nodes)``; together the
    positions cover ``0..n-1`` once.  The same for every edge type: a typed ``one_hop_fn``
    splits and stitches each edge type's frontier.  One piece that covers the frontier in order
    is returned as it is (moved to ``device``).  A piece from another device (a peer's answer on a
    GPU worker) is copied over once.
    """
    device = torch.device("cpu") if device is None else device
    pieces = [(pos.to(device), _on(res, device)) for pos, res in pieces]
    if len(pieces) == 1 and pieces[0][0].numel() == n and _in_order(pieces[0][0]):
        return pieces[0][1]
    counts = torch.zeros(n, dtype=torch.int64, device=device)
    for pos, res in pieces:
        counts.index_copy_(0, pos, res.counts)
    ends = torch.cumsum(counts, 0)
    offsets = ends - counts
    total = int(ends[-1]) if n else 0
    neighbors = torch.empty(total, dtype=torch.int64, device=device)
    edge_ids = torch.empty(total, dtype=torch.int64, device=device)
    for pos, res in pieces:
        # a piece's j-th neighbor of its i-th node goes to offsets[pos[i]] + j: shift its own offsets
        m = res.neighbors.numel()
        shift = offsets.index_select(0, pos) - (torch.cumsum(res.counts, 0) - res.counts)
        dst = torch.repeat_interleave(shift, res.counts, output_size=m) + torch.arange(m, device=device)
        neighbors.index_copy_(0, dst, res.neighbors)
        edge_ids.index_copy_(0, dst, res.eids)
    return OneHop(counts, neighbors, edge_ids)


def _on(res: OneHop, device: torch.device) -> OneHop:
    """``res`` on ``device`` (itself when it is there)."""
    if res.counts.device == device:
        return res
    return OneHop(res.counts.to(device), res.neighbors.to(device), res.eids.to(device))


def _in_order(pos: torch.Tensor) -> bool:
    """Whether ``pos`` is ``0, 1, ..., len - 1``."""
    return pos.numel() == 0 or (int(pos[0]) == 0 and int(pos[-1]) == pos.numel() - 1 and
                                bool((pos[1:] > pos[:-1]).all()))
