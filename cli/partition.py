"""``graphfeed partition``: turn a graph into a graphfeed partition folder.

Reads a ``.npy`` folder or a ``torch.save`` file, homogeneous or typed (each layout a reader of
:mod:`graphfeed.server.partition.inputs.reader`),
assigns nodes to parts (random, METIS, or METIS balancing pre-sampled access counts: hotness),
writes the folder atomically and prints a summary.

Chunked inputs (``edge_index_*.npy``/``x_*.npy`` chunks, a ``chunks.json`` manifest, Parquet; see
:mod:`graphfeed.server.partition.inputs.chunked`), ``--memory-limit``, ``--scheduler`` or ``--workers``
take the bounded-memory path (:mod:`graphfeed.server.partition.build.bounded`): chunk tasks through disk,
here or on a Dask cluster, resumable after a kill, with ``--method random``, ``fennel`` (streaming) or
``metis`` (when the graph fits).
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
    parser.add_argument("--method", choices=("random", "metis", "hotness", "fennel"), default=None,
                        help="random assignment, METIS (fewer cut edges; balances nodes and training nodes), "
                             "hotness (METIS balancing each part's access count, found by pre-sampling the training "
                             "nodes' neighbourhoods, instead of its nodes; homogeneous graphs) or fennel (streaming, "
                             "few cut edges in bounded memory; bounded path only). Default: metis in memory, "
                             "fennel on the bounded path")
    parser.add_argument("--memory-limit", default=None, metavar="SIZE",
                        help="partition in chunks through disk, holding at most SIZE per process (e.g. 2GB); "
                             "default for chunked inputs: half the memory available")
    parser.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                        help="run the chunk tasks on this dask.distributed cluster (input, --output and --scratch "
                             "must be on storage every worker shares)")
    parser.add_argument("--workers", type=int, default=0,
                        help="run the chunk tasks on a local Dask cluster of this many worker processes")
    parser.add_argument("--scratch", default=None, metavar="DIR",
                        help="bounded path: folder for intermediate files and resume markers (default "
                             ".OUTPUT.work next to --output; kept after a failure so a re-run continues)")
    parser.add_argument("--fennel-passes", type=int, default=3,
                        help="fennel: label propagation rounds over the streamed graph per cluster size "
                             "(default 3)")
    parser.add_argument("--hotness-epochs", type=int, default=1,
                        help="hotness: epochs of pre-sampling to count accesses (default 1, at most 10)")
    parser.add_argument("--num-neighbors", type=fanouts_arg, default=(15, 10, 5), metavar="F1,F2,...",
                        help="hotness: the loader's fanouts to pre-sample with (default 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="hotness: the loader's batch size to pre-sample with (default 1024)")
    parser.add_argument("--output", "-o", required=True, help="partition folder to create")
    parser.add_argument("--topology", choices=sorted(TOPOLOGY_CHOICES), default="csc",
                        help="csc: in-edges (default, PyG's direction); csr: out-edges; both")
    parser.add_argument("--seed", type=int, default=0, help="seed for random assignment / METIS (default 0)")
    parser.add_argument("--link-split", type=link_split_arg, default=None, metavar="val=S,test=S",
                        help="hold out shares of the edges (node pairs: both directions together) as link "
                             "seed splits val/test, left out of the stored graph; train is the rest "
                             "(deterministic with --seed), e.g. val=0.05,test=0.10")
    parser.add_argument("--link-edge-type", type=edge_type_arg, default=None, metavar="SRC,REL,DST",
                        help="typed graph: the edge type --link-split holds edges out of (loaders then take "
                             "edge_label_index=((SRC, REL, DST), 'val'))")
    parser.add_argument("--link-rev-edge-type", type=edge_type_arg, default=None, metavar="DST,REL,SRC",
                        help="typed graph: its reverse edge type, whose reverses of held-out edges are left out "
                             "too (PyG's RandomLinkSplit rev_edge_types)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an output folder holding another partitioning")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="let a torch.save input unpickle arbitrary objects (only for files you trust)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")


def link_split_arg(text: str) -> dict[str, float]:
    """``"val=0.05,test=0.1"`` as ``{"val": 0.05, "test": 0.1}`` (argparse prints the error as a usage error)."""
    import argparse

    out = {}
    for item in text.split(","):
        name, sep, share = item.partition("=")
        try:
            out[name.strip()] = float(share) if sep else float("nan")
        except ValueError:
            sep = ""
        if not sep:
            raise argparse.ArgumentTypeError(f"item {item!r}: write SPLIT=SHARE, e.g. val=0.05,test=0.10")
    return out


def edge_type_arg(text: str) -> tuple[str, str, str]:
    """``"user,rates,item"`` as ``("user", "rates", "item")``."""
    import argparse

    names = tuple(n.strip() for n in text.split(","))
    if len(names) != 3 or not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give an edge type as SRC,REL,DST, e.g. user,rates,item")
    return names   # type: ignore[return-value]


def fanouts_arg(text: str) -> tuple[int, ...]:
    """``"15,10,5"`` as ``(15, 10, 5)``."""
    import argparse

    try:
        return tuple(int(f) for f in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integer fanouts, e.g. 15,10,5") from None


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
                    leave=False, mininterval=0.5)


def _access_sampling(args):
    """The hotness pre-sampling's settings (None for other methods); UsageError naming a bad argument."""
    from graphfeed.server.sampling.access import AccessSampling

    if args.method != "hotness":
        return None
    try:
        return AccessSampling(args.num_neighbors, args.batch_size, args.hotness_epochs)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _differences(meta, graph, args, topologies) -> list[str]:
    how = _access_sampling(args)
    wanted = {"input fingerprint": graph.fingerprint, "num_parts": args.num_parts, "method": args.method,
              "topology": list(topologies), "seed": args.seed, "link split": args.link_split or {},
              "link edge type": list(getattr(args, "link_edge_type", None) or meta.link_edge_type() or ()),
              **_setting_items(how.settings() if how else {})}
    have = {"input fingerprint": meta.source_fingerprint, "num_parts": meta.num_parts, "method": meta.method,
            "topology": list(meta.topologies), "seed": meta.seed, **_setting_items(meta.method_settings),
            "link split": {k: s["share"] for k, s in meta.link_splits.items() if k != "train"},
            "link edge type": list(meta.link_edge_type() or ())}
    keys = list(wanted) + [k for k in have if k not in wanted]
    return [f"{k} {have.get(k, '-')!s:.16} -> {wanted.get(k, '-')!s:.16}" for k in keys
            if have.get(k) != wanted.get(k)]


