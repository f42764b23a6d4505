"""Partitioning in bounded memory: chunked input in, the same partition folder out, through disk.

Stages (each a list of chunk tasks a :mod:`runner <graphfeed.server.partition.build.runner>` runs here or on
a Dask cluster; every task's memory is bounded by the chunk sizes of the memory plan, :mod:`.plan`):

1. **assign** (here): each node's part: ``random`` (the in-memory path's permutation, dealt in
   slices), ``fennel`` (streaming, :mod:`graphfeed.server.partition.build.fennel`) or ``metis`` (the edges
   loaded whole, for graphs that fit).  Held as int16/int32 [N] (``parts.npy`` in the scratch folder).
2. **number** (here): new ids ordered by (part, original id), computed a slice at a time
   (``new_{ntype}.npy``: int32 [N_t] while ids fit).
3. **nodes** (a task per row chunk): each chunk's rows of every stored node column
   (:data:`graphfeed.core.columns.NODE_COLUMNS`: x, y, time, orig_id) written straight
   into every part's preallocated ``.npy`` file at the rows that part's earlier nodes leave free.
4. **degrees** (a task per edge chunk): each key node's edge count and the edge cut; from them
   every part's ``indptr`` and the sort buckets (runs of key nodes whose edges fit one sort).
5. **bucket** (a task per edge chunk): the chunk's edges renumbered and appended, by bucket, to
   files in the scratch folder (external bucketing).
6. **sort** (a task per bucket): a bucket's edges sorted by (key, neighbour, edge id) and written
   into its part's preallocated files at the bucket's offset.

The files are byte-identical to the in-memory writer's (:mod:`builder`) for the same assignment.
Everything is written under ``.NAME.work/`` next to the output: finished tasks leave a marker
there, so a killed run re-run with the same input and parameters continues from them (a changed
input or parameter is named and the run starts over: :func:`.scratch.open_scratch`).  The partition
folder is ``.NAME.work/out`` until META.json is written last and it is renamed to NAME: nothing
half-written looks complete.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from graphfeed.core.columns import INPUT_COLUMNS, NODE_COLUMNS, TIME, NodeColumn
from graphfeed.server.partition.build.plan import (
    BASELINE_BYTES,
    BOUNDED_METHODS,
    METIS_BYTES_PER_EDGE,
    default_memory_limit,
    format_bytes,
    make_plan,
)
from graphfeed.server.partition.build.runner import InProcess
from graphfeed.server.partition.build.scratch import (
    Job,
    Plan,
    count_ids,
    edge_chunks,
    id_dtype,
    load_bucket,
    mark_done,
    open_scratch,
    parts_dtype,
    plan_buckets,
    save_atomic,
    save_by_bucket,
    stable_order,
    write_json_atomic,
)
from graphfeed.server.partition.format.layout import (
    PartitionMeta,
    PartitionPaths,
    edge_type_dirname,
    save_array,
    write_meta,
)
from graphfeed.server.partition.format.quantize import add_scales
from graphfeed.server.partition.inputs.chunked import ChunkedGraph
from graphfeed.server.partition.inputs.chunks import ArrayChunks, chunk_classes
from graphfeed.server.partition.inputs.graph import EdgeType, EdgeTypeInput, GraphInput, NodeTypeInput

Progress = Callable[[Iterable, str], Iterable]
Log = Callable[[str], None]
# ----------------------------------------------------------------------------- preallocated .npy files

def preallocate(path: Path, dtype, shape: tuple[int, ...]) -> int:
    """Create ``path`` as a ``.npy`` file of ``shape`` (the exact header ``np.save`` writes, data zero-filled,
    sparse) unless it already has that size; returns the header length (where row 0 starts)."""
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": tuple(int(s) for s in shape)})
    head = header.getvalue()
    size = len(head) + int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
    if path.is_file() and path.stat().st_size == size:
        return len(head)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return len(head)


def _header_length(path: Path) -> int:
    """Where row 0 of the ``.npy`` file ``path`` starts (its magic says the header's length field size)."""
    with open(path, "rb") as fh:
        major, _ = np.lib.format.read_magic(fh)
        size = int.from_bytes(fh.read(2 if major == 1 else 4), "little")
        return fh.tell() + size


def write_rows(path: Path, row: int, array: np.ndarray) -> None:
    """Write ``array`` at row ``row`` of the preallocated ``.npy`` file ``path`` (rows of ``array``'s row size)."""
    if array.size == 0:
        return
    data = np.ascontiguousarray(array)
    offset = _header_length(path) + row * (data.nbytes // max(1, data.shape[0]))
    with open(path, "r+b") as fh:    # never truncates: other tasks write other rows of the same file
        fh.seek(offset)
        data.tofile(fh)


# ----------------------------------------------------------------------------- 1. assignment

def random_parts_bounded(graph: ChunkedGraph, num_parts: int, seed: int) -> np.ndarray:
    """The in-memory path's random assignment (``builder._random_parts``), dealt a slice at a time."""
    rng = np.random.default_rng(seed)
    out = np.empty(graph.num_nodes, dtype=parts_dtype(num_parts))
    start = 0
    step = 1 << 22
    for t in graph.nodes.values():
        perm = rng.permutation(t.num_nodes)
        view = out[start:start + t.num_nodes]
        for a in range(0, t.num_nodes, step):
            b = min(a + step, t.num_nodes)
            view[perm[a:b]] = np.arange(a, b, dtype=np.int64) % num_parts
        del perm
        start += t.num_nodes
    return out


def metis_parts_bounded(graph: ChunkedGraph, num_parts: int, seed: int, memory_limit: int) -> np.ndarray:
    """METIS on the whole edge list (graphs that fit): ValueError with the estimate when it would not."""
    from graphfeed.server.partition.build.metis import metis_parts

    need = BASELINE_BYTES + METIS_BYTES_PER_EDGE * graph.num_edges + 40 * graph.num_nodes
    if need > memory_limit:
        raise ValueError(f"--method metis holds the whole graph (about {format_bytes(need)} for "
                         f"{graph.num_edges:,} edges), more than --memory-limit {format_bytes(memory_limit)}; "
                         f"use --method fennel (streaming) or random, or raise --memory-limit")
    nodes = {t: NodeTypeInput(n.num_nodes) for t, n in graph.nodes.items()}
    edges = {e: EdgeTypeInput(graph.read_edges(e, 0, c.num_edges)) for e, c in graph.edges.items()}
    whole = GraphInput.typed(nodes, edges, graph.splits, graph.label_type)
    return metis_parts(whole, num_parts, seed).astype(parts_dtype(num_parts))


# ----------------------------------------------------------------------------- 2. numbering

def number_nodes(parts: np.ndarray, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(new_of_orig, ranges)`` of one node type: new ids ordered by (part, original id), as
    ``builder._Numbering``, computed a slice at a time (int32 while ids fit)."""
    counts = np.bincount(parts, minlength=num_parts).astype(np.int64)
    ranges = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(counts, out=ranges[1:])
    new = np.empty(parts.size, dtype=id_dtype(parts.size))
    running = ranges[:-1].copy()
    step = 1 << 22
    for a in range(0, parts.size, step):
        chunk = np.asarray(parts[a:a + step], dtype=np.int64)
        order = stable_order(chunk, num_parts)
        c = np.bincount(chunk, minlength=num_parts)
        rank = np.empty(chunk.size, dtype=np.int64)
        rank[order] = np.arange(chunk.size) - np.repeat(np.cumsum(c) - c, c)
        new[a:a + chunk.size] = running[chunk] + rank
        running += c
    return new, ranges


def _parts_of_type(parts: np.ndarray, graph: ChunkedGraph, ntype: str) -> np.ndarray:
    offset = graph.node_offsets()[ntype]
    return parts[offset:offset + graph.nodes[ntype].num_nodes]


# ----------------------------------------------------------------------------- 3. nodes

def node_tasks(job: Job, ranges: dict[str, list[int]]) -> list[tuple[str, int, int, list[int]]]:
    """``(ntype, start, stop, rows_before)`` per row chunk; preallocates every part's node files."""
    graph, plan, paths = job.graph, job.plan, PartitionPaths(job.out)
    parts, tasks = job.parts(), []
    for ntype, t in graph.nodes.items():
        row_bytes = sum(f.row_bytes for f in t.fields.values()) + 16
        step = max(1, plan.node_bytes // row_bytes)
        mine = _parts_of_type(parts, graph, ntype)
        before = np.zeros(plan.num_parts, dtype=np.int64)
        for a in range(0, t.num_nodes, step):
            b = min(a + step, t.num_nodes)
            tasks.append((ntype, a, b, before.tolist()))
            before += np.bincount(mine[a:b], minlength=plan.num_parts)
        for k in range(plan.num_parts):
            size = ranges[ntype][k + 1] - ranges[ntype][k]
            for column in INPUT_COLUMNS:
                f = t.fields.get(column.file)
                if f is not None:
                    preallocate(paths.node_file(k, column.name, ntype), _node_dtype(column, f), (size, *f.row_shape))
            preallocate(paths.node_file(k, "orig_id", ntype), np.int64, (size,))
    return tasks


def _node_dtype(column: NodeColumn, f: ArrayChunks) -> np.dtype:
    """The stored dtype of ``column`` read from the chunks ``f`` (the column's own, else the input's)."""
    return np.dtype(column.dtype or f.dtype)


def run_node_task(job: Job, task: tuple[str, int, int, list[int]]) -> int:
    """Copy rows ``[a, b)`` of ``ntype``'s fields into every part's files; returns the rows copied."""
    ntype, a, b, before = task
    marker = job.done("nodes", f"{ntype}.{a}")
    if marker.exists():
        return 0
    graph, paths = job.graph, PartitionPaths(job.out)
    t = graph.nodes[ntype]
    parts = np.asarray(_parts_of_type(job.parts(), graph, ntype)[a:b])
    masks = [parts == k for k in range(job.plan.num_parts)]
    for column in INPUT_COLUMNS:
        f = t.fields.get(column.file)
        if f is None:
            continue
        rows = f.read(a, b).astype(_node_dtype(column, f), copy=False)
        for k, mask in enumerate(masks):
            write_rows(paths.node_file(k, column.name, ntype), before[k], rows[mask])
    ids = np.arange(a, b, dtype=np.int64)
    for k, mask in enumerate(masks):
        write_rows(paths.node_file(k, "orig_id", ntype), before[k], ids[mask])
    mark_done(marker)
    return b - a


def write_splits(job: Job, ranges: dict[str, list[int]]) -> None:
    graph, paths = job.graph, PartitionPaths(job.out)
    new = job.new_ids(graph.label_type)
    bounds = ranges[graph.label_type]
    for split, idx in graph.splits.items():
        gids = np.sort(np.asarray(new[idx], dtype=np.int64))
        for k in range(job.plan.num_parts):
            lo, hi = np.searchsorted(gids, [bounds[k], bounds[k + 1]])
            save_array(paths.split_file(k, split, graph.label_type), gids[lo:hi])


# ----------------------------------------------------------------------------- 4. degrees and buckets

def _key_other(etype: EdgeType, topo: str) -> tuple[int, str, str]:
    """Row of the key endpoint, key node type, other node type (CSC: destinations own the edge)."""
    return (1, etype[2], etype[0]) if topo == "csc" else (0, etype[0], etype[2])


def run_degree_task(job: Job, task: tuple[str, int, int]) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Per topology, the edge count of each key node (original ids) in edges ``[a, b)``; and their cut."""
    dirname, a, b = task
    etype = _etype_of(job.graph, dirname)
    ei = job.graph.read_edges(etype, a, b)
    counts = []
    for topo in job.plan.topologies:
        row, key_type, _ = _key_other(etype, topo)
        counts.append(count_ids(ei[row], job.graph.nodes[key_type].num_nodes))
    parts = job.parts()
    src = np.asarray(_parts_of_type(parts, job.graph, etype[0]))
    dst = src if etype[0] == etype[2] else np.asarray(_parts_of_type(parts, job.graph, etype[2]))
    return counts, int(np.count_nonzero(src[ei[0]] != dst[ei[1]]))


def _etype_of(graph: ChunkedGraph, dirname: str) -> EdgeType:
    return next(e for e in graph.edges if edge_type_dirname(e) == dirname)


def run_bucket_task(job: Job, task: tuple[str, str, int, int]) -> int:
    """Renumber edges ``[a, b)`` and append them, by sort bucket, to the scratch folder; returns the edges."""
    dirname, topo, a, b = task
    marker = job.done(f"bucket.{dirname}.{topo}", a)
    if marker.exists():
        return 0
    graph, etype = job.graph, _etype_of(job.graph, dirname)
    row, key_type, other_type = _key_other(etype, topo)
    ei = graph.read_edges(etype, a, b)
    key_new = np.asarray(job.new_ids(key_type))[ei[row]]
    other_new = np.asarray(job.new_ids(other_type))[ei[1 - row]]
    starts = np.asarray(job.table(f"buckets.{dirname}.{topo}")["starts"], dtype=np.int64)
    columns = {"key": key_new, "other": other_new, "eid": np.arange(a, b, dtype=np.int64)}
    del ei
    columns.update(_edge_extras(job, etype, other_type, a, b, other_new))
    save_by_bucket(starts, key_new, columns, lambda bkt: job.bucket_dir(etype, topo, bkt), f"{a:012d}")
    mark_done(marker)
    return b - a


def _edge_extras(job: Job, etype: EdgeType, other_type: str, a: int, b: int,
                 other_new: np.ndarray) -> dict[str, np.ndarray]:
    """Edge features, weights and times of edges ``[a, b)`` (as the in-memory path stores them), and each
    neighbour's node time when the other type has node times."""
    fields, out = job.graph.edges[etype].fields, {}
    if "edge_attr" in fields:
        out["edge_attr"] = fields["edge_attr"].read(a, b)
    if "edge_weight" in fields:
        w = fields["edge_weight"].read(a, b)
        out["edge_weight"] = w if np.issubdtype(w.dtype, np.floating) else w.astype(np.float32)
    if "edge_time" in fields:
        out["edge_time"] = fields["edge_time"].read(a, b).astype(np.int64)
    node_time = job.graph.nodes[other_type].fields.get(NODE_COLUMNS[TIME].file)
    if node_time is not None:
        by_new = _time_by_new(job, other_type, node_time)
        out["nbr_time"] = by_new[other_new]
    return out


def _time_by_new(job: Job, ntype: str, node_time: ArrayChunks) -> np.ndarray:
    """Node times of ``ntype`` in new-id order (written once into the scratch folder, then memory-mapped)."""
    path = job.root / f"time_{ntype}.npy"
    if not path.is_file():
        new = np.asarray(job.new_ids(ntype))
        times = np.empty(new.size, dtype=np.int64)
        times[new] = node_time.read(0, node_time.rows).astype(np.int64)
        save_atomic(path, times)
    return np.load(path, mmap_mode="r")


# ----------------------------------------------------------------------------- 5. sort and write

def preallocate_edges(job: Job, etype: EdgeType, topo: str, part_edges: list[int], bucket_columns: dict) -> None:
    paths = PartitionPaths(job.out)
    for k, size in enumerate(part_edges):
        preallocate(paths.edge_file(k, topo, "indices", etype), np.int64, (size,))
        for name, (dtype, shape) in bucket_columns.items():
            preallocate(paths.edge_file(k, topo, name, etype), dtype, (size, *shape))


def run_sort_task(job: Job, task: tuple[str, str, int]) -> int:
    """Sort bucket ``bucket``'s edges by (key, neighbour, edge id) and write them at its offset in its part."""
    from graphfeed.server.partition.build.builder import _edge_order

    dirname, topo, bkt = task
    marker = job.done(f"sort.{dirname}.{topo}", bkt)
    if marker.exists():
        return 0
    etype = _etype_of(job.graph, dirname)
    table = job.table(f"buckets.{dirname}.{topo}")
    part, first, end, offset = table["buckets"][bkt]
    folder = job.bucket_dir(etype, topo, bkt)
    columns = load_bucket(folder)
    if not columns:
        mark_done(marker)
        return 0
    key = np.subtract(columns.pop("key"), first, dtype=np.int64)
    other = columns.pop("other")
    n_local = end - first
    indptr = np.zeros(n_local + 1, dtype=np.int64)
    np.cumsum(np.bincount(key, minlength=n_local), out=indptr[1:])
    _, other_type = _key_other(etype, topo)[1:]
    order = _edge_order(key, other, n_local, indptr, job.graph.nodes[other_type].num_nodes)
    del key
    paths = PartitionPaths(job.out)
    write_rows(paths.edge_file(part, topo, "indices", etype), offset, other[order].astype(np.int64))
    del other
    for name, values in columns.items():
        write_rows(paths.edge_file(part, topo, name, etype), offset, values[order])
    mark_done(marker)
    shutil.rmtree(folder, ignore_errors=True)   # its edges are in the part now: free the disk
    return int(order.size)


def write_indptr(job: Job, etype: EdgeType, topo: str, degrees_new: np.ndarray, ranges: list[int]) -> None:
    """Each part's ``indptr`` (int64 [n_k + 1]) from its key nodes' edge counts, a slice at a time."""
    paths, step = PartitionPaths(job.out), 1 << 22
    for k in range(len(ranges) - 1):
        lo, hi = ranges[k], ranges[k + 1]
        path = paths.edge_file(k, topo, "indptr", etype)
        preallocate(path, np.int64, (hi - lo + 1,))
        write_rows(path, 0, np.zeros(1, dtype=np.int64))
        total = 0
        for a in range(lo, hi, step):
            c = np.cumsum(degrees_new[a:min(a + step, hi)], dtype=np.int64) + total
            write_rows(path, a - lo + 1, c)
            total = int(c[-1])


# ----------------------------------------------------------------------------- the whole run

@dataclass
class Reporter:
    progress: Progress
    log: Log


def partition_chunked(graph: ChunkedGraph, num_parts: int, output: str | os.PathLike, *, method: str = "random",
                      topologies=("csc",), seed: int = 0, memory_limit: int | None = None, runner=None,
                      scratch: str | os.PathLike | None = None, overwrite: bool = False,
                      progress: Progress | None = None, log: Log | None = None,
                      fennel_passes: int = 3) -> PartitionMeta:
    """Partition the chunked ``graph`` into ``output`` under ``memory_limit`` bytes per process (see the
    module docstring); ``runner`` (:mod:`runner`) runs the chunk tasks (default: in this process).
    ``scratch`` (default ``.NAME.work`` next to ``output``) must be readable and writable by every worker.
    Raises ValueError for bad parameters, FileExistsError for an output it may not replace."""
    from graphfeed.server.partition.build.builder import _check_replaceable, _replace_dir

    if method not in BOUNDED_METHODS:
        raise ValueError(f"--memory-limit/--scheduler partition with --method {', '.join(BOUNDED_METHODS)}, not "
                         f"{method!r} (hotness pre-samples the whole graph in memory: drop --memory-limit)")
    if not 1 <= num_parts <= graph.num_nodes:
        raise ValueError(f"--num-parts must be between 1 and the number of nodes ({graph.num_nodes}), got {num_parts}")
    output = Path(output)
    _check_replaceable(output, overwrite)
    memory_limit = memory_limit or default_memory_limit()
    plan = make_plan(graph, num_parts, method, seed, topologies, memory_limit, fennel_passes)
    report = Reporter(progress or (lambda it, desc: it), log or (lambda message: None))
    scratch = Path(scratch) if scratch else output.parent / f".{output.name}.work"
    open_scratch(scratch, plan, report.log)
    job = Job(dataclasses.replace(graph, splits={}), plan, str(scratch))
    runner = runner or InProcess(report.progress)
    report.log(f"memory limit {format_bytes(memory_limit)}: {plan.edge_rows:,} edges per chunk task, "
               f"{plan.sort_edges:,} per sort bucket; tasks run {runner.name}")
    parts = _assign(job, graph, memory_limit, runner, report)
    ranges = _number(job, parts, report)
    del parts
    write_splits(dataclasses.replace(job, graph=graph), ranges)   # the job's copy of the graph carries no splits
    runner.map(run_node_task, job, node_tasks(job, ranges), "writing nodes")
    cut = sum(_write_edge_type(job, etype, ranges, runner, report) for etype in graph.edge_types)
    meta = _meta(graph, plan, ranges, cut)
    add_scales(job.out, meta)    # int8 feature scales, as the in-memory path stores them
    write_meta(job.out, meta)
    _replace_dir(job.out, output, overwrite)
    shutil.rmtree(scratch, ignore_errors=True)
    return meta


def assign_only(graph: ChunkedGraph, num_parts: int, method: str, *, seed: int = 0, memory_limit: int | None = None,
                fennel_passes: int = 3, log: Log | None = None) -> np.ndarray:
    """Stage 1 alone: every node's part (homogeneous view) as :func:`partition_chunked` would assign it, its
    scratch work in a temporary folder and nothing written out (what ``graphfeed bench partition`` measures)."""
    import tempfile

    memory_limit = memory_limit or default_memory_limit()
    plan = make_plan(graph, num_parts, method, seed, ("csc",), memory_limit, fennel_passes)
    report = Reporter(lambda it, desc: it, log or (lambda message: None))
    with tempfile.TemporaryDirectory(prefix="graphfeed-assign-") as tmp:
        open_scratch(Path(tmp), plan, report.log)
        job = Job(dataclasses.replace(graph, splits={}), plan, tmp)
        return np.array(_assign(job, graph, memory_limit, InProcess(report.progress), report))


def _assign(job: Job, graph: ChunkedGraph, memory_limit: int, runner, report: Reporter) -> np.ndarray:
    path = job.root / "parts.npy"
    if path.is_file():
        return np.load(path)
    plan = job.plan
    report.log(f"assigning {graph.num_nodes:,} nodes to {plan.num_parts} part(s) ({plan.method})")
    if plan.method == "random":
        parts = random_parts_bounded(graph, plan.num_parts, plan.seed)
    elif plan.method == "metis":
        parts = metis_parts_bounded(graph, plan.num_parts, plan.seed, memory_limit)
    else:
        from graphfeed.server.partition.build.fennel import fennel_parts
        parts = fennel_parts(job, runner, report, graph.splits)
    save_atomic(path, parts)
    return parts


def _number(job: Job, parts: np.ndarray, report: Reporter) -> dict[str, list[int]]:
    graph, ranges = job.graph, {}
    report.log("numbering nodes by part")
    for ntype in graph.node_types:
        path, mine = job.root / f"new_{ntype}.npy", _parts_of_type(parts, graph, ntype)
        counts = np.bincount(mine, minlength=job.plan.num_parts)
        ranges[ntype] = [0, *np.cumsum(counts).tolist()]
        if not path.is_file():
            new, _ = number_nodes(mine, job.plan.num_parts)
            save_atomic(path, new)
    return ranges


def _write_edge_type(job: Job, etype: EdgeType, ranges: dict[str, list[int]], runner, report: Reporter) -> int:
    """Every topology of one edge type; returns its edge cut."""
    dirname, graph, plan = edge_type_dirname(etype), job.graph, job.plan
    named = "" if graph.is_homogeneous else f" {dirname}"
    chunks = edge_chunks(job, etype)
    totals = [np.zeros(graph.nodes[_key_other(etype, topo)[1]].num_nodes, dtype=np.int32) for topo in plan.topologies]
    cut = [0]

    def combine(result) -> None:   # summed as tasks finish: one table per topology, never one per task
        for total, (ids, counts) in zip(totals, result[0]):
            total[ids] += counts
        cut[0] += result[1]

    runner.map(run_degree_task, job, [(dirname, a, b) for a, b in chunks], f"counting degrees{named}", combine)
    for i, topo in enumerate(plan.topologies):
        _, key_type, other_type = _key_other(etype, topo)
        degrees, totals[i] = totals[i], np.empty(0, dtype=np.int32)
        new = np.asarray(job.new_ids(key_type))
        degrees_new = np.empty_like(degrees)
        degrees_new[new] = degrees
        del degrees, new
        buckets = plan_buckets(degrees_new, ranges[key_type], plan.sort_edges)
        table_path = job.root / f"buckets.{dirname}.{topo}.json"
        write_json_atomic(table_path, {"buckets": buckets, "starts": [b[1] for b in buckets]})
        part_edges = [int(degrees_new[ranges[key_type][k]:ranges[key_type][k + 1]].sum())
                      for k in range(plan.num_parts)]
        write_indptr(job, etype, topo, degrees_new, ranges[key_type])
        del degrees_new
        preallocate_edges(job, etype, topo, part_edges, _extra_columns(graph, etype, other_type))
        runner.map(run_bucket_task, job, [(dirname, topo, a, b) for a, b in chunks], f"bucketing {topo}{named}")
        runner.map(run_sort_task, job, [(dirname, topo, i) for i in range(len(buckets))], f"sorting {topo}{named}")
    return cut[0]


def _extra_columns(graph: ChunkedGraph, etype: EdgeType, other_type: str) -> dict[str, tuple[np.dtype, tuple]]:
    fields, out = graph.edges[etype].fields, {}
    if "edge_attr" in fields:
        out["edge_attr"] = (np.dtype(fields["edge_attr"].dtype), fields["edge_attr"].row_shape)
    if "edge_weight" in fields:
        w = np.dtype(fields["edge_weight"].dtype)
        out["edge_weight"] = (w if np.issubdtype(w, np.floating) else np.dtype(np.float32), ())
    if "edge_time" in fields:
        out["edge_time"] = (np.dtype(np.int64), ())
    out["eid"] = (np.dtype(np.int64), ())
    if NODE_COLUMNS[TIME].file in graph.nodes[other_type].fields:
        out["nbr_time"] = (np.dtype(np.int64), ())
    return out


def _spec(f: ArrayChunks, dtype=None) -> dict:
    return {"shape": list(f.row_shape), "dtype": str(np.dtype(dtype or f.dtype))}


def _meta(graph: ChunkedGraph, plan: Plan, ranges: dict[str, list[int]], cut: int) -> PartitionMeta:
    features = {}
    for ntype, t in graph.nodes.items():
        features[ntype] = {c.name: _spec(t.fields[c.file], c.dtype) for c in INPUT_COLUMNS if c.file in t.fields}
    edges = {edge_type_dirname(e): c.fields for e, c in graph.edges.items()}
    return PartitionMeta(
        num_parts=plan.num_parts, node_types=graph.node_types, edge_types=[list(e) for e in graph.edge_types],
        node_ranges=ranges, num_edges={d: f["edge_index"].rows for d, f in edges.items()},
        topologies=list(plan.topologies), features=features,
        edge_features={d: _spec(f["edge_attr"]) for d, f in edges.items() if "edge_attr" in f},
        edge_weights=[d for d, f in edges.items() if "edge_weight" in f],
        edge_times=[d for d, f in edges.items() if "edge_time" in f],
        num_classes=int(graph.num_classes), split_sizes={k: int(v.size) for k, v in graph.splits.items()},
        label_type=graph.label_type,
        num_classes_by_type=({} if graph.is_homogeneous else
                             {t: (graph.num_classes if t == graph.label_type else chunk_classes(n.y))
                              for t, n in graph.nodes.items() if n.y is not None}),
        graph_name=graph.name, method=plan.method, edge_cut=int(cut), source_fingerprint=graph.fingerprint,
        seed=plan.seed)



