"""The bounded partitioner's scratch folder and the helpers its chunk tasks share.

:class:`Job` is what every chunk task receives (picklable: Dask ships it to the workers once); files
are written under temporary names and renamed, and a finished task leaves a marker under ``done/``.
:func:`open_scratch` prepares the folder for a :class:`Plan`: a re-run under the same plan keeps the finished
tasks, under another one it starts over.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from graphfeed.server.partition.format.layout import edge_type_dirname
from graphfeed.server.partition.inputs.chunked import ChunkedGraph
from graphfeed.server.partition.inputs.graph import EdgeType

PLAN_VERSION = 2   # 2: fennel buckets hold global ids (a version-1 scratch folder is started over)


@dataclass(frozen=True)
class Plan:
    """Everything that decides the output and the chunking; a scratch folder is resumed only under the same plan."""

    num_parts: int
    method: str
    seed: int
    topologies: tuple[str, ...]
    fingerprint: str
    edge_rows: int            # edges per degree/bucket task
    sort_edges: int           # edges per sort bucket (a single node with more edges is one bucket)
    node_bytes: int           # bytes of node rows per node task
    fennel_passes: int = 3
    version: int = PLAN_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def differences(self, other: dict) -> list[str]:
        mine = json.loads(self.to_json())
        return [f"{k} {other.get(k)!r} -> {v!r}" for k, v in mine.items() if other.get(k) != v]


def parts_dtype(num_parts: int) -> np.dtype:
    return np.dtype(np.int16 if num_parts < (1 << 15) else np.int32)


def id_dtype(n: int) -> np.dtype:
    return np.dtype(np.int32 if n < (1 << 31) else np.int64)


@dataclass(frozen=True)
class Job:
    """What every task needs: the graph's description, the plan and the scratch folder (picklable)."""

    graph: ChunkedGraph
    plan: Plan
    scratch: str

    @property
    def root(self) -> Path:
        return Path(self.scratch)

    @property
    def out(self) -> Path:
        return self.root / "out"

    def done(self, stage: str, item) -> Path:
        return self.root / "done" / stage / f"{item}"

    def parts(self) -> np.ndarray:
        return np.load(self.root / "parts.npy", mmap_mode="r")

    def new_ids(self, ntype: str) -> np.ndarray:
        return np.load(self.root / f"new_{ntype}.npy", mmap_mode="r")

    def bucket_dir(self, etype: EdgeType, topo: str, bucket: int) -> Path:
        return self.root / "buckets" / f"{edge_type_dirname(etype)}.{topo}" / f"{bucket:06d}"

    def table(self, name: str) -> dict:
        return json.loads((self.root / f"{name}.json").read_text())


def mark_done(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def save_atomic(path: Path, array: np.ndarray) -> None:
    """``np.save`` to a temporary name, then rename: a killed task never leaves a complete-looking file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(array))
    os.replace(tmp, path)


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def edge_chunks(job: Job, etype: EdgeType) -> list[tuple[int, int]]:
    n = job.graph.edges[etype].num_edges
    step = job.plan.edge_rows
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def count_ids(ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct ids, int32 counts)`` of ids in ``[0, n)``: a chunk's share of a degree table, sized by the
    chunk, not by N (a bincount while N is at most 4x the chunk, else a sort)."""
    if n <= 4 * ids.size:
        counts = np.bincount(ids, minlength=n)
        distinct = np.flatnonzero(counts)
        return distinct, counts[distinct].astype(np.int32)
    distinct, counts = np.unique(ids, return_counts=True)
    return distinct, counts.astype(np.int32)


def plan_buckets(degrees_new: np.ndarray, ranges: list[int], sort_edges: int) -> list[tuple[int, int, int, int]]:
    """``(part, first key, end key, edge offset in the part)`` runs of key nodes (new ids) of at most
    ``sort_edges`` edges each (a node with more is a run of its own), never crossing a part boundary."""
    out = []
    for k in range(len(ranges) - 1):
        lo, hi = ranges[k], ranges[k + 1]
        cum = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(degrees_new[lo:hi], out=cum[1:])
        start = 0
        while start < hi - lo:
            end = int(np.searchsorted(cum, cum[start] + sort_edges, side="right")) - 1
            end = max(end, start + 1)
            out.append((k, lo + start, lo + end, int(cum[start])))
            start = end
    return out


def stable_order(keys: np.ndarray, num_keys: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for integer keys in ``[0, num_keys)``, faster: up to 2^16 keys
    as uint16 (numpy sorts those stably by radix, ~5x faster), more by sorting packed
    ``key << bits | position`` int64 values (numpy's vectorised sort, ~2x faster)."""
    if num_keys <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    bits = max(1, int(keys.size - 1).bit_length())
    if max(1, int(num_keys - 1).bit_length()) + bits > 63:
        return np.argsort(keys, kind="stable")
    packed = np.left_shift(keys, bits, dtype=np.int64)
    packed |= np.arange(keys.size, dtype=np.int64)
    packed.sort()
    packed &= (1 << bits) - 1
    return packed


def save_by_bucket(starts: np.ndarray, key: np.ndarray, columns: dict[str, np.ndarray],
                   folder_of: Callable[[int], Path], stem: str) -> None:
    """External bucketing, the writing half: each row goes to the bucket of the last of ``starts`` (ascending)
    at or below its ``key``; every bucket's rows of every column (in input order) are saved as
    ``folder_of(bucket)/STEM.COLUMN.npy``.  ``stem`` names the chunk (no two chunks share one)."""
    bucket = np.searchsorted(starts, key, side="right") - 1
    order = stable_order(bucket, starts.size)   # stable: rows keep their input order within a bucket
    offsets = np.zeros(starts.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(bucket, minlength=starts.size), out=offsets[1:])
    for bkt in np.flatnonzero(np.diff(offsets)):
        sel = order[offsets[bkt]:offsets[bkt + 1]]
        folder = folder_of(int(bkt))
        for name, values in columns.items():
            save_atomic(folder / f"{stem}.{name}.npy", values[sel])


def load_bucket(folder: Path) -> dict[str, np.ndarray]:
    """The reading half: every column of one bucket, its chunks concatenated in stem order ({} if none)."""
    if not folder.is_dir():
        return {}
    by_name: dict[str, list[Path]] = {}
    for p in sorted(folder.glob("*.npy")):
        if not p.name.startswith("."):                 # a temporary file of a killed writer
            by_name.setdefault(p.name.rsplit(".", 2)[1], []).append(p)
    return {name: np.concatenate([np.load(p) for p in files]) for name, files in by_name.items()}


def open_scratch(scratch: Path, plan: Plan, log: Callable[[str], None]) -> bool:
    """Prepare ``scratch`` for ``plan``; True when it continues an earlier run's work."""
    plan_file = scratch / "plan.json"
    if plan_file.is_file():
        try:
            old = json.loads(plan_file.read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
        diff = plan.differences(old)
        if not diff:
            done = sum(1 for p in (scratch / "done").rglob("*") if p.is_file()) if (scratch / "done").is_dir() else 0
            log(f"resuming the run in {scratch}: {done} finished task(s) kept")
            return True
        log(f"cannot resume the run in {scratch} ({'; '.join(diff)}): starting over")
        shutil.rmtree(scratch)
    elif scratch.exists():
        log(f"cannot resume the run in {scratch} (no plan.json: it was killed before starting): starting over")
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    write_json_atomic(plan_file, json.loads(plan.to_json()))
    return False
