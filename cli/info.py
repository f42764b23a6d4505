"""``graphfeed info DIR``: describe a partition folder from its META.json and part files.

A homogeneous graph gets one table (per part: node range, nodes, edges, split sizes); a
typed graph one line per node and edge type, then a node table (per part and node type,
with the label type's splits) and an edge table (per part and edge type).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.format.layout import (
    PartitionMeta,
    PartitionPaths,
    edge_type_dirname,
    load_array,
    read_meta,
)
from graphfeed.server.partition.format.store import Partition

HELP = "describe a partition folder"


@dataclass(frozen=True)
class PartStats:
    part: int
    start: int                   # the label type's node range (the graph's, when homogeneous)
    stop: int
    edges: dict[str, int]        # topology -> edges stored with this part's nodes (every edge type)
    splits: dict[str, int]       # split -> nodes of this part in the split
    nodes_by_type: dict[str, int] = field(default_factory=dict)              # node type -> owned nodes
    edges_by_type: dict[str, dict[str, int]] = field(default_factory=dict)   # edge type dir -> topology -> edges

    @property
    def nodes(self) -> int:
        return self.stop - self.start


def part_stats(root, meta: PartitionMeta) -> list[PartStats]:
    """Per-part counts, read from the memory-mapped files (only their last entries and shapes)."""
    paths = PartitionPaths(root)
    label = meta.label_type
    out = []
    for k in range(meta.num_parts):
        by_type = {edge_type_dirname(e): {t: int(load_array(paths.edge_file(k, t, "indptr", e))[-1])
                                          for t in meta.topologies} for e in meta.edge_type_tuples()}
        edges = {t: sum(counts[t] for counts in by_type.values()) for t in meta.topologies}
        splits = {s: int(load_array(paths.split_file(k, s, label)).shape[0]) for s in SPLITS if s in meta.split_sizes}
        nodes = {nt: r[k + 1] - r[k] for nt, r in meta.node_ranges.items()}
        ranges = meta.node_ranges[label]
        out.append(PartStats(k, ranges[k], ranges[k + 1], edges, splits, nodes, by_type))
    return out


WARN_IMBALANCE = 1.2   # `graphfeed partition` warns when a part holds more than this times the mean of the seeds


def imbalance(counts: list[int]) -> float:
    """The largest count over the mean (1.0: even; also for no counts at all)."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 1.0


def balance_text(meta: PartitionMeta, stats: list[PartStats]) -> str:
    """The largest part over the mean, for the label type's nodes and its training nodes (each part's
    training nodes are the table's ``train`` column): a part with more seeds produces more batches."""
    label = "" if meta.is_homogeneous else f"{meta.label_type} "
    text = f"largest part / mean: {label}nodes {imbalance([s.nodes for s in stats]):.2f}x"
    if "train" in meta.split_sizes:
        text += f", training nodes {imbalance([s.splits['train'] for s in stats]):.2f}x"
    return text


