"""The stored per-node columns of a partition: one record per column, read by every side that handles one.

A column is read from the input graph (``file``: ``{file}.npy`` in a ``.npy`` folder or a typed one's node type
folder, ``{file}_NNNNN.npy`` chunks, a Parquet column; ``attr``: the PyG ``Data`` / ``HeteroData`` attribute),
checked by its ``check`` rule, written into every part as ``nodes/{ntype}/{name}.npy`` (and listed in
``META.json``'s ``features`` of the type), read back by the part's node store (``NodeStore.column(name)``) and,
with a ``batch_field``, gathered into that node field of every batch (``NodeRows``, the batch schema's
:data:`graphfeed.core.batch.BATCH_FIELDS`, PyG's feature store rows).  The writers (in-memory and bounded), the
readers, the node store, the GPU source and ``graphfeed.pyg`` loop over :data:`NODE_COLUMNS`; a new stored
per-node field is a record here, plus its ``NodeRows`` field (``server/sampling/types.py``) when it goes into
batches.

``x`` and ``y`` have roles beyond a column's (``x``'s rows give a homogeneous graph's node count, ``y`` its
classes), which the input readers keep; ``orig_id`` is written from the renumbering, never read from an input.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the input checks a column may name (the input readers apply them: ``inputs.arrays.check_node_column``)
CHECKS = ("features", "labels", "times", "rows")


@dataclass(frozen=True)
class NodeColumn:
    """One stored per-node column."""

    name: str                       # stored name: nodes/{ntype}/{name}.npy, META.json features key, store column
    meaning: str                    # what a row holds (the batch field's meaning, when it has one)
    file: str = ""                  # its input name (.npy file, chunk files, Parquet column); "": not an input
    attr: str = ""                  # its PyG Data / HeteroData attribute ("": ``file``)
    check: str = "rows"             # input check: "features" ([N, F] numeric), "labels", "times" (integer [N] ->
                                    # int64) or "rows" (numeric or bool, one row per node)
    dtype: str | None = None        # stored dtype (numpy name); None: as the input gives it
    batch_field: str = ""           # the batch's node field its rows fill ("": not in batches)
    quantizable: bool = False       # int8 scales of it are stored (a loader's feature_dtype="int8")
    listed: bool = True             # in META.json's features of the types that have it (orig_id: every type has it)

    @property
    def input_attr(self) -> str:
        return self.attr or self.file


NODE_COLUMNS: dict[str, NodeColumn] = {c.name: c for c in (
    NodeColumn("x", "features of the type's batch nodes, [num_nodes, F] (dtype as stored); only for types with "
                    "features", file="x", check="features", batch_field="x", quantizable=True),
    NodeColumn("y", "labels of the type's batch nodes, [num_nodes]; only for types with labels", file="y",
               check="labels", batch_field="y"),
    NodeColumn("time", "node timestamps (temporal sampling, time_attr='time'), [num_nodes]", file="node_time",
               attr="time", check="times", dtype="int64"),
    NodeColumn("orig_id", "original ids of the type's nodes", dtype="int64", batch_field="n_id", listed=False),
)}
#: the columns read from an input graph, in table order
INPUT_COLUMNS = tuple(c for c in NODE_COLUMNS.values() if c.file)
#: the columns read from an input other than ``x`` and ``y`` (whose roles the readers spell out)
OTHER_INPUT_COLUMNS = tuple(c for c in INPUT_COLUMNS if c.name not in ("x", "y"))
#: the columns whose int8 scales are stored (a loader's feature_dtype="int8" sends them quantized)
QUANTIZABLE = tuple(c.name for c in NODE_COLUMNS.values() if c.quantizable)
#: batch node field -> the stored column its rows come from (``n_id``: ``orig_id``)
BATCH_COLUMNS = {c.batch_field: c.name for c in NODE_COLUMNS.values() if c.batch_field}
#: the input columns whose rows go into batches as stored (``x``, ``y``; not ``orig_id``, which becomes ``n_id``)
ROW_COLUMNS = tuple(c for c in INPUT_COLUMNS if c.batch_field)
#: their batch node fields (what PyG's feature store serves of a batch)
ROW_FIELDS = tuple(c.batch_field for c in ROW_COLUMNS)
FEATURES = "x"  # the feature column: its rows are what the feature caches (trainer, peers, GPU) hold
TIME = "time"   # the node timestamps' column (temporal sampling reads it, and each edge's neighbour time from it)


def input_column(file: str) -> NodeColumn | None:
    """The input column whose input name (file, chunk or Parquet column) is ``file``, or None."""
    return next((c for c in INPUT_COLUMNS if c.file == file), None)
