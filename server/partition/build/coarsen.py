"""Multilevel partitioning of a weighted graph that fits in memory, and the label propagation steps it
shares with the streamed first level of :mod:`graphfeed.server.partition.build.fennel`.

After Meyerhenke, Sanders and Schulz ("Partitioning complex networks via size-constrained
clustering", SEA 2014): size-constrained label propagation gathers nodes into clusters of at most
``cap`` fine nodes, contraction turns the clusters into the nodes of a coarser graph (edge weights:
the fine edges between two clusters), and this repeats until the graph is small; a restreamed
Fennel pass (Tsourakakis et al., WSDM 2014) partitions the coarsest graph, and on the way back every
level is refined by balanced label propagation (a node moves to the part holding most of its edge
weight when that part has room).  A streaming pass that places single nodes cannot move a whole
cluster; moving a coarse node moves one, which is what closes most of the gap to METIS on real
graphs (Cora: 3.2x METIS's cut before, see ``docs/partition-scale.md``).

Balance: a node's weight is a vector, its fine nodes in each balance group (``[C, G]``); a part
may hold at most ``caps[g]`` of group ``g``.  Moves and placements keep every part within its caps
where the clusters allow it; :func:`rebalance` restores them where an early level could not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

GAMMA = 1.5                # Fennel's exponent
CLUSTER_FRACTION = 16      # a cluster holds at most 1/16 of a part's share of the nodes: clusters pack into parts
COARSEST_PER_PART = 30     # stop coarsening at this many nodes per part ...
MIN_SHRINK = 0.9           # ... or when a level keeps more than 90% of the nodes
CLUSTER_ROUNDS = 6         # label propagation rounds per coarsening level (in memory)
REFINE_ROUNDS = 8          # refinement rounds per level (each stops early when nothing moves)
INITIAL_TRIALS = 8         # Fennel placements of the coarsest graph; the best cut that keeps the caps wins
TRIAL_NODES = 40_000       # fewer trials when the coarsest graph has more nodes than this (one at a time)
INITIAL_PASSES = 3         # passes of each (a first placement and restreams)
LEVEL_TRIES = 6            # multilevel partitions of the streamed clusters' graph; the best cut wins ...
TRIES_ENTRIES = 1 << 21    # ... fewer on a coarse graph of more entries than this / LEVEL_TRIES (each try is a whole
                           # multilevel run in memory)

Log = Callable[[str], None]


@dataclass
class Weighted:
    """A graph in memory: CSR neighbour lists holding both directions of every edge, weighted."""

    indptr: np.ndarray        # int64 [C + 1]
    nbrs: np.ndarray          # int64 [M]
    weights: np.ndarray       # int64 [M]: the fine edges (one per direction) each entry stands for
    node_weights: np.ndarray  # int64 [C, G]: the fine nodes of each balance group each node stands for

    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    def entries(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, position)`` of every neighbour entry of ``nodes`` (row: index into ``nodes``)."""
        starts, degree = self.indptr[nodes], np.diff(self.indptr)[nodes]
        row = np.repeat(np.arange(nodes.size), degree)
        return row, np.arange(row.size) - np.repeat(np.cumsum(degree) - degree, degree) + np.repeat(starts, degree)


# ----------------------------------------------------------------------------- clustering

def relabel_batch(rows: np.ndarray, nbr_labels: np.ndarray, weights: np.ndarray | None, own: np.ndarray,
                  node_size: np.ndarray, sizes: np.ndarray, cap: int, rng) -> np.ndarray:
    """Size-constrained label propagation for one batch of nodes: each takes the label (cluster) holding most of
    its edge weight among those with room for it (``sizes[label] + node_size <= cap``; ties: its own label, then
    at random).  ``rows`` [entries] indexes the batch, ``nbr_labels`` the neighbours' labels, ``own`` the batch's
    labels.  Updates ``sizes`` (total weight per label) and returns the batch's new labels; joins that would
    overfill a cluster together are refused in batch order."""
    if rows.size == 0:
        return own.copy()
    space = sizes.size
    key = rows.astype(np.int64) * space + nbr_labels
    uniq, inverse = np.unique(key, return_inverse=True)
    conn = np.bincount(inverse, weights=weights, minlength=uniq.size)
    row, label = uniq // space, uniq % space
    mine = label == own[row]
    fits = mine | (sizes[label] + node_size[row] <= cap)
    score = np.where(fits, conn + rng.random(uniq.size) * 0.5 + mine * 0.5, -np.inf)
    order = np.lexsort((-score, row))
    first = order[np.r_[True, row[order][1:] != row[order][:-1]]]
    first = first[np.isfinite(score[first])]
    choice = own.copy()
    choice[row[first]] = label[first]
    moving = np.flatnonzero(choice != own)
    if moving.size:
        moving = moving[np.argsort(choice[moving], kind="stable")]
        target, w = choice[moving], node_size[moving]
        within = np.cumsum(w)
        starts = np.r_[True, target[1:] != target[:-1]]
        within -= np.repeat((within - w)[starts], np.diff(np.r_[np.flatnonzero(starts), target.size]))
        refused = moving[sizes[target] + within > cap]
        choice[refused] = own[refused]
        moved = moving[sizes[target] + within <= cap]
        np.subtract.at(sizes, own[moved], node_size[moved])
        np.add.at(sizes, choice[moved], node_size[moved])
    return choice


