"""Building a partition folder from an in-memory graph: assign, renumber, write atomically."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .format import (DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE, TOPOLOGIES, PartitionMeta, PartitionPaths,
                     save_array, write_meta)

METHODS = ("random", "metis")


@dataclass
class GraphInput:
    """A homogeneous graph to partition (original ids are row positions)."""

    edge_index: np.ndarray                 # int64 [2, E], row 0 = source
    x: np.ndarray                          # [N, F]
    y: np.ndarray                          # [N]
    splits: dict[str, np.ndarray]          # split name -> original node ids
    edge_attr: np.ndarray | None = None    # [E, ...]
    name: str = ""
    fingerprint: str = ""
    num_classes: int = field(default=0)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


def assign_parts(graph: GraphInput, num_parts: int, method: str, seed: int = 0) -> np.ndarray:
    """Part of every node (int64 [N])."""
    n = graph.num_nodes
    if method == "random":
        rng = np.random.default_rng(seed)
        parts = np.empty(n, dtype=np.int64)
        parts[rng.permutation(n)] = np.arange(n) % num_parts
        return parts
    if method == "metis":
        return _metis(graph, num_parts)
    raise ValueError(f"unknown partition method {method!r}: use one of {', '.join(METHODS)}")


def _metis(graph: GraphInput, num_parts: int) -> np.ndarray:
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    import pymetis

    n = graph.num_nodes
    src, dst = graph.edge_index
    keep = src != dst
    # METIS wants a symmetric adjacency without self loops or duplicates.
    key = np.unique(np.concatenate([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]))
    a, b = key // n, key % n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=xadj[1:])
    # Two balance constraints: nodes, and training nodes (so every part gets its share of seeds).
    train = np.zeros(n, dtype=np.int64)
    train[graph.splits.get("train", np.empty(0, dtype=np.int64))] = 1
    vweights = np.stack([np.ones(n, dtype=np.int64), train], axis=1).reshape(-1)
    _, membership = pymetis.part_graph(num_parts, xadj=xadj, adjncy=b, vweights=vweights)
    return np.asarray(membership, dtype=np.int64)


def edge_cut(edge_index: np.ndarray, parts: np.ndarray) -> int:
    return int((parts[edge_index[0]] != parts[edge_index[1]]).sum())


def _compressed(key_nodes: np.ndarray, other: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges sorted by (key node, other endpoint, edge id): ``(indptr, indices, eid)`` over all nodes."""
    order = np.argsort(key_nodes * n + other, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key_nodes, minlength=n), out=indptr[1:])
    return indptr, other[order], order.astype(np.int64)


def write_partitions(graph: GraphInput, parts: np.ndarray, num_parts: int, out: Path, *, method: str,
                     topologies=("csc",), progress=None) -> PartitionMeta:
    """Write the partition folder into ``out`` (which must be empty); returns its meta."""
    n = graph.num_nodes
    progress = progress or (lambda it, desc: it)
    order = np.argsort(parts, kind="stable")          # new id -> original id
    new_of_orig = np.empty(n, dtype=np.int64)
    new_of_orig[order] = np.arange(n)
    ranges = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_parts), out=ranges[1:])
    paths = PartitionPaths(out)

    for k in progress(range(num_parts), "writing nodes"):
        owned = order[ranges[k]:ranges[k + 1]]
        save_array(paths.node_file(k, "x"), graph.x[owned])
        save_array(paths.node_file(k, "y"), graph.y[owned])
        save_array(paths.node_file(k, "orig_id"), owned)
        for split, idx in graph.splits.items():
            gids = np.sort(new_of_orig[idx])
            save_array(paths.split_file(k, split), gids[(gids >= ranges[k]) & (gids < ranges[k + 1])])

    src_new = new_of_orig[graph.edge_index[0]]
    dst_new = new_of_orig[graph.edge_index[1]]
    for topo in topologies:
        key, other = (dst_new, src_new) if topo == "csc" else (src_new, dst_new)
        indptr, indices, eid = _compressed(key, other, n)
        for k in progress(range(num_parts), f"writing {topo}"):
            lo, hi = indptr[ranges[k]], indptr[ranges[k + 1]]
            save_array(paths.edge_file(k, topo, "indptr"), indptr[ranges[k]:ranges[k + 1] + 1] - lo)
            save_array(paths.edge_file(k, topo, "indices"), indices[lo:hi])
            save_array(paths.edge_file(k, topo, "eid"), eid[lo:hi])
            if graph.edge_attr is not None:
                save_array(paths.edge_file(k, topo, "edge_attr"), graph.edge_attr[eid[lo:hi]])
        del indptr, indices, eid

    meta = PartitionMeta(
        num_parts=num_parts,
        node_types=[DEFAULT_NODE_TYPE],
        edge_types=[list(DEFAULT_EDGE_TYPE)],
        node_ranges={DEFAULT_NODE_TYPE: ranges.tolist()},
        num_edges={"__".join(DEFAULT_EDGE_TYPE): int(graph.edge_index.shape[1])},
        topologies=list(topologies),
        features={DEFAULT_NODE_TYPE: {
            "x": {"shape": list(graph.x.shape[1:]), "dtype": str(graph.x.dtype)},
            "y": {"shape": list(graph.y.shape[1:]), "dtype": str(graph.y.dtype)},
        }},
        edge_features=({"__".join(DEFAULT_EDGE_TYPE): {"shape": list(graph.edge_attr.shape[1:]),
                                                        "dtype": str(graph.edge_attr.dtype)}}
                       if graph.edge_attr is not None else {}),
        num_classes=int(graph.num_classes or (int(graph.y.max()) + 1 if graph.y.size else 0)),
        split_sizes={k: int(v.size) for k, v in graph.splits.items()},
        graph_name=graph.name,
        method=method,
        edge_cut=edge_cut(graph.edge_index, parts),
        source_fingerprint=graph.fingerprint,
    )
    write_meta(out, meta)
    return meta


def partition_graph(graph: GraphInput, num_parts: int, output: str | os.PathLike, *, method: str = "random",
                    topologies=("csc",), seed: int = 0, overwrite: bool = False, progress=None) -> PartitionMeta:
    """Partition ``graph`` into ``output`` atomically: the folder appears complete or not at all.

    Everything is written into a temporary sibling folder, META.json last, then renamed
    into place; a crash leaves only the temporary folder, which never loads as valid.
    """
    if not 1 <= num_parts <= graph.num_nodes:
        raise ValueError(f"--num-parts must be between 1 and the number of nodes ({graph.num_nodes}), got {num_parts}")
    bad = [t for t in topologies if t not in TOPOLOGIES]
    if bad or not topologies:
        raise ValueError(f"topology must be csc, csr or both, got {list(topologies)}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    parts = assign_parts(graph, num_parts, method, seed)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        meta = write_partitions(graph, parts, num_parts, tmp, method=method, topologies=tuple(topologies),
                                progress=progress)
        _replace_dir(tmp, output, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _replace_dir(tmp: Path, output: Path, overwrite: bool) -> None:
    if output.exists():
        if not overwrite:
            raise FileExistsError(f"{output} already exists; pass --overwrite to replace it")
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.rename(output, old)
        os.rename(tmp, output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, output)
