"""``graphfeed partition``: turn a graph into a graphfeed partition folder.

Reads a ``.npy`` folder or a ``torch.save`` file, homogeneous or typed (see
:mod:`graphfeed.server.partition.inputs` and :mod:`graphfeed.server.partition.typed_inputs`),
assigns nodes to parts (random or METIS), writes the folder atomically and prints a summary.
An output folder that already holds the same partitioning (same input fingerprint and
parameters) is left alone and reported up to date.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from graphfeed.cli.main import UsageError

HELP = "partition a graph into a graphfeed partition folder"
TOPOLOGY_CHOICES = {"csc": ("csc",), "csr": ("csr",), "both": ("csc", "csr")}


def add_arguments(parser) -> None:
    parser.add_argument("input", help="a folder in the .npy layout (edge_index.npy, x.npy, y.npy, train_idx.npy, ...; "
                                      "typed: one sub-folder per node type and per edge type src__rel__dst) "
                                      "or a PyG Data / HeteroData saved with torch.save")
    parser.add_argument("--num-parts", "-p", type=int, required=True, help="number of partitions (1..nodes)")
    parser.add_argument("--method", choices=("random", "metis"), default="metis",
                        help="random assignment or METIS (fewer cut edges; balances nodes and training nodes)")
    parser.add_argument("--output", "-o", required=True, help="partition folder to create")
    parser.add_argument("--topology", choices=sorted(TOPOLOGY_CHOICES), default="csc",
                        help="csc: in-edges (default, PyG's direction); csr: out-edges; both")
    parser.add_argument("--seed", type=int, default=0, help="seed for random assignment / METIS (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder holding another partitioning")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="let a torch.save input unpickle arbitrary objects (only for files you trust)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


class _Reporter:
    """Step lines and tqdm bars on stderr, with the elapsed time."""

    def __init__(self, quiet: bool):
        self.quiet, self.t0 = quiet, time.perf_counter()

    def log(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:7.1f}s] {message}", file=sys.stderr, flush=True)

    def progress(self, iterable, desc: str):
        if self.quiet:
            return iterable
        from tqdm import tqdm
        return tqdm(iterable, desc=f"[{time.perf_counter() - self.t0:7.1f}s] {desc}", file=sys.stderr,
                    unit="part", leave=False, mininterval=0.5)


def _differences(meta, graph, args, topologies) -> list[str]:
    wanted = {"input fingerprint": graph.fingerprint, "num_parts": args.num_parts, "method": args.method,
              "topology": list(topologies), "seed": args.seed}
    have = {"input fingerprint": meta.source_fingerprint, "num_parts": meta.num_parts, "method": meta.method,
            "topology": list(meta.topologies), "seed": meta.seed}
    return [f"{k} {have[k]!s:.16} -> {wanted[k]!s:.16}" for k in wanted if have[k] != wanted[k]]


def _check_output(output: Path, graph, args, topologies) -> bool:
    """True when ``output`` already holds exactly this partitioning; raises when it may not be replaced."""
    from graphfeed.server.partition.format import META_FILE, PartitionFormatError, read_meta

    if not output.exists():
        return False
    if not output.is_dir():
        raise UsageError(f"--output {output} is a file; give a folder path")
    if not any(output.iterdir()):
        return False
    if not (output / META_FILE).is_file():
        raise UsageError(f"--output {output} is not empty and is not a graphfeed partition folder "
                         f"(no {META_FILE}); choose a new or empty folder")
    try:
        meta = read_meta(output)
    except PartitionFormatError as exc:
        if args.overwrite:
            return False
        raise UsageError(f"--output {output} holds a partition graphfeed cannot read ({exc}); "
                         f"pass --overwrite to replace it") from exc
    diff = _differences(meta, graph, args, topologies)
    if not diff:
        return True
    if not args.overwrite:
        raise UsageError(f"--output {output} already holds a different partitioning ({'; '.join(diff)}); "
                         f"pass --overwrite to replace it or choose another folder")
    return False


def summary(root, seconds: float) -> str:
    from graphfeed.cli.info import format_table, part_stats
    from graphfeed.server.partition.format import read_meta

    meta = read_meta(root)
    total = sum(meta.num_edges.values())
    cut = f"{meta.edge_cut:,} of {total:,} edges ({100.0 * meta.edge_cut / max(total, 1):.1f}%)"
    return "\n".join([
        f"partitioned {meta.graph_name or 'graph'} into {root}: {meta.num_parts} part(s), method {meta.method}, "
        f"topology {'+'.join(meta.topologies)}",
        format_table(meta, part_stats(root, meta)),
        f"edge cut: {cut}",
        f"time: {seconds:.1f} s",
    ])


def run(args) -> int:
    from graphfeed.server.partition.builder import partition_graph
    from graphfeed.server.partition.inputs import read_graph

    if args.num_parts < 1:
        raise UsageError(f"--num-parts must be at least 1, got {args.num_parts}")
    topologies = TOPOLOGY_CHOICES[args.topology]
    output = Path(args.output)
    report = _Reporter(args.quiet)
    report.log(f"reading {args.input}")
    graph = read_graph(args.input, allow_pickle=args.allow_pickle)
    if graph.dropped:   # shown even with --quiet: data the user may expect in the batches is not kept
        print(f"graphfeed partition: warning: not stored (graphfeed keeps x, y, edge_index, edge_attr and the "
              f"splits): {', '.join(graph.dropped)}", file=sys.stderr, flush=True)
    types = "" if graph.is_homogeneous else \
        f" of {len(graph.node_types)} node and {len(graph.edge_types)} edge types (label type {graph.label_type})"
    report.log(f"read {graph.num_nodes:,} nodes, {graph.num_edges:,} edges{types} "
               f"(input sha256 {graph.fingerprint[:12]})")
    if args.num_parts > graph.num_nodes:
        raise UsageError(f"--num-parts {args.num_parts} is larger than the number of nodes ({graph.num_nodes}); "
                         f"use at most {graph.num_nodes}")
    if _check_output(output, graph, args, topologies):
        print(f"{output} is up to date (same input and parameters); nothing to do")
        return 0
    partition_graph(graph, args.num_parts, output, method=args.method, topologies=topologies, seed=args.seed,
                    overwrite=args.overwrite, progress=report.progress, log=report.log)
    print(summary(output, time.perf_counter() - report.t0))
    return 0
