"""Building a partition folder from an in-memory graph: assign, renumber, write atomically."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from graphfeed.server.partition.format import (
    DEFAULT_EDGE_TYPE,
    DEFAULT_NODE_TYPE,
    META_FILE,
    TOPOLOGIES,
    PartitionMeta,
    PartitionPaths,
    save_array,
    write_meta,
)

METHODS = ("random", "metis")
# progress(iterable, description) -> iterable (e.g. a tqdm bar); log(message) for steps without a loop.
Progress = Callable[[Iterable, str], Iterable]
Log = Callable[[str], None]
_EDGE_CHUNK = 1 << 24  # edges per chunk in whole-edge-list passes: bounds temporaries to ~130 MB
_PACK_BITS = 63        # bits of a packed (node, neighbor, edge id) sort key (lowered in tests)


def _no_progress(iterable, desc):
    return iterable


def _no_log(message):
    pass


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
    """Part of every node (int64 [N]); deterministic for a given ``seed``."""
    n = graph.num_nodes
    if method == "random":
        rng = np.random.default_rng(seed)
        parts = np.empty(n, dtype=np.int64)
        parts[rng.permutation(n)] = np.arange(n) % num_parts
        return parts
    if method == "metis":
        return _metis(graph, num_parts, seed)
    raise ValueError(f"unknown partition method {method!r}: use one of {', '.join(METHODS)}")


def _metis(graph: GraphInput, num_parts: int, seed: int = 0) -> np.ndarray:
    if num_parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int64)
    import pymetis

    n = graph.num_nodes
    xadj, adjncy = symmetric_adjacency(graph.edge_index, n)
    # Two balance constraints: nodes, and training nodes (so every part gets its share of seeds).
    train = np.zeros(n, dtype=np.int64)
    train[graph.splits.get("train", np.empty(0, dtype=np.int64))] = 1
    weights = [np.ones(n, dtype=np.int64)] + ([train] if train.any() else [])
    vweights = np.stack(weights, axis=1).reshape(-1)
    del train, weights
    _, membership = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights,
                                       options=pymetis.Options(seed=int(seed)))
    return np.asarray(membership, dtype=np.int64)


def symmetric_adjacency(edge_index: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(xadj, adjncy)`` of the undirected graph without self loops or duplicates (what METIS wants).

    Memory: one 2E int64 key array (``u * n + v``) sorted in place, then one deduplicated copy
    that becomes ``adjncy`` in place; row pointers come from a search over the sorted keys.
    """
    if n >= 1 << 31:
        raise ValueError(f"METIS partitioning supports fewer than 2^31 nodes, the graph has {n}; "
                         f"use --method random")
    src, dst = edge_index[0], edge_index[1]
    keep = np.flatnonzero(src != dst)
    m = keep.size
    key = np.empty(2 * m, dtype=np.int64)
    for start in range(0, m, _EDGE_CHUNK):
        sel = keep[start:start + _EDGE_CHUNK]
        s, d = src[sel], dst[sel]
        stop = start + sel.size
        np.multiply(s, n, out=key[start:stop])
        key[start:stop] += d
        np.multiply(d, n, out=key[m + start:m + stop])
        key[m + start:m + stop] += s
    del keep
    key.sort()
    if key.size:
        first = np.empty(key.size, dtype=bool)
        first[0] = True
        np.not_equal(key[1:], key[:-1], out=first[1:])
        key = key[first]
        del first
    xadj = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * n)
    np.remainder(key, n, out=key)
    return xadj.astype(np.int64, copy=False), key


def edge_cut(edge_index: np.ndarray, parts: np.ndarray) -> int:
    """Number of directed edges whose endpoints lie in different parts."""
    cut = 0
    for start in range(0, edge_index.shape[1], _EDGE_CHUNK):
        chunk = edge_index[:, start:start + _EDGE_CHUNK]
        cut += int(np.count_nonzero(parts[chunk[0]] != parts[chunk[1]]))
    return cut


