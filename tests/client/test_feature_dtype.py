"""Reduced-precision feature transport (``feature_dtype``): the spec, the protobuf field, the local
loader (the reference) and the remote loader through real daemons (2 parts, 3000 nodes)."""
from __future__ import annotations

import grpc
import pytest
import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.spec import LoaderSpec, feature_dtype
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.local import LocalNeighborLoader

FANOUTS = [5, 3]
KW = dict(batch_size=64, shuffle=True, seed=3)


@pytest.fixture(scope="module")
def graph(shared_graph):
    return shared_graph


@pytest.fixture(scope="module")
def parts_dir(shared_parts):
    return shared_parts


def _assert_rounded(got, full, dtype: torch.dtype) -> None:
    """``got`` equals ``full`` on every key, except that its ``x`` is ``full.x`` rounded to ``dtype``."""
    assert set(got.keys()) == set(full.keys())
    for key in full.keys():
        a, b = got[key], full[key]
        if key == "x":
            assert a.dtype == dtype and b.dtype == torch.float32
            assert torch.equal(a, b.to(dtype))
        elif torch.is_tensor(b):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        else:
            assert a == b, key


# ---- the record and its wire form --------------------------------------------------------------------

@pytest.mark.parametrize("given, name", [("bf16", "bfloat16"), ("BF16", "bfloat16"), (torch.bfloat16, "bfloat16"),
                                         ("fp16", "float16"), (torch.float16, "float16"), ("half", "float16"),
                                         ("fp32", "float32"), (None, None), ("", None)])
def test_feature_dtype_spellings(given, name):
    assert feature_dtype(given) == name
    spec = LoaderSpec.of("train", [2], feature_dtype=given)
    assert spec.feature_dtype == name
    assert spec.feature_torch_dtype == (None if name is None else getattr(torch, name))


@pytest.mark.parametrize("bad", ["int8", "bf8", torch.int64, 16])
def test_bad_feature_dtype_names_the_choices(bad):
    with pytest.raises(ValueError, match="feature_dtype must be one of 'bf16', 'fp16', 'fp32'"):
        LoaderSpec.of("train", [2], feature_dtype=bad)


def test_feature_dtype_survives_the_protobuf_round_trip():
    for given in ("bf16", "fp16", None):
        spec = LoaderSpec.of("train", [3, 2], batch_size=8, feature_dtype=given)
        assert loader_spec_from_proto(open_session_request(spec, "g")) == spec
    req = open_session_request(LoaderSpec.of("train", [2]), "g")
    req.feature_dtype = "complex64"
    with pytest.raises(ValueError, match="feature_dtype = 'complex64'.*must be one of"):
        loader_spec_from_proto(req)


def test_cast_features_touches_only_floating_x_of_every_type():
    wire = {"x@paper": torch.rand(3, 4), "x@author": torch.arange(6).view(3, 2), "y@paper": torch.tensor([1., 2, 3]),
            "n_id@paper": torch.arange(3), "meta": torch.zeros(5, dtype=torch.int64)}
    before = {k: v.clone() for k, v in wire.items()}
    out = batch_codec.cast_features(dict(wire), torch.bfloat16)
    assert out["x@paper"].dtype == torch.bfloat16 and torch.equal(out["x@paper"], before["x@paper"].bfloat16())
    for key in ("x@author", "y@paper", "n_id@paper", "meta"):   # integer features, labels, ids: untouched
        assert out[key].dtype == before[key].dtype and torch.equal(out[key], before[key])
    assert batch_codec.cast_features(wire, None) is wire


# ---- the local loader (the reference) ----------------------------------------------------------------

@pytest.mark.parametrize("dtype, given", [(torch.bfloat16, "bf16"), (torch.float16, torch.float16)])
def test_local_batches_equal_full_precision_rounded(parts_dir, dtype, given):
    full = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    low = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype=given, **KW))
    assert len(low) == len(full) > 1
    for a, b in zip(low, full):
        _assert_rounded(a, b, dtype)


# ---- through the servers -----------------------------------------------------------------------------

def _bytes_served(addresses) -> int:
    total = 0
    for address in addresses:
        with grpc.insecure_channel(address) as ch:
            total += pb_grpc.ControlStub(ch).GetStats(pb.StatsRequest(), timeout=10).bytes_served_total
    return total


def test_remote_bf16_equals_local_and_halves_the_feature_bytes(parts_dir, shared_cluster, connect):
    full = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    x_bytes = sum(b.x.numel() * b.x.element_size() for b in full)
    addresses = [s.address for s in shared_cluster]
    with connect(addresses, timeout=60) as client:
        before = _bytes_served(addresses)
        got_full = list(client.neighbor_loader("train", FANOUTS, prefetch=2, **KW))
        mid = _bytes_served(addresses)
        got_bf16 = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="bf16", **KW))
        after = _bytes_served(addresses)
    assert len(got_bf16) == len(full)
    for a, b, c in zip(got_bf16, full, got_full):
        _assert_rounded(a, b, torch.bfloat16)
        _assert_rounded(a, c, torch.bfloat16)    # and the full-precision remote epoch is the local one
    full_epoch, bf16_epoch = mid - before, after - mid
    # the workers' bytes metric: the same epoch costs exactly half the feature bytes less, nothing else changed
    assert full_epoch - bf16_epoch == x_bytes // 2, (full_epoch, bf16_epoch, x_bytes)
