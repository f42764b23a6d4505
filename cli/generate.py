"""``graphfeed generate``: write a deterministic synthetic graph in the ``.npy`` input layout.

The folder it writes is what ``graphfeed partition`` reads. Homogeneous presets::

    edge_index.npy  int64 [2, E]   symmetric, sorted, no self loops
    x.npy           float32 [N, F]
    y.npy           int64 [N]
    train_idx.npy, val_idx.npy, test_idx.npy   int64 node ids (sorted)
    meta.json       preset, sizes, seed and the sha256 of edge_index.npy's data

Typed presets (``mag-*``, see :func:`graphfeed.server.partition.inputs.synth.generate_mag`) write
the typed layout (:mod:`graphfeed.server.partition.inputs.typed`)::

    paper/x.npy, paper/y.npy, paper/{train,val,test}_idx.npy
    author/num_nodes.npy                       (authors have no features)
    field/x.npy
    paper__cites__paper/edge_index.npy, author__writes__paper/, paper__has_topic__field/,
    paper__written_by__author/, field__topic_of__paper/
    meta.json       preset, per-type sizes, seed

With ``--chunk-edges N`` (homogeneous presets) the graph is drawn chunk by chunk and written in the
chunked layout ``graphfeed partition`` reads with bounded memory (see
:mod:`graphfeed.server.partition.inputs.chunked`)::

    edge_index_00000.npy, edge_index_00001.npy, ...   int64 [2, <= N] each
    x_00000.npy, x_00001.npy, ...                      float32 row chunks of about 16 N bytes
    y.npy, train_idx.npy, val_idx.npy, test_idx.npy, meta.json
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from graphfeed.server.partition.format.layout import edge_type_dirname
from graphfeed.server.partition.inputs.synth import (
    MAG_EDGE_TYPES,
    MAG_NODE_TYPES,
    MAG_PRESETS,
    PRESETS,
    chunk_name,
    generate_chunked,
    generate_mag_preset,
    generate_preset,
    hard_negatives,
)
from graphfeed.server.partition.inputs.typed import write_typed_folder

HELP = "write a deterministic synthetic graph (.npy layout)"
HARD_NEG_NPY = "hard_neg_dst.npy"   # written only with --hard-negatives
LAYOUT_FILES = ("edge_index.npy", "x.npy", "y.npy", "train_idx.npy", "val_idx.npy", "test_idx.npy", "meta.json",
                HARD_NEG_NPY)
TYPED_LAYOUT = (*MAG_NODE_TYPES, *(edge_type_dirname(e) for e in MAG_EDGE_TYPES), "meta.json")


def _preset_help() -> str:
    sizes = [f"{k}={v[0]:,} nodes" for k, v in PRESETS.items()]
    sizes += [f"{k}={sum(v[:3]):,} nodes of 3 types (typed)" for k, v in MAG_PRESETS.items()]
    return "graph size: " + ", ".join(sizes)


def add_arguments(parser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS) + sorted(MAG_PRESETS), default="tiny",
                        help=_preset_help())
    parser.add_argument("--out", required=True, help="folder to write (created; must be new or empty)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a folder that already holds a generated graph")
    parser.add_argument("--chunk-edges", type=int, default=0, metavar="N",
                        help="write edges and features in chunks of N edges (edge_index_00000.npy, x_00000.npy, "
                             "...) without holding the graph whole; homogeneous presets (default: one file each)")
    parser.add_argument("--hard-negatives", type=int, default=0, metavar="K",
                        help="also write hard_neg_dst.npy [E, K]: per edge, nodes of the destination's class not "
                             "linked to the source (-1 padding), for link loaders' num_hard_negatives; one-file "
                             "homogeneous presets")
    parser.add_argument("--skip-existing", action="store_true",
                        help="leave a folder that already holds this preset and seed alone (exit 0); only what it "
                             "misses is made (hard_neg_dst.npy for --hard-negatives, or the graph again when one of "
                             "its files is gone)")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder path")
    if out.is_dir() and any(out.iterdir()):
        names = {p.name for p in out.iterdir()}
        ours = names <= set(LAYOUT_FILES) or names <= set(TYPED_LAYOUT) or all(map(_is_chunk_file, names))
        if not ours:
            raise ValueError(f"--out {out} is not empty and does not hold a generated graph; choose a new folder")
        if not overwrite:
            raise FileExistsError(f"--out {out} already holds a graph; pass --overwrite to replace it")


def _is_chunk_file(name: str) -> bool:
    stem = name[:-4] if name.endswith(".npy") else ""
    field, _, index = stem.rpartition("_")
    return name in LAYOUT_FILES or (field in ("edge_index", "x") and index.isdigit())


def write_graph(out: Path, preset: str, seed: int, chunk_edges: int = 0, progress=None,
                hard_negatives: int = 0) -> dict:
    """Generate ``preset`` and write it into ``out`` atomically (temporary sibling, then rename);
    ``chunk_edges`` > 0: in the chunked layout, chunk by chunk (see :func:`generate_chunked`);
    ``hard_negatives`` > 0: with ``hard_neg_dst.npy`` of that width (one-file homogeneous presets)."""
    if hard_negatives and (chunk_edges > 0 or preset in MAG_PRESETS):
        raise ValueError(f"--hard-negatives is for one-file homogeneous presets ({', '.join(PRESETS)}), without "
                         f"--chunk-edges")
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755 & ~_umask())
        if chunk_edges > 0:
            meta = _write_chunked(tmp, preset, seed, chunk_edges, progress)
        else:
            meta = _write_typed(tmp, preset, seed) if preset in MAG_PRESETS else \
                _write_homogeneous(tmp, preset, seed, hard_negatives)
        meta["seconds"] = round(time.perf_counter() - t0, 1)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def _write_homogeneous(tmp: Path, preset: str, seed: int, hard: int = 0) -> dict:
    edge_index, x, y, splits = generate_preset(preset, seed=seed)
    np.save(tmp / "edge_index.npy", edge_index)
    if hard > 0:
        np.save(tmp / HARD_NEG_NPY, hard_negatives(edge_index, y, hard, seed=seed))
    np.save(tmp / "x.npy", x)
    np.save(tmp / "y.npy", y)
    for name, idx in splits.items():
        np.save(tmp / f"{name}_idx.npy", idx)
    nodes, _, features, classes = PRESETS[preset]
    return dict(name=f"synth-{preset}", preset=preset, nodes=nodes, directed_edges=int(edge_index.shape[1]),
                features=features, classes=classes, seed=seed,
                edge_index_sha256=hashlib.sha256(edge_index.tobytes()).hexdigest())


def _write_chunked(tmp: Path, preset: str, seed: int, chunk_edges: int, progress) -> dict:
    if preset in MAG_PRESETS:
        raise ValueError(f"--chunk-edges is for homogeneous presets ({', '.join(PRESETS)}), not {preset!r}")
    counts = generate_chunked(tmp, preset, seed=seed, chunk_edges=chunk_edges, progress=progress)
    return dict(name=f"synth-{preset}", preset=preset, seed=seed, chunk_edges=chunk_edges, **counts)


def _write_typed(tmp: Path, preset: str, seed: int) -> dict:
    graph = generate_mag_preset(preset, seed=seed)
    write_typed_folder(tmp, graph)
    features = MAG_PRESETS[preset][6]
    return dict(name=graph.name, preset=preset, nodes=graph.num_nodes, directed_edges=graph.num_edges,
                features=features, classes=graph.num_classes, seed=seed,
                label_type=graph.label_type, node_types={t: n.num_nodes for t, n in graph.nodes.items()},
                edge_types={edge_type_dirname(e): v.num_edges for e, v in graph.edges.items()})


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _generated(out: Path, preset: str, seed: int) -> dict | None:
    """The ``meta.json`` of ``out`` when it says ``out`` was generated from ``preset`` and ``seed``, else None."""
    try:
        meta = json.loads((out / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("preset") == preset and meta.get("seed") == seed else None


def _missing(out: Path, meta: dict, preset: str) -> list[str]:
    """The files of the generated graph in ``out`` that are gone (``hard_neg_dst.npy`` is optional: only
    ``--hard-negatives`` writes it)."""
    if meta.get("chunk_edges"):
        needed: tuple[str, ...] = (chunk_name("edge_index", 0), "y.npy")
    elif preset in MAG_PRESETS:
        needed = TYPED_LAYOUT
    else:
        needed = tuple(f for f in LAYOUT_FILES if f != HARD_NEG_NPY)
    return [f for f in needed if not (out / f).exists()]


def _hard_negatives_width(out: Path) -> int:
    """The width K of ``out/hard_neg_dst.npy`` ([E, K]), 0 when there is none (or it cannot be read)."""
    try:
        array = np.load(out / HARD_NEG_NPY, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return 0
    return int(array.shape[1]) if array.ndim == 2 else 0


def _add_hard_negatives(out: Path, k: int, seed: int) -> None:
    """Write ``out/hard_neg_dst.npy`` of width ``k`` for the graph already there (atomically: a temporary file,
    then a rename), as ``generate --hard-negatives k`` writes it with the graph."""
    edge_index, y = np.load(out / "edge_index.npy"), np.load(out / "y.npy")
    tmp = out / f".{HARD_NEG_NPY}.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, hard_negatives(edge_index, y, k, seed=seed))
    os.replace(tmp, out / HARD_NEG_NPY)


def _skip_existing(out: Path, args) -> bool:
    """``--skip-existing``: True when ``out`` holds this preset and seed complete (after adding what only a flag
    makes: hard negatives); False when it must be generated (it then holds an incomplete copy of this graph, made
    again whole -- generation is deterministic -- or something ``_check_out`` judges)."""
    meta = _generated(out, args.preset, args.seed)
    if meta is None:
        return False
    missing = _missing(out, meta, args.preset)
    if missing:
        print(f"{out} holds preset {args.preset!r} (seed {args.seed}) without {', '.join(missing)}: making it "
              f"again", file=sys.stderr)
        args.overwrite = True
        args.hard_negatives = args.hard_negatives or _hard_negatives_width(out)   # keep what it had
        return False
    if args.hard_negatives and _hard_negatives_width(out) != args.hard_negatives:
        if args.chunk_edges or meta.get("chunk_edges") or args.preset in MAG_PRESETS:
            raise ValueError(f"--hard-negatives is for one-file homogeneous presets ({', '.join(PRESETS)}), "
                             f"without --chunk-edges")
        _add_hard_negatives(out, args.hard_negatives, args.seed)
        print(f"{out} holds preset {args.preset!r} (seed {args.seed}): added {HARD_NEG_NPY} "
              f"[E, {args.hard_negatives}]")
        return True
    print(f"{out} already holds preset {args.preset!r} (seed {args.seed}): up to date")
    return True


def run(args) -> int:
    out = Path(args.out)
    if args.skip_existing and _skip_existing(out, args):
        return 0
    _check_out(out, args.overwrite)
    print(f"generating preset {args.preset!r} (seed {args.seed}) ...", file=sys.stderr)
    meta = write_graph(out, args.preset, args.seed, args.chunk_edges, _progress, args.hard_negatives)
    if "node_types" in meta:
        print(f"wrote {out}: {meta['nodes']:,} nodes ({_counts(meta['node_types'])}), {meta['directed_edges']:,} "
              f"directed edges ({_counts(meta['edge_types'])}), {meta['label_type']} features "
              f"{meta['features']}, {meta['classes']} classes ({meta['seconds']} s)")
    else:
        print(f"wrote {out}: {meta['nodes']:,} nodes, {meta['directed_edges']:,} directed edges, "
              f"{meta['features']} features, {meta['classes']} classes ({meta['seconds']} s)")
    return 0


def _counts(table: dict) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in table.items())


def _progress(iterable, desc: str):
    from tqdm import tqdm
    return tqdm(iterable, desc=desc, file=sys.stderr, leave=False, mininterval=0.5)
