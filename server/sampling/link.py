"""Link batches: seed edges, their negatives, and the batch a link loader yields.

A link batch is the node batch's pipeline with a different seed record
(:class:`graphfeed.core.spec.LinkInput`): the plan slices seed-edge *positions* (each part's
are the seed edges whose source it owns, :meth:`Partition.input_nodes`), this module turns
them into endpoint pairs, draws the negatives, and hands the endpoints (seeds per node type:
a typed seed edge's source and destination types; with ``disjoint`` one subgraph per seed edge
and per binary negative) to the one producer,
:func:`graphfeed.server.sampling.producer.produce_batch`, with the link fields of
:mod:`graphfeed.core.batch` (``input_id``, ``edge_label_index``/``edge_label``, or
``src_index``/``dst_pos_index``/``dst_neg_index`` in triplet mode; ``edge_label_time`` /
``seed_time`` when temporal; ``link_edge_type`` on a typed graph).

Negatives.  The destination of negative ``j`` of a batch (paired with seed edge
``i = j mod B``, draw ``a = j div B``) is ``draw(seed, position of seed edge i, a * ROUNDS + r)
mod num_nodes`` with the counter-based RNG of :mod:`graphfeed.server.sampling.rng`, round ``r``
starting at 0: a pure function of the batch seed and the seed edge, so the local loader and
the servers draw the same negatives bit for bit.  With ``strict`` every drawn pair is
checked against the graph (:meth:`PartitionedGraph.has_edges`: the part owning the source,
a peer worker when that part is elsewhere) and the pairs that are edges are redrawn, up to
:data:`ROUNDS` draws in all.  A pair still an edge after that -- its source is linked to
nearly every node, so a non-edge is (almost) impossible to draw -- fails the batch with
:class:`StrictNegativeError`, naming the seed edge and the fix (``strict=False``, or leave
such edges out of ``edge_label_index``): no silent non-strict fallback.

Hard negatives (``num_hard_negatives = h``).  Draw ``a < h`` of seed edge ``i`` takes the ``a``-th of its
stored hard-negative destinations (:meth:`PartitionedGraph.hard_negatives`) in an order drawn with the same
RNG (hop :data:`HARD_HOP`, keyed by the seed edge's position): a seed edge with fewer than ``h`` stored gets
them all, and its other draws are random as above.  With ``strict`` a hard negative that is an edge of the
graph is redrawn like any other (and is no longer hard).  Batches carry ``neg_is_hard``.

Seed-edge exclusion (``exclude_seed_edges``).  The batch's seed edges (every column of ``edge_label_index``
in it, not the drawn negatives) are handed to the sampler as pairs no hop may sample
(:func:`seed_edge_exclusion`): on a homogeneous graph both ``(u, v)`` and ``(v, u)``; on a typed graph
``(u, v)`` of the seed edge type and ``(v, u)`` of its reverse edge type
(:func:`graphfeed.core.spec.reverse_edge_type`).  The multi-hop driver drops them from each hop's draw on the
producing worker, after the pieces of every part are stitched, so local and remote batches stay equal.
"""
from __future__ import annotations

from typing import Callable, ContextManager

import torch

from graphfeed.core.epoch import BatchSpec
from graphfeed.core.spec import EdgeType, LinkInput, SamplingSpec, reverse_edge_type
from graphfeed.server.sampling import rng
from graphfeed.server.sampling.neighbor import SUBGRAPH_SHIFT
from graphfeed.server.sampling.producer import produce_batch

ROUNDS = 32               # draws per negative with strict (the first plus 31 redraws)
NEG_HOP = 1 << 20         # the RNG "hop" of negatives: above any sampling hop, so the streams differ
HARD_HOP = NEG_HOP + 1    # the RNG "hop" of the order hard negatives are taken in


class StrictNegativeError(ValueError):
    """Strict negative sampling drew only edges of the graph for some seed edge's source."""


