"""Graphs split over many files: read chunk by chunk, never whole.

Three layouts, homogeneous or typed (a typed graph has one sub-folder per node type and per edge
type ``src__rel__dst``, each laid out like a homogeneous folder, as in
:mod:`graphfeed.server.partition.inputs.typed`):

* ``.npy`` chunks: ``edge_index_*.npy`` ([2, E_i] each, concatenated along the edges),
  ``x_*.npy``, ``y_*.npy``, ``node_time_*.npy`` (row chunks, concatenated in name order),
  ``edge_attr_*.npy``, ``edge_weight_*.npy``, ``edge_time_*.npy``.  Any field may instead be one
  whole file (``y.npy``); the splits (``train_idx.npy``, ...) are always whole files.
* a manifest ``chunks.json`` naming the files of each field in order (paths relative to it)::

      {"edge_index": ["e/part-0.npy", "e/part-1.npy"], "x": ["n/x-0.npy"], "y": ["n/y.npy"],
       "train_idx": "train_idx.npy"}

  (typed: ``{"nodes": {"paper": {...}}, "edges": {"paper__cites__paper": {...}}}``).
* Parquet: ``edges*.parquet`` with integer columns ``src`` and ``dst`` (and optional
  ``edge_weight``, ``edge_time``), ``nodes*.parquet`` with rows in node id order and optional
  columns ``x`` (a list of numbers per row, or numbered columns ``x0, x1, ...``), ``y`` and
  ``node_time``; splits as ``{split}_idx.npy`` (or ``.parquet`` with one column).

A chunk that cannot be read (truncated, not ``.npy``/Parquet, wrong shape or dtype) is named in
one :class:`InputError` line when the graph is opened; edge ids out of range are named, with
their chunk, when the chunk is read.  :class:`ChunkedGraph` is a picklable description (paths
and shapes): Dask workers open the files themselves.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphfeed.core.columns import INPUT_COLUMNS, OTHER_INPUT_COLUMNS
from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE, edge_type_dirname
from graphfeed.server.partition.inputs.arrays import InputError, check_split, unreadable_npy
from graphfeed.server.partition.inputs.chunks import ArrayChunks, chunk_classes, hash_chunks, npy_chunks, parquet_fields
from graphfeed.server.partition.inputs.graph import EdgeType, EdgeTypeInput, GraphInput, NodeTypeInput, TypedView

MANIFEST = "chunks.json"
NODE_FIELDS = tuple(c.file for c in INPUT_COLUMNS)   # x, y, node_time: the stored node columns' input names
EDGE_FIELDS = ("edge_index", "edge_attr", "edge_weight", "edge_time")
_CHUNK_RE = re.compile(r"^(?P<field>[a-z_]+?)_(?P<index>\d+)\.npy$")


# ----------------------------------------------------------------------------- the graph

@dataclass
class ChunkedNodeType:
    num_nodes: int
    fields: dict[str, ArrayChunks] = field(default_factory=dict)   # by input name: x, y, node_time

    @property
    def x(self) -> ArrayChunks | None:
        return self.fields.get("x")

    @property
    def y(self) -> ArrayChunks | None:
        return self.fields.get("y")


@dataclass
class ChunkedEdgeType:
    fields: dict[str, ArrayChunks]   # edge_index, and edge_attr, edge_weight, edge_time when present

    @property
    def num_edges(self) -> int:
        return self.fields["edge_index"].rows


@dataclass
class ChunkedGraph(TypedView):
    """A graph described by its chunk files; node and edge types sorted by name (as :class:`GraphInput`)."""

    nodes: dict[str, ChunkedNodeType]
    edges: dict[EdgeType, ChunkedEdgeType]
    splits: dict[str, np.ndarray]
    label_type: str
    name: str = ""
    num_classes: int = 0
    fingerprint: str = ""
    dropped: list[str] = field(default_factory=list)

    def read_edges(self, etype: EdgeType, start: int, stop: int) -> np.ndarray:
        """Edges ``[start, stop)`` of ``etype`` as int64 ``[2, n]``; InputError naming the chunk when an id
        is out of range."""
        chunks = self.edges[etype].fields["edge_index"]
        ei = chunks.read(start, stop).astype(np.int64, copy=False)
        for row, ntype in ((0, etype[0]), (1, etype[2])):
            if ei.shape[1] and (int(ei[row].min()) < 0 or int(ei[row].max()) >= self.nodes[ntype].num_nodes):
                bad = int(np.flatnonzero((ei[row] < 0) | (ei[row] >= self.nodes[ntype].num_nodes))[0])
                role = "source" if row == 0 else "destination"
                raise InputError(f"chunk {chunks.which(start + bad)} of edge_index has {role} "
                                 f"id {int(ei[row, bad])}, but node type {ntype!r} has {self.nodes[ntype].num_nodes} "
                                 f"nodes; fix that chunk or the node count")
        return ei

    def to_graph_input(self) -> GraphInput:
        """The whole graph in memory (the in-memory path; tests compare the two)."""
        nodes = {ntype: NodeTypeInput(t.num_nodes, **{c.name: _whole(t.fields.get(c.file)) for c in INPUT_COLUMNS})
                 for ntype, t in self.nodes.items()}
        edges = {etype: EdgeTypeInput(e.fields["edge_index"].read(0, e.num_edges).astype(np.int64, copy=False),
                                      *(_whole(e.fields.get(f)) for f in EDGE_FIELDS[1:]))
                 for etype, e in self.edges.items()}
        if self.is_homogeneous:
            n, e = nodes[DEFAULT_NODE_TYPE], edges[DEFAULT_EDGE_TYPE]
            graph = GraphInput(e.edge_index, n.x, n.y, self.splits, e.edge_attr, name=self.name,
                               num_classes=self.num_classes, edge_weight=e.edge_weight, edge_time=e.edge_time,
                               node_columns={c.name: n.column(c.name) for c in OTHER_INPUT_COLUMNS},
                               num_nodes=n.num_nodes)
        else:
            graph = GraphInput.typed(nodes, edges, self.splits, self.label_type, name=self.name,
                                     num_classes=self.num_classes)
        graph.fingerprint = self.fingerprint
        return graph


def _whole(chunks: ArrayChunks | None) -> np.ndarray | None:
    return None if chunks is None else chunks.read(0, chunks.rows)


# ----------------------------------------------------------------------------- opening a folder

def chunk_files_of(folder: str | os.PathLike, name: str) -> list[Path]:
    """The ``NAME_NNNNN.npy`` chunk files of field ``name`` in ``folder``, in order."""
    return sorted(p for p in Path(folder).glob(f"{name}_*.npy")
                  if (m := _CHUNK_RE.match(p.name)) and m["field"] == name)


def is_chunked_folder(folder: Path) -> bool:
    """A folder (or, typed, one of its type sub-folders) with a manifest, ``*_NNNNN.npy`` chunks or Parquet."""
    def chunked(d: Path) -> bool:
        return ((d / MANIFEST).is_file() or any(_CHUNK_RE.match(p.name) for p in d.glob("*_*.npy"))
                or any(d.glob("*.parquet")))
    if (folder / "edge_index.npy").exists() and (folder / "x.npy").exists():
        return False
    return chunked(folder) or any(chunked(d) for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def open_chunked(folder: str | os.PathLike, *, with_fingerprint: bool = True) -> ChunkedGraph:
    """Describe the chunked graph in ``folder`` (see the module docstring), checking every chunk's header.

    ``with_fingerprint``: hash every chunk's bytes (one streaming read, ~1 s/GB) so the fingerprint equals
    that of the same graph read whole (:func:`graphfeed.server.partition.inputs.graph.fingerprint`).
    """
    folder = Path(folder)
    manifest = _manifest(folder)
    subs = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    typed = bool(manifest.get("nodes")) if manifest else (not _has_fields(folder) and bool(subs))
    if typed:
        graph = _open_typed(folder, manifest, subs)
    else:
        fields = _folder_fields(folder, manifest)
        graph = _assemble({DEFAULT_NODE_TYPE: _node_fields(fields)}, {DEFAULT_EDGE_TYPE: _edge_fields(fields)},
                          _splits_of(folder, manifest), folder, _count_of(folder, manifest))
        graph.dropped = [] if manifest else _unread_files(folder)
    graph.name = _name_of(folder)
    if with_fingerprint:
        graph.fingerprint = chunked_fingerprint(graph)
    return graph


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON ({exc}); fix the manifest") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path} must hold a JSON object mapping field names to lists of files")
    return data


def _has_fields(folder: Path) -> bool:
    return (any(_CHUNK_RE.match(p.name) for p in folder.glob("*.npy")) or any(folder.glob("*.parquet"))
            or (folder / "x.npy").exists() or (folder / "edge_index.npy").exists())


def _name_of(folder: Path) -> str:
    meta = folder / "meta.json"
    try:
        data = json.loads(meta.read_text()) if meta.is_file() else {}
        if isinstance(data, dict) and (data.get("name") or data.get("preset")):
            return str(data.get("name") or data.get("preset"))
    except (OSError, json.JSONDecodeError):
        pass  # meta.json is informational only
    return folder.resolve().name


def _folder_fields(folder: Path, manifest: dict) -> dict[str, ArrayChunks]:
    """Every chunked field of one (type) folder: from the manifest, ``*_NNNNN.npy`` files, whole files, Parquet."""
    fields: dict[str, ArrayChunks] = {}
    if manifest:
        for name, files in manifest.items():
            if name in NODE_FIELDS + EDGE_FIELDS:
                paths = [files] if isinstance(files, str) else list(files)
                fields[name] = npy_chunks(name, [folder / p for p in paths])
        return _numeric(fields)
    groups: dict[str, list[Path]] = {}
    for p in sorted(folder.glob("*.npy")):
        m = _CHUNK_RE.match(p.name)
        if m and m["field"] in NODE_FIELDS + EDGE_FIELDS:
            groups.setdefault(m["field"], []).append(p)
        elif p.stem in NODE_FIELDS + EDGE_FIELDS:
            groups.setdefault(p.stem, []).append(p)
    fields = {name: npy_chunks(name, paths) for name, paths in groups.items()}
    fields.update(parquet_fields(folder))
    return _numeric(fields)


def _numeric(fields: dict[str, ArrayChunks]) -> dict[str, ArrayChunks]:
    """``fields``, each checked to hold numbers (:meth:`ArrayChunks.check_numeric`)."""
    for chunks in fields.values():
        chunks.check_numeric()
    return fields


def _unread_files(folder: Path) -> list[str]:
    """The ``.npy`` files of a plain chunk folder that the bounded path does not store (named by ``graphfeed
    partition``, as the in-memory path names what it drops): neither a field's chunks, nor a split, nor a count."""
    kept = set(NODE_FIELDS + EDGE_FIELDS)
    out = []
    for p in sorted(folder.glob("*.npy")):
        m = _CHUNK_RE.match(p.name)
        if (m and m["field"] in kept) or p.stem in kept or p.stem == "num_nodes" or \
                p.stem in {f"{s}_idx" for s in SPLITS}:
            continue
        out.append(p.name)
    return out


