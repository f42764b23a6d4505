"""Building a partition folder from an in-memory graph: assign, renumber, write atomically.

Typed graphs and homogeneous ones (the one-type case) take the same path: parts are assigned
over the homogeneous view (every node type stacked), then each node type is renumbered and
each edge type written on its own.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from graphfeed.core.columns import INPUT_COLUMNS, QUANTIZABLE
from graphfeed.core.process import pid_alive
from graphfeed.server.partition.build.metis import metis_parts, symmetric_adjacency
from graphfeed.server.partition.format.hard_negatives import write_hard_negatives
from graphfeed.server.partition.format.layout import (
    LINK_SPLITS,
    META_FILE,
    TOPOLOGIES,
    PartitionMeta,
    PartitionPaths,
    edge_type_dirname,
    save_array,
    write_meta,
)
from graphfeed.server.partition.format.quantize import column_range, is_quantizable, scales_of_range, write_scales
from graphfeed.server.partition.inputs.graph import EdgeType, EdgeTypeInput, GraphInput, NodeTypeInput

__all__ = ["GraphInput", "NodeTypeInput", "EdgeTypeInput", "METHODS", "assign_parts", "edge_cut",
           "graph_edge_cut", "partition_graph", "symmetric_adjacency", "whole_topology", "write_partitions"]

# hotness: METIS balancing each part's pre-sampled access count (the caller counts them) instead of nodes
METHODS = ("random", "metis", "hotness")
# progress(iterable, description) -> iterable (e.g. a tqdm bar); log(message) for steps without a loop.
Progress = Callable[[Iterable, str], Iterable]
Log = Callable[[str], None]
_EDGE_CHUNK = 1 << 24  # edges per chunk in whole-edge-list passes: bounds temporaries to ~130 MB
_PACK_BITS = 63        # bits of a packed (node, neighbor, edge id) sort key (lowered in tests)


def _no_progress(iterable, desc):
    return iterable


def _no_log(message):
    pass


def assign_parts(graph: GraphInput, num_parts: int, method: str, seed: int = 0,
                 node_weights: np.ndarray | None = None) -> np.ndarray:
    """Part of every node of the homogeneous view (int64 [N], node types stacked in ``graph.node_types``
    order, see :meth:`GraphInput.node_offsets`); deterministic for a given ``seed``.  ``hotness`` needs
    ``node_weights`` (each node's access count, int [N]): METIS balances them as one more constraint."""
    if method == "random":
        return _random_parts(graph, num_parts, seed)
    if method == "metis":
        return metis_parts(graph, num_parts, seed)
    if method == "hotness":
        _check_node_weights(graph, node_weights)
        return metis_parts(graph, num_parts, seed, node_weights=node_weights)
    raise ValueError(f"unknown partition method {method!r}: use one of {', '.join(METHODS)}")


def _check_node_weights(graph: GraphInput, node_weights: np.ndarray | None) -> None:
    if not graph.is_homogeneous:
        raise ValueError("--method hotness needs a homogeneous graph (typed graphs: use --method metis)")
    if node_weights is None or np.shape(node_weights) != (graph.num_nodes,):
        raise ValueError(f"--method hotness needs one access count per node ({graph.num_nodes}), got "
                         f"{None if node_weights is None else np.shape(node_weights)}")
    if np.asarray(node_weights).min(initial=0) < 0:
        raise ValueError("--method hotness: access counts must be >= 0")


def whole_topology(graph: GraphInput, kind: str = "csc") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, indices, eid)`` (int64) of a homogeneous graph's every node in its input ids: one part
    holding the whole graph, as the writer stores it (CSC: in-edges; CSR: out-edges)."""
    src, dst = graph.edge_index[0], graph.edge_index[1]
    key, other = (dst, src) if kind == "csc" else (src, dst)
    indptr, indices, eid = _compressed(key, other, graph.num_nodes)
    return indptr, indices.astype(np.int64, copy=False), eid


def _random_parts(graph: GraphInput, num_parts: int, seed: int) -> np.ndarray:
    """Every node type dealt round-robin over the parts in a random order (balanced per type)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in graph.nodes.values():
        parts = np.empty(t.num_nodes, dtype=np.int64)
        parts[rng.permutation(t.num_nodes)] = np.arange(t.num_nodes) % num_parts
        out.append(parts)
    return np.concatenate(out)