def seed_imbalance_warning(meta: PartitionMeta, stats: list[PartStats]) -> str | None:
    """A warning when a part holds more than :data:`WARN_IMBALANCE` times the mean of the training nodes (and
    more than one above an even share: 3 seeds in 2 parts are as even as they can be); None otherwise."""
    train = [s.splits.get("train", 0) for s in stats]
    total = sum(train)
    if not total or max(train) <= max(WARN_IMBALANCE * total / len(train), -(-total // len(train))):
        return None
    worst = int(np.argmax(train))
    fix = ("--method metis or fennel balance them" if meta.method in ("random", "hotness") else
           "too few of them to spread evenly, or a node type's balance came first")
    return (f"part {worst} holds {imbalance(train):.2f}x the mean of the training nodes ({train[worst]:,} of "
            f"{total:,}), so its trainer gets that many more batches per epoch; {fix}")


def _main_topology(meta: PartitionMeta) -> tuple[str, str]:
    topo = "csc" if "csc" in meta.topologies else meta.topologies[0]
    return topo, "in-edges" if topo == "csc" else "out-edges"


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731 -- a one-line local formatter
    return "\n".join([line(header)] + [line(r) for r in rows])


def format_table(meta: PartitionMeta, stats: list[PartStats]) -> str:
    """Fixed-width table(s): one row per part, then the totals."""
    if not meta.is_homogeneous:
        return format_typed_tables(meta, stats)
    topo, edge_col = _main_topology(meta)
    splits = [s for s in SPLITS if s in meta.split_sizes]
    header = ["part", "node range", "nodes", edge_col] + splits
    rows = [[str(s.part), f"[{s.start:,}, {s.stop:,})", f"{s.nodes:,}", f"{s.edges[topo]:,}"]
            + [f"{s.splits[x]:,}" for x in splits] for s in stats]
    rows.append(["all", "", f"{sum(s.nodes for s in stats):,}", f"{sum(s.edges[topo] for s in stats):,}"]
                + [f"{sum(s.splits[x] for s in stats):,}" for x in splits])
    return _render(header, rows)


def _edge_columns(meta: PartitionMeta) -> dict[str, str]:
    """Edge type folder -> column title: the relation name when relation names are unique."""
    etypes = meta.edge_type_tuples()
    rels = [e[1] for e in etypes]
    unique = len(set(rels)) == len(rels)
    return {edge_type_dirname(e): (e[1] if unique else edge_type_dirname(e)) for e in etypes}


def format_typed_tables(meta: PartitionMeta, stats: list[PartStats]) -> str:
    """A node table (nodes per type, the label type's splits) and an edge table (edges per type)."""
    splits = [s for s in SPLITS if s in meta.split_sizes]
    header = ["part"] + list(meta.node_types) + [f"{meta.label_type} {s}" for s in splits]
    rows = [[str(s.part)] + [f"{s.nodes_by_type[t]:,}" for t in meta.node_types]
            + [f"{s.splits[x]:,}" for x in splits] for s in stats]
    rows.append(["all"] + [f"{sum(s.nodes_by_type[t] for s in stats):,}" for t in meta.node_types]
                + [f"{sum(s.splits[x] for s in stats):,}" for x in splits])
    topo, edge_col = _main_topology(meta)
    columns = _edge_columns(meta)
    edge_header = [f"part ({edge_col})"] + list(columns.values())
    edge_rows = [[str(s.part)] + [f"{s.edges_by_type[d][topo]:,}" for d in columns] for s in stats]
    edge_rows.append(["all"] + [f"{sum(s.edges_by_type[d][topo] for s in stats):,}" for d in columns])
    return _render(header, rows) + "\n\n" + _render(edge_header, edge_rows)


def _feature_text(meta: PartitionMeta, ntype: str) -> str:
    return ", ".join(f"{name} {spec['dtype']}{spec['shape']}" for name, spec in meta.features.get(ntype, {}).items())


def _type_lines(meta: PartitionMeta) -> list[str]:
    lines = []
    for ntype in meta.node_types:
        feats = _feature_text(meta, ntype) or "no features"
        classes = f", {meta.classes_of(ntype)} classes" if "y" in meta.features.get(ntype, {}) else ""
        label = " (label type: holds the splits)" if ntype == meta.label_type else ""
        lines.append(f"  node type       {ntype}: {meta.node_ranges[ntype][-1]:,} nodes; {feats}{classes}{label}")
    for etype in meta.edge_type_tuples():
        name = edge_type_dirname(etype)
        efeat = meta.edge_features.get(name)
        feats = f"; edge features {efeat['dtype']}{efeat['shape']}" if efeat else ""
        lines.append(f"  edge type       ({', '.join(etype)}): {meta.num_edges[name]:,} edges{feats}")
    return lines


def describe(root) -> str:
    meta = read_meta(root)
    stats = part_stats(root, meta)
    total = meta.num_edges and sum(meta.num_edges.values())
    cut_pct = 100.0 * meta.edge_cut / total if total else 0.0
    lines = [
        f"partition folder {Path(root)}",
        f"  format version  {meta.format_version}",
        f"  graph           {meta.graph_name or '(unnamed)'}  (input sha256 {meta.source_fingerprint[:16] or '?'}...)",
        f"  method          {meta.method} (seed {meta.seed}), {meta.num_parts} part(s), topology "
        f"{'+'.join(meta.topologies)}",
        f"  nodes / edges   {meta.num_nodes:,} / {total:,} directed",
        f"  edge cut        {meta.edge_cut:,} ({cut_pct:.1f}% of edges cross parts)",
    ]
    if meta.method_settings:
        lines.append("  method settings " + ", ".join(f"{k} {v}" for k, v in sorted(meta.method_settings.items())))
    if meta.access_mass:
        lines.append("  access mass     " + " / ".join(f"{m:,}" for m in meta.access_mass)
                     + " pre-sampled accesses per part")
    if meta.is_homogeneous:
        efeats = ", ".join(f"{spec['dtype']}{spec['shape']}" for spec in meta.edge_features.values()) or "none"
        lines += [f"  node features   {_feature_text(meta, meta.label_type)}; {meta.num_classes} classes",
                  f"  edge features   {efeats}" + ("; edge weights (weight_attr='edge_weight')"
                                                        if meta.edge_weights else "")]
        if meta.link_splits:
            sizes = meta.link_split_sizes()
            lines.append("  link splits     " + ", ".join(f"{k} {v:,}" for k, v in sizes.items())
                         + " seed edges (val/test held out of the stored graph; per part: "
                         + "; ".join(f"{k} {meta.link_splits[k]['sizes']}" for k in sizes) + ")")
    else:
        lines += _type_lines(meta)
    lines += _link_extras(root, meta)
    lines.append(f"  balance         {balance_text(meta, stats)}")
    return "\n".join(lines + [sampler_line(), "", format_table(meta, stats)])


def _link_extras(root, meta: PartitionMeta) -> list[str]:
    """What feature_dtype="int8" and num_hard_negatives read from part 0 (stored in every part)."""
    part = Partition(root, 0, meta)
    floating = [t for t in meta.node_types if np.issubdtype(np.dtype(meta.features.get(t, {}).get("x", {}).get(
        "dtype", "int64")), np.floating)]
    missing = [t for t in floating if part.nodes(t).quant_scales is None]
    hard = [e for e in meta.edge_type_tuples() if part.edges(e).hard_negatives is not None]
    lines = []
    if floating:
        lines.append("  int8 scales     " + ("stored (feature_dtype='int8')" if not missing else
                                             f"missing: run `graphfeed quantize {root}` for feature_dtype='int8'"))
    if hard:
        width = max(part.edges(e).hard_negatives.width for e in hard)   # type: ignore[union-attr]
        what = "" if meta.is_homogeneous else " of " + ", ".join(map(str, hard))
        lines.append(f"  hard negatives  up to {width} per edge{what} (num_hard_negatives)")
    return lines


def sampler_line() -> str:
    """Which sampling implementation this install runs (loading, or on first use building, the native ops)."""
    from graphfeed.server.sampling import dispatch

    return f"  sampler         {dispatch.describe()}"


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="partition folder (written by `graphfeed partition --output DIR`)")


def run(args) -> int:
    print(describe(args.dir))
    return 0
