"""Reading and validating typed (heterogeneous) input graphs.

Two inputs:

* a typed ``.npy`` folder (what ``graphfeed generate --preset mag-*`` writes)::

      {ntype}/x.npy              numeric [N_t, F_t]  features (optional)
      {ntype}/y.npy              integer [N_t, ...]  labels (optional)
      {ntype}/num_nodes.npy      0-d integer         node count; required only without x and y
      {ntype}/{split}_idx.npy    integer [k]         ids of the split's nodes, or
      {ntype}/{split}_mask.npy   bool [N_t]          (train required, val/test optional; one type only)
      {ntype}/node_time.npy      integer [N_t]       node timestamps (optional; time_attr="time")
      {src}__{rel}__{dst}/edge_index.npy  integer [2, E]  row 0 = {src} ids, row 1 = {dst} ids
      {src}__{rel}__{dst}/edge_attr.npy   numeric [E, ...] optional
      {src}__{rel}__{dst}/edge_weight.npy numeric [E]      optional sampling weights (weight_attr="edge_weight")
      {src}__{rel}__{dst}/edge_time.npy   integer [E]      optional edge timestamps (time_attr="edge_time")
      meta.json                  optional; its "name" (or "preset") names the graph

  A sub-folder whose name holds ``__`` is an edge type, any other one a node type; node ids
  are row positions within their type.

* a PyG ``HeteroData`` saved with ``torch.save``: per node type ``x``, ``y``, ``num_nodes``,
  ``{split}_mask`` or ``{split}_idx``, optional ``time``; per edge type ``edge_index`` and optional
  ``edge_attr``, ``edge_weight`` and ``edge_time``.

The node type that holds the splits is the label type; it must have ``y``. Every problem
raises :class:`InputError` naming the node or edge type, the file or attribute, and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from graphfeed.core.columns import OTHER_INPUT_COLUMNS
from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.format.layout import edge_type_dirname
from graphfeed.server.partition.inputs import arrays
from graphfeed.server.partition.inputs.arrays import HARD_NEG_FILE, InputError, field_of, to_numpy
from graphfeed.server.partition.inputs.graph import EdgeType, EdgeTypeInput, GraphInput, NodeTypeInput, fingerprint

NODE_FILES = ("x", "y", "num_nodes", *(f"{s}_idx" for s in SPLITS), *(f"{s}_mask" for s in SPLITS),
              *(c.file for c in OTHER_INPUT_COLUMNS))
EDGE_FILES = ("edge_index", "edge_attr", "edge_weight", "edge_time", HARD_NEG_FILE)
Where = Callable[[str], str]   # array name -> where it came from, prefixed with its type


@dataclass
class RawNodeType:
    """One node type's arrays as read, before validation (``where`` names the type and the source)."""

    where: Where
    num_nodes_hint: str                   # how to give the node count in this input format
    x: np.ndarray | None = None
    y: np.ndarray | None = None
    num_nodes: np.ndarray | int | None = None
    idx: dict[str, np.ndarray] = field(default_factory=dict)     # split -> node ids
    masks: dict[str, np.ndarray] = field(default_factory=dict)   # split -> bool [N]
    columns: dict[str, np.ndarray] = field(default_factory=dict)   # other stored columns (time, ...) by name
    by_attr: bool = False                 # the input names them by PyG attribute (HeteroData), not by file


@dataclass
class RawEdgeType:
    where: Where
    edge_index: np.ndarray
    edge_attr: np.ndarray | None = None
    edge_weight: np.ndarray | None = None   # sampling weights [E]
    edge_time: np.ndarray | None = None     # edge timestamps [E]
    hard_neg_dst: np.ndarray | None = None  # hard-negative destinations [E, k], -1 padding


# ----------------------------------------------------------------------------- typed .npy folder