def edge_cut(edge_index: np.ndarray, parts: np.ndarray, dst_parts: np.ndarray | None = None) -> int:
    """Number of directed edges whose endpoints lie in different parts (``dst_parts``: of the destination
    type's nodes, when it differs from the source type)."""
    dst_parts = parts if dst_parts is None else dst_parts
    cut = 0
    for start in range(0, edge_index.shape[1], _EDGE_CHUNK):
        chunk = edge_index[:, start:start + _EDGE_CHUNK]
        cut += int(np.count_nonzero(parts[chunk[0]] != dst_parts[chunk[1]]))
    return cut


def graph_edge_cut(graph: GraphInput, parts: np.ndarray) -> int:
    """Cut edges over every edge type; ``parts`` as :func:`assign_parts` gives them."""
    of_type = _parts_by_type(graph, parts)
    return sum(edge_cut(e.edge_index, of_type[src], of_type[dst]) for (src, _, dst), e in graph.edges.items())


def _parts_by_type(graph: GraphInput, parts: np.ndarray) -> dict[str, np.ndarray]:
    offsets = graph.node_offsets()
    return {ntype: parts[offsets[ntype]:offsets[ntype] + t.num_nodes] for ntype, t in graph.nodes.items()}


def _renumber(ids: np.ndarray, new_of_orig: np.ndarray) -> np.ndarray:
    """``new_of_orig[ids]`` in chunks, as int32 when ids fit (halves the two E-sized endpoint arrays)."""
    dtype = np.int32 if new_of_orig.size < (1 << 31) else np.int64
    table = new_of_orig.astype(dtype, copy=False)
    out = np.empty(ids.shape, dtype=dtype)
    for start in range(0, ids.size, _EDGE_CHUNK):
        np.take(table, ids[start:start + _EDGE_CHUNK], out=out[start:start + _EDGE_CHUNK])
    return out


