"""Streaming node assignment (Fennel, restreamed) for graphs too large for METIS.

Fennel (Tsourakakis et al., WSDM 2014) places nodes one after the other: node v goes to the part p
maximising ``|N(v) in p| - alpha * gamma * |p| ** (gamma - 1)`` (gamma 1.5, alpha
``sqrt(k) * M / N ** 1.5``) among parts with room.  Restreaming (Nishimura and Ugander, KDD 2013)
repeats the pass, each node now seeing every neighbour's latest part, which brings the cut
much closer to METIS's.  Nodes are placed ``batch`` at a time (vectorised; the first pass breaks
ties at random), in node id order over the homogeneous view (all node and edge types, edges taken
in both directions).

Balance as METIS's (:data:`metis.BALANCE_SLACK`): every part holds at most ``(1 + slack)`` times
its share of each group: the label type's training nodes, its other nodes, and each other node type.

Memory: the neighbour lists are bucketed through the scratch folder into blocks of at most
``plan.sort_edges`` entries (int32 ids), built by chunk tasks; a pass holds one block, the parts
(int16 [N]) and the group of every node (int8 [N]).
"""
from __future__ import annotations

import math
import shutil

import numpy as np

from graphfeed.server.partition.metis import BALANCE_SLACK
from graphfeed.server.partition.scratch import (
    count_ids,
    edge_chunks,
    id_dtype,
    mark_done,
    parts_dtype,
    plan_buckets,
    save_atomic,
    stable_order,
    write_json_atomic,
)

GAMMA = 1.5
RESTREAM_ALPHA = 0.0   # restreaming passes: alpha times this (0: plain majority; the caps keep the balance)
MIN_BATCH = 8          # nodes placed together (vectorised); they do not see each other's new parts
REFINE_ROUNDS = 4      # balanced refinement rounds after the passes (each one pass over the neighbour lists)


