"""Reading and validating the graphs ``graphfeed partition`` accepts.

Two inputs, both homogeneous (original node ids are row positions of ``x``):

* a folder in the ``.npy`` layout (what ``graphfeed generate`` writes)::

      edge_index.npy   integer [2, E]   row 0 = source, row 1 = destination
      x.npy            numeric [N, F]   node features (N defines the number of nodes)
      y.npy            integer [N] or [N, ...]
      train_idx.npy    integer [k]      node ids (required); val_idx.npy, test_idx.npy (optional)
      edge_attr.npy    numeric [E, ...] optional edge features
      meta.json        optional; its "name" (or "preset") names the graph

* a file written with ``torch.save`` holding a PyG ``Data`` (or a dict of tensors) with
  ``x``, ``y``, ``edge_index``, splits as ``train_mask``/``val_mask``/``test_mask`` (bool [N])
  or ``train_idx``/... (ids), and optional ``edge_attr``.

Every problem raises :class:`InputError` naming the file or attribute and the fix.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from graphfeed.core.constants import SPLITS
from graphfeed.server.partition.builder import GraphInput

REQUIRED_FILES = ("edge_index", "x", "y", "train_idx")
_HASH_CHUNK = 1 << 26  # bytes hashed per update: bounds the temporary copy of a non-contiguous array


class InputError(ValueError):
    """The input graph is missing, malformed or inconsistent (message names the file and the fix)."""


# ----------------------------------------------------------------------------- entry point

def read_graph(path: str | os.PathLike, *, allow_pickle: bool = False) -> GraphInput:
    """Read and validate a graph from a ``.npy`` folder or a ``torch.save`` file.

    ``allow_pickle`` lets a torch file that holds more than PyG data and tensors be
    unpickled (arbitrary code runs: only for files you trust).
    """
    path = Path(path)
    if path.is_dir():
        return read_npy_folder(path)
    if path.is_file():
        return read_torch_file(path, allow_pickle=allow_pickle)
    raise InputError(f"input {path} does not exist: give a folder in the .npy layout "
                     f"(edge_index.npy, x.npy, y.npy, train_idx.npy, ...) or a file saved with torch.save")


# ----------------------------------------------------------------------------- .npy folder

def _load_npy(folder: Path, name: str, required: bool) -> np.ndarray | None:
    file = folder / f"{name}.npy"
    if not file.is_file():
        if required:
            raise InputError(f"{file} is missing: a .npy input folder needs "
                             f"{', '.join(f + '.npy' for f in REQUIRED_FILES)} (see `graphfeed generate`)")
        return None
    try:
        # Memory-mapped read-only: large features are paged in as the writer copies them out.
        return np.load(file, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{file} is not a readable .npy array ({exc}); re-save it with numpy.save") from exc


def _graph_name(folder: Path) -> str:
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
    folder = Path(folder)
    arrays = {name: _load_npy(folder, name, name in REQUIRED_FILES)
              for name in ("edge_index", "x", "y", *(f"{s}_idx" for s in SPLITS), "edge_attr")}
    where = lambda name: str(folder / f"{name}.npy")  # noqa: E731 -- a one-line local formatter
    splits = {s: arrays[f"{s}_idx"] for s in SPLITS}
    return build_graph_input(arrays["edge_index"], arrays["x"], arrays["y"], splits, arrays["edge_attr"],
                             name=_graph_name(folder), where=where)


# ----------------------------------------------------------------------------- torch.save file

def _torch_load(file: Path, allow_pickle: bool):
    import torch
    if not zipfile.is_zipfile(file):  # torch.save has written zip archives since torch 1.6
        raise InputError(f"{file} is not a file written by torch.save (and not a folder); give a .npy folder "
                         f"or save the graph with torch.save(data, path)")
    try:
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import BaseStorage, EdgeStorage, GlobalStorage, NodeStorage
        safe = [DataEdgeAttr, DataTensorAttr, BaseStorage, GlobalStorage, NodeStorage, EdgeStorage]
    except ImportError:  # PyG absent: plain dicts of tensors still load
        safe = []
    try:
        if allow_pickle:
            return torch.load(file, map_location="cpu", weights_only=False)
        with torch.serialization.safe_globals(safe):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f"such as {found.group(1)}" if found else "that torch.load(weights_only=True) refuses"
        raise InputError(f"{file} holds objects other than PyG data and tensors ({what}); if you trust the "
                         f"file pass --allow-pickle, or re-save it as a PyG Data / dict of tensors") from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{file} is not a file written by torch.save ({exc}); "
                         f"save the graph with torch.save(data, path)") from exc


def _field(obj, name):
    if isinstance(obj, dict):
        return obj.get(name)
    store = getattr(obj, "_store", None)  # PyG Data: absent attributes are simply not in its store
    if store is not None:
        return store.get(name) if hasattr(store, "get") else getattr(obj, name, None)
    return getattr(obj, name, None)


def _to_numpy(value, where: str) -> np.ndarray | None:
    if value is None:
        return None
    try:
        import torch
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().numpy()
    except ImportError:
        pass
    if isinstance(value, np.ndarray):
        return value
    raise InputError(f"{where} is a {type(value).__name__}, expected a tensor; store it as a torch.Tensor")


def _split_from_torch(obj, split: str, num_nodes: int, file: Path) -> np.ndarray | None:
    idx = _to_numpy(_field(obj, f"{split}_idx"), f"{file}: attribute {split}_idx")
    if idx is not None:
        return idx
    mask = _to_numpy(_field(obj, f"{split}_mask"), f"{file}: attribute {split}_mask")
    if mask is None:
        return None
    if mask.dtype != np.bool_ or mask.shape != (num_nodes,):
        raise InputError(f"{file}: attribute {split}_mask must be a bool tensor of shape [{num_nodes}] "
                         f"(one entry per node), got {mask.dtype} {list(mask.shape)}")
    return np.flatnonzero(mask).astype(np.int64)


def read_torch_file(file: str | os.PathLike, *, allow_pickle: bool = False) -> GraphInput:
    file = Path(file)
    obj = _torch_load(file, allow_pickle)
    if type(obj).__name__ == "HeteroData":
        raise InputError(f"{file} holds a HeteroData; graphfeed partition reads homogeneous graphs for now: "
                         f"convert it with data.to_homogeneous()")
    if not isinstance(obj, dict) and not hasattr(obj, "edge_index"):
        raise InputError(f"{file} holds a {type(obj).__name__}, expected a PyG Data (or a dict of tensors) "
                         f"with x, y, edge_index and train_mask/train_idx")
    where = lambda name: f"{file}: attribute {name}"  # noqa: E731 -- a one-line local formatter
    fields: dict[str, np.ndarray] = {}
    for name in ("edge_index", "x", "y"):
        value = _to_numpy(_field(obj, name), where(name))
        if value is None:
            raise InputError(f"{where(name)} is missing: the Data needs x, y, edge_index and a train split "
                             f"(train_mask or train_idx)")
        fields[name] = value
    x = fields["x"]
    num_nodes = int(x.shape[0]) if x.ndim else 0
    splits = {s: _split_from_torch(obj, s, num_nodes, file) for s in SPLITS}
    if splits["train"] is None:
        raise InputError(f"{where('train_mask')} is missing: give the training nodes as train_mask (bool [N]) "
                         f"or train_idx (node ids)")
    edge_attr = _to_numpy(_field(obj, "edge_attr"), where("edge_attr"))
    name = _field(obj, "name")
    name = name if isinstance(name, str) and name else file.stem
    return build_graph_input(fields["edge_index"], x, fields["y"], splits, edge_attr, name=name, where=where)


# ----------------------------------------------------------------------------- validation

def _check_edge_index(edge_index: np.ndarray, num_nodes: int, where: Callable[[str], str]) -> np.ndarray:
    w = where("edge_index")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        hint = " (it looks like [E, 2]: transpose it)" if edge_index.ndim == 2 and edge_index.shape[1] == 2 else ""
        raise InputError(f"{w} must have shape [2, E] (row 0 = source, row 1 = destination), "
                         f"got {list(edge_index.shape)}{hint}")
    if not np.issubdtype(edge_index.dtype, np.integer):
        raise InputError(f"{w} must hold integer node ids, got dtype {edge_index.dtype}; convert it to int64")
    if edge_index.dtype != np.int64:
        edge_index = edge_index.astype(np.int64)
    if edge_index.shape[1]:
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise InputError(f"{w} refers to node ids {lo}..{hi}, but x has {num_nodes} rows (valid ids "
                             f"0..{num_nodes - 1}); fix the edge list or add the missing nodes' features")
    return edge_index


def _check_x(x: np.ndarray, where) -> None:
    if x.ndim != 2:
        raise InputError(f"{where('x')} must have shape [N, F] (one row per node), got {list(x.shape)}; "
                         f"reshape it, e.g. x.reshape(N, -1)")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise InputError(f"{where('x')} must be numeric, got dtype {x.dtype}; convert it to float32")


def _check_y(y: np.ndarray, num_nodes: int, where) -> None:
    if y.ndim == 0 or y.shape[0] != num_nodes:
        raise InputError(f"{where('y')} has {y.shape[0] if y.ndim else 0} entries but x has {num_nodes} rows; "
                         f"give one label per node (same order as x)")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{where('y')} must hold integer class labels, got dtype {y.dtype}; convert it to int64")


def _check_split(idx: np.ndarray, name: str, num_nodes: int, where) -> np.ndarray:
    w = where(f"{name}_idx")
    if idx.ndim != 1:
        raise InputError(f"{w} must be a 1-D list of node ids, got shape {list(idx.shape)}")
    if idx.dtype == np.bool_:
        raise InputError(f"{w} is a bool mask; store node ids instead (numpy.flatnonzero(mask))")
    if not np.issubdtype(idx.dtype, np.integer):
        raise InputError(f"{w} must hold integer node ids, got dtype {idx.dtype}; convert it to int64")
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num_nodes):
        raise InputError(f"{w} holds node ids {int(idx.min())}..{int(idx.max())}, outside 0..{num_nodes - 1} "
                         f"(x has {num_nodes} rows); fix the split")
    uniq = np.unique(idx)
    if uniq.size != idx.size:
        raise InputError(f"{w} lists {idx.size - uniq.size} node id(s) more than once; deduplicate it")
    return uniq


def _check_edge_attr(edge_attr: np.ndarray, num_edges: int, where) -> None:
    if edge_attr.ndim == 0 or edge_attr.shape[0] != num_edges:
        raise InputError(f"{where('edge_attr')} has {edge_attr.shape[0] if edge_attr.ndim else 0} rows but "
                         f"edge_index has {num_edges} edges; give one row per edge (same order)")
    if not (np.issubdtype(edge_attr.dtype, np.number) or edge_attr.dtype == np.bool_):
        raise InputError(f"{where('edge_attr')} must be numeric, got dtype {edge_attr.dtype}")


def build_graph_input(edge_index, x, y, splits: dict, edge_attr=None, *, name: str = "",
                      where: Callable[[str], str] = lambda n: n) -> GraphInput:
    """Validate arrays and assemble a :class:`GraphInput` with its fingerprint.

    ``splits`` maps split name to ids or None (absent: stored as empty); ``where(name)``
    says where an array came from, for error messages.
    """
    _check_x(x, where)
    num_nodes = int(x.shape[0])
    if num_nodes == 0:
        raise InputError(f"{where('x')} has no rows: the graph has no nodes")
    _check_y(y, num_nodes, where)
    edge_index = _check_edge_index(edge_index, num_nodes, where)
    checked = {s: (_check_split(idx, s, num_nodes, where) if idx is not None else np.empty(0, dtype=np.int64))
               for s, idx in splits.items()}
    if not checked.get("train", np.empty(0)).size:
        raise InputError(f"{where('train_idx')} is empty: give at least one training node")
    if edge_attr is not None:
        _check_edge_attr(edge_attr, edge_index.shape[1], where)
    graph = GraphInput(edge_index=edge_index, x=x, y=y, splits=checked, edge_attr=edge_attr, name=name,
                       num_classes=int(y.max()) + 1 if y.size else 0)
    graph.fingerprint = fingerprint(graph)
    return graph


# ----------------------------------------------------------------------------- fingerprint

def _hash_array(h, label: str, array: np.ndarray) -> None:
    h.update(f"{label}:{array.dtype.str}:{list(array.shape)};".encode())
    if array.ndim == 0 or array.size == 0:
        return
    # Chunks of rows: bounded temporary copies when the array is not contiguous (a transposed tensor).
    rows = max(1, _HASH_CHUNK // max(1, array[:1].nbytes))
    for start in range(0, array.shape[0], rows):
        h.update(np.ascontiguousarray(array[start:start + rows]))


def fingerprint(graph: GraphInput) -> str:
    """sha256 over every array's dtype, shape and bytes (edges, features, labels, splits, edge features).

    Hashing everything costs about a second per GB and makes "same input" exact: a changed
    feature value or split gives a different fingerprint, so an old partition is never reused.
    """
    h = hashlib.sha256(b"graphfeed-input-v1;")
    _hash_array(h, "edge_index", graph.edge_index)
    _hash_array(h, "x", graph.x)
    _hash_array(h, "y", graph.y)
    for split in sorted(graph.splits):
        _hash_array(h, f"split:{split}", graph.splits[split])
    if graph.edge_attr is not None:
        _hash_array(h, "edge_attr", graph.edge_attr)
    return h.hexdigest()
