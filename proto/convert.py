"""The one conversion between the spec records (:mod:`graphfeed.core.spec`) and protobuf.

The client builds an ``OpenSessionRequest`` with :func:`open_session_request`; the daemon
turns it back into the same :class:`LoaderSpec` with :func:`loader_spec_from_proto`, which
raises ``ValueError`` naming the field for anything the record refuses.  Checks that need
the partition (does the split or the node type exist, are the ids in range) stay on the server.
"""
from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import torch

from graphfeed.core.constants import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE
from graphfeed.core.feature_cache import CachedIds
from graphfeed.core.spec import (
    EdgeType,
    Fanouts,
    LinkInput,
    LoaderSpec,
    NegativeSampling,
    NodeInput,
    SamplingSpec,
    SeedInput,
    TypedFanouts,
)
from graphfeed.proto import control_pb2 as pb


def edge_type_to_proto(etype) -> pb.EdgeType:
    src, rel, dst = etype
    return pb.EdgeType(src=src, rel=rel, dst=dst)


def edge_type_from_proto(msg: pb.EdgeType) -> EdgeType:
    return msg.src, msg.rel, msg.dst


def _plain_to_proto(record, msg, skip: tuple[str, ...] = ()) -> None:
    """Copy ``record``'s plain fields onto the fields of ``msg`` that have the same name.

    The one naming convention between the records and ``control.proto``, so that a new scalar
    option travels without an edit here: field ``x`` of the record is field ``x`` of the message,
    ``None`` travels as the unset field (``""`` / ``0``); a per-hop tuple travels as the repeated
    field ``x_per_hop``.  Fields in ``skip`` (structured ones) are converted by hand.
    ``tests/core/test_proto.py`` checks that every field of the records has its message field."""
    names = msg.DESCRIPTOR.fields_by_name
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name in skip or value is None:
            continue
        if isinstance(value, tuple):
            getattr(msg, f"{f.name}_per_hop").extend(value)
        elif f.name in names:
            setattr(msg, f.name, value)
        else:
            raise TypeError(f"{type(record).__name__}.{f.name} has no field of its name in control.proto: add it")


def _plain_from_proto(cls, msg, skip: tuple[str, ...] = ()) -> dict:
    """The keyword arguments of ``cls`` that ``msg`` carries (the inverse of :func:`_plain_to_proto`):
    an empty string is the record's default; ``x_per_hop``, when set, is ``x`` as a tuple."""
    names = msg.DESCRIPTOR.fields_by_name
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name not in names:
            continue
        value = getattr(msg, f.name)
        per_hop = f"{f.name}_per_hop"
        if per_hop in names and len(getattr(msg, per_hop)):
            if value:
                raise ValueError(f"set {f.name} (every hop) or {per_hop}, not both")
            out[f.name] = tuple(getattr(msg, per_hop))
        elif value != "":
            out[f.name] = value
    return out


# SamplingSpec fields converted by hand (structured); the rest travel by name
_SAMPLING_STRUCTURED = ("num_neighbors", "reverse_edge_types")


def sampling_to_proto(spec: SamplingSpec) -> pb.SamplingSpec:
    msg = pb.SamplingSpec()
    _plain_to_proto(spec, msg, skip=_SAMPLING_STRUCTURED)
    for etype, rev in spec.reverse_edge_types:
        msg.reverse_edge_types.add(edge_type=edge_type_to_proto(etype), reverse=edge_type_to_proto(rev))
    if not spec.is_typed:
        msg.num_neighbors.extend(cast(Fanouts, spec.num_neighbors))
        return msg
    for etype, hops in cast(TypedFanouts, spec.num_neighbors):
        msg.edge_type_fanouts.add(edge_type=edge_type_to_proto(etype), fanouts=list(hops))
    return msg


def sampling_from_proto(msg: pb.SamplingSpec) -> SamplingSpec:
    if msg.num_neighbors and msg.edge_type_fanouts:
        raise ValueError("spec: set num_neighbors (one list for every edge type) or edge_type_fanouts, not both")
    num_neighbors: Fanouts | TypedFanouts
    if msg.edge_type_fanouts:
        num_neighbors = tuple((edge_type_from_proto(f.edge_type), tuple(f.fanouts)) for f in msg.edge_type_fanouts)
    else:
        num_neighbors = tuple(msg.num_neighbors)
    try:
        reverse = tuple((edge_type_from_proto(r.edge_type), edge_type_from_proto(r.reverse))
                        for r in msg.reverse_edge_types)
        return SamplingSpec(num_neighbors, reverse_edge_types=reverse,
                            **_plain_from_proto(SamplingSpec, msg, skip=_SAMPLING_STRUCTURED))
    except ValueError as exc:
        raise ValueError(f"spec: {exc}") from None