def _renumber(ids: np.ndarray, new_of_orig: np.ndarray) -> np.ndarray:
    """``new_of_orig[ids]`` in chunks, as int32 when ids fit (halves the two E-sized endpoint arrays)."""
    dtype = np.int32 if new_of_orig.size < (1 << 31) else np.int64
    table = new_of_orig.astype(dtype, copy=False)
    out = np.empty(ids.shape, dtype=dtype)
    for start in range(0, ids.size, _EDGE_CHUNK):
        np.take(table, ids[start:start + _EDGE_CHUNK], out=out[start:start + _EDGE_CHUNK])
    return out


def _compressed(key_nodes: np.ndarray, other: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges sorted by (key node, other endpoint, edge id): ``(indptr, indices, eid)`` over all nodes.

    ``indices`` keeps the dtype of ``other`` (the writer widens each part to int64).
    """
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(key_nodes, minlength=n), out=indptr[1:])
    eid = _edge_order(key_nodes, other, n, indptr)
    return indptr, other[eid], eid


def _edge_order(key: np.ndarray, other: np.ndarray, n: int, indptr: np.ndarray) -> np.ndarray:
    """Edge ids ordered by (key, other, edge id).

    Packs ``(key - block start) * n + other`` above the edge id into one int64 and sorts the
    values (a vectorised sort, ~10x faster than a stable argsort); nodes are processed in
    blocks small enough for the packed value to fit in 63 bits (one block up to ~1e9 n*E).
    """
    num_edges = key.size
    eid_bits = max(1, int(num_edges - 1).bit_length())
    block = (1 << (_PACK_BITS - eid_bits)) // max(n, 1) if eid_bits < _PACK_BITS else 0  # key nodes per block
    if block == 0:   # too large to pack: stable argsort keeps edge ids ascending among ties
        composite = np.multiply(key, n, dtype=np.int64)
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
        packed *= n
        packed += other[ids]
        packed <<= eid_bits
        packed |= ids
        packed.sort()
        np.bitwise_and(packed, mask, out=out[lo:hi])
    return out


def _write_nodes(graph: GraphInput, paths: PartitionPaths, order, new_of_orig, ranges, progress: Progress) -> None:
    num_parts = ranges.size - 1
    new_splits = {split: np.sort(new_of_orig[idx]) for split, idx in graph.splits.items()}
    for k in progress(range(num_parts), "writing nodes"):
        owned = order[ranges[k]:ranges[k + 1]]
        save_array(paths.node_file(k, "x"), graph.x[owned])
        save_array(paths.node_file(k, "y"), graph.y[owned])
        save_array(paths.node_file(k, "orig_id"), owned)
        for split, gids in new_splits.items():
            lo, hi = np.searchsorted(gids, [ranges[k], ranges[k + 1]])
            save_array(paths.split_file(k, split), gids[lo:hi])


def _write_topology(graph: GraphInput, paths: PartitionPaths, topo: str, key, other, ranges,
                    progress: Progress) -> None:
    n = int(ranges[-1])
    indptr, indices, eid = _compressed(key, other, n)
    for k in progress(range(ranges.size - 1), f"writing {topo}"):
        lo, hi = indptr[ranges[k]], indptr[ranges[k + 1]]
        save_array(paths.edge_file(k, topo, "indptr"), indptr[ranges[k]:ranges[k + 1] + 1] - lo)
        save_array(paths.edge_file(k, topo, "indices"), indices[lo:hi].astype(np.int64))
        save_array(paths.edge_file(k, topo, "eid"), eid[lo:hi])
        if graph.edge_attr is not None:
            save_array(paths.edge_file(k, topo, "edge_attr"), graph.edge_attr[eid[lo:hi]])


def write_partitions(graph: GraphInput, parts: np.ndarray, num_parts: int, out: Path, *, method: str,
                     topologies=("csc",), seed: int = 0, progress: Progress | None = None,
                     log: Log | None = None) -> PartitionMeta:
    """Write the partition folder into ``out`` (which must be empty), META.json last; returns its meta.

    Peak memory beyond the input, while one topology is built: the renumbered endpoints (int32
    when ids fit) plus three int64 arrays of E entries (sort keys, permutation, sort buffer).
    """
    n = graph.num_nodes
    progress, log = progress or _no_progress, log or _no_log
    order = np.argsort(parts, kind="stable")          # new id -> original id
    new_of_orig = np.empty(n, dtype=np.int64)
    new_of_orig[order] = np.arange(n)
    ranges = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(np.bincount(parts, minlength=num_parts), out=ranges[1:])
    paths = PartitionPaths(out)
    _write_nodes(graph, paths, order, new_of_orig, ranges, progress)

    log("renumbering edges")
    src_new = _renumber(graph.edge_index[0], new_of_orig)
    dst_new = _renumber(graph.edge_index[1], new_of_orig)
    for topo in topologies:
        log(f"sorting {topo.upper()} adjacency ({graph.edge_index.shape[1]:,} edges)")
        key, other = (dst_new, src_new) if topo == "csc" else (src_new, dst_new)
        _write_topology(graph, paths, topo, key, other, ranges, progress)
    del src_new, dst_new

    meta = _meta(graph, parts, ranges, method=method, topologies=topologies, seed=seed)
    write_meta(out, meta)
    return meta


def _meta(graph: GraphInput, parts, ranges, *, method: str, topologies, seed: int) -> PartitionMeta:
    etype = "__".join(DEFAULT_EDGE_TYPE)
    return PartitionMeta(
        num_parts=int(ranges.size - 1),
        node_types=[DEFAULT_NODE_TYPE],
        edge_types=[list(DEFAULT_EDGE_TYPE)],
        node_ranges={DEFAULT_NODE_TYPE: ranges.tolist()},
        num_edges={etype: int(graph.edge_index.shape[1])},
        topologies=list(topologies),
        features={DEFAULT_NODE_TYPE: {
            "x": {"shape": list(graph.x.shape[1:]), "dtype": str(graph.x.dtype)},
            "y": {"shape": list(graph.y.shape[1:]), "dtype": str(graph.y.dtype)},
        }},
        edge_features=({etype: {"shape": list(graph.edge_attr.shape[1:]), "dtype": str(graph.edge_attr.dtype)}}
                       if graph.edge_attr is not None else {}),
        num_classes=int(graph.num_classes or (int(graph.y.max()) + 1 if graph.y.size else 0)),
        split_sizes={k: int(v.size) for k, v in graph.splits.items()},
        graph_name=graph.name,
        method=method,
        edge_cut=edge_cut(graph.edge_index, parts),
        source_fingerprint=graph.fingerprint,
        seed=int(seed),
    )


def partition_graph(graph: GraphInput, num_parts: int, output: str | os.PathLike, *, method: str = "random",
                    topologies=("csc",), seed: int = 0, overwrite: bool = False,
                    progress: Progress | None = None, log: Log | None = None) -> PartitionMeta:
    """Partition ``graph`` into ``output`` atomically: the folder appears complete or not at all.

    Everything is written into a temporary sibling folder, META.json last, then renamed
    into place; a crash leaves only the temporary folder (``.NAME.tmp-PID-*``, no META.json),
    which never loads as valid and is deleted by the next run into the same ``output``.  ``output`` must not
    exist, be empty, or (with ``overwrite``) hold a graphfeed partition; anything else raises ``FileExistsError``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}: use one of {', '.join(METHODS)}")
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
    parts = assign_parts(graph, num_parts, method, seed)
    _remove_stale_temporaries(output)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-{os.getpid()}-", dir=output.parent))
    try:
        os.chmod(tmp, 0o755 & ~_umask())
        meta = write_partitions(graph, parts, num_parts, tmp, method=method, topologies=tuple(topologies),
                                seed=seed, progress=progress, log=log)
        _replace_dir(tmp, output, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _remove_stale_temporaries(output: Path) -> None:
    """Delete ``.NAME.tmp-PID-*`` folders left by crashed runs (their process no longer exists)."""
    for tmp in output.parent.glob(f".{output.name}.tmp-*-*"):
        pid = tmp.name[len(f".{output.name}.tmp-"):].split("-", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)) and not (tmp / META_FILE).exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
