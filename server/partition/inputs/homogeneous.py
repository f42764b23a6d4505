"""Reading and validating the graphs ``graphfeed partition`` accepts.

Homogeneous inputs (original node ids are row positions of ``x``):

* a folder in the ``.npy`` layout (what ``graphfeed generate`` writes)::

      edge_index.npy   integer [2, E]   row 0 = source, row 1 = destination
      x.npy            numeric [N, F]   node features (N defines the number of nodes); optional: a
                                        featureless graph gives N by y.npy or num_nodes.npy (0-d integer)
                                        and is trained with a learnable embedding table (``client.embedding``)
      y.npy            optional labels, stored and served as given: integer classes [N],
                       multi-label [N, C], float regression targets [N] or [N, ...]
      train_idx.npy    integer [k]      node ids (required); val_idx.npy, test_idx.npy (optional)
      edge_attr.npy    numeric [E, ...] optional edge features
      meta.json        optional; its "name" (or "preset") names the graph

* a file written with ``torch.save`` holding a PyG ``Data`` (or a dict of tensors) with
  ``x``, ``edge_index``, splits as ``train_mask``/``val_mask``/``test_mask`` (bool [N])
  or ``train_idx``/... (ids), and optional ``y`` and ``edge_attr``; without ``x`` (a featureless graph),
  ``y`` or an explicitly set ``num_nodes`` gives the node count.

A featureless graph is stored without ``x``, like a typed graph's featureless node types: its batches carry
no ``x``, and ``client.embedding(..., field="x")`` gives its nodes learnable rows.

Anything else the input carries (other ``.npy`` files, other ``Data`` attributes) is not
stored: :attr:`GraphInput.dropped` names it, and ``graphfeed partition`` prints one warning
line with those names.

Typed inputs (a PyG ``HeteroData`` file, a typed ``.npy`` folder) are read by
:mod:`graphfeed.server.partition.inputs.typed`; :func:`graphfeed.server.partition.inputs.reader.read_graph`
tells them apart.

Every problem raises :class:`InputError` naming the file or attribute and the fix.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np

from graphfeed.core.columns import OTHER_INPUT_COLUMNS
from graphfeed.core.constants import DEFAULT_EDGE_TYPE, SPLITS
from graphfeed.server.partition.inputs.arrays import (
    HARD_NEG_FILE,
    InputError,
    check_edge_columns,
    check_edge_index_shape,
    check_hard_neg_dst,
    check_node_column,
    check_split,
    check_x,
    check_y_dtype,
    field_of,
    label_classes,
    load_npy,
    mask_to_ids,
    node_count,
    to_numpy,
    torch_load,
)
from graphfeed.server.partition.inputs.graph import GraphInput, fingerprint
from graphfeed.server.partition.inputs.typed import is_hetero_data, read_hetero_data

REQUIRED_FILES = ("edge_index", "train_idx")
NPY_FILES = ("edge_index", "x", "y", "num_nodes", *(f"{s}_idx" for s in SPLITS), "edge_attr", "edge_weight",
             *(c.file for c in OTHER_INPUT_COLUMNS), "edge_time", HARD_NEG_FILE)
# Data attributes read (or, for num_nodes/name, understood) by read_torch_file
DATA_KEYS = frozenset({"edge_index", "x", "y", "edge_attr", "edge_weight", "name", "num_nodes", "edge_time",
                       HARD_NEG_FILE, *(c.input_attr for c in OTHER_INPUT_COLUMNS),
                       *(f"{s}_{kind}" for s in SPLITS for kind in ("idx", "mask"))})


# ----------------------------------------------------------------------------- .npy folder

def _load_npy(folder: Path, name: str, required: bool) -> np.ndarray | None:
    return load_npy(folder / f"{name}.npy", required,
                    f"a .npy input folder needs {', '.join(f + '.npy' for f in REQUIRED_FILES)} and x.npy "
                    f"(or, for a featureless graph, y.npy or num_nodes.npy) (see `graphfeed generate`)")


def graph_name(folder: Path) -> str:
    """A graph folder's name: its ``meta.json``'s ``name`` (or ``preset``), else the folder's."""
    meta = folder / "meta.json"
    if meta.is_file():
        try:
            data = json.loads(meta.read_text())
            if isinstance(data, dict):
                return str(data.get("name") or data.get("preset") or folder.name)
        except (OSError, json.JSONDecodeError):
            pass  # meta.json is informational only
    return folder.resolve().name