# LoaderSpec fields converted by hand (records of their own); the rest travel by name
_LOADER_STRUCTURED = ("sampling", "input", "feature_cache")


def open_session_request(spec: LoaderSpec, group_id: str) -> pb.OpenSessionRequest:
    """The OpenSession request of a loader.  Input ``None`` (every node) travels as no input at all,
    so the servers number it as the local loader does (each part's nodes in id order); an ordered
    loader spells it out as ids first (:meth:`LoaderSpec.ordered_input`)."""
    req = pb.OpenSessionRequest(group_id=group_id, spec=sampling_to_proto(spec.sampling),
                                node_type=spec.input.node_type or "")
    _plain_to_proto(spec, req, skip=_LOADER_STRUCTURED)
    if isinstance(spec.input, LinkInput):
        req.link.CopyFrom(link_to_proto(spec.input))
    elif spec.input.split is not None:
        req.split = spec.input.split
    elif spec.input.ids is not None:
        req.node_ids.ids.extend(spec.input.ids.tolist())
    elif spec.ordered:
        raise ValueError("an ordered loader sends its input as ids: call spec.ordered_input(num_nodes) first")
    if not isinstance(spec.input, LinkInput) and spec.input.time is not None:
        req.input_time.extend(spec.input.time.tolist())
    if spec.feature_cache is not None:
        req.feature_cache.CopyFrom(pb.FeatureCache(node_type=spec.feature_cache.node_type,
                                                   node_ids=spec.feature_cache.ids.tolist()))
    return req


def link_to_proto(link: LinkInput) -> pb.LinkSeeds:
    if link.every_edge:   # every edge of the type: the type alone
        msg = pb.LinkSeeds(edge_type=list(link.edge_type or ()))
    elif link.index is None:
        msg = pb.LinkSeeds(split=link.split, edge_type=list(link.edge_type or ()))
    else:
        msg = pb.LinkSeeds(src=link.index[0].tolist(), dst=link.index[1].tolist(), edge_type=list(link.edge_type or ()),
                           time=[] if link.time is None else link.time.tolist())
    if link.label is not None:
        (msg.float_label if link.label.dtype.is_floating_point else msg.int_label).extend(link.label.tolist())
    if link.neg is not None:
        msg.neg.CopyFrom(pb.NegativeSampling(mode=link.neg.mode, amount=link.neg.amount, strict=link.neg.strict,
                                             num_hard=link.neg.num_hard))
    return msg


def link_from_proto(msg: pb.LinkSeeds) -> LinkInput:
    """The :class:`LinkInput` of a LinkSeeds message; ValueError naming the field."""
    if len(msg.src) != len(msg.dst):
        raise ValueError(f"link: src has {len(msg.src)} ids, dst {len(msg.dst)}: give one of each per seed edge")
    if msg.float_label and msg.int_label:
        raise ValueError("link: set float_label or int_label, not both")
    neg = NegativeSampling(msg.neg.mode, msg.neg.amount, msg.neg.strict, msg.neg.num_hard) if msg.HasField("neg") \
        else None
    if msg.edge_type and len(msg.edge_type) != 3:
        raise ValueError(f"link: edge_type has {len(msg.edge_type)} names: give [src, rel, dst] or none")
    etype = (msg.edge_type[0], msg.edge_type[1], msg.edge_type[2]) if msg.edge_type else None
    if msg.split:
        if msg.src or msg.float_label or msg.int_label:
            raise ValueError(f"link: split {msg.split!r} names the seed edges: leave src, dst and labels empty")
        return LinkInput(None, None, neg, etype, split=msg.split)
    if not msg.src and etype is not None:   # every edge of the type
        if msg.float_label or msg.int_label or msg.time:
            raise ValueError("link: every edge of edge_type (no src/dst) takes no labels or times")
        return LinkInput(None, None, neg, etype)
    index = torch.from_numpy(np.asarray([msg.src, msg.dst], dtype=np.int64).reshape(2, -1))
    label = None
    if msg.float_label:
        label = torch.from_numpy(np.asarray(msg.float_label, dtype=np.float32))
    elif msg.int_label:
        label = torch.from_numpy(np.asarray(msg.int_label, dtype=np.int64))
    time = torch.from_numpy(np.asarray(msg.time, dtype=np.int64)) if msg.time else None
    return LinkInput(index, label, neg, etype, time)