def dense_labels(labels: np.ndarray, sizes: np.ndarray) -> int:
    """Renumber ``labels`` (in place) to ``0..C-1`` in order of the label values; returns C.  ``sizes``
    (weight per label, > 0 exactly for the labels in use) is overwritten with the new numbers."""
    used = sizes > 0
    count = int(np.count_nonzero(used))
    np.cumsum(used, out=sizes)
    sizes -= 1
    step = 1 << 22
    for a in range(0, labels.size, step):
        labels[a:a + step] = sizes[labels[a:a + step]]
    return count


def cluster(graph: Weighted, cap: int, rng, rounds: int = CLUSTER_ROUNDS) -> tuple[np.ndarray, int]:
    """``(labels, C)``: clusters of at most ``cap`` fine nodes, numbered ``0..C-1``."""
    n = graph.num_nodes
    labels = np.arange(n, dtype=np.int64)
    node_size = graph.node_weights.sum(axis=1)
    sizes = node_size.copy()
    batch = cluster_batch(n)
    for _ in range(rounds):
        changed = 0
        for nodes in np.array_split(rng.permutation(n), max(1, n // batch)):
            row, pos = graph.entries(nodes)
            new = relabel_batch(row, labels[graph.nbrs[pos]], graph.weights[pos], labels[nodes], node_size[nodes],
                                sizes, cap, rng)
            changed += int(np.count_nonzero(new != labels[nodes]))
            labels[nodes] = new
        if changed <= n // 1000:
            break
    return labels, dense_labels(labels, sizes)


def cluster_batch(n: int) -> int:
    """Nodes moved together (vectorised) in a graph of ``n``: they do not see each other's moves, so few of them."""
    return int(np.clip(n // 256, 8, 4096))


# ----------------------------------------------------------------------------- contraction

def coarse_entries(src_labels: np.ndarray, dst_labels: np.ndarray, weights: np.ndarray | None,
                   num_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, weights)`` of the coarse graph's entries from fine entries: key ``a * C + b`` per distinct pair
    of different clusters, summed weights."""
    keep = src_labels != dst_labels
    key = src_labels[keep].astype(np.int64) * num_clusters + dst_labels[keep]
    uniq, inverse = np.unique(key, return_inverse=True)
    w = np.bincount(inverse, weights=None if weights is None else weights[keep], minlength=uniq.size)
    return uniq, w.astype(np.int64)


def merge_entries(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([p[0] for p in pieces]) if pieces else np.empty(0, np.int64)
    weights = np.concatenate([p[1] for p in pieces]) if pieces else np.empty(0, np.int64)
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=weights, minlength=uniq.size).astype(np.int64)


def from_entries(keys: np.ndarray, weights: np.ndarray, node_weights: np.ndarray) -> Weighted:
    """The coarse graph of merged (sorted, distinct) entries."""
    c = node_weights.shape[0]
    indptr = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // max(c, 1), minlength=c), out=indptr[1:])
    return Weighted(indptr, keys % max(c, 1), weights, node_weights)


def contract(graph: Weighted, labels: np.ndarray, num_clusters: int) -> Weighted:
    src = np.repeat(labels, np.diff(graph.indptr))
    keys, weights = coarse_entries(src, labels[graph.nbrs], graph.weights, num_clusters)
    node_weights = np.stack([np.bincount(labels, weights=graph.node_weights[:, g], minlength=num_clusters)
                             for g in range(graph.node_weights.shape[1])], axis=1).astype(np.int64)
    return from_entries(keys, weights, node_weights)


# ----------------------------------------------------------------------------- the levels

def partition_levels(graph: Weighted, caps: np.ndarray, num_parts: int, cap: int, rng, log: Log) -> np.ndarray:
    """Every node's part (int64 [C]): coarsen ``graph`` (clusters of at most ``cap``), place the coarsest,
    refine every level on the way back."""
    levels: list[tuple[Weighted, np.ndarray]] = []
    while graph.num_nodes > COARSEST_PER_PART * num_parts:
        labels, count = cluster(graph, cap, rng)
        if count > MIN_SHRINK * graph.num_nodes:
            break
        levels.append((graph, labels))
        graph = contract(graph, labels, count)
    log(f"fennel: {len(levels) + 1} level(s) in memory, the coarsest {graph.num_nodes:,} nodes, "
        f"{graph.nbrs.size:,} entries")
    parts = initial_parts(graph, caps, num_parts, rng)
    for fine, labels in [(graph, None), *reversed(levels)]:
        if labels is not None:
            parts = parts[labels]
        loads = part_loads(fine, parts, num_parts)
        rebalance(fine, parts, loads, caps, rng)
        refine(fine, parts, loads, caps, rng)
    return parts


def best_of_levels(graph: Weighted, caps: np.ndarray, num_parts: int, cap: int, rng, log: Log) -> np.ndarray:
    """The best of :func:`partition_levels` run ``LEVEL_TRIES`` times (fewer on a large coarse graph): fewest cut
    edges among those within the caps (the least overfull if none is).  Each try clusters the coarse levels
    anew, so one poor early cluster does not decide the cut: on cora_ml, 8 parts, one try cut 1.20x METIS's
    edges, the best of six 1.09x (dblp: 1.11x and 1.01x)."""
    tries = int(np.clip(TRIES_ENTRIES // max(graph.nbrs.size, 1), 1, LEVEL_TRIES))
    best, best_key = None, None
    for t in range(tries):
        parts = partition_levels(graph, caps, num_parts, cap, rng, log if t == 0 else lambda message: None)
        loads = part_loads(graph, parts, num_parts)
        key = (int(np.maximum(loads - caps[:, None], 0).sum()), cut_weight(graph, parts))
        if best_key is None or key < best_key:
            best, best_key = parts, key
    assert best is not None and best_key is not None
    log(f"fennel: the best of {tries} multilevel tries cuts {best_key[1] // 2:,} edges of the coarse graph")
    return best


def part_loads(graph: Weighted, parts: np.ndarray, num_parts: int) -> np.ndarray:
    """``[G, k]``: each part's fine nodes of each balance group."""
    return np.stack([np.bincount(parts, weights=graph.node_weights[:, g], minlength=num_parts)
                     for g in range(graph.node_weights.shape[1])]).astype(np.int64)


def cut_weight(graph: Weighted, parts: np.ndarray) -> int:
    own = np.repeat(parts, np.diff(graph.indptr))
    return int(graph.weights[own != parts[graph.nbrs]].sum())


def initial_parts(graph: Weighted, caps: np.ndarray, num_parts: int, rng) -> np.ndarray:
    """The best of :data:`INITIAL_TRIALS` restreamed Fennel placements, each refined: fewest cut edges among
    those within the caps (the least overfull if none is)."""
    best, best_key = None, None
    for _ in range(int(np.clip(TRIAL_NODES // max(graph.num_nodes, 1), 1, INITIAL_TRIALS))):
        parts = fennel_place(graph, caps, num_parts, rng)
        loads = part_loads(graph, parts, num_parts)
        rebalance(graph, parts, loads, caps, rng)
        refine(graph, parts, loads, caps, rng)
        key = (int(np.maximum(loads - caps[:, None], 0).sum()), cut_weight(graph, parts))
        if best_key is None or key < best_key:
            best, best_key = parts, key
    assert best is not None
    return best


def fennel_place(graph: Weighted, caps: np.ndarray, num_parts: int, rng) -> np.ndarray:
    """Fennel, one node after the other (heaviest first, ties at random), then restreamed: each node to the
    part maximising its edge weight there minus ``alpha * gamma * load ** (gamma - 1)`` times its weight,
    among the parts with room for it (else the one it overfills least)."""
    n, k = graph.num_nodes, num_parts
    size = graph.node_weights.sum(axis=1)
    total = max(int(size.sum()), 1)
    alpha = math.sqrt(k) * (graph.weights.sum() / 2) / total ** GAMMA
    order = np.lexsort((rng.random(n), -size))
    parts = np.full(n, -1, dtype=np.int64)
    loads = np.zeros((graph.node_weights.shape[1], k), dtype=np.int64)
    for p in range(INITIAL_PASSES):
        for v in order:
            lo, hi = graph.indptr[v], graph.indptr[v + 1]
            if parts[v] >= 0:
                loads[:, parts[v]] -= graph.node_weights[v]
            nbr_parts = parts[graph.nbrs[lo:hi]]
            seen = nbr_parts >= 0
            conn = np.bincount(nbr_parts[seen], weights=graph.weights[lo:hi][seen], minlength=k)
            over = (loads + graph.node_weights[v][:, None] - caps[:, None]).max(axis=0)
            penalty = alpha * GAMMA * np.sqrt(loads.sum(axis=0)) * size[v] if p == 0 else 0.0
            score = conn - penalty + rng.random(k) * 1e-3
            choice = int(np.argmax(np.where(over <= 0, score, -np.inf))) if (over <= 0).any() \
                else int(np.argmin(over))
            parts[v] = choice
            loads[:, choice] += graph.node_weights[v]
    return parts


# ----------------------------------------------------------------------------- refinement

def refine(graph: Weighted, parts: np.ndarray, loads: np.ndarray, caps: np.ndarray, rng,
           rounds: int = REFINE_ROUNDS) -> int:
    """Balanced label propagation (in place on ``parts`` and ``loads``): in random batches, every node with
    more edge weight in another part that has room for it moves there.  Returns the nodes moved."""
    n, k = graph.num_nodes, loads.shape[1]
    total = 0
    for _ in range(rounds):
        moved = 0
        for nodes in np.array_split(rng.permutation(n), max(1, n // cluster_batch(n))):
            conn = _connections(graph, parts, nodes, k)
            own = parts[nodes]
            gain = conn - conn[np.arange(nodes.size), own][:, None] + rng.random(conn.shape) * 0.5
            gain[np.arange(nodes.size), own] = -np.inf
            target = np.argmax(gain, axis=1)
            for i in np.flatnonzero(gain[np.arange(nodes.size), target] >= 1):
                v, q = nodes[i], target[i]
                if np.all(loads[:, q] + graph.node_weights[v] <= caps):
                    loads[:, parts[v]] -= graph.node_weights[v]
                    loads[:, q] += graph.node_weights[v]
                    parts[v] = q
                    moved += 1
        total += moved
        if moved == 0:
            break
    return total


def rebalance(graph: Weighted, parts: np.ndarray, loads: np.ndarray, caps: np.ndarray, rng) -> int:
    """Move nodes out of parts above a cap (in place), those losing the least edge weight first, into parts with
    room for them.  Returns the nodes moved (some caps may stay exceeded when no node fits anywhere)."""
    k, moved = loads.shape[1], 0
    for g, p in zip(*np.nonzero(loads > caps[:, None])):
        nodes = np.flatnonzero((parts == p) & (graph.node_weights[:, g] > 0))
        if nodes.size == 0:
            continue
        conn = _connections(graph, parts, nodes, k)
        loss = conn[:, p][:, None] - conn + rng.random(conn.shape) * 0.5
        loss[:, p] = np.inf
        for i in np.argsort(loss.min(axis=1), kind="stable"):
            if loads[g, p] <= caps[g]:
                break
            v = nodes[i]
            for q in np.argsort(loss[i], kind="stable")[:-1]:
                if np.all(loads[:, q] + graph.node_weights[v] <= caps):
                    loads[:, p] -= graph.node_weights[v]
                    loads[:, q] += graph.node_weights[v]
                    parts[v] = q
                    moved += 1
                    break
    return moved


def _connections(graph: Weighted, parts: np.ndarray, nodes: np.ndarray, k: int) -> np.ndarray:
    """``[len(nodes), k]``: each node's edge weight into each part."""
    row, pos = graph.entries(nodes)
    flat = row * k + parts[graph.nbrs[pos]]
    return np.bincount(flat, weights=graph.weights[pos], minlength=nodes.size * k).reshape(nodes.size, k)
