"""Partition quality per method: edge cut, node balance and training-node balance at several part counts.

For every part count and method the assignment alone is computed (the bounded path's stage 1,
:func:`assign_only`: Fennel streams its neighbour lists through a temporary folder, METIS loads the
edges whole) and measured: the edge cut (the fraction of directed edges whose ends lie in different
parts), the node balance and the training-node balance (each the largest part's count over the
mean; 1.0 is perfect), and each method's cut over METIS's.  One line per part count and method, or
JSON lines with ``--json``::

    graphfeed bench partition /tmp/dblp -p 2,4,8
    python -m graphfeed.bench.partition_quality /tmp/dblp --methods fennel,metis --json

The graph folder is any ``graphfeed partition`` input (``python ../shared/data/densify.py
../shared/data/dblp --out /tmp/dblp`` writes one for the real graphs of ``../shared/data``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from graphfeed.server.partition.build.bounded import assign_only
from graphfeed.server.partition.build.plan import parse_bytes
from graphfeed.server.partition.inputs.chunked import ChunkedGraph, open_chunked

METHODS = ("fennel", "metis", "random")


@dataclass(frozen=True)
class Quality:
    method: str
    parts: int
    cut: float            # fraction of directed edges whose ends lie in different parts
    node_balance: float   # the largest part's nodes over the mean
    train_balance: float  # the largest part's training nodes over the mean (1.0 without training nodes)
    seconds: float
    cut_vs_metis: float | None = None


def edge_cut(graph: ChunkedGraph, parts: np.ndarray) -> int:
    """Directed edges between parts; ``parts`` over the homogeneous view (every node type stacked)."""
    offsets, cut = graph.node_offsets(), 0
    step = 1 << 24
    for etype, edges in graph.edges.items():
        for a in range(0, edges.num_edges, step):
            ei = graph.read_edges(etype, a, min(a + step, edges.num_edges))
            cut += int(np.count_nonzero(parts[ei[0] + offsets[etype[0]]] != parts[ei[1] + offsets[etype[2]]]))
    return cut


def imbalance(members: np.ndarray, num_parts: int) -> float:
    """The largest part's count of ``members`` (their parts) over the mean; 1.0 when there are none."""
    if members.size == 0:
        return 1.0
    counts = np.bincount(members, minlength=num_parts)
    return float(counts.max() / (members.size / num_parts))


def measure(graph: ChunkedGraph, num_parts: int, method: str, seed: int, memory_limit: int | None) -> Quality:
    t0 = time.perf_counter()
    parts = assign_only(graph, num_parts, method, seed=seed, memory_limit=memory_limit).astype(np.int64)
    seconds = time.perf_counter() - t0
    train = graph.node_offsets()[graph.label_type] + np.asarray(graph.splits.get("train", []), dtype=np.int64)
    return Quality(method, num_parts, edge_cut(graph, parts) / max(graph.num_edges, 1), imbalance(parts, num_parts),
                   imbalance(parts[train], num_parts), round(seconds, 2))


def compare(graph: ChunkedGraph, num_parts: int, methods, seed: int = 0,
            memory_limit: int | None = None) -> list[Quality]:
    """Every method's :class:`Quality` at ``num_parts``, with its cut over METIS's when METIS is among them."""
    out = [measure(graph, num_parts, m, seed, memory_limit) for m in methods]
    metis = next((q.cut for q in out if q.method == "metis"), None)
    if metis is None:
        return out
    return [Quality(**{**asdict(q), "cut_vs_metis": round(q.cut / metis, 3) if metis else None}) for q in out]


def format_line(graph_name: str, q: Quality) -> str:
    ratio = f"  {q.cut_vs_metis:.2f}x METIS" if q.cut_vs_metis is not None and q.method != "metis" else ""
    return (f"{graph_name}  {q.parts} parts  {q.method:<7} cut {100 * q.cut:5.1f}%{ratio}  nodes {q.node_balance:.3f}x"
            f"  training nodes {q.train_balance:.3f}x  ({q.seconds:.1f} s)")


def add_arguments(parser) -> None:
    parser.add_argument("graph", help="a graph folder (any `graphfeed partition` input)")
    parser.add_argument("-p", "--num-parts", default="2,4,8", help="part counts, comma-separated (default 2,4,8)")
    parser.add_argument("--methods", default="fennel,metis", help=f"comma-separated among {', '.join(METHODS)} "
                                                                   "(default fennel,metis)")
    parser.add_argument("--memory-limit", default=None, help="Fennel's limit (default: half the available memory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of text")


def run(args) -> int:
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        print(f"graphfeed bench partition: unknown method(s) {', '.join(unknown)}; choose among {', '.join(METHODS)}",
              file=sys.stderr)
        return 2
    graph = open_chunked(args.graph, with_fingerprint=False)
    limit = parse_bytes(args.memory_limit) if args.memory_limit else None
    for k in (int(p) for p in args.num_parts.split(",")):
        for q in compare(graph, k, methods, args.seed, limit):
            print(json.dumps({"graph": graph.name, **asdict(q)}) if args.json else format_line(graph.name, q),
                  flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