def fennel_parts(job, runner, report) -> np.ndarray:
    """Every node's part (homogeneous view, int16/int32 [N]) after ``job.plan.fennel_passes`` passes."""

    graph, plan = job.graph, job.plan
    n = graph.num_nodes
    tasks = [(etype, a, b) for etype in graph.edge_types for a, b in _chunks(job, etype)]
    degrees = np.zeros(n, dtype=np.int32)

    def combine(result) -> None:
        ids, counts = result
        degrees[ids] += counts

    runner.map(_degree_task, job, tasks, "fennel: counting neighbours", combine)
    blocks = [(b[1], b[2]) for b in plan_buckets(degrees, [0, n], plan.sort_edges)]
    entries = int(degrees.sum(dtype=np.int64))
    degrees.resize(0, refcheck=False)   # its memory back: the passes hold parts instead
    write_json_atomic(job.root / "fennel_blocks.json", {"starts": [b[0] for b in blocks], "blocks": blocks})
    runner.map(_bucket_task, job, tasks, "fennel: bucketing neighbours")
    runner.map(_build_task, job, list(range(len(blocks))), "fennel: building neighbour lists")
    groups, caps = _groups(graph, plan.num_parts)
    parts = np.full(n, -1, dtype=parts_dtype(plan.num_parts))
    alpha = math.sqrt(plan.num_parts) * (entries / 2) / max(n, 1) ** GAMMA
    rng = np.random.default_rng(plan.seed)
    state = _State(parts, groups, caps, alpha, plan.num_parts, rng)
    batch = int(np.clip(n // 1000, MIN_BATCH, 1024))
    for p in range(plan.fennel_passes):
        state.alpha = alpha * (1.0 if p == 0 else RESTREAM_ALPHA)
        for b, (lo, hi) in enumerate(report.progress(blocks, f"fennel: pass {p + 1} of {plan.fennel_passes}")):
            indptr = np.load(_adjacency(job, b, "indptr"))
            nbrs = np.load(_adjacency(job, b, "nbrs"))
            for s in range(lo, hi, batch):
                e = min(s + batch, hi)
                state.place(s, e, nbrs[indptr[s - lo]:indptr[e - lo]], np.diff(indptr[s - lo:e - lo + 1]))
        report.log(f"fennel: pass {p + 1}: {state.cut_estimate(job, blocks):,} of {entries // 2:,} edges cut")
    best, best_cut = parts.copy(), state.cut_estimate(job, blocks)
    for r in range(REFINE_ROUNDS):
        moved = state.refine(job, blocks, r)
        cut = state.cut_estimate(job, blocks)
        report.log(f"fennel: refinement {r + 1}: {moved:,} nodes moved, {cut:,} edges cut")
        if cut < best_cut:
            best[:], best_cut = parts, cut
        if moved == 0 or cut >= best_cut * 0.999 and cut != best_cut:
            break
    shutil.rmtree(job.root / "fennel", ignore_errors=True)
    return best


def _chunks(job, etype):
    return edge_chunks(job, etype)


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
    return count_ids(np.concatenate([u, v]), job.graph.num_nodes)


def _bucket_task(job, task) -> int:
    etype, a, b = task
    marker = job.done(f"fennel.bucket.{'__'.join(etype)}", a)
    if marker.exists():
        return 0
    u, v = _ends(job, etype, a, b)
    key, nbr = np.concatenate([u, v]), np.concatenate([v, u]).astype(id_dtype(job.graph.num_nodes))
    del u, v
    starts = np.asarray(job.table("fennel_blocks")["starts"], dtype=np.int64)
    block = np.searchsorted(starts, key, side="right") - 1
    order = stable_order(block, starts.size)
    counts = np.bincount(block, minlength=starts.size)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    tag = f"{'__'.join(etype)}.{a:012d}"
    for blk in np.flatnonzero(counts):
        sel = order[offsets[blk]:offsets[blk + 1]]
        folder = job.root / "fennel" / f"{blk:06d}"
        save_atomic(folder / f"{tag}.key.npy", (key[sel] - starts[blk]).astype(np.int32))
        save_atomic(folder / f"{tag}.nbr.npy", nbr[sel])
    mark_done(marker)
    return int(key.size)


def _build_task(job, block: int) -> int:
    """Block ``block``'s neighbour lists as ``indptr`` (local) and ``nbrs`` files."""
    if _adjacency(job, block, "nbrs").is_file():
        return 0
    lo, hi = job.table("fennel_blocks")["blocks"][block]
    folder = job.root / "fennel" / f"{block:06d}"
    keys = sorted(folder.glob("*.key.npy")) if folder.is_dir() else []
    key = np.concatenate([np.load(p) for p in keys]) if keys else np.empty(0, np.int32)
    nbr = np.concatenate([np.load(p.with_name(p.name.replace(".key.", ".nbr."))) for p in keys]) if keys else \
        np.empty(0, np.int32)
    order = stable_order(key, hi - lo)
    indptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=hi - lo), out=indptr[1:])
    save_atomic(_adjacency(job, block, "indptr"), indptr)
    save_atomic(_adjacency(job, block, "nbrs"), nbr[order])
    shutil.rmtree(folder, ignore_errors=True)
    return int(key.size)


