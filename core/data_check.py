"""``data=``: a script's in-memory graph checked against the graph a loader serves (both loaders).

A ported PyG script that transforms its dataset (``NormalizeFeatures``, ``ToUndirected``, ...) changes its
own copy only: the servers serve what was partitioned, so without a word the model would train on other
data.  When the script hands a loader that copy (``data=data``, where PyG's loaders take it), the loader
compares a small deterministic sample with what it serves -- each node type's node count, the ``x`` and
``y`` rows of :data:`SAMPLE_ROWS` evenly spaced original ids, and the edge count -- before any batch is
made.  The loader's ``transform=`` is applied to the served sample first (it reaches every batch the same
way), so ``transform=NormalizeFeatures()`` over a raw partition passes against a normalised ``data``.

:func:`check_data` raises a one-line ValueError naming each difference and the fix; ``verify=False``
turns it into a :class:`DataMismatchWarning`.  What is served comes through :class:`ServedGraph`: the
remote loader's reads ``node_rows`` on every server, the local loader's reads its parts.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Protocol

import torch

SAMPLE_ROWS = 32          # original ids per node type whose rows are compared (evenly spaced, both ends)
FIELDS = ("x", "y")       # the per-node fields compared
RTOL, ATOL = 1e-3, 1e-5   # float rows: as stored, or cast by the partition (fp16 keeps ~5e-4 relative)
FIX = ("pass the transform the script applied to its dataset as transform= (applied to every batch, e.g. "
       "transform=NormalizeFeatures()), or re-partition the transformed data (graphfeed partition); "
       "verify=False makes this a warning")


class DataMismatchWarning(UserWarning):
    """``data=`` differs from the served graph and the loader was made with ``verify=False``."""


class ServedGraph(Protocol):
    """What a loader serves, as far as the check reads it."""

    node_types: list[str]
    label_type: str

    def num_nodes(self, ntype: str) -> int: ...

    def num_edges(self) -> int: ...   # every stored edge, all edge types together

    def rows(self, ntype: str, ids: torch.Tensor) -> Mapping[str, torch.Tensor]:
        """The stored per-node fields (``x``, ``y``; those the type has) of original ids ``ids``, in order."""
        ...


def check_data(data, served: ServedGraph, *, transform: Callable[[Any], Any] | None = None,
               verify: bool = True) -> list[str]:
    """Compare ``data`` (a PyG ``Data``/``HeteroData``) with ``served`` (module doc); returns the differences.

    ValueError (one line: the differences and the fix) when there are any and ``verify``; else a
    :class:`DataMismatchWarning` with the same text.  TypeError for a ``data`` that is no PyG graph."""
    from torch_geometric.data import Data, HeteroData

    if not isinstance(data, (Data, HeteroData)):
        raise TypeError(f"data= takes the script's torch_geometric Data or HeteroData (to check it against the "
                        f"served graph), got {type(data).__name__}")
    found = differences(data, served, transform if callable(transform) else None)
    if found:
        text = f"data= differs from the graph this loader serves: {'; '.join(found)}. Fix: {FIX}"
        if verify:
            raise ValueError(text)
        warnings.warn(text, DataMismatchWarning, stacklevel=3)
    return found


def sample_ids(num_nodes: int, count: int = SAMPLE_ROWS) -> torch.Tensor:
    """``count`` evenly spaced original ids of ``0..num_nodes-1`` (first and last included; fewer when the
    type has fewer nodes): the same ids on every call, so a check is repeatable."""
    if num_nodes <= 0:
        return torch.empty(0, dtype=torch.int64)
    return torch.linspace(0, num_nodes - 1, min(count, num_nodes), dtype=torch.float64).round().to(torch.int64)


def differences(data, served: ServedGraph, transform: Callable[[Any], Any] | None = None) -> list[str]:
    """Each difference between ``data`` and ``served`` as a short phrase (empty: they agree on the sample)."""
    typed = _is_typed(data)
    if not typed and list(served.node_types) != [served.label_type]:
        return [f"data is a Data but the served graph is typed (node types {', '.join(served.node_types)}): "
                f"pass the HeteroData"]
    ntypes = list(data.node_types) if typed else [served.label_type]
    out = [f"node type {t!r} is not in the served graph" for t in ntypes if t not in served.node_types]
    ntypes = [t for t in ntypes if t in served.node_types]
    counts = {t: (int(_store(data, t, typed).num_nodes or 0), served.num_nodes(t)) for t in ntypes}
    out += [f"{_of(t, typed)}node count: {a} in data, {b} served" for t, (a, b) in counts.items() if a != b]
    ids = {t: sample_ids(counts[t][1]) for t in ntypes if counts[t][0] == counts[t][1]}
    sample = _served_sample(served, ids, typed, transform, out)
    if sample is not None:
        for t, t_ids in ids.items():
            out += _row_differences(_store(data, t, typed), _store(sample, t, typed), t_ids, _of(t, typed))
    edges, stored = int(data.num_edges), served.num_edges()
    if edges != stored:
        out.append(f"edge count: {edges} in data, {stored} served")
    return out


def _is_typed(data) -> bool:
    from torch_geometric.data import HeteroData

    return isinstance(data, HeteroData)


def _store(data, ntype: str, typed: bool):
    return data[ntype] if typed else data


def _of(ntype: str, typed: bool) -> str:
    return f"{ntype!r} " if typed else ""


def _served_sample(served: ServedGraph, ids: Mapping[str, torch.Tensor], typed: bool, transform, out: list[str]):
    """The served rows of ``ids`` as a PyG object of the script's kind, ``transform`` applied (None, with a
    phrase in ``out``, when the transform cannot run on rows without edges)."""
    from torch_geometric.data import Data, HeteroData

    sample: Any = HeteroData() if typed else Data()
    for t, t_ids in ids.items():
        store = _store(sample, t, typed)
        store.num_nodes = int(t_ids.numel())
        for name, rows in served.rows(t, t_ids).items():
            if name in FIELDS and rows is not None:
                store[name] = rows
    if not typed:
        sample.edge_index = torch.empty(2, 0, dtype=torch.int64)
    if transform is None:
        return sample
    try:
        return transform(sample)
    except Exception as exc:  # noqa: BLE001 -- any transform's failure: the rows are then not compared
        out.append(f"transform= could not run on the served rows to compare them "
                   f"({type(exc).__name__}: {_first_line(exc)})")
        return None


def _row_differences(mine, theirs, ids: torch.Tensor, of: str) -> list[str]:
    """Phrases for the fields of ``FIELDS`` whose sampled rows differ (``mine``: the script's whole store)."""
    out = []
    for name in FIELDS:
        full, served = getattr(mine, name, None), getattr(theirs, name, None)
        if not isinstance(full, torch.Tensor) or ids.numel() == 0:
            continue   # the script holds no such field: nothing to differ from
        if not isinstance(served, torch.Tensor):
            out.append(f"{of}{name}: in data, not stored in the partition")
            continue
        given = full.index_select(0, ids.to(full.device)).cpu()
        if given.shape[1:] != served.shape[1:] and given.numel() != served.numel():
            out.append(f"{of}{name}: rows of shape {list(given.shape[1:])} in data, {list(served.shape[1:])} served")
            continue
        bad = _first_mismatch(given.reshape(served.shape), served)
        if bad is not None:
            out.append(f"{of}{name} differs ({_describe(name, int(ids[bad]), given[bad], served[bad])})")
    return out


def _first_mismatch(given: torch.Tensor, served: torch.Tensor) -> int | None:
    """Position of the first row that differs (floats within RTOL/ATOL agree), None when none does."""
    a, b = given.reshape(given.size(0), -1), served.reshape(served.size(0), -1)
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        same = torch.isclose(a.double(), b.double(), rtol=RTOL, atol=ATOL, equal_nan=True).all(dim=1)
    else:
        same = (a.to(torch.int64) == b.to(torch.int64)).all(dim=1)
    bad = (~same).nonzero()
    return None if bad.numel() == 0 else int(bad[0])


def _describe(name: str, node: int, given: torch.Tensor, served: torch.Tensor) -> str:
    """One row's difference in a few numbers: a feature row by its sum (what a normalisation changes)."""
    if given.numel() > 1:
        return (f"node {node}: row sum {float(given.double().sum()):.4g} in data, "
                f"{float(served.double().sum()):.4g} served")
    return f"node {node}: {given.reshape(-1).tolist()[0]:g} in data, {served.reshape(-1).tolist()[0]:g} served"



def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
