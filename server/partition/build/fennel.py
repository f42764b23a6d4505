"""Streaming node assignment for graphs too large for METIS: multilevel, the first level streamed.

Plain streaming Fennel (Tsourakakis et al., WSDM 2014; restreamed as Nishimura and Ugander, KDD
2013) places single nodes and cannot move a whole community: on Cora it cut 3.2x METIS's edges.  So
the nodes are first gathered into clusters by size-constrained label propagation over the neighbour
lists streamed from disk (``plan.fennel_passes`` rounds; a cluster holds at most 1/16 of a part's
share of the nodes), the clusters are contracted into a weighted coarse graph that fits in memory
(else the clusters grow fourfold and the rounds go on), and :mod:`coarsen` partitions that graph:
more levels in memory, restreamed Fennel on the coarsest, balanced refinement on the way back, the
best cut of several such tries (:data:`coarsen.LEVEL_TRIES`).  The
coarse parts are projected onto the nodes, and balanced refinement rounds over the streamed lists
finish.  The view is homogeneous (all node and edge types, edges taken in both directions).

Balance as METIS's (:data:`metis.BALANCE_SLACK`): every part holds at most ``(1 + slack)`` times
its share of each group, rounded up (at least one above an even share, so a small group has room to
move): the label type's training nodes, its other nodes, and each other node type.  80 training
nodes in 8 parts: at most 11 a part, 1.1x the mean.

Memory: the neighbour lists are bucketed through the scratch folder into blocks of at most
``plan.sort_edges`` entries (int32 ids), built by chunk tasks; a pass holds one block and per-node
tables: while clustering the labels and cluster sizes (int32 [N] each), later the parts (int16
[N]), the best parts so far and the refinement's gains and targets; always each node's group (int8
[N]).  The coarse graph holds at most half a block's entries.
"""
from __future__ import annotations

import shutil

import numpy as np

from graphfeed.server.partition.build import scratch
from graphfeed.server.partition.build.coarsen import (
    CLUSTER_FRACTION,
    Weighted,
    best_of_levels,
    cluster_batch,
    coarse_entries,
    dense_labels,
    from_entries,
    merge_entries,
    relabel_batch,
)
from graphfeed.server.partition.build.metis import BALANCE_SLACK

REFINE_ROUNDS = 4      # balanced refinement rounds over the streamed lists (each one pass, two with the cut)


def fennel_parts(job, runner, report, splits: dict[str, np.ndarray]) -> np.ndarray:
    """Every node's part (homogeneous view, int16/int32 [N]): the first level streamed, the rest in memory.
    ``splits``: the label type's seed splits (the job's graph carries none: it travels to every worker)."""
    graph, plan = job.graph, job.plan
    n, k = graph.num_nodes, plan.num_parts
    tasks = [(etype, a, b) for etype in graph.edge_types for a, b in _chunks(job, etype)]
    degrees = np.zeros(n, dtype=np.int32)

    def combine(result) -> None:
        ids, counts = result
        degrees[ids] += counts

    runner.map(_degree_task, job, tasks, "fennel: counting neighbours", combine)
    blocks = [(b[1], b[2]) for b in scratch.plan_buckets(degrees, [0, n], plan.sort_edges)]
    degrees.resize(0, refcheck=False)   # its memory back: the passes hold labels and parts instead
    scratch.write_json_atomic(job.root / "fennel_blocks.json", {"starts": [b[0] for b in blocks], "blocks": blocks})
    runner.map(_bucket_task, job, tasks, "fennel: bucketing neighbours")
    runner.map(_build_task, job, list(range(len(blocks))), "fennel: building neighbour lists")
    groups, caps = _groups(graph, k, splits)
    rng = np.random.default_rng(plan.seed)
    lists = _Lists(job, blocks)
    parts = _multilevel(lists, groups, caps, k, plan, rng, report)
    best = _refine_fine(_Fine(parts, groups, caps, k, rng), lists, report)
    shutil.rmtree(job.root / "fennel", ignore_errors=True)
    return best


