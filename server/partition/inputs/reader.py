"""One interface over every input layout ``graphfeed partition`` reads.

A :class:`GraphReader` is one layout: whether a path is in it (``accepts``) and how to read the whole graph into
memory (``read``: a checked :class:`GraphInput` with its fingerprint).  :data:`READERS` lists them in the order a
path is tried and :func:`read_graph` reads a path with the first that accepts it.  A ``chunked`` reader's inputs
can also be read a row range at a time (:func:`graphfeed.server.partition.inputs.chunked.open_chunked`): the
bounded-memory path takes those.  Every problem raises :class:`InputError` naming the file and the fix.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from graphfeed.server.partition.inputs.arrays import InputError
from graphfeed.server.partition.inputs.chunked import is_chunked_folder, open_chunked
from graphfeed.server.partition.inputs.graph import GraphInput
from graphfeed.server.partition.inputs.homogeneous import graph_name, read_npy_folder, read_torch_file
from graphfeed.server.partition.inputs.typed import is_typed_folder, read_typed_folder

__all__ = ["GraphReader", "InputError", "READERS", "read_graph", "reader_for"]


@dataclass(frozen=True)
class GraphReader:
    """One input layout."""

    layout: str                                  # what messages call it
    accepts: Callable[[Path], bool]
    read: Callable[[Path, bool], GraphInput]     # (path, allow_pickle) -> the whole graph
    chunked: bool = False                        # also read a row range at a time (the bounded-memory path)


READERS = (
    GraphReader("chunked folder (.npy chunks, chunks.json or Parquet)",
                lambda path: path.is_dir() and is_chunked_folder(path),
                lambda path, _: open_chunked(path).to_graph_input(), chunked=True),
    GraphReader("typed .npy folder (a sub-folder per node and edge type)",
                lambda path: path.is_dir() and is_typed_folder(path),
                lambda path, _: read_typed_folder(path, graph_name(path))),
    GraphReader(".npy folder", Path.is_dir, lambda path, _: read_npy_folder(path)),
    GraphReader("torch.save file (PyG Data, dict of tensors or HeteroData)", Path.is_file,
                lambda path, allow_pickle: read_torch_file(path, allow_pickle=allow_pickle)),
)


def reader_for(path: str | os.PathLike) -> GraphReader:
    """The reader of ``path``'s layout; InputError when nothing is there."""
    path = Path(path)
    reader = next((r for r in READERS if r.accepts(path)), None)
    if reader is None:
        raise InputError(f"input {path} does not exist: give a folder in the .npy layout "
                         f"(edge_index.npy, x.npy, y.npy, train_idx.npy, ...; or one sub-folder per node and edge "
                         f"type) or a file saved with torch.save")
    return reader


def read_graph(path: str | os.PathLike, *, allow_pickle: bool = False) -> GraphInput:
    """Read and check the graph at ``path`` whole, in whichever layout it is (:data:`READERS`).

    ``allow_pickle`` lets a torch file that holds more than PyG data and tensors be
    unpickled (arbitrary code runs: only for files you trust).
    """
    return reader_for(path).read(Path(path), allow_pickle)