def _groups(graph, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """Each node's balance group (int8 [N]) and each group's capacity per part."""
    offsets, n = graph.node_offsets(), graph.num_nodes
    groups = np.empty(n, dtype=np.int8)
    for i, (ntype, t) in enumerate(graph.nodes.items()):
        groups[offsets[ntype]:offsets[ntype] + t.num_nodes] = i
    train = offsets[graph.label_type] + np.asarray(graph.splits.get("train", np.empty(0)), dtype=np.int64)
    groups[train] = len(graph.nodes)
    sizes = np.bincount(groups, minlength=len(graph.nodes) + 1)
    caps = np.ceil(sizes / num_parts * (1 + BALANCE_SLACK)).astype(np.int64) + 1
    return groups, caps


class _State:
    """The assignment under way: parts, per-group part sizes, Fennel's penalty."""

    def __init__(self, parts, groups, caps, alpha: float, num_parts: int, rng):
        self.parts, self.groups, self.caps, self.alpha, self.k, self.rng = parts, groups, caps, alpha, num_parts, rng
        self.group_sizes = np.zeros((caps.size, num_parts), dtype=np.int64)
        self.sizes = np.zeros(num_parts, dtype=np.int64)

    def place(self, s: int, e: int, nbrs: np.ndarray, degree: np.ndarray) -> None:
        """(Re)place nodes ``[s, e)`` whose neighbour lists are ``nbrs`` (``degree`` entries each)."""
        k, m = self.k, e - s
        old = self.parts[s:e].astype(np.int64)
        g = self.groups[s:e].astype(np.int64)
        placed = old >= 0
        np.subtract.at(self.group_sizes, (g[placed], old[placed]), 1)
        self.sizes -= np.bincount(old[placed], minlength=k)
        nbr_parts = self.parts[nbrs].astype(np.int64)
        rows = np.repeat(np.arange(m), degree)
        seen = nbr_parts >= 0
        counts = np.bincount(rows[seen] * k + nbr_parts[seen], minlength=m * k).reshape(m, k).astype(np.float64)
        score = counts - self.alpha * GAMMA * np.sqrt(self.sizes)[None, :]
        score += self.rng.random((m, k)) * 1e-3          # ties at random (early first-pass nodes see no one)
        choice = self._within_caps(score, g)
        np.add.at(self.group_sizes, (g, choice), 1)
        self.sizes += np.bincount(choice, minlength=k)
        self.parts[s:e] = choice

    def _within_caps(self, score: np.ndarray, g: np.ndarray) -> np.ndarray:
        room = self.caps[:, None] - self.group_sizes            # [groups, k]
        score[room[g] <= 0] = -np.inf
        for _ in range(self.k + 1):
            choice = np.argmax(score, axis=1)
            over = False
            for grp in np.unique(g):
                mine = np.flatnonzero(g == grp)
                taken = np.bincount(choice[mine], minlength=self.k)
                for p in np.flatnonzero(taken > room[grp]):
                    losers = mine[choice[mine] == p][max(int(room[grp, p]), 0):]
                    score[losers, p] = -np.inf
                    over = True
            if not over:
                return choice
        return np.argmax(score, axis=1)

    def refine(self, job, blocks, round_: int) -> int:
        """One round of balanced refinement: every node's best part by neighbour count (gain over its own),
        then, per pair of parts and balance group, the best-gain moves each way, swapped in pairs plus as
        many one-way moves as the receiving part has room for.  Returns the nodes moved."""
        n, k = self.parts.size, self.k
        gain = np.zeros(n, dtype=np.int32)
        target = np.zeros(n, dtype=self.parts.dtype)
        step = max(1, (1 << 22) // k)
        for b, (lo, hi) in enumerate(blocks):
            indptr, nbrs = np.load(_adjacency(job, b, "indptr")), np.load(_adjacency(job, b, "nbrs"))
            for s in range(lo, hi, step):
                e = min(s + step, hi)
                deg = np.diff(indptr[s - lo:e - lo + 1])
                rows = np.repeat(np.arange(e - s), deg)
                flat = rows * k + self.parts[nbrs[indptr[s - lo]:indptr[e - lo]]].astype(np.int64)
                counts = np.bincount(flat, minlength=(e - s) * k).reshape(e - s, k)
                own = self.parts[s:e].astype(np.int64)
                best = np.argmax(counts + self.rng.random(counts.shape) * 0.5, axis=1)
                gain[s:e] = counts[np.arange(e - s), best] - counts[np.arange(e - s), own]
                target[s:e] = best
        movers = np.flatnonzero((gain > 0) & ((np.arange(n) + round_) % 2 == 0))   # half at a time: fewer
        moved = 0                                                                 # neighbours move together
        for grp in range(self.caps.size):
            mine = movers[self.groups[movers] == grp]
            for p in range(k):
                for q in range(p + 1, k):
                    moved += self._exchange(grp, mine, p, q, gain, target)
        return moved

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

    def cut_estimate(self, job, blocks) -> int:
        """Edges (the neighbour lists hold each edge in both directions, counted once) between parts."""
        cut = 0
        for b, (lo, hi) in enumerate(blocks):
            indptr, nbrs = np.load(_adjacency(job, b, "indptr")), np.load(_adjacency(job, b, "nbrs"))
            own = np.repeat(self.parts[lo:hi], np.diff(indptr))
            cut += int(np.count_nonzero(own != self.parts[nbrs]))
        return cut // 2
