"""Loading and checking the arrays of an input graph (shared by the homogeneous and typed readers).

``w`` is always where an array came from (a file, ``file: attribute``, prefixed with the node or
edge type for a typed graph), so every message names the array and says the fix.
"""
from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from graphfeed.core.columns import NodeColumn


class InputError(ValueError):
    """The input graph is missing, malformed or inconsistent (message names the file and the fix)."""


# ----------------------------------------------------------------------------- loading

def load_npy(file: Path, required: bool, missing_hint: str = "") -> np.ndarray | None:
    """Memory-map ``file`` read-only (large features are paged in as the writer copies them out)."""
    if not file.is_file():
        if required:
            raise InputError(f"{file} is missing: {missing_hint}")
        return None
    try:
        return np.load(file, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(unreadable_npy(file, exc, "re-save it with numpy.save")) from exc


def unreadable_npy(file: Path | str, exc: Exception, fix: str) -> str:
    """Why ``file`` could not be loaded, in one line: an array of Python objects (strings, mixed values) is named as
    such with the conversion to numbers; anything else with ``exc`` and ``fix``."""
    dtype = npy_dtype(file)
    if dtype is not None and dtype.hasobject:
        return (f"{file} holds Python objects (dtype object), not numbers: graphfeed reads numeric arrays only; "
                f"convert it and save it again, e.g. numpy.save(path, array.astype('float32')) for features or "
                f"'int64' for ids and labels")
    return f"{file} is not a readable .npy array ({exc}); {fix}"


def npy_dtype(file: Path | str) -> np.dtype | None:
    """The dtype in a ``.npy`` file's header, or None when the header cannot be read."""
    try:
        with open(file, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            return read(fh)[2]
    except (ValueError, OSError, EOFError):
        return None


def check_numeric_dtype(dtype, w: str, fix: str) -> None:
    """InputError unless ``dtype`` is a number or bool type (strings and objects are refused before any work: a
    partition stores numbers); ``w`` names the file or column, ``fix`` says how to convert it."""
    dtype = np.dtype(dtype)
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
        kind = "strings" if dtype.kind in "US" else "Python objects (e.g. strings)" if dtype.hasobject else \
            f"{dtype} values"
        raise InputError(f"{w} holds {kind}, not numbers (dtype {dtype}): graphfeed partitions numeric columns "
                         f"only; {fix}")


def torch_load(file: Path, allow_pickle: bool):
    """A ``torch.save`` file, unpickling only PyG data and tensors unless ``allow_pickle``."""
    import torch
    if not zipfile.is_zipfile(file):  # torch.save has written zip archives since torch 1.6
        raise InputError(f"{file} is not a file written by torch.save (and not a folder); give a .npy folder "
                         f"or save the graph with torch.save(data, path)")
    try:
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import AttrType, BaseStorage, EdgeStorage, GlobalStorage, NodeStorage
        # AttrType: an enum that RandomLinkSplit's outputs carry (they hold only tensors and enums)
        safe = [DataEdgeAttr, DataTensorAttr, BaseStorage, GlobalStorage, NodeStorage, EdgeStorage, AttrType]
    except ImportError:  # PyG absent: plain dicts of tensors still load
        safe = []
    try:
        if allow_pickle:
            return torch.load(file, map_location="cpu", weights_only=False)
        try:
            with torch.serialization.safe_globals(safe):
                return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:   # e.g. RandomLinkSplit's outputs: their stores cache in a defaultdict,
            # which weights_only refuses whatever is allowed; the same allow-list, with containers, instead
            return torch.load(file, map_location="cpu", weights_only=False, pickle_module=_PyGDataPickle)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f"such as {found.group(1)}" if found else "that torch.load(weights_only=True) refuses"
        raise InputError(f"{file} holds objects other than PyG data and tensors ({what}); if you trust the "
                         f"file pass --allow-pickle, or re-save it as a PyG Data / dict of tensors") from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{file} is not a file written by torch.save ({exc}); "
                         f"save the graph with torch.save(data, path)") from exc


def field_of(obj, name):
    """Attribute ``name`` of a dict, a PyG Data or a PyG storage; None when absent."""
    if isinstance(obj, dict):
        return obj.get(name)
    store = getattr(obj, "_store", None)  # PyG Data: absent attributes are simply not in its store
    if store is not None:
        return store.get(name) if hasattr(store, "get") else getattr(obj, name, None)
    if hasattr(obj, "get"):              # PyG NodeStorage / EdgeStorage (a mapping)
        return obj.get(name)
    return getattr(obj, name, None)


def to_numpy(value, w: str) -> np.ndarray | None:
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
    raise InputError(f"{w} is a {type(value).__name__}, expected a tensor; store it as a torch.Tensor")


def mask_to_ids(mask: np.ndarray, num_nodes: int, w: str) -> np.ndarray:
    if mask.dtype != np.bool_ or mask.shape != (num_nodes,):
        raise InputError(f"{w} must be a bool tensor of shape [{num_nodes}] (one entry per node), "
                         f"got {mask.dtype} {list(mask.shape)}")
    return np.flatnonzero(mask).astype(np.int64)


# ----------------------------------------------------------------------------- checks

def check_edge_index_shape(edge_index: np.ndarray, w: str) -> np.ndarray:
    """Shape [2, E] and an integer dtype; returns it as int64."""
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        hint = " (it looks like [E, 2]: transpose it)" if edge_index.ndim == 2 and edge_index.shape[1] == 2 else ""
        raise InputError(f"{w} must have shape [2, E] (row 0 = source, row 1 = destination), "
                         f"got {list(edge_index.shape)}{hint}")
    if not np.issubdtype(edge_index.dtype, np.integer):
        raise InputError(f"{w} must hold integer node ids, got dtype {edge_index.dtype}; convert it to int64")
    return edge_index if edge_index.dtype == np.int64 else edge_index.astype(np.int64)


def id_range(ids: np.ndarray) -> tuple[int, int] | None:
    return (int(ids.min()), int(ids.max())) if ids.size else None


def node_count(sources: list[tuple[str, np.ndarray | int | None]], what: str, hint: str) -> int:
    """The node count that ``sources`` -- (where, array) pairs of ``x``, ``y`` (their rows) and ``num_nodes`` (a 0-d
    integer), None where absent -- agree on; InputError when none is given (``hint`` says how to give it) or two
    disagree (``what`` names the graph or node type)."""
    counts = [(w, _check_num_nodes(a, w) if name == "num_nodes" else _rows(a))
              for name, (w, a) in zip(("x", "y", "num_nodes"), sources) if a is not None]
    if not counts:
        raise InputError(f"{what} has no x, y or num_nodes, so its node count is unknown; {hint}")
    (first, n), *others = counts
    for w, count in others:
        if count != n:
            raise InputError(f"{w} gives {count} nodes but {first} gives {n}: every array of {what} "
                             f"needs one row per node (same order); fix the one that is wrong")
    return n


def _rows(array) -> int:
    array = np.asarray(array)
    return int(array.shape[0]) if array.ndim else 0


def _check_num_nodes(value, w: str) -> int:
    array = np.asarray(value)
    if array.ndim != 0 or not np.issubdtype(array.dtype, np.integer) or int(array) < 0:
        raise InputError(f"{w} must be a non-negative integer scalar (0-d int64), got {array.dtype} "
                         f"{list(array.shape)}; save it with numpy.save(path, numpy.int64(N))")
    return int(array)


def check_x(x: np.ndarray, w: str) -> None:
    if x.ndim != 2:
        raise InputError(f"{w} must have shape [N, F] (one row per node), got {list(x.shape)}; "
                         f"reshape it, e.g. x.reshape(N, -1)")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise InputError(f"{w} must be numeric, got dtype {x.dtype}; convert it to float32")


def check_y_dtype(y: np.ndarray, w: str) -> None:
    """Labels are stored and served as given: integer classes [N], multi-label [N, C] (integer, bool or
    float), regression targets (float, [N] or [N, ...])."""
    if y.ndim == 0:
        raise InputError(f"{w} is a scalar; give one label per node (an array of shape [N] or [N, ...])")
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating) or y.dtype == np.bool_):
        raise InputError(f"{w} must be numeric (integer classes, float targets or 0/1 multi-label), got dtype "
                         f"{y.dtype}; convert it to int64 or float32")