class LinkSeeds:
    """A link loader's seed edges in global ids: ``src[i]``, ``dst[i]`` for every position ``i``
    of the input's ``edge_label_index`` that :meth:`resolve` was asked for (-1 elsewhere)."""

    def __init__(self, link: LinkInput):
        self.link = link
        self.src = torch.full((link.num_edges,), -1, dtype=torch.int64)
        self.dst = torch.full((link.num_edges,), -1, dtype=torch.int64)

    def resolve(self, graph, positions: torch.Tensor) -> LinkSeeds:
        """Resolve the endpoints of the seed edges at ``positions`` through ``graph.to_global`` (every
        part is asked: an endpoint may live anywhere).  ValueError naming an id outside the graph.  A link
        split's seed edges come from the parts in this process instead (each serves its own:
        :meth:`Partition.link_split`)."""
        if self.link.index is None:   # a link split or every edge of a type: listed by the parts
            return self._resolve_split(graph)
        if positions.numel() == 0:
            return self
        assert self.link.index is not None   # a LinkInput has a split or an index
        ends = self.link.index[:, positions]
        src_type, dst_type = self.link.end_types(graph.label_type)
        if src_type == dst_type:
            gids = graph.to_global(ends.reshape(-1), src_type).view(2, -1)
        else:
            gids = torch.stack([graph.to_global(ends[0], src_type), graph.to_global(ends[1], dst_type)])
        missing = gids < 0
        if bool(missing.any()):
            row = int(missing.nonzero()[0, 0])
            bad, ntype = int(ends[missing][0]), (src_type, dst_type)[row]
            what = "node" if graph.is_homogeneous else f"{ntype!r} node"
            raise ValueError(f"edge_label_index has node id {bad}, which is not in the graph: original {what} ids "
                             f"are 0..{graph.num_nodes_of(ntype) - 1}")
        self.src[positions], self.dst[positions] = gids[0], gids[1]
        return self

    def add(self, positions: torch.Tensor, ends: torch.Tensor) -> LinkSeeds:
        """Seed edges at ``positions`` with global endpoints ``ends`` ``[2, k]`` (a peer part's link split)."""
        size = max(self.src.numel(), int(positions.max()) + 1 if positions.numel() else 0)
        if size > self.src.numel():
            grow = torch.full((size - self.src.numel(),), -1, dtype=torch.int64)
            self.src, self.dst = torch.cat([self.src, grow]), torch.cat([self.dst, grow])
        self.src[positions], self.dst[positions] = ends[0], ends[1]
        return self

    def _resolve_split(self, graph) -> LinkSeeds:
        stored = [part.stored_link_seeds(self.link) for part in graph.parts]
        size = max((int(pos[-1]) + 1 for pos, _, _ in stored if pos.numel()), default=0)
        self.src = torch.full((size,), -1, dtype=torch.int64)
        self.dst = torch.full((size,), -1, dtype=torch.int64)
        for pos, src, dst in stored:
            self.src[pos], self.dst[pos] = src, dst
        return self