def _node_fields(fields: dict[str, ArrayChunks]) -> dict[str, ArrayChunks]:
    return {k: v for k, v in fields.items() if k in NODE_FIELDS}


def _edge_fields(fields: dict[str, ArrayChunks]) -> dict[str, ArrayChunks]:
    return {k: v for k, v in fields.items() if k in EDGE_FIELDS}


def _splits_of(folder: Path, manifest: dict, named_only: bool = False) -> dict[str, np.ndarray]:
    out = {}
    for split in SPLITS:
        name = manifest.get(f"{split}_idx", None if named_only else f"{split}_idx.npy")
        if name is None:   # a typed manifest names the splits of the one type that has them
            continue
        path = folder / name
        parquet = folder / f"{split}_idx.parquet"
        if path.is_file():
            try:
                out[split] = np.load(path, allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:
                raise InputError(unreadable_npy(path, exc, "re-save it with numpy.save")) from exc
        elif parquet.is_file() and not named_only:
            import pyarrow.parquet as pq
            out[split] = pq.read_table(parquet).column(0).to_numpy()
    return out


def _open_typed(folder: Path, manifest: dict, subs: list[Path]) -> ChunkedGraph:
    nodes_raw: dict[str, dict[str, ArrayChunks]] = {}
    edges_raw: dict[EdgeType, dict[str, ArrayChunks]] = {}
    splits: dict[str, dict[str, np.ndarray]] = {}
    counts: dict[str, int] = {}
    if manifest:
        for ntype, spec in manifest.get("nodes", {}).items():
            nodes_raw[ntype] = _node_fields(_folder_fields(folder, spec))
            splits[ntype] = _splits_of(folder, spec, named_only=True)
            if "num_nodes" in spec:
                counts[ntype] = int(spec["num_nodes"])
        for name, spec in manifest.get("edges", {}).items():
            edges_raw[_etype(name, folder)] = _edge_fields(_folder_fields(folder, spec))
    else:
        for sub in subs:
            if "__" in sub.name:
                edges_raw[_etype(sub.name, folder)] = _edge_fields(_folder_fields(sub, {}))
            else:
                nodes_raw[sub.name] = _node_fields(_folder_fields(sub, {}))
                splits[sub.name] = _splits_of(sub, {})
                if (sub / "num_nodes.npy").is_file():
                    counts[sub.name] = int(np.load(sub / "num_nodes.npy"))
    with_splits = [t for t, s in splits.items() if s.get("train") is not None]
    if len(with_splits) != 1:
        raise InputError(f"typed chunked graph {folder}: exactly one node type needs train_idx.npy "
                         f"(found {with_splits or 'none'})")
    nodes = {t: _node_type(t, f, counts.get(t)) for t, f in nodes_raw.items()}
    return _assemble_typed(nodes, edges_raw, splits[with_splits[0]], with_splits[0], folder)


def _etype(name: str, folder: Path) -> EdgeType:
    parts = name.split("__")
    if len(parts) != 3 or not all(parts):
        raise InputError(f"{folder / name} is not a valid edge type name: use src__rel__dst")
    return parts[0], parts[1], parts[2]


def _node_type(ntype: str, fields: dict[str, ArrayChunks], count: int | None) -> ChunkedNodeType:
    sizes = {name: f.rows for name, f in fields.items()}
    if count is not None:
        sizes["num_nodes"] = count
    if not sizes:
        raise InputError(f"node type {ntype!r} has no x, y or num_nodes, so its node count is unknown; "
                         f"save num_nodes.npy (numpy.save(path, N)) in its folder")
    if len(set(sizes.values())) > 1:
        raise InputError(f"node type {ntype!r}: its fields give different node counts {sizes}; every field needs "
                         f"one row per node")
    return ChunkedNodeType(next(iter(sizes.values())), fields)


def _count_of(folder: Path, manifest: dict) -> int | None:
    """A folder's (or manifest's) explicit node count, ``num_nodes.npy`` / ``"num_nodes"``: None when not given."""
    if "num_nodes" in manifest:
        return int(manifest["num_nodes"])
    path = folder / "num_nodes.npy"
    return int(np.load(path, allow_pickle=False)) if path.is_file() else None


def _assemble(nodes_raw: dict[str, dict[str, ArrayChunks]], edges_raw: dict[EdgeType, dict[str, ArrayChunks]],
              splits: dict[str, np.ndarray], folder: Path, count: int | None = None) -> ChunkedGraph:
    node = nodes_raw[DEFAULT_NODE_TYPE]
    if "edge_index" not in edges_raw[DEFAULT_EDGE_TYPE] or not ("x" in node or "y" in node or count is not None):
        raise InputError(f"chunked input {folder} needs edge_index chunks (edge_index_00000.npy, ... or "
                         f"edges*.parquet with src, dst) and x chunks (x_00000.npy, ... or nodes*.parquet; a "
                         f"featureless graph: y chunks or num_nodes.npy instead)")
    if splits.get("train") is None:
        raise InputError(f"{folder / 'train_idx.npy'} is missing: give the training node ids")
    nodes = {DEFAULT_NODE_TYPE: _node_type(DEFAULT_NODE_TYPE, node, count)}
    return _assemble_typed(nodes, edges_raw, splits, DEFAULT_NODE_TYPE, folder)


def _assemble_typed(nodes: dict[str, ChunkedNodeType], edges_raw: dict[EdgeType, dict[str, ArrayChunks]],
                    splits: dict[str, np.ndarray], label_type: str, folder: Path) -> ChunkedGraph:
    edges = {}
    for etype, fields in sorted(edges_raw.items()):
        if "edge_index" not in fields:
            raise InputError(f"edge type {edge_type_dirname(etype)} in {folder} has no edge_index chunks")
        for ntype in (etype[0], etype[2]):
            if ntype not in nodes:
                raise InputError(f"edge type {edge_type_dirname(etype)} names node type {ntype!r}, which {folder} "
                                 f"does not have; add it or fix the name")
        n_edges = fields["edge_index"].rows
        for name, f in fields.items():
            if f.rows != n_edges:
                raise InputError(f"{name} of edge type {edge_type_dirname(etype)} has {f.rows} rows but edge_index "
                                 f"has {n_edges} edges; give one row per edge")
        edges[etype] = ChunkedEdgeType(fields)
    n = nodes[label_type].num_nodes
    checked = {s: check_split(idx, f"{folder}: {s}_idx", n, f"node type {label_type!r} has {n} nodes")
               for s, idx in splits.items() if idx is not None}
    y = nodes[label_type].y
    graph = ChunkedGraph(dict(sorted(nodes.items())), edges, {s: checked.get(s, np.empty(0, np.int64))
                                                             for s in SPLITS}, label_type)
    graph.num_classes = chunk_classes(y) if y is not None else 0
    return graph


# ----------------------------------------------------------------------------- fingerprint

def _hash_whole(h, label: str, array: np.ndarray) -> None:
    h.update(f"{label}:{array.dtype.str}:{list(array.shape)};".encode())
    if array.size:
        h.update(np.ascontiguousarray(array))


def chunked_fingerprint(graph: ChunkedGraph) -> str:
    """:func:`graph_input.fingerprint` of the graph the chunks make up, without holding it."""
    node = graph.nodes.get(DEFAULT_NODE_TYPE)
    if graph.is_homogeneous and node is not None and node.x is not None and node.y is not None:
        h = hashlib.sha256(b"graphfeed-input-v1;")
        e = graph.edges[DEFAULT_EDGE_TYPE].fields
        hash_chunks(h, "edge_index", e["edge_index"])
        hash_chunks(h, "x", node.x)
        hash_chunks(h, "y", node.y)
        for split in sorted(graph.splits):
            _hash_whole(h, f"split:{split}", graph.splits[split])
        for name in ("edge_attr", "edge_weight"):
            if name in e:
                hash_chunks(h, name, e[name])
        optional = [(c.file, node.fields.get(c.file)) for c in OTHER_INPUT_COLUMNS]
        for name, chunks in (*optional, ("edge_time", e.get("edge_time"))):
            if chunks is not None:
                hash_chunks(h, name, chunks)
        return h.hexdigest()
    h = hashlib.sha256(b"graphfeed-input-typed-v1;")
    for ntype in sorted(graph.nodes):
        t = graph.nodes[ntype]
        h.update(f"node:{ntype}:{t.num_nodes};".encode())
        for name, key in ((c.name, c.file) for c in INPUT_COLUMNS):
            if key in t.fields:
                hash_chunks(h, f"{ntype}.{name}", t.fields[key])
    for etype in sorted(graph.edges):
        fields, label = graph.edges[etype].fields, "__".join(etype)
        for name in EDGE_FIELDS:
            if name in fields:
                hash_chunks(h, f"{label}.{name}", fields[name])
    h.update(f"label_type:{graph.label_type};".encode())
    for split in sorted(graph.splits):
        _hash_whole(h, f"split:{split}", graph.splits[split])
    return h.hexdigest()
