"""The bounded partitioner's memory plan: how many edges and node rows a chunk task may hold under a limit.

``--memory-limit`` bounds every process of a run (this one and each Dask worker); what a process holds
whatever the chunk size (:func:`fixed_bytes`: the per-node tables) comes first, and the chunk sizes
share what is left (:func:`make_plan`).  The plan is recorded in the scratch folder
(:class:`graphfeed.server.partition.build.scratch.Plan`): a run resumes only under the same one.
"""
from __future__ import annotations

import re

from graphfeed.server.partition.build.scratch import Plan, parts_dtype
from graphfeed.server.partition.inputs.chunked import ChunkedGraph
from graphfeed.server.partition.inputs.chunks import ArrayChunks

BOUNDED_METHODS = ("random", "fennel", "metis")
BASELINE_BYTES = 128 << 20    # the interpreter, numpy and graphfeed's imports (~40 MB resident), with room
EDGE_TASK_BYTES = 96          # per edge held by a degree/bucket task (input ids, new ids, bucket order, copies)
SORT_TASK_BYTES = 80          # per edge held by a sort task (columns, packed keys, order, output copies)
METIS_BYTES_PER_EDGE = 72     # the in-memory METIS path: edge list, symmetric keys, pymetis' int32 copies
FENNEL_NODE_BYTES = 11        # per node, fennel: groups, then cluster labels and sizes (int32 each) while clustering,
                              # the best parts so far and the refinement's gains and targets later
_MIN_WORK = 256 << 10
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"2GB"``, ``"512MiB"``, ``"1.5G"`` or a byte count as bytes (binary units); ValueError naming the form."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m[2].upper() not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write e.g. 2GB, 512MB or 1073741824")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def default_memory_limit() -> int:
    """Half of the memory available now (at least 256 MB): room for the page cache and other processes."""
    import psutil
    return max(256 << 20, int(psutil.virtual_memory().available) // 2)


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def fixed_bytes(graph: ChunkedGraph, num_parts: int, topologies=("csc",)) -> int:
    """Bytes a process holds whatever the chunk size: parts and new ids of every node, and while an edge type
    is counted one degree table per topology and one renumbered (int32 each)."""
    n = graph.num_nodes
    id_bytes = 4 if n < (1 << 31) else 8
    return n * (parts_dtype(num_parts).itemsize + id_bytes + 4 * (len(topologies) + 1))


def make_plan(graph: ChunkedGraph, num_parts: int, method: str, seed: int, topologies, memory_limit: int,
              fennel_passes: int = 3) -> Plan:
    """Chunk sizes that keep every process under ``memory_limit``; ValueError when it cannot be met."""
    fixed = fixed_bytes(graph, num_parts, topologies)
    if method == "random":   # the permutation the in-memory path draws (int64 [N_t], one type at a time)
        fixed += 8 * max(t.num_nodes for t in graph.nodes.values())
    elif method == "fennel":
        fixed += FENNEL_NODE_BYTES * graph.num_nodes
    extra_row = sum(_edge_extra_bytes(e.fields) for e in graph.edges.values())
    work = memory_limit - BASELINE_BYTES - fixed
    if work < _MIN_WORK:
        need = BASELINE_BYTES + fixed + _MIN_WORK
        raise ValueError(f"--memory-limit {format_bytes(memory_limit)} is too small for {graph.num_nodes:,} nodes: "
                         f"the partitioner needs at least {format_bytes(need)} (per-node tables "
                         f"{format_bytes(fixed)}); raise --memory-limit")
    return Plan(num_parts=num_parts, method=method, seed=int(seed), topologies=tuple(topologies),
                fingerprint=graph.fingerprint, edge_rows=max(1024, work // (EDGE_TASK_BYTES + 2 * extra_row)),
                sort_edges=max(1024, work // (SORT_TASK_BYTES + 2 * extra_row)), node_bytes=max(1 << 20, work // 3),
                fennel_passes=fennel_passes)


def _edge_extra_bytes(fields: dict[str, ArrayChunks]) -> int:
    return sum(f.row_bytes for name, f in fields.items() if name != "edge_index") + 8   # + neighbour time
