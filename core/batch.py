"""The batch schema: every tensor key of a mini-batch, and the one conversion to PyG.

A batch travels as a flat ``dict[str, Tensor]`` (torch RPC pickles tensors without copying
them through protobuf).  One wire format serves homogeneous and typed graphs; a homogeneous
graph is the one-type case (node type ``"_N"``, edge type ``("_N", "to", "_N")``).  Keys::

    {field}@{node type}              a node field of :data:`BATCH_FIELDS`, e.g. ``x@paper``
    {field}@{src}__{rel}__{dst}      an edge field, e.g. ``edge_index@author__writes__paper``
    input_id                         a batch field (no type): positions of the seeds in the loader's input
    meta                             [batch_size, epoch, seq, batch index, input type position]
    {field}                          a batch field (the seeds' input_id; a link batch's labelled edges)

Every node type and every edge type of the graph carries its required fields, as empty
tensors where nothing of it was sampled, so a batch's key set is a function of the graph's
schema (``x``/``y`` exist for the types that have features/labels).  Both the local loader
and the remote loader turn a batch into PyG with :func:`to_pyg` (``Data`` for the one-type
graph, ``HeteroData`` otherwise), so they yield identical batches.  Code outside this
module reads a batch through its helpers (:func:`batch_size`, :func:`num_edges`,
:func:`layout`), never by spelling keys.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from graphfeed.core.columns import ROW_COLUMNS
from graphfeed.core.constants import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE

EdgeType = tuple[str, str, str]
NODE, EDGE, BATCH = "node", "edge", "batch"     # the scope a field belongs to
META = "meta"
TYPE_SEP = "@"          # between a field's name and its node / edge type
EDGE_TYPE_SEP = "__"    # between src, rel and dst (as the partition format's edge folders)


@dataclass(frozen=True)
class Field:
    """One tensor of the schema: its scope (one per node type, per edge type, or per batch), whether
    every batch carries it, its dtype (None = as stored), its meaning, and whether :func:`to_pyg`
    gives it as a Python list (PyG's per-hop counts are lists)."""

    scope: str
    required: bool
    dtype: torch.dtype | None
    meaning: str
    as_list: bool = False


# name -> Field.  Node fields are aligned with the type's n_id, edge fields with its e_id.
BATCH_FIELDS: dict[str, Field] = {
    # the stored columns' rows (x, y: graphfeed.core.columns), as stored
    **{c.batch_field: Field(NODE, False, None, c.meaning) for c in ROW_COLUMNS},
    "x_cached": Field(NODE, False, torch.int64, "positions (in the type's n_id) of the batch nodes whose x rows the "
                                                "server left out because the trainer's feature cache holds them; x "
                                                "then has only the other rows.  The client fills them in and drops "
                                                "this field before to_pyg (graphfeed.core.feature_cache)"),
    "x_scale": Field(NODE, False, torch.float32, "feature_dtype='int8': the type's per-column scale, [F] (x = "
                                                 "(q + 128) * x_scale + x_offset); not aligned with n_id"),
    "x_offset": Field(NODE, False, torch.float32, "feature_dtype='int8': the type's per-column offset, [F]"),
    "emb": Field(NODE, False, None, "rows of the loader's embedding table of this type (graphfeed.core.embedding), "
                                    "[num_nodes, dim]; the trainer gets them as a leaf that requires grad, under "
                                    "the table's field name"),
    "emb_gid": Field(NODE, False, torch.int64, "global ids of the type's batch nodes, aligned with emb: the keys "
                                               "the sparse optimizer sends gradient rows by"),
    "edge_index": Field(EDGE, True, torch.int64, "sampled edges in local ids, [2, num_edges]: row indexes the "
                                                 "source type's n_id, col the destination type's"),
    "edge_attr": Field(EDGE, False, None, "features of the type's sampled edges, aligned with e_id; only for "
                                          "edge types with features"),
    "n_id": Field(NODE, True, torch.int64, "original ids of the type's batch nodes, the input type's seeds first"),
    "batch": Field(NODE, False, torch.int64, "disjoint sampling: the subgraph (seed, or seed edge) of each of "
                                             "the type's batch nodes, aligned with n_id"),
    "e_id": Field(EDGE, True, torch.int64, "original ids (input positions) of the type's sampled edges"),
    "num_sampled_nodes": Field(NODE, True, torch.int64, "new nodes of the type per hop, [hops + 1]; the input "
                                                        "type's first entry = batch_size", as_list=True),
    "num_sampled_edges": Field(EDGE, True, torch.int64, "sampled edges of the type per hop, [hops]", as_list=True),
    "input_id": Field(BATCH, True, torch.int64, "position of each seed in the loader's input, [batch_size] (as "
                                                "PyG: input_nodes[input_id] are the seeds when input_nodes are ids)"),
    META: Field(BATCH, True, torch.int64, "[batch_size, epoch, seq, batch index in the epoch, position of the "
                                          "input node type among the batch's sorted node types]"),
    # link batches (seeds are edges; batch_size counts the seed *nodes*: the labelled edges' endpoints, while
    # input_id holds each seed edge's position in the loader's edge_label_index)
    "edge_label_index": Field(BATCH, False, torch.int64, "labelled edges in local ids of the input type, [2, K]: "
                                                         "the seed edges, then the binary negatives"),
    "edge_label": Field(BATCH, False, None, "labels of edge_label_index's edges; negatives are 0"),
    "src_index": Field(BATCH, False, torch.int64, "triplet mode: local id of each seed edge's source, [B]"),
    "dst_pos_index": Field(BATCH, False, torch.int64, "triplet mode: local id of each seed edge's destination"),
    "dst_neg_index": Field(BATCH, False, torch.int64, "triplet mode: local ids of the negative destinations, "
                                                      "[B] (amount 1) or [B, amount]"),
    "seed_time": Field(BATCH, False, torch.int64, "temporal sampling: the time of each seed (node batches, "
                                                  "[batch_size]) or seed edge (triplet link batches, [B])"),
    "edge_label_time": Field(BATCH, False, torch.int64, "temporal link batches: the time of each edge of "
                                                        "edge_label_index (a negative has its seed edge's)"),
    "neg_is_hard": Field(BATCH, False, torch.bool, "link batches with num_hard_negatives: whether each negative "
                                                   "came from its seed edge's stored hard-negative list (binary: "
                                                   "[K], edge_label_index's negatives; triplet: as dst_neg_index)"),
    "link_edge_type": Field(BATCH, False, torch.int64, "typed link batches: [1], position of the seed edges' type "
                                                       "among the batch's sorted edge types (rows of the link "
                                                       "fields index its source / destination type's n_id)"),
}
META_LENGTH = 5


_BATCH_KEYS = frozenset(name for name, f in BATCH_FIELDS.items() if f.scope == BATCH)   # keys without a type
_REQUIRED_BATCH_KEYS = frozenset(name for name in _BATCH_KEYS if BATCH_FIELDS[name].required)
_LINK_KEYS = frozenset(("edge_label_index", "src_index"))   # a batch with one of these is a link batch


def fields_of(scope: str) -> dict[str, Field]:
    """The fields of one scope (:data:`NODE`, :data:`EDGE` or :data:`BATCH`), in schema order."""
    return {name: f for name, f in BATCH_FIELDS.items() if f.scope == scope}


class BatchSchemaError(ValueError):
    """A batch dict does not match :data:`BATCH_FIELDS` (a version mismatch between peers)."""


# ---- key names ------------------------------------------------------------------------------------

def edge_type_name(etype: Iterable[str]) -> str:
    """``src__rel__dst``; ValueError when the names would not read back as the same triple."""
    etype = tuple(etype)
    name = EDGE_TYPE_SEP.join(etype)
    if len(etype) != 3 or parse_edge_type(name) != etype:
        raise ValueError(f"edge type {etype} cannot be written as src__rel__dst: its names must be non-empty, "
                         f"must not contain '__' and (source, relation) must not end with '_'")
    return name


def parse_edge_type(name: str) -> EdgeType | None:
    """The ``(src, rel, dst)`` of ``src__rel__dst``, or None when ``name`` is not one."""
    parts = tuple(name.split(EDGE_TYPE_SEP))
    return parts if len(parts) == 3 and all(parts) else None  # type: ignore[return-value]


def node_key(name: str, ntype: str) -> str:
    return f"{name}{TYPE_SEP}{ntype}"


def edge_key(name: str, etype: Iterable[str]) -> str:
    return f"{name}{TYPE_SEP}{edge_type_name(etype)}"


# ---- encoding -------------------------------------------------------------------------------------

def encode_typed(*, nodes: Mapping[str, Mapping[str, torch.Tensor | None]],
                 edges: Mapping[EdgeType, Mapping[str, torch.Tensor | None]], input_type: str,
                 batch_size: int, epoch: int, seq: int, index: int, input_id,
                 extra: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Build the wire form of a batch of a typed graph.

    ``nodes[t]`` holds node type ``t``'s fields by name (``n_id``, ``num_sampled_nodes``; ``x``,
    ``y`` or None), ``edges[(src, rel, dst)]`` an edge type's (``edge_index``, ``e_id``,
    ``num_sampled_edges``).  Pass every node and edge type of the graph (empty tensors for those
    not sampled).  Tensors are stored as given (no copy); the per-hop counts become int64
    tensors.  ``input_id`` holds the seeds' positions in the loader's input: ``batch_size`` of
    them for a node batch; for a link batch (``extra`` has ``edge_label_index`` or
    ``src_index``) one per seed edge, while ``batch_size`` counts its seed nodes.  ``extra``
    holds the other batch fields (a link batch's labelled edges).  ValueError for a missing or
    unknown field, an edge type whose endpoint is not in ``nodes``, an ``input_type`` that is
    not, or a node batch's ``input_id`` of the wrong length.
    """
    node_types = sorted(nodes)
    if input_type not in nodes:
        raise ValueError(f"input type {input_type!r} is not one of the batch's node types {node_types}")
    wire: dict[str, torch.Tensor] = {}
    for ntype in node_types:
        wire.update(_encode_scope(NODE, nodes[ntype], ntype, f"node type {ntype!r}"))
    for etype in sorted(edges):
        missing = [t for t in (etype[0], etype[2]) if t not in nodes]
        if missing:
            raise ValueError(f"edge type {etype} joins node type(s) {missing} that the batch lacks: pass every "
                             f"node type of the graph in nodes")
        wire.update(_encode_scope(EDGE, edges[etype], edge_type_name(etype), f"edge type {etype}"))
    input_id = torch.as_tensor(input_id, dtype=torch.int64).reshape(-1)
    if input_id.numel() != batch_size and not _LINK_KEYS & set(extra or {}):
        raise ValueError(f"input_id has {input_id.numel()} entries for a batch of {batch_size} seeds: give one "
                         f"input position per seed")
    wire["input_id"] = input_id
    wire[META] = torch.tensor([batch_size, epoch, seq, index, node_types.index(input_type)], dtype=torch.int64)
    batch_fields = {name for name in _BATCH_KEYS if name not in (META, "input_id")}
    for name, value in (extra or {}).items():
        if name not in batch_fields:
            raise ValueError(f"unknown batch field {name!r}; the schema's batch fields are {sorted(batch_fields)}")
        wire[name] = value
    return wire


def _encode_scope(scope: str, values: Mapping[str, torch.Tensor | None], suffix: str,
                  where: str) -> dict[str, torch.Tensor]:
    """The wire entries ``{name}@{suffix}`` of one node or edge type's fields."""
    schema = fields_of(scope)
    unknown = sorted(set(values) - set(schema))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; the schema's {scope} fields are {list(schema)}")
    out = {}
    for name, f in schema.items():
        value = values.get(name)
        if value is None:
            if f.required:
                raise ValueError(f"{where} lacks {name}, which every batch carries")
            continue
        out[f"{name}{TYPE_SEP}{suffix}"] = torch.as_tensor(value, dtype=f.dtype) if f.as_list else value
    return out


def encode(*, x: torch.Tensor | None, y: torch.Tensor | None, edge_index: torch.Tensor, n_id: torch.Tensor,
           e_id: torch.Tensor, num_sampled_nodes, num_sampled_edges, batch_size: int, epoch: int,
           seq: int, index: int, input_id, extra: Mapping[str, torch.Tensor] | None = None,
           edge_attr: torch.Tensor | None = None, batch: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Build the wire form of a batch of a homogeneous graph: :func:`encode_typed` with node type
    ``"_N"`` and edge type ``("_N", "to", "_N")`` (``batch``: disjoint sampling's subgraph per node)."""
    nodes = {DEFAULT_NODE_TYPE: {"x": x, "y": y, "n_id": n_id, "num_sampled_nodes": num_sampled_nodes,
                                 "batch": batch}}
    edges = {DEFAULT_EDGE_TYPE: {"edge_index": edge_index, "e_id": e_id, "num_sampled_edges": num_sampled_edges,
                                 "edge_attr": edge_attr}}
    return encode_typed(nodes=nodes, edges=edges, input_type=DEFAULT_NODE_TYPE, batch_size=batch_size,
                        epoch=epoch, seq=seq, index=index, input_id=input_id, extra=extra)


# ---- reading --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchLayout:
    """What a batch's keys say about it: its node types and edge types (sorted) and its input type."""

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    input_type: str

    @property
    def is_homogeneous(self) -> bool:
        return self.node_types == (DEFAULT_NODE_TYPE,) and self.edge_types == (DEFAULT_EDGE_TYPE,)


def _mismatch(problem: str) -> BatchSchemaError:
    return BatchSchemaError(f"the batch does not match this graphfeed's batch schema ({problem}); client and "
                            f"server run different graphfeed versions: install the same version on both")


def _scoped_fields(batch: Mapping[str, torch.Tensor]) -> tuple[dict[str, set], dict[EdgeType, set]]:
    """The field names present per node type and per edge type; BatchSchemaError for an unknown key."""
    nodes: dict[str, set] = {}
    edges: dict[EdgeType, set] = {}
    for key in batch:
        if key in _BATCH_KEYS:
            continue
        name, sep, where = key.partition(TYPE_SEP)
        f = BATCH_FIELDS.get(name)
        etype = parse_edge_type(where) if f is not None and f.scope == EDGE else None
        if not sep or not where or f is None or f.scope == BATCH or (f.scope == EDGE and etype is None):
            raise _mismatch(f"unknown key {key!r}")
        if etype is None:
            nodes.setdefault(where, set()).add(name)
        else:
            edges.setdefault(etype, set()).add(name)
    return nodes, edges


def _require(present: dict, scope: str, what: str) -> None:
    required = [name for name, f in fields_of(scope).items() if f.required]
    for t, names in present.items():
        missing = [name for name in required if name not in names]
        if missing:
            raise _mismatch(f"{what} {t!r} lacks {', '.join(missing)}")


def layout(batch: Mapping[str, torch.Tensor]) -> BatchLayout:
    """The :class:`BatchLayout` of a wire batch; :class:`BatchSchemaError` (a version mismatch between
    the peers) for an unknown key, a type missing a required field, or a missing or malformed meta."""
    nodes, edges = _scoped_fields(batch)
    missing = sorted(_REQUIRED_BATCH_KEYS - set(batch))
    if missing:
        raise _mismatch(f"no {', '.join(missing)}")
    if not nodes:
        raise _mismatch("no node type")
    _require(nodes, NODE, "node type")
    _require(edges, EDGE, "edge type")
    node_types = tuple(sorted(nodes))
    for etype in edges:
        if etype[0] not in nodes or etype[2] not in nodes:
            raise _mismatch(f"edge type {etype} joins a node type the batch lacks")
    meta = batch[META]
    if meta.dim() != 1 or meta.numel() != META_LENGTH or not 0 <= int(meta[-1]) < len(node_types):
        raise _mismatch(f"meta has shape {list(meta.shape)}, expected [{META_LENGTH}] with a valid input type")
    return BatchLayout(node_types, tuple(sorted(edges)), node_types[int(meta[-1])])


def check(batch: Mapping[str, torch.Tensor]) -> None:
    """BatchSchemaError unless ``batch`` matches the schema (see :func:`layout`)."""
    layout(batch)


def cast_features(batch: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``batch`` with every floating-point feature tensor (``x`` of every node type) cast to ``dtype``,
    in place (the dict is returned); labels, ids, edge data and integer features are untouched.
    ``dtype=None`` leaves the batch as it is."""
    if dtype is None:
        return batch
    prefix = "x" + TYPE_SEP
    for key, value in batch.items():
        if key.startswith(prefix) and value.is_floating_point() and value.dtype != dtype:
            batch[key] = value.to(dtype)
    return batch


QUANT_LOW = -128          # int8 feature q stands for (q - QUANT_LOW) * scale + offset
QUANT_LEVELS = 255


def quantize_features(batch: dict[str, torch.Tensor], scales: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
                      ) -> dict[str, torch.Tensor]:
    """``batch`` with ``x`` of every node type in ``scales`` (``{node type: (scale [F], offset [F])}``, stored
    at partition time) quantized to int8, in place, and the type's ``x_scale`` / ``x_offset`` added: a
    value ``v`` becomes ``round((v - offset) / scale) + QUANT_LOW``, clamped, so dequantizing is off by at
    most ``scale / 2`` for values inside the partition's column range."""
    for ntype, (scale, offset) in scales.items():
        key = node_key("x", ntype)
        x = batch.get(key)
        if x is None or not x.is_floating_point():
            continue
        scale, offset = scale.to(x.device), offset.to(x.device)
        q = torch.round((x.float() - offset) / scale).clamp_(0, QUANT_LEVELS) + QUANT_LOW
        batch[key] = q.to(torch.int8)
        batch[node_key("x_scale", ntype)], batch[node_key("x_offset", ntype)] = scale, offset
    return batch


def dequantize_features(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of ``batch`` (wire keys) whose int8 ``x`` of every node type with ``x_scale`` is float32 again,
    the scales dropped; a batch without them as it is."""
    out = dict(batch)
    for key in [k for k in batch if k.startswith("x_scale" + TYPE_SEP)]:
        ntype = key.partition(TYPE_SEP)[2]
        x, scale, offset = out.get(node_key("x", ntype)), out.pop(key), out.pop(node_key("x_offset", ntype))
        if x is not None:
            out[node_key("x", ntype)] = (x.to(torch.float32) - QUANT_LOW) * scale + offset
    return out


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as a flat ``uint8`` tensor (a view where ``t`` is contiguous, else a copy).

    A one-element tensor counts as contiguous whatever its stride (e.g. ``a[::2][:1]``), and a byte view
    of it would fail on the stride: it is copied into fresh contiguous storage first."""
    flat = t.detach().contiguous().reshape(-1)
    if not flat.numel():
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    if flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def to_host(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with every device tensor on the host, in one device-to-host copy (the batch as it is when
    every tensor is already there).

    The device tensors are packed into one device buffer (device-side copies, 16-byte aligned), which is
    copied once into pinned host memory; the host tensors are views of it, bytes unchanged."""
    on_device = [k for k, t in batch.items() if t.device.type != "cpu"]
    if not on_device:
        return batch
    device = batch[on_device[0]].device
    offsets, total = {}, 0
    for k in on_device:
        offsets[k] = total
        total += -(-batch[k].numel() * batch[k].element_size() // 16) * 16
    packed = torch.empty(total, dtype=torch.uint8, device=device)
    for k in on_device:
        t = batch[k]
        if t.numel():
            packed[offsets[k]:offsets[k] + t.numel() * t.element_size()].copy_(byte_view(t))
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host.copy_(packed)
    out = dict(batch)
    for k in on_device:
        t = batch[k]
        n = t.numel() * t.element_size()
        out[k] = host[offsets[k]:offsets[k] + n].view(t.dtype).view(t.shape) if n else torch.empty(t.shape,
                                                                                                      dtype=t.dtype)
    return out


def nbytes(batch: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


def batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    """Seeds of the batch (the first ``batch_size`` nodes of its input type)."""
    return int(batch[META][0])


def num_edges(batch: Mapping[str, torch.Tensor]) -> int:
    """Sampled edges of the batch, over every edge type."""
    prefix = "edge_index" + TYPE_SEP
    return sum(int(t.size(1)) for key, t in batch.items() if key.startswith(prefix))


# ---- PyG ------------------------------------------------------------------------------------------

def to_pyg(batch: Mapping[str, torch.Tensor], dequantize: bool = True):
    """The PyG form of a batch, with ``NeighborLoader``'s attributes.

    The one-type graph gives a ``Data``: ``x, y, edge_index, n_id, e_id, batch_size, input_id,
    num_sampled_nodes, num_sampled_edges`` (lists), ``epoch, seq, batch_index``.  Any other
    gives a ``HeteroData`` (:class:`graphfeed.core.hetero.TypedBatch`: ``x_dict`` of a batch whose types
    are all id-only names ``n_id``): per node type ``x``, ``y`` (where present), ``n_id``,
    ``num_sampled_nodes`` (list) and ``num_nodes`` for types without features; per edge type
    ``edge_index``, ``e_id``, ``num_sampled_edges`` (list); ``batch_size`` and ``input_id`` on
    the input type;
    ``epoch, seq, batch_index`` on the graph.  BatchSchemaError as :func:`check`.  An int8 batch
    (``feature_dtype="int8"``) gets float32 ``x`` back (:func:`dequantize_features`) unless ``dequantize`` is
    False: then ``x`` stays int8 beside its type's ``x_scale`` and ``x_offset``.
    """
    if dequantize:
        batch = dequantize_features(batch)
    lay = layout(batch)
    size, epoch, seq, index, _ = batch[META].tolist()
    position = {"epoch": epoch, "seq": seq, "batch_index": index}
    if lay.is_homogeneous:
        return _data(batch, size, position)
    return _hetero_data(batch, lay, size, position)


def _store_values(batch: Mapping[str, torch.Tensor], scope: str, suffix: str) -> tuple[dict, dict]:
    """(tensor fields, per-hop count lists) of one node or edge type (keys ``{name}@{suffix}``), in schema order."""
    tensors, counts = {}, {}
    for name, f in fields_of(scope).items():
        value = batch.get(f"{name}{TYPE_SEP}{suffix}")
        if value is None:
            continue
        if f.as_list:
            counts[name] = value.tolist()
        else:
            tensors[name] = value
    return tensors, counts


def _batch_values(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch-scope fields a batch carries (besides meta), in schema order."""
    return {name: batch[name] for name, f in fields_of(BATCH).items() if name != META and name in batch}


def _data_values(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`_batch_values` as a ``Data`` carries them (a one-type batch has no seed edge type to name)."""
    values = _batch_values(batch)
    values.pop("link_edge_type", None)
    return values


def _data(batch: Mapping[str, torch.Tensor], size: int, position: dict):
    from torch_geometric.data import Data

    ntensors, ncounts = _store_values(batch, NODE, DEFAULT_NODE_TYPE)
    etensors, ecounts = _store_values(batch, EDGE, edge_type_name(DEFAULT_EDGE_TYPE))
    present = {**ntensors, **etensors}
    tensors = {name: present[name] for name in BATCH_FIELDS if name in present}   # today's attribute order
    return Data(**tensors, batch_size=size, **ncounts, **ecounts, **_data_values(batch), **position)


def _link_store(lay: BatchLayout, name: str, link_type: torch.Tensor | None):
    """Where PyG's hetero ``LinkNeighborLoader`` puts a typed link batch's field ``name``: ``src_index`` on the
    seed edge type's source type, ``dst_pos_index``/``dst_neg_index`` on its destination type, the rest
    (``input_id``, ``edge_label_index``, ``edge_label``) on the edge type; None for a node batch."""
    if link_type is None:
        return None
    etype = lay.edge_types[int(link_type[0])]
    return {"src_index": etype[0], "dst_pos_index": etype[2], "dst_neg_index": etype[2]}.get(name, etype)


def _hetero_data(batch: Mapping[str, torch.Tensor], lay: BatchLayout, size: int, position: dict):
    from graphfeed.core.hetero import TypedBatch

    data = TypedBatch()
    for ntype in lay.node_types:
        tensors, counts = _store_values(batch, NODE, ntype)
        store = data[ntype]
        for name, value in {**tensors, **counts}.items():
            setattr(store, name, value)
        if "x" not in tensors:   # PyG cannot infer the size of a type without features
            store.num_nodes = int(tensors["n_id"].numel())
    for etype in lay.edge_types:
        tensors, counts = _store_values(batch, EDGE, edge_type_name(etype))
        store = data[etype]
        for name, value in {**tensors, **counts}.items():
            setattr(store, name, value)
    data[lay.input_type].batch_size = size
    values = _batch_values(batch)
    link_type = values.pop("link_edge_type", None)
    for name, value in values.items():   # on the input type's store, as PyG puts input_id
        setattr(data[_link_store(lay, name, link_type) or lay.input_type], name, value)
    for name, value in position.items():
        setattr(data, name, value)
    return data