def _sub_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def is_typed_folder(folder: Path) -> bool:
    """A folder without top-level ``edge_index.npy``/``x.npy`` that has (type) sub-folders."""
    if (folder / "edge_index.npy").exists() or (folder / "x.npy").exists():
        return False
    return bool(_sub_folders(folder))


def _edge_type_of(name: str, folder: Path) -> EdgeType:
    parts = name.split("__")
    if len(parts) != 3 or not all(parts):
        raise InputError(f"{folder / name} is not a valid edge type folder: name edge type folders "
                         f"src__rel__dst (three non-empty names joined by '__', e.g. author__writes__paper)")
    return parts[0], parts[1], parts[2]


def _npy_arrays(sub: Path, allowed: tuple[str, ...], what: str) -> dict[str, np.ndarray]:
    unknown = sorted(p.name for p in sub.glob("*.npy") if p.stem not in allowed)
    if unknown:
        raise InputError(f"{sub / unknown[0]} is not part of the typed .npy layout ({what} folders hold "
                         f"{', '.join(a + '.npy' for a in allowed)}); rename or remove it")
    return _present({name: arrays.load_npy(sub / f"{name}.npy", False) for name in allowed})


def _read_node_folder(sub: Path) -> RawNodeType:
    arrays = _npy_arrays(sub, NODE_FILES, "node type")
    where = lambda name: f"node type {sub.name!r}: {sub / name}.npy"  # noqa: E731 -- a one-line formatter
    return RawNodeType(where=where, num_nodes_hint=f"save it as {sub / 'num_nodes.npy'} (numpy.save(path, N))",
                       x=arrays.get("x"), y=arrays.get("y"), num_nodes=arrays.get("num_nodes"),
                       idx={s: arrays[f"{s}_idx"] for s in SPLITS if f"{s}_idx" in arrays},
                       masks={s: arrays[f"{s}_mask"] for s in SPLITS if f"{s}_mask" in arrays},
                       columns={c.name: arrays[c.file] for c in OTHER_INPUT_COLUMNS if c.file in arrays})


def _read_edge_folder(sub: Path, etype: EdgeType) -> RawEdgeType:
    arrays = _npy_arrays(sub, EDGE_FILES, "edge type")
    where = lambda name: f"edge type {etype!r}: {sub / name}.npy"  # noqa: E731 -- a one-line formatter
    if "edge_index" not in arrays:
        raise InputError(f"{where('edge_index')} is missing: every edge type folder needs edge_index.npy [2, E]")
    return RawEdgeType(where=where, edge_index=arrays["edge_index"], edge_attr=arrays.get("edge_attr"),
                       edge_weight=arrays.get("edge_weight"), edge_time=arrays.get("edge_time"),
                       hard_neg_dst=arrays.get(HARD_NEG_FILE))


def read_typed_folder(folder: Path, name: str) -> GraphInput:
    """A typed ``.npy`` folder (see the module docstring)."""
    nodes: dict[str, RawNodeType] = {}
    edges: dict[EdgeType, RawEdgeType] = {}
    for sub in _sub_folders(folder):
        if "__" in sub.name:
            etype = _edge_type_of(sub.name, folder)
            edges[etype] = _read_edge_folder(sub, etype)
        else:
            nodes[sub.name] = _read_node_folder(sub)
    return build_typed_graph_input(nodes, edges, name=name)


# ----------------------------------------------------------------------------- HeteroData

def is_hetero_data(obj) -> bool:
    return type(obj).__name__ == "HeteroData"