def loader_spec_from_proto(req: pb.OpenSessionRequest) -> LoaderSpec:
    """The :class:`LoaderSpec` an OpenSession request asks for; ValueError naming what is wrong."""
    sampling = sampling_from_proto(req.spec)
    node_input = _node_input(req)
    plain = _plain_from_proto(LoaderSpec, req, skip=_LOADER_STRUCTURED)
    plain["world_size"] = req.world_size or 1  # 0 = unset (not DDP): one rank
    try:
        return LoaderSpec(sampling, node_input, feature_cache=_feature_cache(req), **plain)
    except ValueError as exc:
        raise ValueError(f"rank = {req.rank}, world_size = {req.world_size}, batch_size = {req.batch_size}, "
                         f"feature_dtype = {req.feature_dtype!r}, ordered = {req.ordered}: {exc}") from None


def check_lengths(req: pb.OpenSessionRequest, num_nodes: dict[str, int], label_type: str) -> None:
    """Refuse from the lengths alone, before anything is decoded, the id lists of an OpenSession request
    that cannot be valid: more ids than their node type has nodes (so some repeat: node_ids, the feature
    cache's ids), seed times or link labels not one per seed.  ``num_nodes``: nodes per node type;
    ``label_type``: the type of node_ids without ``node_type``.  ValueError naming the field and the fix.

    A request may hold ``max_message_bytes`` of ids, several hundred MB once decoded and sorted to find
    repeats; these refusals cost nothing."""
    if req.WhichOneof("input") == "node_ids":
        count = len(req.node_ids.ids)
        _at_most_nodes("node_ids", count, req.node_type or label_type, num_nodes)
        if req.input_time and len(req.input_time) != count:
            raise ValueError(f"input_time has {len(req.input_time):,} entries for {count:,} input nodes: give "
                             f"one time per input node")
    if req.HasField("feature_cache"):
        _at_most_nodes("feature_cache.node_ids", len(req.feature_cache.node_ids), req.feature_cache.node_type,
                       num_nodes)
    if req.WhichOneof("input") == "link":
        link, edges = req.link, len(req.link.src)
        for name in ("float_label", "int_label", "time"):
            have = len(getattr(link, name))
            if have and have != edges:
                raise ValueError(f"link: {name} has {have:,} entries for {edges:,} seed edges: give one per "
                                 f"seed edge (edge_label_index column)")


def _at_most_nodes(field: str, count: int, ntype: str, num_nodes: dict[str, int]) -> None:
    total = num_nodes.get(ntype)
    if total is not None and count > total:
        raise ValueError(f"{field} has {count:,} ids but the graph has {total:,} {ntype!r} nodes, so at least "
                         f"{count - total:,} of them repeat: pass each node once (torch.unique(ids))")


def _feature_cache(req: pb.OpenSessionRequest) -> CachedIds | None:
    """The cached nodes of a request (None when it has no feature_cache); ValueError naming the field."""
    if not req.HasField("feature_cache"):
        return None
    ids = torch.from_numpy(np.asarray(req.feature_cache.node_ids, dtype=np.int64))
    return CachedIds(req.feature_cache.node_type, ids)


def _node_input(req: pb.OpenSessionRequest) -> SeedInput:
    which = req.WhichOneof("input")
    if which == "link":
        return link_from_proto(req.link)
    node_type = req.node_type or None   # "" = the graph's label type
    if which == "split":
        return NodeInput(split=req.split, node_type=node_type)
    if which is None:
        return NodeInput(node_type=node_type)   # every node of the type
    if not req.node_ids.ids:
        raise ValueError("node_ids is empty: give at least one original node id")
    time = torch.from_numpy(np.asarray(req.input_time, dtype=np.int64)) if req.input_time else None
    return NodeInput(ids=torch.from_numpy(np.asarray(req.node_ids.ids, dtype=np.int64)), node_type=node_type,
                     time=time)


def graph_schema(info: pb.ClusterInfo) -> tuple[list[str], list[EdgeType], str]:
    """``(node_types, edge_types, label_type)`` of the graph a server holds (its ClusterInfo).
    A server that predates typed graphs sends none: its graph is the homogeneous one."""
    if not info.node_types:
        return [DEFAULT_NODE_TYPE], [DEFAULT_EDGE_TYPE], DEFAULT_NODE_TYPE
    return list(info.node_types), [edge_type_from_proto(e) for e in info.edge_types], info.label_type
