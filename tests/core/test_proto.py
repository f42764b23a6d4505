"""The wire contracts: checked-in gRPC stubs match control.proto; every batch field is documented."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import torch

from graphfeed.core import batch
from graphfeed.core.constants import DEFAULT_NODE_TYPE
from graphfeed.core.feature_cache import CachedIds, drop_cached_rows
from graphfeed.core.spec import LoaderSpec, NodeInput, SamplingSpec
from graphfeed.proto import control_pb2
from graphfeed.proto.convert import (
    edge_type_from_proto,
    edge_type_to_proto,
    graph_schema,
    loader_spec_from_proto,
    open_session_request,
    sampling_from_proto,
    sampling_to_proto,
)


def test_generated_stubs_are_current():
    proc = subprocess.run([sys.executable, "-m", "graphfeed.proto.generate", "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"stale stubs: {proc.stderr.strip()}"


def test_every_batch_field_is_documented_and_encoded():
    for name, f in batch.BATCH_FIELDS.items():
        assert f.scope in (batch.NODE, batch.EDGE, batch.BATCH), name
        assert f.dtype is None or isinstance(f.dtype, torch.dtype), name
        assert isinstance(f.meaning, str) and len(f.meaning.split()) >= 3, f"BATCH_FIELDS[{name!r}] needs a description"
    wire = batch.encode(x=torch.zeros(3, 2), y=torch.zeros(3, dtype=torch.int64),
                        edge_index=torch.zeros(2, 1, dtype=torch.int64), n_id=torch.arange(3),
                        e_id=torch.zeros(1, dtype=torch.int64), num_sampled_nodes=[1, 2], num_sampled_edges=[1],
                        batch_size=1, epoch=0, seq=0, index=0, input_id=[0], edge_attr=torch.zeros(1, 4),
                        batch=torch.zeros(3, dtype=torch.int64),
                        extra={"edge_label_index": torch.zeros(2, 1, dtype=torch.int64),
                               "edge_label": torch.ones(1), "link_edge_type": torch.zeros(1, dtype=torch.int64),
                               "seed_time": torch.zeros(1, dtype=torch.int64),
                               "edge_label_time": torch.zeros(1, dtype=torch.int64),
                               "neg_is_hard": torch.zeros(0, dtype=torch.bool),
                               **{k: torch.zeros(1, dtype=torch.int64)
                                  for k in ("src_index", "dst_pos_index", "dst_neg_index")}})
    wire = drop_cached_rows(wire, CachedIds(DEFAULT_NODE_TYPE, torch.tensor([1])))   # and x_cached (feature cache)
    wire = batch.quantize_features(wire, {DEFAULT_NODE_TYPE: (torch.ones(2), torch.zeros(2))})   # int8: x_scale, ...
    wire.update({batch.node_key("emb", DEFAULT_NODE_TYPE): torch.zeros(3, 4),   # a loader's embedding table
                 batch.node_key("emb_gid", DEFAULT_NODE_TYPE): torch.arange(3)})
    # with features, labels, edge features, the link fields, a feature cache, int8 features and an embedding
    # table, a one-type batch carries every field once
    assert sorted(key.partition("@")[0] for key in wire) == sorted(batch.BATCH_FIELDS)
    for key, tensor in wire.items():
        dtype = batch.BATCH_FIELDS[key.partition("@")[0]].dtype
        assert dtype is None or tensor.dtype == dtype, key
    batch.check(wire)
    data = batch.to_pyg(wire)
    assert (data.batch_size, data.epoch, data.seq) == (1, 0, 0)


def test_graph_schema_of_cluster_info():
    info = control_pb2.ClusterInfo(node_types=["author", "paper"], label_type="paper")
    info.edge_types.add(src="author", rel="writes", dst="paper")
    info.edge_types.add(src="paper", rel="cites", dst="paper")
    assert graph_schema(info) == (["author", "paper"], [("author", "writes", "paper"), ("paper", "cites", "paper")],
                                  "paper")
    # a server from before typed graphs sends no schema: its graph is the one-type graph
    assert graph_schema(control_pb2.ClusterInfo()) == (["_N"], [("_N", "to", "_N")], "_N")


def test_edge_type_messages_round_trip():
    etype = ("author", "writes", "paper")
    assert edge_type_from_proto(edge_type_to_proto(etype)) == etype
    assert edge_type_from_proto(edge_type_to_proto(list(etype))) == etype


def test_control_service_surface():
    service = control_pb2.DESCRIPTOR.services_by_name["Control"]
    assert service.full_name == "graphfeed.control.v1.Control"
    assert {m.name for m in service.methods} == {"GetClusterInfo", "OpenGroup", "JoinGroup", "Heartbeat", "CloseGroup",
                                                  "OpenSession", "StartEpoch", "CloseSession", "GetStats", "Drain"}
    # no RPC stops a server at once: the daemon outlives its clients; Drain (an operator's, with the admin token
    # where there is one) starts the drain SIGTERM starts, which serves open groups for their grace
    assert not any("shutdown" in m.name.lower() or "stop" in m.name.lower() for m in service.methods)


def test_every_spec_field_travels_by_name():
    """A new option needs no edit in proto/convert.py: each plain field of SamplingSpec and LoaderSpec has the
    message field of its name (a per-hop tuple: ``<name>_per_hop``), and a spec with no field at its default
    comes back equal from the wire."""
    for cls, msg, structured in ((SamplingSpec, control_pb2.SamplingSpec, {"num_neighbors"}),
                                 (LoaderSpec, control_pb2.OpenSessionRequest, {"sampling", "input", "feature_cache"})):
        names = msg.DESCRIPTOR.fields_by_name
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in structured and f.name not in names]
        assert not missing, f"{cls.__name__} fields with no control.proto field of their name: {missing}"
    sampling = SamplingSpec((4, 3), replace=(True, False), direction="out", time_attr="time",
                            temporal_strategy="last", disjoint=True)
    assert sampling_from_proto(sampling_to_proto(sampling)) == sampling
    weighted = SamplingSpec((2,), replace=True, weight_attr="edge_attr:1")
    assert sampling_from_proto(sampling_to_proto(weighted)) == weighted
    spec = LoaderSpec(weighted, NodeInput(ids=torch.tensor([3, 1, 2])), batch_size=7, shuffle=True, drop_last=True,
                      seed=11, rank=1, world_size=2, kind="val", feature_dtype="bfloat16")
    back = loader_spec_from_proto(open_session_request(spec, "g"))
    assert back == spec and back.input.ids.tolist() == [3, 1, 2]
    fields = {f.name: getattr(back, f.name) for f in dataclasses.fields(LoaderSpec) if f.name not in {"input"}}
    assert fields == {f.name: getattr(spec, f.name) for f in dataclasses.fields(LoaderSpec) if f.name != "input"}