def read_npy_folder(folder: str | os.PathLike) -> GraphInput:
    """A homogeneous ``.npy`` folder (see the module docstring)."""
    folder = Path(folder)
    arrays = {name: _load_npy(folder, name, name in REQUIRED_FILES) for name in NPY_FILES}
    where = lambda name: str(folder / f"{name}.npy")  # noqa: E731 -- a one-line local formatter
    splits = {s: arrays[f"{s}_idx"] for s in SPLITS}
    graph = build_graph_input(arrays["edge_index"], arrays["x"], arrays["y"], splits, arrays["edge_attr"],
                              name=graph_name(folder), where=where, edge_weight=arrays["edge_weight"],
                              node_columns={c.name: arrays[c.file] for c in OTHER_INPUT_COLUMNS},
                              edge_time=arrays["edge_time"], num_nodes=arrays["num_nodes"])
    _add_hard_negatives(graph, arrays[HARD_NEG_FILE], where(HARD_NEG_FILE))
    graph.dropped = sorted(p.name for p in folder.glob("*.npy") if p.stem not in NPY_FILES)
    return graph


def _add_hard_negatives(graph: GraphInput, hard: np.ndarray | None, where: str) -> None:
    """Attach a homogeneous graph's checked ``hard_neg_dst`` [E, k] (None: none given)."""
    if hard is not None:
        edges = graph.edges[DEFAULT_EDGE_TYPE]
        edges.hard_neg_dst = check_hard_neg_dst(hard, edges.num_edges, graph.num_nodes, where)


# ----------------------------------------------------------------------------- torch.save file

def _split_from_torch(obj, split: str, num_nodes: int, file: Path) -> np.ndarray | None:
    idx = to_numpy(field_of(obj, f"{split}_idx"), f"{file}: attribute {split}_idx")
    if idx is not None:
        return idx
    mask = to_numpy(field_of(obj, f"{split}_mask"), f"{file}: attribute {split}_mask")
    return None if mask is None else mask_to_ids(mask, num_nodes, f"{file}: attribute {split}_mask")


def read_torch_file(file: str | os.PathLike, *, allow_pickle: bool = False) -> GraphInput:
    """A ``torch.save`` file: a PyG ``HeteroData`` (typed), or a PyG ``Data`` / dict of tensors."""
    file = Path(file)
    obj = torch_load(file, allow_pickle)
    if is_hetero_data(obj):
        return read_hetero_data(obj, file)
    if not isinstance(obj, dict) and not hasattr(obj, "edge_index"):
        raise InputError(f"{file} holds a {type(obj).__name__}, expected a PyG Data (or a dict of tensors) "
                         f"with x, y, edge_index and train_mask/train_idx, or a HeteroData")
    where = lambda name: f"{file}: attribute {name}"  # noqa: E731 -- a one-line local formatter
    edge_index = to_numpy(field_of(obj, "edge_index"), where("edge_index"))
    if edge_index is None:
        raise InputError(f"{where('edge_index')} is missing: the Data needs edge_index and a train split "
                         f"(train_mask or train_idx); x and y are optional")
    x, y = to_numpy(field_of(obj, "x"), where("x")), to_numpy(field_of(obj, "y"), where("y"))
    if x is not None:     # its shape first: the masks are checked against its rows
        check_x(x, where("x"))
    if y is not None:
        check_y_dtype(y, where("y"))
    given = field_of(obj, "num_nodes")    # set explicitly (Data stores it only then): a featureless graph's count
    given = given if given is None or isinstance(given, int) else to_numpy(given, where("num_nodes"))
    num_nodes = _node_count(x, y, given, where)
    splits = {s: _split_from_torch(obj, s, num_nodes, file) for s in SPLITS}
    if splits["train"] is None:
        raise InputError(f"{where('train_mask')} is missing: give the training nodes as train_mask (bool [N]) "
                         f"or train_idx (node ids)")
    edge_attr = to_numpy(field_of(obj, "edge_attr"), where("edge_attr"))
    edge_weight = to_numpy(field_of(obj, "edge_weight"), where("edge_weight"))
    name = field_of(obj, "name")
    name = name if isinstance(name, str) and name else file.stem
    graph = build_graph_input(edge_index, x, y, splits, edge_attr, name=name, where=where,
                              edge_weight=edge_weight, node_columns=_node_columns(obj, where),
                              edge_time=to_numpy(field_of(obj, "edge_time"), where("edge_time")), num_nodes=given)
    _add_hard_negatives(graph, to_numpy(field_of(obj, HARD_NEG_FILE), where(HARD_NEG_FILE)), where(HARD_NEG_FILE))
    graph.dropped = sorted(k for k in _attribute_names(obj) if k not in DATA_KEYS)
    return graph