def _multilevel(lists: _Lists, groups: np.ndarray, caps: np.ndarray, k: int, plan, rng, report) -> np.ndarray:
    """Clusters over the streamed lists, partitioned in memory, projected onto the nodes (int16/int32 [N])."""
    n = groups.size
    labels, coarse = _coarsen_streamed(lists, groups, caps, k, plan, rng, report)
    report.log(f"fennel: {n:,} nodes clustered into {coarse.num_nodes:,} (at most {lists.cap:,} nodes each), "
               f"{coarse.nbrs.size // 2:,} pairs of clusters joined by edges")
    coarse_parts = best_of_levels(coarse, caps, k, lists.cap, rng, report.log).astype(scratch.parts_dtype(k))
    del coarse
    parts = np.empty(n, dtype=scratch.parts_dtype(k))
    step = 1 << 22
    for a in range(0, n, step):
        parts[a:a + step] = coarse_parts[labels[a:a + step]]
    return parts


def _refine_fine(state: "_Fine", lists: _Lists, report) -> np.ndarray:
    """Balanced refinement rounds over the streamed lists; the parts with the fewest cut edges seen."""
    if state.overfull():
        report.log(f"fennel: {state.rebalance(lists):,} nodes moved to keep every part within its share")
    best, best_cut = state.parts.copy(), state.cut_estimate(lists)
    report.log(f"fennel: {best_cut:,} edges cut before refinement")
    for r in range(REFINE_ROUNDS):
        moved = state.refine(lists, r)
        cut = state.cut_estimate(lists)
        report.log(f"fennel: refinement {r + 1}: {moved:,} nodes moved, {cut:,} edges cut")
        if cut < best_cut:
            best[:], best_cut = state.parts, cut
        if moved == 0 or cut >= best_cut * 0.999 and cut != best_cut:
            break
    return best


class _Lists:
    """The neighbour lists on disk, a block (node range) at a time."""

    def __init__(self, job, blocks: list[tuple[int, int]]):
        self.job, self.blocks, self.cap = job, blocks, 1

    def __iter__(self):
        for b, (lo, hi) in enumerate(self.blocks):
            yield lo, hi, np.load(_adjacency(self.job, b, "indptr")), np.load(_adjacency(self.job, b, "nbrs"))