def _hetero_node_type(store, ntype: str, file: Path) -> RawNodeType:
    where = lambda name: f"node type {ntype!r}: {file}: data[{ntype!r}].{name}"  # noqa: E731 -- a formatter
    arrays = {name: to_numpy(field_of(store, name), where(name))
              for name in NODE_FILES if name not in ("num_nodes", *(c.file for c in OTHER_INPUT_COLUMNS))}
    num_nodes = field_of(store, "num_nodes")
    if num_nodes is not None and not isinstance(num_nodes, int):
        num_nodes = to_numpy(num_nodes, where("num_nodes"))
    x, ids = arrays["x"], to_numpy(field_of(store, "node_id"), where("node_id"))
    if x is not None and x.ndim == 1 and np.issubdtype(x.dtype, np.integer):   # x = node ids, as node_id
        x, ids = None, x if ids is None else ids
    if ids is not None and num_nodes is None:
        num_nodes = np.int64(_id_only_count(ids, where("node_id" if "node_id" in store else "x")))
    return RawNodeType(where=where, num_nodes_hint=f"set data[{ntype!r}].num_nodes = N before saving",
                       x=x, y=arrays["y"], num_nodes=num_nodes,
                       idx=_present({s: arrays[f"{s}_idx"] for s in SPLITS}),
                       masks=_present({s: arrays[f"{s}_mask"] for s in SPLITS}),
                       columns=_present({c.name: to_numpy(field_of(store, c.input_attr), where(c.input_attr))
                                         for c in OTHER_INPUT_COLUMNS}), by_attr=True)


def _id_only_count(ids: np.ndarray, w: str) -> int:
    """An id-only node type (PyG's ``node_id = torch.arange(N)`` for an ``Embedding``, or ids as a 1-D ``x``):
    its node count; it is stored without features, and a batch's ``n_id`` of the type is the embedding index."""
    if ids.ndim != 1 or not np.array_equal(ids, np.arange(ids.shape[0])):
        raise InputError(f"{w} must be the node ids 0..N-1 in order ([N] integers) for an id-only node type; "
                         f"a batch's n_id gives them (index an Embedding with it), so drop this attribute and set "
                         f"num_nodes = N, or give real features as x [N, F]")
    return int(ids.shape[0])


