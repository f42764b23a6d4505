"""``graphfeed info DIR``: describe a partition folder from its META.json and part files."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.format import (
    DEFAULT_NODE_TYPE,
    PartitionMeta,
    PartitionPaths,
    load_array,
    read_meta,
)

HELP = "describe a partition folder"


@dataclass(frozen=True)
class PartStats:
    part: int
    start: int
    stop: int
    edges: dict[str, int]        # topology -> edges stored with this part's nodes
    splits: dict[str, int]       # split -> nodes of this part in the split

    @property
    def nodes(self) -> int:
        return self.stop - self.start


def part_stats(root, meta: PartitionMeta) -> list[PartStats]:
    """Per-part counts, read from the memory-mapped files (only their last entries and shapes)."""
    paths = PartitionPaths(root)
    ranges = meta.node_ranges[DEFAULT_NODE_TYPE]
    out = []
    for k in range(meta.num_parts):
        edges = {t: int(load_array(paths.edge_file(k, t, "indptr"))[-1]) for t in meta.topologies}
        splits = {s: int(load_array(paths.split_file(k, s)).shape[0]) for s in SPLITS if s in meta.split_sizes}
        out.append(PartStats(k, ranges[k], ranges[k + 1], edges, splits))
    return out


def format_table(meta: PartitionMeta, stats: list[PartStats]) -> str:
    """Fixed-width table: one row per part, then the totals."""
    topo = "csc" if "csc" in meta.topologies else meta.topologies[0]
    edge_col = "in-edges" if topo == "csc" else "out-edges"
    splits = [s for s in SPLITS if s in meta.split_sizes]
    header = ["part", "node range", "nodes", edge_col] + splits
    rows = [[str(s.part), f"[{s.start:,}, {s.stop:,})", f"{s.nodes:,}", f"{s.edges[topo]:,}"]
            + [f"{s.splits[x]:,}" for x in splits] for s in stats]
    rows.append(["all", "", f"{sum(s.nodes for s in stats):,}", f"{sum(s.edges[topo] for s in stats):,}"]
                + [f"{sum(s.splits[x] for s in stats):,}" for x in splits])
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731 -- a one-line local formatter
    return "\n".join([line(header)] + [line(r) for r in rows])


def describe(root) -> str:
    meta = read_meta(root)
    stats = part_stats(root, meta)
    total = meta.num_edges and sum(meta.num_edges.values())
    feats = ", ".join(f"{name} {spec['dtype']}{spec['shape']}"
                      for name, spec in meta.features[DEFAULT_NODE_TYPE].items())
    efeats = ", ".join(f"{spec['dtype']}{spec['shape']}" for spec in meta.edge_features.values()) or "none"
    cut_pct = 100.0 * meta.edge_cut / total if total else 0.0
    lines = [
        f"partition folder {Path(root)}",
        f"  format version  {meta.format_version}",
        f"  graph           {meta.graph_name or '(unnamed)'}  (input sha256 {meta.source_fingerprint[:16] or '?'}...)",
        f"  method          {meta.method} (seed {meta.seed}), {meta.num_parts} part(s), topology "
        f"{'+'.join(meta.topologies)}",
        f"  nodes / edges   {meta.num_nodes:,} / {total:,} directed",
        f"  edge cut        {meta.edge_cut:,} ({cut_pct:.1f}% of edges cross parts)",
        f"  node features   {feats}; {meta.num_classes} classes",
        f"  edge features   {efeats}",
        "",
        format_table(meta, stats),
    ]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("dir", help="partition folder (written by `graphfeed partition --output DIR`)")


def run(args) -> int:
    print(describe(args.dir))
    return 0
