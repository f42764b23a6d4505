"""The one conversion between the spec records (:mod:`graphfeed.core.spec`) and protobuf.

The client builds an ``OpenSessionRequest`` with :func:`open_session_request`; the daemon
turns it back into the same :class:`LoaderSpec` with :func:`loader_spec_from_proto`, which
raises ``ValueError`` naming the field for anything the record refuses.  Checks that need
the partition (does the split exist, are the ids in range) stay on the server.
"""
from __future__ import annotations

import numpy as np
import torch

from graphfeed.core.spec import LoaderSpec, NodeInput, SamplingSpec
from graphfeed.proto import control_pb2 as pb


def sampling_to_proto(spec: SamplingSpec) -> pb.SamplingSpec:
    return pb.SamplingSpec(num_neighbors=list(spec.num_neighbors), replace=spec.replace, direction=spec.direction)


def sampling_from_proto(msg: pb.SamplingSpec) -> SamplingSpec:
    try:
        return SamplingSpec(tuple(msg.num_neighbors), replace=msg.replace, direction=msg.direction or "in")
    except ValueError as exc:
        raise ValueError(f"spec: {exc}") from None


def open_session_request(spec: LoaderSpec, group_id: str) -> pb.OpenSessionRequest:
    """The OpenSession request of a loader.  Input ``None`` (every node) travels as explicit ids,
    so the caller passes ``NodeInput(ids=torch.arange(num_nodes))`` for it."""
    req = pb.OpenSessionRequest(group_id=group_id, spec=sampling_to_proto(spec.sampling),
                                batch_size=spec.batch_size, shuffle=spec.shuffle, drop_last=spec.drop_last,
                                seed=spec.seed, rank=spec.rank, world_size=spec.world_size, kind=spec.kind)
    if spec.input.split is not None:
        req.split = spec.input.split
    elif spec.input.ids is not None:
        req.node_ids.ids.extend(spec.input.ids.tolist())
    else:
        raise ValueError("a remote session needs explicit input nodes: a split or ids (every node = all ids)")
    return req


def loader_spec_from_proto(req: pb.OpenSessionRequest) -> LoaderSpec:
    """The :class:`LoaderSpec` an OpenSession request asks for; ValueError naming what is wrong."""
    sampling = sampling_from_proto(req.spec)
    node_input = _node_input(req)
    world_size = req.world_size or 1  # 0 = unset (not DDP): one rank
    try:
        return LoaderSpec(sampling, node_input, batch_size=req.batch_size, shuffle=req.shuffle,
                          drop_last=req.drop_last, seed=req.seed, rank=req.rank, world_size=world_size,
                          kind=req.kind)
    except ValueError as exc:
        raise ValueError(f"rank = {req.rank}, world_size = {req.world_size}, batch_size = {req.batch_size}: "
                         f"{exc}") from None


def _node_input(req: pb.OpenSessionRequest) -> NodeInput:
    which = req.WhichOneof("input")
    if which == "split":
        return NodeInput(split=req.split)
    if which != "node_ids":
        raise ValueError("no input nodes: set split (train/val/test) or node_ids")
    if not req.node_ids.ids:
        raise ValueError("node_ids is empty: give at least one original node id")
    return NodeInput(ids=torch.from_numpy(np.asarray(req.node_ids.ids, dtype=np.int64)))