def _node_columns(obj, where: Callable[[str], str]) -> dict[str, np.ndarray | None]:
    """The stored node columns other than x and y a ``Data`` (or dict of tensors) holds, by column name."""
    return {c.name: to_numpy(field_of(obj, c.input_attr), where(c.input_attr)) for c in OTHER_INPUT_COLUMNS}


def _attribute_names(obj) -> list[str]:
    """The attribute names of a PyG ``Data`` (its ``keys()``) or the keys of a dict."""
    if isinstance(obj, dict):
        return [str(k) for k in obj]
    keys = getattr(obj, "keys", None)
    try:
        return [str(k) for k in (keys() if callable(keys) else keys or [])]
    except TypeError:
        return []


# ----------------------------------------------------------------------------- validation

def _check_edge_index(edge_index: np.ndarray, num_nodes: int, where: Callable[[str], str], rows: str) -> np.ndarray:
    w = where("edge_index")
    edge_index = check_edge_index_shape(edge_index, w)
    if edge_index.shape[1]:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise InputError(f"{w} refers to node ids {lo}..{hi}, but {rows} (valid ids "
                             f"0..{num_nodes - 1}); fix the edge list or add the missing nodes' features")
    return edge_index


def _check_y(y: np.ndarray | None, x: np.ndarray | None, where) -> None:
    if y is None:
        return
    check_y_dtype(y, where("y"))
    if x is not None and y.shape[0] != x.shape[0]:
        raise InputError(f"{where('y')} has {y.shape[0]} entries but x has {x.shape[0]} rows; "
                         f"give one label per node (same order as x)")


def _node_count(x: np.ndarray | None, y: np.ndarray | None, num_nodes, where: Callable[[str], str]) -> int:
    """N: the rows of ``x``, or for a featureless graph the entries of ``y`` or ``num_nodes`` (all that are given
    must agree)."""
    return node_count([(where("x"), x), (where("y"), y), (where("num_nodes"), num_nodes)], "the graph",
                      f"give features as {where('x')} [N, F], or for a featureless graph labels as {where('y')} "
                      f"or the node count as {where('num_nodes')} (a 0-d integer)")


def build_graph_input(edge_index, x, y, splits: dict, edge_attr=None, *, name: str = "",
                      where: Callable[[str], str] = lambda n: n, edge_weight=None,
                      node_columns: dict[str, np.ndarray | None] | None = None, edge_time=None,
                      num_nodes=None) -> GraphInput:
    """Validate a homogeneous graph's arrays and assemble a :class:`GraphInput` with its fingerprint.

    ``splits`` maps split name to ids or None (absent: stored as empty); ``where(name)``
    says where an array came from, for error messages.  ``node_columns``: the stored node columns other than
    ``x`` and ``y`` by name (:data:`graphfeed.core.columns.NODE_COLUMNS`; ``time``: integer timestamps [N] for
    temporal sampling, ``node_time.npy`` / ``Data.time``); ``edge_time`` [E]: integer edge timestamps
    (``edge_time.npy`` / ``Data.edge_time``).  ``x`` None: a featureless graph, whose node count ``y`` or
    ``num_nodes`` (a 0-d integer) gives.
    """
    if x is not None:
        check_x(x, where("x"))
    _check_y(y, x, where)
    count = _node_count(x, y, num_nodes, where)
    if count == 0:
        raise InputError(f"{where('x')} has no rows: the graph has no nodes" if x is not None else
                         "the graph has no nodes (num_nodes is 0)")
    rows = f"x has {count} rows" if x is not None else f"the graph has {count} nodes"
    edge_index = _check_edge_index(edge_index, count, where, rows)
    checked = {s: (check_split(idx, where(f"{s}_idx"), count, rows) if idx is not None
                   else np.empty(0, dtype=np.int64)) for s, idx in splits.items()}
    if not checked.get("train", np.empty(0)).size:
        raise InputError(f"{where('train_idx')} is empty: give at least one training node")
    edges = check_edge_columns(edge_index.shape[1], count, where, "edge_index", edge_attr=edge_attr,
                               edge_weight=edge_weight, edge_time=edge_time)
    columns = {c.name: check_node_column(c, (node_columns or {}).get(c.name), count, where(c.file),
                                         "x has" if x is not None else "the graph has")
               for c in OTHER_INPUT_COLUMNS}
    graph = GraphInput(edge_index=edge_index, x=x, y=y, splits=checked, edge_attr=edges["edge_attr"], name=name,
                       num_classes=label_classes(y), edge_weight=edges["edge_weight"], node_columns=columns,
                       edge_time=edges["edge_time"], num_nodes=count)
    graph.fingerprint = fingerprint(graph)
    return graph
