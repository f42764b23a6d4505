"""The wire contracts: checked-in gRPC stubs match control.proto; every batch key is documented."""
from __future__ import annotations

import subprocess
import sys

import torch

from graphfeed.core import batch
from graphfeed.proto import control_pb2


def test_generated_stubs_are_current():
    proc = subprocess.run([sys.executable, "-m", "graphfeed.proto.generate", "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"stale stubs: {proc.stderr.strip()}"


def test_every_batch_key_is_documented_and_encoded():
    for key, entry in batch.BATCH_KEYS.items():
        assert isinstance(entry, tuple) and len(entry) == 2, key
        dtype, meaning = entry
        assert dtype is None or isinstance(dtype, torch.dtype), key
        assert isinstance(meaning, str) and len(meaning.split()) >= 3, f"BATCH_KEYS[{key!r}] needs a description"
    wire = batch.encode(x=torch.zeros(3, 2), y=torch.zeros(3, dtype=torch.int64),
                        edge_index=torch.zeros(2, 1, dtype=torch.int64), n_id=torch.arange(3),
                        e_id=torch.zeros(1, dtype=torch.int64), num_sampled_nodes=[1, 2], num_sampled_edges=[1],
                        batch_size=1, epoch=0, seq=0, index=0)
    assert set(wire) == set(batch.BATCH_KEYS)
    for key, (dtype, _) in batch.BATCH_KEYS.items():
        assert dtype is None or wire[key].dtype == dtype, key
    batch.check(wire)
    data = batch.to_pyg(wire)
    assert (data.batch_size, data.epoch, data.seq) == (1, 0, 0)


def test_control_service_surface():
    service = control_pb2.DESCRIPTOR.services_by_name["Control"]
    assert service.full_name == "graphfeed.control.v1.Control"
    assert {m.name for m in service.methods} == {"GetClusterInfo", "OpenGroup", "Heartbeat", "CloseGroup",
                                                  "OpenSession", "StartEpoch", "CloseSession", "GetStats"}
    # no RPC may stop a server: the daemon outlives its clients
    assert not any("shutdown" in m.name.lower() or "stop" in m.name.lower() for m in service.methods)