def _compressed(key_nodes: np.ndarray, other: np.ndarray, n: int,
                n_other: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges sorted by (key node, other endpoint, edge id): ``(indptr, indices, eid)`` over all ``n`` key nodes.

    ``other`` ids lie in ``[0, n_other)`` (default ``n``: both endpoints of one node type).
    ``indices`` keeps the dtype of ``other`` (the writer widens each part to int64).
    """
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key_nodes, minlength=n), out=indptr[1:])
    eid = _edge_order(key_nodes, other, n, indptr, n if n_other is None else n_other)
    return indptr, other[eid], eid


def _edge_order(key: np.ndarray, other: np.ndarray, n: int, indptr: np.ndarray, n_other: int) -> np.ndarray:
    """Edge ids ordered by (key, other, edge id).

    Packs ``(key - block start) * n_other + other`` above the edge id into one int64 and sorts
    the values (a vectorised sort, ~10x faster than a stable argsort); key nodes are processed
    in blocks small enough for the packed value to fit in 63 bits (one block up to ~1e9 n*E).
    """
    num_edges = key.size
    eid_bits = max(1, int(num_edges - 1).bit_length())
    block = (1 << (_PACK_BITS - eid_bits)) // max(n_other, 1) if eid_bits < _PACK_BITS else 0  # key nodes/block
    if block == 0:   # too large to pack: stable argsort keeps edge ids ascending among ties
        composite = np.multiply(key, n_other, dtype=np.int64)
        composite += other
        return np.argsort(composite, kind="stable")
    mask = (1 << eid_bits) - 1
    if block >= n:
        by_key = None
    else:            # group edge ids by key first (key and edge id always fit together)
        by_key = np.left_shift(key, eid_bits, dtype=np.int64)
        by_key |= np.arange(num_edges, dtype=np.int64)
        by_key.sort()
        by_key &= mask
    out = np.empty(num_edges, dtype=np.int64)
    for a in range(0, n, block):
        lo, hi = int(indptr[a]), int(indptr[min(a + block, n)])
        ids = np.arange(lo, hi, dtype=np.int64) if by_key is None else by_key[lo:hi]
        packed = np.subtract(key[ids], a, dtype=np.int64)
        packed *= n_other
        packed += other[ids]
        packed <<= eid_bits
        packed |= ids
        packed.sort()
        np.bitwise_and(packed, mask, out=out[lo:hi])
    return out


@dataclass(frozen=True)
class _Numbering:
    """One node type's new ids: ``order[new] = original``, ``new_of_orig[original] = new``, part boundaries."""

    order: np.ndarray
    new_of_orig: np.ndarray
    ranges: np.ndarray

    @classmethod
    def of(cls, parts: np.ndarray, num_parts: int) -> "_Numbering":
        """Part k owns ``[ranges[k], ranges[k+1])``, ordered by (part, original id)."""
        order = np.argsort(parts, kind="stable")
        new_of_orig = np.empty(parts.size, dtype=np.int64)
        new_of_orig[order] = np.arange(parts.size)
        ranges = np.zeros(num_parts + 1, dtype=np.int64)
        np.cumsum(np.bincount(parts, minlength=num_parts), out=ranges[1:])
        return cls(order, new_of_orig, ranges)

    @property
    def num_nodes(self) -> int:
        return int(self.ranges[-1])


def _write_nodes(graph: GraphInput, ntype: str, paths: PartitionPaths, numbering: _Numbering,
                 progress: Progress) -> None:
    t, ranges = graph.nodes[ntype], numbering.ranges
    splits = graph.splits if ntype == graph.label_type else {}
    new_splits = {split: np.sort(numbering.new_of_orig[idx]) for split, idx in splits.items()}
    desc = "writing nodes" if graph.is_homogeneous else f"writing {ntype} nodes"
    for k in progress(range(ranges.size - 1), desc):
        owned = numbering.order[ranges[k]:ranges[k + 1]]
        for column in INPUT_COLUMNS:
            values = t.column(column.name)
            if values is not None:
                save_array(paths.node_file(k, column.name, ntype), values[owned])
        save_array(paths.node_file(k, "orig_id", ntype), owned)
        for split, gids in new_splits.items():
            lo, hi = np.searchsorted(gids, [ranges[k], ranges[k + 1]])
            save_array(paths.split_file(k, split, ntype), gids[lo:hi])


def _write_edges(graph: GraphInput, etype: EdgeType, paths: PartitionPaths, numbering: dict[str, _Numbering],
                 topologies, progress: Progress, log: Log, keep: np.ndarray | None = None) -> None:
    """CSC (in-edges of owned destination-type nodes) and/or CSR (out-edges of owned source-type nodes)
    of the edges at positions ``keep`` (None: every edge; stored edge ids stay input positions)."""
    edges, (src, _, dst) = graph.edges[etype], etype
    named = "" if graph.is_homogeneous else f" {edge_type_dirname(etype)}"
    log(f"renumbering{named} edges")
    ends = edges.edge_index if keep is None else edges.edge_index[:, keep]
    src_new = _renumber(ends[0], numbering[src].new_of_orig)
    dst_new = _renumber(ends[1], numbering[dst].new_of_orig)
    for topo in topologies:
        log(f"sorting {topo.upper()} adjacency{named} ({ends.shape[1]:,} edges)")
        key, other = (dst_new, src_new) if topo == "csc" else (src_new, dst_new)
        key_type, other_type = (dst, src) if topo == "csc" else (src, dst)
        other_time = graph.nodes[other_type].time   # a neighbor's node time, in renumbered id order
        nbr_time = None if other_time is None else other_time[numbering[other_type].order]
        _write_topology(edges, etype, paths, topo, key, other, numbering[key_type].ranges,
                        numbering[other_type].num_nodes, progress, keep, nbr_time)


def _write_topology(edges: EdgeTypeInput, etype: EdgeType, paths: PartitionPaths, topo: str, key, other, ranges,
                    n_other: int, progress: Progress, keep: np.ndarray | None = None,
                    nbr_time: np.ndarray | None = None) -> None:
    indptr, indices, eid = _compressed(key, other, int(ranges[-1]), n_other)
    if keep is not None:
        eid = keep[eid]
    for k in progress(range(ranges.size - 1), f"writing {topo}"):
        lo, hi = indptr[ranges[k]], indptr[ranges[k + 1]]
        save_array(paths.edge_file(k, topo, "indptr", etype), indptr[ranges[k]:ranges[k + 1] + 1] - lo)
        save_array(paths.edge_file(k, topo, "indices", etype), indices[lo:hi].astype(np.int64))
        save_array(paths.edge_file(k, topo, "eid", etype), eid[lo:hi])
        if edges.edge_attr is not None:
            save_array(paths.edge_file(k, topo, "edge_attr", etype), edges.edge_attr[eid[lo:hi]])
        if edges.edge_weight is not None:
            save_array(paths.edge_file(k, topo, "edge_weight", etype), edges.edge_weight[eid[lo:hi]])
        if edges.edge_time is not None:
            save_array(paths.edge_file(k, topo, "edge_time", etype), edges.edge_time[eid[lo:hi]])
        if nbr_time is not None:
            save_array(paths.edge_file(k, topo, "nbr_time", etype), nbr_time[indices[lo:hi]])


def check_link_shares(shares: dict[str, float]) -> None:
    """ValueError (naming ``--link-split`` and the fix) unless ``shares`` are val/test shares in (0, 1)
    summing to less than 1."""
    bad = sorted(set(shares) - {"val", "test"})
    if bad or not shares:
        raise ValueError(f"--link-split names {', '.join(bad) or 'no split'}: give val=SHARE and/or test=SHARE "
                         f"(train is every other edge), e.g. --link-split val=0.05,test=0.10")
    if any(not 0 < v < 1 for v in shares.values()) or sum(shares.values()) >= 1:
        raise ValueError(f"--link-split shares must each be in (0, 1) and sum to less than 1, got {shares}")


def link_split_edges(edge_index: np.ndarray, shares: dict[str, float], seed: int = 0,
                     symmetric: bool = True) -> dict[str, np.ndarray]:
    """Positions (ascending) in ``edge_index`` of the seed edges of every link split: ``val`` and ``test``
    (those in ``shares``) hold out that share of the graph's node pairs, ``train`` is every other edge.

    Edges ``(u, v)`` and ``(v, u)`` (and repeats of either) are one node pair, held out together, so an
    undirected graph stored with both directions never keeps the reverse of a held-out edge (not
    ``symmetric``: an edge type between two node types, where ``(u, v)`` and ``(v, u)`` differ).  Pairs are
    picked by a random permutation of ``seed``: deterministic.  ValueError (naming ``--link-split``)
    for a split other than val/test, a share outside (0, 1), shares summing to 1 or more, or a share
    that holds out no pair.
    """
    check_link_shares(shares)
    ends = edge_index.astype(np.int64, copy=False)
    n = int(ends.max()) + 1 if ends.size else 1
    keys = np.minimum(ends[0], ends[1]) * n + np.maximum(ends[0], ends[1]) if symmetric else ends[0] * n + ends[1]
    pairs, pair_of = np.unique(keys, return_inverse=True)
    rank = np.empty(pairs.size, dtype=np.int64)
    rank[np.random.default_rng(seed).permutation(pairs.size)] = np.arange(pairs.size)
    rank_of_edge, start = rank[pair_of.reshape(-1)], 0
    out: dict[str, np.ndarray] = {}
    for split in ("val", "test"):
        if split not in shares:
            continue
        count = int(round(shares[split] * pairs.size))
        if count == 0:
            raise ValueError(f"--link-split {split}={shares[split]} holds out no edge ({pairs.size} node pairs); "
                             f"give a larger share")
        out[split] = np.flatnonzero((rank_of_edge >= start) & (rank_of_edge < start + count))
        start += count
    out["train"] = np.flatnonzero(rank_of_edge >= start)
    return {split: out[split] for split in LINK_SPLITS if split in out}


def _write_link_splits(graph: GraphInput, etype: EdgeType, paths: PartitionPaths, numbering: dict[str, _Numbering],
                       splits: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Each part's seed edges (of edge type ``etype``) of every link split (those whose source it owns, by
    input position); returns each split's per-part counts."""
    ei, ranges = graph.edges[etype].edge_index, numbering[etype[0]].ranges
    sizes = {}
    for split, pos in splits.items():
        src, dst = numbering[etype[0]].new_of_orig[ei[0, pos]], numbering[etype[2]].new_of_orig[ei[1, pos]]
        part = np.searchsorted(ranges, src, side="right") - 1
        order = np.argsort(part, kind="stable")
        counts = np.bincount(part, minlength=ranges.size - 1)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for k in range(ranges.size - 1):
            mine = order[offsets[k]:offsets[k + 1]]
            for name, values in (("src", src), ("dst", dst), ("eid", pos)):
                save_array(paths.link_split_file(k, split, name, etype), values[mine].astype(np.int64))
        sizes[split] = counts.tolist()
    return sizes


def link_split_type(graph: GraphInput, etype: EdgeType | None, rev: EdgeType | None = None) -> EdgeType:
    """The edge type ``--link-split`` holds edges out of: ``etype``, or a homogeneous graph's one edge type.
    ValueError naming ``--link-edge-type`` and the graph's edge types when it is missing on a typed graph or
    names a type the graph lacks, or ``rev`` does not go the other way."""
    types = [tuple(e) for e in graph.edge_types]
    if etype is None:
        if graph.is_homogeneous:
            return types[0]   # type: ignore[return-value]
        raise ValueError(f"--link-split on a typed graph needs --link-edge-type SRC,REL,DST (one of "
                         f"{', '.join(','.join(e) for e in types)})")
    for name, value in (("--link-edge-type", etype), ("--link-rev-edge-type", rev)):
        if value is not None and tuple(value) not in types:
            raise ValueError(f"{name} {','.join(value)} is not an edge type of the graph: it has "
                             f"{', '.join(','.join(e) for e in types)}")
    if rev is not None and (rev[0], rev[2]) != (etype[2], etype[0]):
        raise ValueError(f"--link-rev-edge-type {','.join(rev)} must go from {etype[2]!r} to {etype[0]!r} (the "
                         f"reverse of {','.join(etype)})")
    return tuple(etype)   # type: ignore[return-value]


def _reverse_kept(ei: np.ndarray, rev_ei: np.ndarray, splits: dict[str, np.ndarray]) -> np.ndarray:
    """Positions of the reverse edge type's edges to store: all but the reverses of held-out (val/test) pairs."""
    held = np.concatenate([splits[s] for s in splits if s != "train"] or [np.zeros(0, dtype=np.int64)])
    n = int(max(ei.max(initial=0), rev_ei.max(initial=0))) + 1
    held_keys = ei[0, held].astype(np.int64) * n + ei[1, held]
    rev_keys = rev_ei[1].astype(np.int64) * n + rev_ei[0]
    return np.flatnonzero(~np.isin(rev_keys, held_keys))


def write_partitions(graph: GraphInput, parts: np.ndarray, num_parts: int, out: Path, *, method: str,
                     topologies=("csc",), seed: int = 0, progress: Progress | None = None,
                     log: Log | None = None, link_split: dict[str, float] | None = None,
                     node_weights: np.ndarray | None = None, method_settings: dict | None = None,
                     link_edge_type: EdgeType | None = None, link_rev_edge_type: EdgeType | None = None
                     ) -> PartitionMeta:
    """Write the partition folder into ``out`` (which must be empty), META.json last; returns its meta.

    ``parts`` is the part of every node of the homogeneous view (:func:`assign_parts`). Each node
    type is renumbered on its own, so part k owns ``[node_ranges[t][k], node_ranges[t][k+1])`` of
    type t. Peak memory beyond the input, while one topology of one edge type is built: its
    renumbered endpoints (int32 when ids fit) plus three int64 arrays of its E entries (sort keys,
    permutation, sort buffer).  ``link_split`` (``{"val": share, "test": share}``): hold out those edges
    (of ``link_edge_type`` on a typed graph; the reverses of held-out pairs in ``link_rev_edge_type`` too,
    as PyG's ``RandomLinkSplit(rev_edge_types=...)``) as link seed splits (:func:`link_split_edges`), not
    stored in the topology.
    ``method_settings`` are recorded in META.json, with each part's sum of ``node_weights`` (hotness).
    """
    progress, log = progress or _no_progress, log or _no_log
    numbering = {ntype: _Numbering.of(p, num_parts) for ntype, p in _parts_by_type(graph, parts).items()}
    paths = PartitionPaths(out)
    link_type = link_split_type(graph, link_edge_type, link_rev_edge_type) if link_split else None
    splits, keep = {}, {}
    if link_split and link_type is not None:
        ei = graph.edges[link_type].edge_index
        splits = link_split_edges(ei, link_split, seed, symmetric=link_type[0] == link_type[2])
        keep[link_type] = splits.get("train")
        if link_rev_edge_type is not None:
            keep[link_rev_edge_type] = _reverse_kept(ei, graph.edges[link_rev_edge_type].edge_index, splits)
    for ntype in graph.node_types:
        _write_nodes(graph, ntype, paths, numbering[ntype], progress)
    for etype in graph.edge_types:
        _write_edges(graph, etype, paths, numbering, topologies, progress, log, keep.get(etype))
    _write_extras(graph, paths, numbering, num_parts, log)
    meta = _meta(graph, parts, numbering, method=method, topologies=topologies, seed=seed)
    if node_weights is not None:
        mass = np.bincount(parts, weights=node_weights, minlength=num_parts)
        meta = dataclasses.replace(meta, method_settings=dict(method_settings or {}),
                                   access_mass=[int(m) for m in mass])
    if link_split and splits and link_type is not None:
        log(f"link splits: {', '.join(f'{k} {v.size:,}' for k, v in splits.items())} edges")
        sizes = _write_link_splits(graph, link_type, paths, numbering, splits)
        shares = {**link_split, "train": 1.0 - sum(link_split.values())}
        typed = {} if graph.is_homogeneous else {"edge_type": list(link_type)}
        if link_rev_edge_type is not None:
            typed["rev_edge_type"] = list(link_rev_edge_type)
        meta = dataclasses.replace(meta, link_splits={k: {"share": float(shares[k]), "sizes": sizes[k], **typed}
                                                      for k in sizes})
    write_meta(out, meta)
    return meta


def _write_extras(graph: GraphInput, paths: PartitionPaths, numbering: dict[str, _Numbering], num_parts: int,
                  log: Log) -> None:
    """What the loaders' options read besides the graph: every node type's int8 feature scales
    (:mod:`.quantize`) and every edge type's hard negatives (:mod:`.hard_negatives`)."""
    for ntype, t in graph.nodes.items():
        for column in QUANTIZABLE:
            values = t.column(column)
            if values is not None and is_quantizable(values):
                write_scales(paths, ntype, num_parts, *scales_of_range(*column_range(values)), column)
    for etype, e in graph.edges.items():
        if e.hard_neg_dst is not None:
            src, _, dst = etype
            n = write_hard_negatives(paths, etype, e.edge_index, e.hard_neg_dst, numbering[src].new_of_orig,
                                     numbering[dst].new_of_orig, numbering[src].ranges)
            log(f"hard negatives: {n:,} edges{'' if graph.is_homogeneous else ' of ' + edge_type_dirname(etype)}")


def _array_spec(array: np.ndarray) -> dict:
    return {"shape": list(array.shape[1:]), "dtype": str(array.dtype)}


def _meta(graph: GraphInput, parts, numbering: dict[str, _Numbering], *, method: str, topologies,
          seed: int) -> PartitionMeta:
    return PartitionMeta(
        num_parts=int(numbering[graph.label_type].ranges.size - 1),
        node_types=graph.node_types,
        edge_types=[list(etype) for etype in graph.edge_types],
        node_ranges={ntype: numbering[ntype].ranges.tolist() for ntype in graph.node_types},
        num_edges={edge_type_dirname(etype): e.num_edges for etype, e in graph.edges.items()},
        topologies=list(topologies),
        features={ntype: {c.name: _array_spec(t.columns[c.name]) for c in INPUT_COLUMNS if c.name in t.columns}
                  for ntype, t in graph.nodes.items()},
        edge_features={edge_type_dirname(etype): _array_spec(e.edge_attr)
                       for etype, e in graph.edges.items() if e.edge_attr is not None},
        edge_weights=[edge_type_dirname(etype) for etype, e in graph.edges.items() if e.edge_weight is not None],
        edge_times=[edge_type_dirname(etype) for etype, e in graph.edges.items() if e.edge_time is not None],
        num_classes=int(graph.num_classes),
        split_sizes={k: int(v.size) for k, v in graph.splits.items()},
        label_type=graph.label_type,
        num_classes_by_type=({} if graph.is_homogeneous else
                             {ntype: t.num_classes for ntype, t in graph.nodes.items() if t.y is not None}),
        graph_name=graph.name,
        method=method,
        edge_cut=graph_edge_cut(graph, parts),
        source_fingerprint=graph.fingerprint,
        seed=int(seed),
    )


def partition_graph(graph: GraphInput, num_parts: int, output: str | os.PathLike, *, method: str = "random",
                    topologies=("csc",), seed: int = 0, overwrite: bool = False,
                    progress: Progress | None = None, log: Log | None = None,
                    link_split: dict[str, float] | None = None, node_weights: np.ndarray | None = None,
                    method_settings: dict | None = None, link_edge_type: EdgeType | None = None,
                    link_rev_edge_type: EdgeType | None = None) -> PartitionMeta:
    """Partition ``graph`` into ``output`` atomically: the folder appears complete or not at all.

    Everything is written into a temporary sibling folder, META.json last, then renamed
    into place; a crash leaves only the temporary folder (``.NAME.tmp-PID-*``, no META.json),
    which never loads as valid and is deleted by the next run into the same ``output``.  ``output`` must not
    exist, be empty, or (with ``overwrite``) hold a graphfeed partition; anything else raises ``FileExistsError``.
    ``link_split``, ``link_edge_type``, ``link_rev_edge_type``: see :func:`write_partitions`.
    ``method="hotness"`` needs
    ``node_weights`` (each node's pre-sampled access count, int [N]; see
    :func:`graphfeed.server.sampling.access.count_accesses`), recorded with ``method_settings``.
    """
    if link_split:
        check_link_shares(link_split)
        link_split_type(graph, link_edge_type, link_rev_edge_type)
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}: use one of {', '.join(METHODS)}")
    if method == "hotness":
        _check_node_weights(graph, node_weights)
    if not 1 <= num_parts <= graph.num_nodes:
        raise ValueError(f"--num-parts must be between 1 and the number of nodes ({graph.num_nodes}), got {num_parts}")
    bad = [t for t in topologies if t not in TOPOLOGIES]
    if bad or not topologies:
        raise ValueError(f"topology must be csc, csr or both, got {list(topologies)}")
    output = Path(output)
    _check_replaceable(output, overwrite)
    output.parent.mkdir(parents=True, exist_ok=True)
    log = log or _no_log
    log(f"assigning {graph.num_nodes:,} nodes to {num_parts} part(s) ({method})")
    parts = assign_parts(graph, num_parts, method, seed, node_weights)
    _remove_stale_temporaries(output)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-{os.getpid()}-", dir=output.parent))
    try:
        os.chmod(tmp, 0o755 & ~_umask())
        meta = write_partitions(graph, parts, num_parts, tmp, method=method, topologies=tuple(topologies),
                                seed=seed, progress=progress, log=log, link_split=link_split,
                                node_weights=node_weights if method == "hotness" else None,
                                method_settings=method_settings, link_edge_type=link_edge_type,
                                link_rev_edge_type=link_rev_edge_type)
        _replace_dir(tmp, output, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _remove_stale_temporaries(output: Path) -> None:
    """Delete ``.NAME.tmp-PID-*`` folders left by crashed runs (their process no longer exists)."""
    for tmp in output.parent.glob(f".{output.name}.tmp-*-*"):
        pid = tmp.name[len(f".{output.name}.tmp-"):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)) and not (tmp / META_FILE).exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _check_replaceable(output: Path, overwrite: bool) -> None:
    if not output.exists():
        return
    if not output.is_dir():
        raise FileExistsError(f"{output} is a file; give a folder path for --output")
    if not any(output.iterdir()):
        return
    if not (output / META_FILE).is_file():
        # Never delete a folder we did not write, even with --overwrite.
        raise FileExistsError(f"{output} is not empty and is not a graphfeed partition folder (no {META_FILE}); "
                              f"choose a new or empty --output folder")
    if not overwrite:
        raise FileExistsError(f"{output} already holds a partition; pass --overwrite to replace it")


def _replace_dir(tmp: Path, output: Path, overwrite: bool) -> None:
    _check_replaceable(output, overwrite)
    if output.is_dir() and not any(output.iterdir()):
        output.rmdir()
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.rename(output, old)
        os.rename(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, output)