def label_classes(y: np.ndarray | None) -> int:
    """Classes a label array implies: ``max + 1`` for integer class labels [N], the column count for
    multi-label [N, C] (integer or bool), 0 for float targets and for no labels."""
    if y is None or y.size == 0 or np.issubdtype(y.dtype, np.floating):
        return 0
    if y.ndim == 2:
        return int(y.shape[1])
    return int(y.max()) + 1 if y.ndim == 1 else 0


def check_split(idx: np.ndarray, w: str, num_nodes: int, rows: str) -> np.ndarray:
    """Node ids of a split: 1-D, integer, in ``0..num_nodes-1``, distinct; returns them sorted.

    ``rows`` says where ``num_nodes`` comes from (e.g. "x has 50 rows").
    """
    if idx.ndim != 1:
        raise InputError(f"{w} must be a 1-D list of node ids, got shape {list(idx.shape)}")
    if idx.dtype == np.bool_:
        raise InputError(f"{w} is a bool mask; store node ids instead (numpy.flatnonzero(mask))")
    if not np.issubdtype(idx.dtype, np.integer):
        raise InputError(f"{w} must hold integer node ids, got dtype {idx.dtype}; convert it to int64")
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= num_nodes):
        raise InputError(f"{w} holds node ids {int(idx.min())}..{int(idx.max())}, outside 0..{num_nodes - 1} "
                         f"({rows}); fix the split")
    uniq = np.unique(idx)
    if uniq.size != idx.size:
        raise InputError(f"{w} lists {idx.size - uniq.size} node id(s) more than once; deduplicate it")
    return uniq