def _coarsen_streamed(lists: _Lists, groups: np.ndarray, caps: np.ndarray, k: int, plan, rng,
                      report) -> tuple[np.ndarray, Weighted]:
    """``(labels, coarse graph)``: nodes without neighbours packed into clusters by group, then size-constrained
    label propagation over the streamed lists (``plan.fennel_passes`` rounds), contracted in memory.  While the
    coarse graph would hold more than half a sort bucket of entries, the cluster cap grows fourfold and more
    rounds run; clusters of a part's size that still have too many edges between them are placed by size alone
    (their edges are left to the refinement over the lists)."""
    n = groups.size
    labels = np.arange(n, dtype=scratch.id_dtype(n))
    sizes = np.ones(n, dtype=np.int32)
    lists.cap = max(1, n // (k * CLUSTER_FRACTION))
    budget = max(plan.sort_edges // 2, 1 << 16)
    _pack_isolated(lists, labels, sizes, groups, caps.size)
    while True:
        for r in range(plan.fennel_passes):
            changed = _cluster_pass(lists, labels, sizes, rng)
            report.log(f"fennel: clustering round {r + 1} (cap {lists.cap:,}): {changed:,} nodes changed cluster")
            if changed <= n // 1000:
                break
        count = dense_labels(labels, sizes)
        coarse = _contract_streamed(lists, labels, groups, caps.size, count, budget)
        if coarse is not None:
            return labels, coarse
        if lists.cap >= n // k:
            report.log(f"fennel: {count:,} clusters with too many edges between them for memory: placed by size")
            empty = np.empty(0, dtype=np.int64)
            return labels, from_entries(empty, empty, _cluster_weights(labels, groups, caps.size, count))
        report.log(f"fennel: {count:,} clusters have too many edges between them for memory: larger clusters")
        sizes[:] = np.bincount(labels, minlength=n)
        lists.cap = min(lists.cap * 4, n // k)


def _pack_isolated(lists: _Lists, labels: np.ndarray, sizes: np.ndarray, groups: np.ndarray, num_groups: int) -> None:
    """Nodes without neighbours (no edge to place them by) into clusters of ``lists.cap`` nodes of one group each, in
    id order: otherwise each would stay a coarse node of its own."""
    leader = np.full(num_groups, -1, dtype=np.int64)
    filled = np.zeros(num_groups, dtype=np.int64)
    for lo, _, indptr, _ in lists:
        alone = lo + np.flatnonzero(np.diff(indptr) == 0)
        for g in range(num_groups):
            ids = alone[groups[alone] == g]
            if ids.size == 0:
                continue
            pos = filled[g] % lists.cap + np.arange(ids.size)
            leaders = ids[pos % lists.cap == 0]
            if pos[0] != 0:
                leaders = np.r_[leader[g], leaders]
            cluster_of = leaders[pos // lists.cap]
            labels[ids] = cluster_of
            sizes[ids] = 0
            np.add.at(sizes, cluster_of, 1)
            leader[g], filled[g] = leaders[-1], filled[g] + ids.size


def _cluster_pass(lists: _Lists, labels: np.ndarray, sizes: np.ndarray, rng) -> int:
    """One label propagation round over the lists, each block's nodes in random batches; returns the changes."""
    changed, batch = 0, cluster_batch(labels.size)
    for lo, hi, indptr, nbrs in lists:
        for nodes in np.array_split(rng.permutation(hi - lo), max(1, (hi - lo) // batch)):
            degree = indptr[nodes + 1] - indptr[nodes]
            rows = np.repeat(np.arange(nodes.size), degree)
            pos = np.arange(rows.size) - np.repeat(np.cumsum(degree) - degree, degree) + np.repeat(indptr[nodes],
                                                                                                  degree)
            own = labels[lo + nodes].astype(np.int64)
            new = relabel_batch(rows, labels[nbrs[pos]].astype(np.int64), None, own,
                                np.ones(nodes.size, dtype=np.int64), sizes, lists.cap, rng)
            changed += int(np.count_nonzero(new != own))
            labels[lo + nodes] = new
    return changed


def _contract_streamed(lists: _Lists, labels: np.ndarray, groups: np.ndarray, num_groups: int, count: int,
                       budget: int) -> Weighted | None:
    """The coarse graph of ``labels`` (``0..count-1``), or None once it holds more than ``budget`` entries."""
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    held = 0
    for lo, hi, indptr, nbrs in lists:
        pieces.append(coarse_entries(np.repeat(labels[lo:hi], np.diff(indptr)), labels[nbrs], None, count))
        held += pieces[-1][0].size
        if held > budget:
            pieces = [merge_entries(pieces)]
            held = pieces[0][0].size
            if held > budget:
                return None
    keys, weights = merge_entries(pieces)
    return from_entries(keys, weights, _cluster_weights(labels, groups, num_groups, count))


def _cluster_weights(labels: np.ndarray, groups: np.ndarray, num_groups: int, count: int) -> np.ndarray:
    """``[count, G]``: each cluster's nodes of each balance group, summed a slice at a time (no [N] temporaries)."""
    out = np.zeros((count, num_groups), dtype=np.int64)
    step = 1 << 22
    for a in range(0, labels.size, step):
        np.add.at(out, (labels[a:a + step], groups[a:a + step]), 1)
    return out


def _chunks(job, etype):
    return scratch.edge_chunks(job, etype)


def _adjacency(job, block: int, name: str):
    return job.root / "fennel" / f"{block:06d}.{name}.npy"


def _ends(job, etype, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Homogeneous-view endpoints of edges ``[a, b)`` of ``etype`` without self loops."""
    offsets = job.graph.node_offsets()
    ei = job.graph.read_edges(etype, a, b)
    u, v = ei[0] + offsets[etype[0]], ei[1] + offsets[etype[2]]
    keep = u != v
    return u[keep], v[keep]


def _degree_task(job, task) -> tuple[np.ndarray, np.ndarray]:
    u, v = _ends(job, *task)
    return scratch.count_ids(np.concatenate([u, v]), job.graph.num_nodes)


def _bucket_task(job, task) -> int:
    etype, a, b = task
    marker = job.done(f"fennel.bucket.{'__'.join(etype)}", a)
    if marker.exists():
        return 0
    u, v = _ends(job, etype, a, b)
    ids = scratch.id_dtype(job.graph.num_nodes)
    key, nbr = np.concatenate([u, v]).astype(ids), np.concatenate([v, u]).astype(ids)
    del u, v
    starts = np.asarray(job.table("fennel_blocks")["starts"], dtype=np.int64)
    scratch.save_by_bucket(starts, key, {"key": key, "nbr": nbr}, lambda blk: job.root / "fennel" / f"{blk:06d}",
                   f"{'__'.join(etype)}-{a:012d}")
    scratch.mark_done(marker)
    return int(key.size)


def _build_task(job, block: int) -> int:
    """Block ``block``'s neighbour lists as ``indptr`` (local) and ``nbrs`` files."""
    if _adjacency(job, block, "nbrs").is_file():
        return 0
    lo, hi = job.table("fennel_blocks")["blocks"][block]
    folder = job.root / "fennel" / f"{block:06d}"
    columns = scratch.load_bucket(folder)
    key = np.subtract(columns.get("key", np.empty(0, np.int64)), lo, dtype=np.int64)
    nbr = columns.get("nbr", np.empty(0, np.int32))
    order = scratch.stable_order(key, hi - lo)
    indptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=hi - lo), out=indptr[1:])
    scratch.save_atomic(_adjacency(job, block, "indptr"), indptr)
    scratch.save_atomic(_adjacency(job, block, "nbrs"), nbr[order])
    shutil.rmtree(folder, ignore_errors=True)
    return int(key.size)


def _groups(graph, num_parts: int, splits: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each node's balance group (int8 [N]) and each group's capacity per part."""
    offsets, n = graph.node_offsets(), graph.num_nodes
    groups = np.empty(n, dtype=np.int8)
    for i, (ntype, t) in enumerate(graph.nodes.items()):
        groups[offsets[ntype]:offsets[ntype] + t.num_nodes] = i
    train = offsets[graph.label_type] + np.asarray(splits.get("train", np.empty(0)), dtype=np.int64)
    groups[train] = len(graph.nodes)
    share = np.bincount(groups, minlength=len(graph.nodes) + 1) / num_parts
    caps = np.maximum(np.ceil(share * (1 + BALANCE_SLACK)), np.ceil(share) + 1).astype(np.int64)
    return groups, caps


class _Fine:
    """The assignment of the fine nodes: balanced refinement over the streamed lists."""

    def __init__(self, parts, groups, caps, num_parts: int, rng):
        self.parts, self.groups, self.caps, self.k, self.rng = parts, groups, caps, num_parts, rng
        self.group_sizes = np.zeros((caps.size, num_parts), dtype=np.int64)
        for g in range(caps.size):
            self.group_sizes[g] = np.bincount(parts[groups == g], minlength=num_parts)
        self.sizes = self.group_sizes.sum(axis=0)

    def overfull(self) -> bool:
        return bool((self.group_sizes > self.caps[:, None]).any())

    def _best_parts(self, lists: _Lists, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every node's ``(gain, target)``: the part (among ``allowed[group, part]``, default all) holding most of
        its neighbours, and how many more than its own part holds (int32, int16/int32 [N])."""
        n, k = self.parts.size, self.k
        gain = np.zeros(n, dtype=np.int32)
        target = np.zeros(n, dtype=self.parts.dtype)
        step = max(1, (1 << 22) // k)
        for lo, hi, indptr, nbrs in lists:
            for s in range(lo, hi, step):
                e = min(s + step, hi)
                deg = np.diff(indptr[s - lo:e - lo + 1])
                rows = np.repeat(np.arange(e - s), deg)
                flat = rows * k + self.parts[nbrs[indptr[s - lo]:indptr[e - lo]]].astype(np.int64)
                counts = np.bincount(flat, minlength=(e - s) * k).reshape(e - s, k)
                own = self.parts[s:e].astype(np.int64)
                score = counts + self.rng.random(counts.shape) * 0.5
                if allowed is not None:
                    score[~allowed[self.groups[s:e]]] = -np.inf
                    score[np.arange(e - s), own] = -np.inf
                best = np.argmax(score, axis=1)
                gain[s:e] = counts[np.arange(e - s), best] - counts[np.arange(e - s), own]
                target[s:e] = best
        return gain, target

    def refine(self, lists: _Lists, round_: int) -> int:
        """One round of balanced refinement: every node's best part by neighbour count (gain over its own),
        then, per pair of parts and balance group, the best-gain moves each way, swapped in pairs plus as
        many one-way moves as the receiving part has room for.  Returns the nodes moved."""
        n, k = self.parts.size, self.k
        gain, target = self._best_parts(lists)
        movers = np.flatnonzero((gain > 0) & ((np.arange(n) + round_) % 2 == 0))   # half at a time: fewer
        moved = 0                                                                 # neighbours move together
        for grp in range(self.caps.size):
            mine = movers[self.groups[movers] == grp]
            for p in range(k):
                for q in range(p + 1, k):
                    moved += self._exchange(grp, mine, p, q, gain, target)
        return moved

    def rebalance(self, lists: _Lists) -> int:
        """Move the nodes losing fewest neighbours out of every part above a cap into parts with room (one pass
        over the lists; the coarse levels normally leave nothing to do).  Returns the nodes moved."""
        room = self.caps[:, None] - self.group_sizes
        gain, target = self._best_parts(lists, allowed=room > 0)
        moved = 0
        for grp, p in zip(*np.nonzero(room < 0)):
            mine = np.flatnonzero((self.groups == grp) & (self.parts == p))
            for v in mine[np.argsort(-gain[mine], kind="stable")]:
                if self.group_sizes[grp, p] <= self.caps[grp]:
                    break
                q = int(target[v])
                if q != p and self.group_sizes[grp, q] < self.caps[grp]:
                    self._move(v, grp, p, q)
                    moved += 1
        return moved

    def _move(self, v: int, grp: int, p: int, q: int) -> None:
        self.parts[v] = q
        self.group_sizes[grp, p] -= 1
        self.group_sizes[grp, q] += 1
        self.sizes[p] -= 1
        self.sizes[q] += 1

    def _exchange(self, grp: int, mine: np.ndarray, p: int, q: int, gain: np.ndarray, target: np.ndarray) -> int:
        ab = mine[(self.parts[mine] == p) & (target[mine] == q)]
        ba = mine[(self.parts[mine] == q) & (target[mine] == p)]
        ab, ba = ab[np.argsort(-gain[ab], kind="stable")], ba[np.argsort(-gain[ba], kind="stable")]
        swaps = min(ab.size, ba.size)
        room_q = int(self.caps[grp] - self.group_sizes[grp, q])
        room_p = int(self.caps[grp] - self.group_sizes[grp, p])
        n_ab = swaps + max(0, min(ab.size - swaps, room_q))
        n_ba = swaps + max(0, min(ba.size - swaps, room_p))
        self.parts[ab[:n_ab]], self.parts[ba[:n_ba]] = q, p
        self.group_sizes[grp, p] += n_ba - n_ab
        self.group_sizes[grp, q] += n_ab - n_ba
        self.sizes[p] += n_ba - n_ab
        self.sizes[q] += n_ab - n_ba
        return n_ab + n_ba

    def cut_estimate(self, lists: _Lists) -> int:
        """Edges (the neighbour lists hold each edge in both directions, counted once) between parts."""
        cut = 0
        for lo, hi, indptr, nbrs in lists:
            own = np.repeat(self.parts[lo:hi], np.diff(indptr))
            cut += int(np.count_nonzero(own != self.parts[nbrs]))
        return cut // 2