def draw_negatives(graph, src: torch.Tensor, positions: torch.Tensor, count: int, strict: bool,
                   seed: int, etype: EdgeType | None = None, hard: torch.Tensor | None = None,
                   num_hard: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(neg_src, neg_dst, is_hard)`` of ``count`` negatives (global ids; whether each came from a hard list)
    for seed edges ``positions`` (sources ``src``) of edge type ``etype`` (None: the homogeneous graph's),
    drawn as the module doc says, the destinations over ``etype``'s destination nodes; the first ``num_hard``
    draws of a seed edge come from its row of ``hard`` ([B, k] global ids, -1 padding) while it lasts.
    :class:`StrictNegativeError` when ``strict`` and :data:`ROUNDS` draws give an edge of the graph every time."""
    b = positions.numel()
    j = torch.arange(count, dtype=torch.int64)
    which, draw = j % b, j // b
    neg_src = src.index_select(0, which)
    keys = rng.node_keys(rng.hop_base(seed, NEG_HOP), positions.index_select(0, which))
    n = graph.num_nodes_of(None if etype is None else etype[2])
    neg_dst = rng.draws(keys, draw * ROUNDS) % n
    is_hard = torch.zeros(count, dtype=torch.bool)
    if hard is not None and num_hard and hard.numel():
        picked = _hard_order(hard, positions, seed)
        slot = draw.clamp(max=picked.size(1) - 1)
        taken = picked[which, slot]
        is_hard = (draw < num_hard) & (draw < picked.size(1)) & (taken >= 0)
        neg_dst[is_hard] = taken[is_hard]
    if not strict:
        return neg_src, neg_dst, is_hard
    todo = torch.arange(count, dtype=torch.int64)
    for r in range(1, ROUNDS + 1):
        todo = todo[graph.has_edges(neg_src[todo], neg_dst[todo], etype)]
        if todo.numel() == 0:
            return neg_src, neg_dst, is_hard
        is_hard[todo] = False
        if r < ROUNDS:
            neg_dst[todo] = rng.draws(keys[todo], draw[todo] * ROUNDS + r) % n
    first = int(positions[which[todo[0]]])
    raise StrictNegativeError(
        f"strict negative sampling drew {ROUNDS} destinations for seed edge {first} of edge_label_index and every "
        f"one is an edge of the graph (its source is linked to nearly every node): pass "
        f"neg_sampling=dict(mode=..., amount=..., strict=False), or leave such edges out of edge_label_index")


def _hard_order(hard: torch.Tensor, positions: torch.Tensor, seed: int) -> torch.Tensor:
    """Each seed edge's stored hard negatives ([B, k], -1 padding) in the order draws take them: its valid
    entries shuffled by the RNG (keyed by batch seed and seed-edge position), then the padding."""
    b, k = hard.shape
    keys = rng.node_keys(rng.hop_base(seed, HARD_HOP), positions).repeat_interleave(k)
    score = rng.draws(keys, torch.arange(k, dtype=torch.int64).repeat(b)).view(b, k)
    shuffled = hard.gather(1, torch.argsort(score, dim=1, stable=True))
    return shuffled.gather(1, torch.argsort((shuffled < 0).to(torch.int8), dim=1, stable=True))


def seed_edge_exclusion(graph, link: LinkInput, spec: SamplingSpec, src: torch.Tensor, dst: torch.Tensor
                        ) -> dict[EdgeType, torch.Tensor]:
    """The ``(src, dst)`` pairs (``[2, n]`` global ids, per edge type) a batch with seed edges ``src -> dst`` may
    not sample under ``exclude_seed_edges``: both directions on a homogeneous graph; on a typed graph the seed
    edges on their type and reversed on its reverse type (``spec.reverse_edge_types`` or PyG's ``rev_`` name;
    none found: the seed edge type only)."""
    forward, backward = torch.stack([src, dst]), torch.stack([dst, src])
    if graph.is_homogeneous or link.edge_type is None:
        return {graph.edge_types[0]: torch.cat([forward, backward], dim=1)}
    etype = link.edge_type
    out = {etype: forward}
    rev = reverse_edge_type(etype, graph.edge_types, spec.reverse_edge_types)
    if rev is not None:
        out[rev] = torch.cat([out[rev], backward], dim=1) if rev in out else backward
    return out


def link_fields(link: LinkInput, positions: torch.Tensor, local: torch.Tensor) -> dict[str, torch.Tensor]:
    """The link batch fields besides ``input_id`` (the seed edges' ``positions``); ``local`` holds the
    local ids of ``[src, dst, negatives...]`` endpoints
    (binary: ``[src, dst, neg_src, neg_dst]``; triplet: ``[src, dst, neg_dst]``)."""
    b, neg = positions.numel(), link.neg
    out: dict[str, torch.Tensor] = {}
    if neg is not None and neg.mode == "triplet":
        amount = int(neg.amount)
        dst_neg = local[2 * b:].view(amount, b).t().contiguous()
        out.update(src_index=local[:b], dst_pos_index=local[b:2 * b],
                   dst_neg_index=dst_neg.view(-1) if amount == 1 else dst_neg)
        return out
    labels = link.labels(positions)
    if neg is None:
        out.update(edge_label_index=local.view(2, b), edge_label=labels)
        return out
    k = (local.numel() - 2 * b) // 2
    src = torch.cat([local[:b], local[2 * b:2 * b + k]])
    index = torch.stack([src, torch.cat([local[b:2 * b], local[2 * b + k:]])])
    out.update(edge_label_index=index, edge_label=torch.cat([labels, torch.zeros(k, dtype=labels.dtype)]))
    return out


def produce_link_batch(graph, seeds: LinkSeeds, positions: torch.Tensor, spec: SamplingSpec, plan_entry: BatchSpec,
                       epoch: int, seq: int, feature_dtype: torch.dtype | None = None,
                       stage: Callable[[str], ContextManager] | None = None,
                       keys: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Batch ``seq`` of ``epoch`` of a link loader: the seed edges at ``positions`` (resolved in
    ``seeds``), their negatives, and the sample of every endpoint (sorted, distinct: the batch's
    first ``batch_size`` nodes), encoded, its features cast to ``feature_dtype`` (None = as stored).
    ``keys`` (default ``positions``): the seed edges' positions in the loader's input, which key their
    negatives and become ``input_id`` -- a batch made outside an epoch indexes ``seeds`` by ``positions``
    but is keyed by where its seed edges sit in the caller's input (:mod:`graphfeed.server.sampling.adhoc`).
    :class:`StrictNegativeError` as :func:`draw_negatives`."""
    link, seed, b = seeds.link, plan_entry.seed, positions.numel()
    keys = positions if keys is None else keys
    src_type, dst_type = link.end_types(graph.label_type)
    src, dst = seeds.src.index_select(0, positions), seeds.dst.index_select(0, positions)
    own = torch.arange(b)                       # disjoint: seed edge i is subgraph i
    ends = [(src_type, src, own), (dst_type, dst, own)]
    times = None if link.time is None else link.time.index_select(0, positions)
    is_hard = None
    if link.neg is not None:
        hard = graph.hard_negatives(link.edge_type, src, dst) if link.neg.num_hard else None
        neg_src, neg_dst, is_hard = draw_negatives(graph, src, keys, link.neg.count(b), link.neg.strict, seed,
                                                   link.edge_type, hard, link.neg.num_hard)
        paired = torch.arange(neg_dst.numel()) % b        # negative j pairs with seed edge j mod b
        if link.neg.mode == "triplet":                     # a seed edge's negatives join its subgraph
            ends += [(dst_type, neg_dst, paired)]
        else:                                              # a binary negative is a subgraph of its own
            alone = b + torch.arange(neg_dst.numel())
            ends += [(src_type, neg_src, alone), (dst_type, neg_dst, alone)]
            times = None if times is None else torch.cat([times, times.index_select(0, paired)])
    nodes, local, subgraphs = _endpoint_seeds(ends, spec.disjoint)
    extra = link_fields(link, positions, local)
    if is_hard is not None and link.neg is not None and link.neg.num_hard:
        extra["neg_is_hard"] = _as_negatives(is_hard, link, b)
    if times is not None and spec.temporal:   # PyG's names: triplet batches carry seed_time
        extra["seed_time" if "src_index" in extra else "edge_label_time"] = times
    if link.edge_type is not None and not graph.is_homogeneous:
        extra["link_edge_type"] = torch.tensor([sorted(graph.edge_types).index(link.edge_type)])
    exclude = seed_edge_exclusion(graph, link, spec, src, dst) if spec.exclude_seed_edges else None
    return produce_batch(graph, nodes, spec, plan_entry, epoch, seq, input_type=src_type, input_id=keys,
                         feature_dtype=feature_dtype, stage=stage, extra=extra, subgraphs=subgraphs,
                         seed_time=times if spec.temporal else None, exclude=exclude)


def _as_negatives(values: torch.Tensor, link: LinkInput, b: int) -> torch.Tensor:
    """Per-negative ``values`` (negative ``j`` of seed edge ``j mod b``) laid out as the batch's negatives:
    binary ``[K]`` (``edge_label_index``'s negatives), triplet as ``dst_neg_index``."""
    assert link.neg is not None
    if link.neg.mode != "triplet":
        return values
    amount = int(link.neg.amount)
    laid = values.view(amount, b).t().contiguous()
    return laid.view(-1) if amount == 1 else laid


def _endpoint_seeds(ends: list[tuple[str, torch.Tensor, torch.Tensor]], disjoint: bool
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor] | None]:
    """The sample's seeds (per node type: the distinct endpoint ids, sorted; with ``disjoint`` distinct
    per subgraph, sorted by subgraph then id), every endpoint's local id within its type in the order of
    ``ends`` (``(node type, global ids, subgraphs)`` groups), and with ``disjoint`` each seed's subgraph."""
    seeds, subgraphs = {}, {}
    local = [torch.empty(0, dtype=torch.int64)] * len(ends)
    for ntype in dict.fromkeys(t for t, _, _ in ends):
        which = [i for i, (t, _, _) in enumerate(ends) if t == ntype]
        keys = torch.cat([(ends[i][2] << SUBGRAPH_SHIFT) + ends[i][1] if disjoint else ends[i][1] for i in which])
        unique, inverse = torch.unique(keys, return_inverse=True)
        seeds[ntype] = unique & ((1 << SUBGRAPH_SHIFT) - 1) if disjoint else unique
        subgraphs[ntype] = unique >> SUBGRAPH_SHIFT
        for i, piece in zip(which, inverse.split([ends[i][1].numel() for i in which])):
            local[i] = piece
    return seeds, torch.cat(local), subgraphs if disjoint else None