def check_edge_attr(edge_attr: np.ndarray, num_edges: int, w: str, edges_w: str) -> None:
    if edge_attr.ndim == 0 or edge_attr.shape[0] != num_edges:
        raise InputError(f"{w} has {edge_attr.shape[0] if edge_attr.ndim else 0} rows but "
                         f"{edges_w} has {num_edges} edges; give one row per edge (same order)")
    if not (np.issubdtype(edge_attr.dtype, np.number) or edge_attr.dtype == np.bool_):
        raise InputError(f"{w} must be numeric, got dtype {edge_attr.dtype}")


def check_edge_weight(edge_weight: np.ndarray, num_edges: int, w: str) -> np.ndarray:
    """``edge_weight`` as float [E] (one weight per edge); InputError naming the fix.  Values (negative, NaN,
    all zero for a node) are checked when a loader samples with them (``weight_attr="edge_weight"``)."""
    if edge_weight.ndim != 1 or edge_weight.shape[0] != num_edges:
        raise InputError(f"{w} has shape {list(edge_weight.shape)}, edge_index has {num_edges} edges: give one "
                         f"weight per edge ([E])")
    if not (np.issubdtype(edge_weight.dtype, np.number) or edge_weight.dtype == np.bool_):
        raise InputError(f"{w} must be numeric, got dtype {edge_weight.dtype}")
    return edge_weight if np.issubdtype(edge_weight.dtype, np.floating) else edge_weight.astype(np.float32)


def check_time(time, count: int, w: str, of: str) -> np.ndarray | None:
    """Timestamps as int64 [count]; InputError naming the array otherwise."""
    if time is None:
        return None
    time = np.asarray(time)
    if not np.issubdtype(time.dtype, np.integer) or time.ndim != 1 or time.shape[0] != count:
        raise InputError(f"{w} must be integer timestamps, one per row ({of} {count}), got dtype {time.dtype} "
                         f"and shape {list(time.shape)}")
    return time.astype(np.int64)