def _setting_items(settings: dict) -> dict:
    """The method's settings as their own items of the up-to-date check (``--hotness-epochs 1`` -> epochs)."""
    return {f"hotness {k}": v for k, v in settings.items()}


def _check_output(output: Path, graph, args, topologies) -> bool:
    """True when ``output`` already holds exactly this partitioning; raises when it may not be replaced."""
    from graphfeed.server.partition.format.layout import META_FILE, PartitionFormatError, read_meta

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


def _count_accesses(graph, how, seed: int, report: _Reporter):
    from graphfeed.server.sampling.access import count_accesses

    report.log(f"pre-sampling {how.epochs} epoch(s) of the training nodes (fanouts "
               f"{','.join(map(str, how.num_neighbors))}, batch {how.batch_size}) to count accesses")
    try:
        counts = count_accesses(graph, how, seed, report.progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    report.log(f"counted {int(counts.sum()):,} accesses to {int((counts > 0).sum()):,} nodes")
    return counts


def summary(root, seconds: float) -> str:
    """What a run wrote (the per-part table, cut, balance); a part with too many of the seeds is warned about on
    stderr, shown even with --quiet."""
    from graphfeed.cli.info import balance_text, format_table, part_stats, seed_imbalance_warning
    from graphfeed.server.partition.format.layout import read_meta

    meta = read_meta(root)
    stats = part_stats(root, meta)
    warning = seed_imbalance_warning(meta, stats)
    if warning:
        print(f"graphfeed partition: warning: {warning}", file=sys.stderr, flush=True)
    total = sum(meta.num_edges.values())
    cut = f"{meta.edge_cut:,} of {total:,} edges ({100.0 * meta.edge_cut / max(total, 1):.1f}%)"
    return "\n".join([
        f"partitioned {meta.graph_name or 'graph'} into {root}: {meta.num_parts} part(s), method {meta.method}, "
        f"topology {'+'.join(meta.topologies)}",
        format_table(meta, stats),
        f"edge cut: {cut}",
        f"balance: {balance_text(meta, stats)}",
        *([f"access mass per part: {', '.join(f'{m:,}' for m in meta.access_mass)}"] if meta.access_mass else []),
        f"time: {seconds:.1f} s",
    ])


def _bounded(args) -> bool:
    """Whether this run takes the bounded-memory (chunked) path."""
    from graphfeed.server.partition.inputs.reader import reader_for

    path = Path(args.input)
    chunked = path.exists() and reader_for(path).chunked
    return bool(chunked or args.memory_limit or args.scheduler or args.workers or args.method == "fennel")


def run(args) -> int:
    if _bounded(args):
        return run_bounded(args)
    args.method = args.method or "metis"
    return run_in_memory(args)


def run_bounded(args) -> int:
    from graphfeed.server.partition.build.bounded import partition_chunked
    from graphfeed.server.partition.build.plan import default_memory_limit, format_bytes, parse_bytes
    from graphfeed.server.partition.build.runner import DaskRunner, InProcess, TaskError
    from graphfeed.server.partition.inputs.arrays import InputError
    from graphfeed.server.partition.inputs.chunked import open_chunked

    args.method = args.method or "fennel"
    if args.num_parts < 1:
        raise UsageError(f"--num-parts must be at least 1, got {args.num_parts}")
    if args.link_split:
        raise UsageError("--link-split holds out node pairs over the whole edge list and needs the in-memory path: "
                         "drop --memory-limit/--scheduler/--workers (one-file input) or split the links beforehand")
    if not Path(args.input).is_dir():
        raise UsageError(f"{args.input}: the bounded path reads folders (.npy chunks, a chunks.json manifest, "
                         f"Parquet or the one-file .npy layout); save torch.save inputs as .npy files first")
    try:
        limit = parse_bytes(args.memory_limit) if args.memory_limit else default_memory_limit()
    except ValueError as exc:
        raise UsageError(f"--memory-limit: {exc}") from exc
    topologies = TOPOLOGY_CHOICES[args.topology]
    output = Path(args.output)
    report = _Reporter(args.quiet)
    report.log(f"reading {args.input} (chunk headers; hashing the chunks for the input fingerprint)")
    graph = open_chunked(args.input)
    if graph.dropped:   # shown even with --quiet, as the in-memory path's
        hard = " (hard negatives are stored by the in-memory path only: partition without --memory-limit)" \
            if any(n.startswith("hard_neg_dst") for n in graph.dropped) else ""
        print(f"graphfeed partition: warning: not stored by the bounded-memory path{hard}: "
              f"{', '.join(graph.dropped)}", file=sys.stderr, flush=True)
    report.log(f"read {graph.num_nodes:,} nodes, {graph.num_edges:,} edges in "
               f"{sum(len(f.files) for e in graph.edges.values() for f in e.fields.values())} edge chunk file(s) "
               f"(input sha256 {graph.fingerprint[:12]}); memory limit {format_bytes(limit)}")
    if args.num_parts > graph.num_nodes:
        raise UsageError(f"--num-parts {args.num_parts} is larger than the number of nodes ({graph.num_nodes})")
    if _check_output(output, graph, args, topologies):
        print(f"{output} is up to date (same input and parameters); nothing to do")
        return 0
    runner = (DaskRunner(args.scheduler, args.workers or 2, report.progress) if args.scheduler or args.workers
              else InProcess(report.progress))
    scratch = Path(args.scratch) if args.scratch else output.parent / f".{output.name}.work"
    try:
        partition_chunked(graph, args.num_parts, output, method=args.method, topologies=topologies, seed=args.seed,
                          memory_limit=limit, runner=runner, scratch=args.scratch, overwrite=args.overwrite,
                          progress=report.progress, log=report.log, fennel_passes=args.fennel_passes)
    except FileExistsError:
        raise    # --output may not be replaced: refused before any work, main's one line says why
    except (InputError, TaskError, OSError) as exc:
        raise UsageError(f"{exc} ({_scratch_left(scratch, not _input_error(exc, InputError))})") from exc
    except ValueError:
        raise    # bad parameters (--method, --num-parts), refused before any work
    except BaseException:    # Ctrl-C or a bug: the traceback (or "interrupted") follows this line
        if scratch.exists():
            print(f"graphfeed partition: the run stopped ({_scratch_left(scratch, True)})", file=sys.stderr,
                  flush=True)
        raise
    finally:
        runner.close()
    print(summary(output, time.perf_counter() - report.t0))
    return 0


def _edge_time_hint(dropped: list[str]) -> str:
    """The fix for edge times stored under PyG's ``time`` (``data[(src, rel, dst)].time``), a line of its own
    after the warning: graphfeed reads an edge type's times as ``edge_time``; empty when no edge type drops one."""
    edge_times = [name for name in dropped if name.startswith("data[(") and name.endswith(")].time")]
    if not edge_times:
        return ""
    return (f"edge times are read as edge_time: rename {', '.join(edge_times)} to "
            f"{', '.join(n[:-len('time')] + 'edge_time' for n in edge_times)}, partition again and sample with "
            f"time_attr='edge_time'")


def _input_error(exc: BaseException, input_error: type) -> bool:
    """Whether ``exc`` is (or, a chunk task's failure, was caused by) a problem of the input: re-running the same
    command fails the same way until the input is fixed."""
    return isinstance(exc, input_error) or isinstance(exc.__cause__, input_error)


def _scratch_left(scratch: Path, resumable: bool) -> str:
    """What to do after a failed bounded run: re-run it (``resumable``: the failure was not the input's) or fix the
    input first, and what the run left in ``scratch``."""
    if not resumable:
        left = f"; this run left its scratch folder {scratch}: remove it with `rm -r {scratch}`" \
            if scratch.exists() else ""
        return f"an input error: re-running the same command fails the same way until the input is fixed{left}"
    if not scratch.exists():
        return "re-run the same command to try again"
    return (f"finished chunks are kept in {scratch}: re-run the same command to continue, or remove them with "
            f"`rm -r {scratch}`")


def _check_link_types(graph, args) -> None:
    """UsageError unless --link-edge-type/--link-rev-edge-type fit the graph (and come with --link-split)."""
    from graphfeed.server.partition.build.builder import link_split_type

    if not args.link_split:
        if args.link_edge_type or args.link_rev_edge_type:
            raise UsageError("--link-edge-type/--link-rev-edge-type name the edge type of --link-split: add "
                             "--link-split val=0.05,test=0.10")
        return
    try:
        link_split_type(graph, args.link_edge_type, args.link_rev_edge_type)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def run_in_memory(args) -> int:
    from graphfeed.server.partition.build.builder import partition_graph
    from graphfeed.server.partition.inputs.reader import read_graph

    if args.num_parts < 1:
        raise UsageError(f"--num-parts must be at least 1, got {args.num_parts}")
    how = _access_sampling(args)
    if how and args.link_split:
        raise UsageError("--method hotness counts node-loader accesses and does not combine with --link-split; "
                         "use --method metis")
    topologies = TOPOLOGY_CHOICES[args.topology]
    output = Path(args.output)
    report = _Reporter(args.quiet)
    report.log(f"reading {args.input}")
    graph = read_graph(args.input, allow_pickle=args.allow_pickle)
    if graph.dropped:   # shown even with --quiet: data the user may expect in the batches is not kept
        print(f"graphfeed partition: warning: not stored (graphfeed keeps x, y, edge_index, edge_attr and the "
              f"splits): {', '.join(graph.dropped)}", file=sys.stderr, flush=True)
        hint = _edge_time_hint(graph.dropped)
        if hint:
            print(f"graphfeed partition: {hint}", file=sys.stderr, flush=True)
    types = "" if graph.is_homogeneous else \
        f" of {len(graph.node_types)} node and {len(graph.edge_types)} edge types (label type {graph.label_type})"
    report.log(f"read {graph.num_nodes:,} nodes, {graph.num_edges:,} edges{types} "
               f"(input sha256 {graph.fingerprint[:12]})")
    if args.num_parts > graph.num_nodes:
        raise UsageError(f"--num-parts {args.num_parts} is larger than the number of nodes ({graph.num_nodes}); "
                         f"use at most {graph.num_nodes}")
    _check_link_types(graph, args)
    if _check_output(output, graph, args, topologies):
        print(f"{output} is up to date (same input and parameters); nothing to do")
        return 0
    counts = _count_accesses(graph, how, args.seed, report) if how else None
    partition_graph(graph, args.num_parts, output, method=args.method, topologies=topologies, seed=args.seed,
                    overwrite=args.overwrite, progress=report.progress, log=report.log, link_split=args.link_split,
                    link_edge_type=args.link_edge_type, link_rev_edge_type=args.link_rev_edge_type,
                    node_weights=counts, method_settings=how.settings() if how else None)
    print(summary(output, time.perf_counter() - report.t0))
    return 0