def _present(arrays: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    return {name: array for name, array in arrays.items() if array is not None}


def _hetero_edge_type(store, etype: EdgeType, file: Path) -> RawEdgeType:
    where = lambda name: f"edge type {etype!r}: {file}: data[{etype!r}].{name}"  # noqa: E731 -- a formatter
    edge_index = to_numpy(field_of(store, "edge_index"), where("edge_index"))
    if edge_index is None:
        raise InputError(f"{where('edge_index')} is missing: give every edge type an edge_index [2, E] "
                         f"(a SparseTensor adj_t is not read; convert it to edge_index)")
    optional = {name: to_numpy(field_of(store, name), where(name))
                for name in ("edge_attr", "edge_weight", "edge_time", HARD_NEG_FILE)}
    return RawEdgeType(where=where, edge_index=edge_index, **optional)


def read_hetero_data(data, file: Path) -> GraphInput:
    """A PyG ``HeteroData`` (see the module docstring)."""
    if not data.node_types:
        raise InputError(f"{file} holds a HeteroData without node types; give it node types "
                         f"(data['paper'].x = ...) and edge types (data['author', 'writes', 'paper'].edge_index)")
    nodes = {ntype: _hetero_node_type(data[ntype], ntype, file) for ntype in data.node_types}
    edges = {tuple(etype): _hetero_edge_type(data[etype], tuple(etype), file) for etype in data.edge_types}
    name = getattr(data, "_global_store", {}).get("name")
    graph = build_typed_graph_input(nodes, edges, name=name if isinstance(name, str) and name else file.stem)
    graph.dropped = hetero_dropped(data)
    return graph


HETERO_NODE_KEYS = frozenset({"x", "y", "num_nodes", "node_id", *(c.input_attr for c in OTHER_INPUT_COLUMNS),
                              *(f"{s}_{k}" for s in SPLITS for k in ("idx", "mask"))})
HETERO_EDGE_KEYS = frozenset({"edge_index", "edge_attr", "edge_weight", "edge_time", HARD_NEG_FILE})


def hetero_dropped(data) -> list[str]:
    """The attributes of a ``HeteroData`` that partitioning does not store, as ``data[type].name`` (edge
    ``time``, ``edge_label``, ``edge_label_index``, node ``pos``, ...), for the one warning line."""
    def keys(store) -> list[str]:
        k = getattr(store, "keys", None)
        return [str(name) for name in (k() if callable(k) else k or [])]

    dropped = [f"data[{nt!r}].{k}" for nt in data.node_types for k in keys(data[nt]) if k not in HETERO_NODE_KEYS]
    dropped += [f"data[{tuple(et)!r}].{k}" for et in data.edge_types for k in keys(data[et])
                if k not in HETERO_EDGE_KEYS]
    dropped += [f"data.{k}" for k in keys(getattr(data, "_global_store", {})) if k != "name"]
    return sorted(dropped)


# ----------------------------------------------------------------------------- validation

def build_typed_graph_input(nodes: dict[str, RawNodeType], edges: dict[EdgeType, RawEdgeType], *,
                            name: str = "") -> GraphInput:
    """Validate a typed graph's arrays and assemble a :class:`GraphInput` with its fingerprint."""
    if not nodes:
        raise InputError(f"graph {name!r} has no node types; give at least one node type (with x or num_nodes)")
    checked = {ntype: _check_node_type(ntype, raw) for ntype, raw in nodes.items()}
    counts = {ntype: t.num_nodes for ntype, (t, _) in checked.items()}
    typed_edges = {etype: _check_edge_type(etype, raw, counts) for etype, raw in edges.items()}
    label_type = _label_type(checked, nodes)
    graph = GraphInput.typed({ntype: t for ntype, (t, _) in checked.items()}, typed_edges,
                             _complete_splits(checked[label_type][1]), label_type, name=name)
    graph.fingerprint = fingerprint(graph)
    return graph


def _check_node_type(ntype: str, raw: RawNodeType) -> tuple[NodeTypeInput, dict[str, np.ndarray]]:
    if not ntype or "__" in ntype:
        raise InputError(f"node type {ntype!r} is not a valid name: node type names are non-empty and have no "
                         f"'__' (it separates the parts of an edge type's name); rename it")
    if raw.x is not None:
        arrays.check_x(raw.x, raw.where("x"))
    if raw.y is not None:
        arrays.check_y_dtype(raw.y, raw.where("y"))
    n = _node_count(ntype, raw)
    rows = f"node type {ntype!r} has {n} nodes"
    splits = {s: arrays.mask_to_ids(m, n, raw.where(f"{s}_mask")) for s, m in raw.masks.items()}
    for s, idx in raw.idx.items():
        if s in splits:
            raise InputError(f"{raw.where(f'{s}_idx')} and {s}_mask both give the {s} split; keep one of them")
        splits[s] = idx
    splits = {s: arrays.check_split(idx, raw.where(f"{s}_idx" if s in raw.idx else f"{s}_mask"), n, rows)
              for s, idx in splits.items()}
    columns = {c.name: arrays.check_node_column(c, raw.columns.get(c.name), n,
                                         raw.where(c.input_attr if raw.by_attr else c.file), f"node type {ntype!r} has")
               for c in OTHER_INPUT_COLUMNS}
    return NodeTypeInput(n, raw.x, raw.y, **columns), splits


def _node_count(ntype: str, raw: RawNodeType) -> int:
    """The type's node count: rows of x, entries of y and num_nodes must agree (one of them is required)."""
    return arrays.node_count([(raw.where(name), a) for name, a in (("x", raw.x), ("y", raw.y),
                                                                  ("num_nodes", raw.num_nodes))],
                             f"node type {ntype!r}", raw.num_nodes_hint)


def _check_edge_type(etype: EdgeType, raw: RawEdgeType, counts: dict[str, int]) -> EdgeTypeInput:
    for role, ntype in (("source", etype[0]), ("destination", etype[2])):
        if ntype not in counts:
            raise InputError(f"edge type {etype!r} names {role} node type {ntype!r}, which the graph does not have "
                             f"(node types: {', '.join(map(repr, counts))}); add node type {ntype!r} "
                             f"(with x or num_nodes) or fix the edge type's name")
    w = raw.where("edge_index")
    edge_index = arrays.check_edge_index_shape(raw.edge_index, w)
    for row, role, ntype in ((0, "source", etype[0]), (1, "destination", etype[2])):
        found, n = arrays.id_range(edge_index[row]), counts[ntype]
        if found is not None and (found[0] < 0 or found[1] >= n):
            raise InputError(f"{w} has {role} ids {found[0]}..{found[1]}, but {role} node type {ntype!r} has {n} "
                             f"nodes (valid ids 0..{n - 1}); fix the edge list or the node count of {ntype!r}")
    return EdgeTypeInput(edge_index, **arrays.check_edge_columns(
        edge_index.shape[1], counts[etype[2]], raw.where, "its edge_index", edge_attr=raw.edge_attr,
        edge_weight=raw.edge_weight, edge_time=raw.edge_time, hard_neg_dst=raw.hard_neg_dst))


def _label_type(checked: dict[str, tuple[NodeTypeInput, dict]], raw: dict[str, RawNodeType]) -> str:
    """The one node type with splits; it needs a non-empty train split (labels are optional).  Without any
    node split (a graph for link prediction) the first labelled node type, else the first node type."""
    with_splits = sorted(ntype for ntype, (_, splits) in checked.items() if splits)
    if len(with_splits) > 1:
        raise InputError(f"node types {', '.join(map(repr, with_splits))} all have splits, but graphfeed trains one "
                         f"node type: keep train/val/test on the type you train and remove them from the others")
    if not with_splits:   # a link-prediction graph: no node loader trains on it, so no node split is needed
        labelled = [ntype for ntype, (t, _) in checked.items() if t.y is not None]
        return (labelled or list(checked))[0]
    ntype = with_splits[0]
    _, splits = checked[ntype]   # labels are optional: an unlabelled graph is served as it is
    if not splits.get("train", np.empty(0)).size:
        raise InputError(f"{raw[ntype].where('train_idx')} is missing or empty: give at least one training node "
                         f"of node type {ntype!r}")
    return ntype


def _complete_splits(splits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every split name, absent ones empty (as a homogeneous input stores them)."""
    return {s: splits.get(s, np.empty(0, dtype=np.int64)) for s in SPLITS}


# ----------------------------------------------------------------------------- writing

def write_typed_folder(folder: Path, graph: GraphInput) -> None:
    """Write ``graph`` into ``folder`` (existing, empty) in the typed ``.npy`` layout."""
    for ntype, t in graph.nodes.items():
        sub = folder / ntype
        sub.mkdir()
        for name, array in (("x", t.x), ("y", t.y)):
            if array is not None:
                np.save(sub / f"{name}.npy", np.ascontiguousarray(array))
        if t.x is None and t.y is None:
            np.save(sub / "num_nodes.npy", np.int64(t.num_nodes))
        for c in OTHER_INPUT_COLUMNS:
            if t.column(c.name) is not None:
                np.save(sub / f"{c.file}.npy", np.ascontiguousarray(t.column(c.name)))
        if ntype == graph.label_type:
            for split, idx in graph.splits.items():
                np.save(sub / f"{split}_idx.npy", np.asarray(idx, dtype=np.int64))
    for etype, e in graph.edges.items():
        sub = folder / edge_type_dirname(etype)
        sub.mkdir()
        np.save(sub / "edge_index.npy", np.ascontiguousarray(e.edge_index))
        for name, array in (("edge_attr", e.edge_attr), ("edge_weight", e.edge_weight), ("edge_time", e.edge_time),
                            (HARD_NEG_FILE, e.hard_neg_dst)):
            if array is not None:
                np.save(sub / f"{name}.npy", np.ascontiguousarray(array))