def check_node_column(column: NodeColumn, array, count: int, w: str, of: str) -> np.ndarray | None:
    """``array`` (None: absent) as stored column ``column`` of a node type with ``count`` nodes, checked by its
    rule (``of`` says where ``count`` comes from, e.g. ``"x has"``); InputError naming the array otherwise."""
    if array is None:
        return None
    if column.check == "times":
        return check_time(array, count, w, of)
    if column.check == "features":
        check_x(array, w)
    elif column.check == "labels":
        check_y_dtype(array, w)
    elif array.ndim == 0 or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise InputError(f"{w} must be numeric, one row per node, got dtype {array.dtype} and shape "
                         f"{list(array.shape)}")
    if array.shape[0] != count:
        raise InputError(f"{w} has {array.shape[0]} rows but {of} {count}: give one row per node (same order)")
    return array if column.dtype is None else array.astype(column.dtype, copy=False)

HARD_NEG_FILE = "hard_neg_dst"    # the hard negatives' input array (.npy file, Data / HeteroData attribute)


def check_hard_neg_dst(array: np.ndarray, num_edges: int, num_dst: int, where: str) -> np.ndarray:
    """``array`` as int64 [E, k] original destination ids with -1 padding; InputError naming the fix."""
    if array.ndim == 1:
        array = array.reshape(-1, 1)
    if array.ndim != 2 or array.shape[0] != num_edges:
        raise InputError(f"{where} has shape {list(array.shape)}, edge_index has {num_edges} edges: give one row "
                         f"of hard-negative destination ids per edge, [E, k] with -1 padding")
    if not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"{where} must hold integer node ids (-1 = none), got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    bad = (array < -1) | (array >= num_dst)
    if bad.any():
        row, col = (int(i[0]) for i in np.nonzero(bad))
        raise InputError(f"{where}[{row}, {col}] = {int(array[row, col])} is not a destination node id: ids are "
                         f"0..{num_dst - 1}, -1 for padding")
    return array


def check_edge_columns(num_edges: int, num_dst: int, where: Callable[[str], str], edges_w: str, *, edge_attr=None,
                       edge_weight=None, edge_time=None, hard_neg_dst=None) -> dict[str, np.ndarray | None]:
    """An edge type's optional columns (None: absent) checked against its ``num_edges`` edges, by name: ``edge_attr``
    as given, ``edge_weight`` float, ``edge_time`` int64, ``hard_neg_dst`` int64 [E, k] ids of the ``num_dst``
    destination nodes.  ``where(name)`` says where an array came from, ``edges_w`` names the edge index."""
    if edge_attr is not None:
        check_edge_attr(edge_attr, num_edges, where("edge_attr"), edges_w)
    if edge_weight is not None:
        edge_weight = check_edge_weight(edge_weight, num_edges, where("edge_weight"))
    edge_time = check_time(edge_time, num_edges, where("edge_time"), f"{edges_w} has")
    if hard_neg_dst is not None:
        hard_neg_dst = check_hard_neg_dst(hard_neg_dst, num_edges, num_dst, where(HARD_NEG_FILE))
    return {"edge_attr": edge_attr, "edge_weight": edge_weight, "edge_time": edge_time, "hard_neg_dst": hard_neg_dst}

class _PyGDataUnpickler(pickle.Unpickler):
    """Unpickles only tensors, plain containers and PyG's data classes (the pickle documentation's
    "restricting globals"): any other global is an UnpicklingError naming it."""

    ALLOWED = {("builtins", "set"), ("builtins", "frozenset"), ("__builtin__", "set"), ("collections", "OrderedDict"),
               ("collections", "defaultdict"), ("torch._utils", "_rebuild_tensor_v2"),
               ("torch_geometric.data.data", "Data"), ("torch_geometric.data.data", "DataEdgeAttr"),
               ("torch_geometric.data.data", "DataTensorAttr"), ("torch_geometric.data.hetero_data", "HeteroData"),
               ("torch_geometric.data.feature_store", "TensorAttr"), ("torch_geometric.data.graph_store", "EdgeAttr"),
               *(("torch_geometric.data.storage", n) for n in ("AttrType", "BaseStorage", "GlobalStorage",
                                                               "NodeStorage", "EdgeStorage"))}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not allowed")
        return super().find_class(module, name)


class _PyGDataPickle:
    """A ``pickle_module`` for ``torch.load`` whose unpickler is :class:`_PyGDataUnpickler`."""

    Unpickler = _PyGDataUnpickler
    __name__ = "graphfeed_pygdata_pickle"
    load = staticmethod(pickle.load)
