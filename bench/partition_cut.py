"""Edge cut of the streaming partitioner (``--method fennel`` on the bounded path) against METIS on one graph.

For every part count: Fennel through :func:`partition_chunked` under ``--memory-limit`` (its parts
written to a temporary folder), METIS on the whole edge list in memory (the graph must fit), the edge
cut of each (directed edges whose ends lie in different parts), the ratio and the wall time of each.
Prints one JSON line per part count::

    python -m graphfeed.bench.partition_cut /work/shared/data/cora -p 2,4
    python -m graphfeed.bench.partition_cut graphs/medium -p 2 --memory-limit 2GB --seed 1
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import numpy as np

from graphfeed.server.partition.build.bounded import metis_parts_bounded, partition_chunked
from graphfeed.server.partition.build.plan import parse_bytes
from graphfeed.server.partition.inputs.chunked import ChunkedGraph, open_chunked


def edge_cut(graph: ChunkedGraph, parts: np.ndarray) -> int:
    """Directed edges between parts; ``parts`` over the homogeneous view (every node type stacked)."""
    offsets, cut = graph.node_offsets(), 0
    for etype, edges in graph.edges.items():
        step = 1 << 24
        for a in range(0, edges.num_edges, step):
            ei = graph.read_edges(etype, a, min(a + step, edges.num_edges))
            cut += int(np.count_nonzero(parts[ei[0] + offsets[etype[0]]] != parts[ei[1] + offsets[etype[2]]]))
    return cut


def compare(path: str, num_parts: int, memory_limit: int, seed: int) -> dict:
    graph = open_chunked(path)
    with tempfile.TemporaryDirectory(prefix="partition-cut-") as tmp:
        t0 = time.perf_counter()
        meta = partition_chunked(graph, num_parts, f"{tmp}/parts", method="fennel", seed=seed,
                                 memory_limit=memory_limit)
        fennel_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    metis = edge_cut(graph, metis_parts_bounded(graph, num_parts, seed, 1 << 50))
    metis_s = time.perf_counter() - t0
    return {"graph": path, "parts": num_parts, "edges": graph.num_edges, "fennel_cut": meta.edge_cut,
            "metis_cut": metis, "ratio": round(meta.edge_cut / max(metis, 1), 3), "fennel_s": round(fennel_s, 1),
            "metis_s": round(metis_s, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("graph", help="a graph folder (chunked or one-file layout)")
    parser.add_argument("-p", "--num-parts", default="2,4", help="part counts, comma-separated (default 2,4)")
    parser.add_argument("--memory-limit", default="1GB", help="Fennel's limit (default 1GB)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for k in (int(p) for p in args.num_parts.split(",")):
        print(json.dumps(compare(args.graph, k, parse_bytes(args.memory_limit), args.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
