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
                                         ("fp32", "float32"), ("int8", "int8"), (torch.int8, "int8"), (None, None),
                                         ("", None)])
def test_feature_dtype_spellings(given, name):
    assert feature_dtype(given) == name
    spec = LoaderSpec.of("train", [2], feature_dtype=given)
    assert spec.feature_dtype == name
    assert spec.feature_torch_dtype == (None if name is None else getattr(torch, name))


@pytest.mark.parametrize("bad", ["int4", "bf8", torch.int64, 16])
def test_bad_feature_dtype_names_the_choices(bad):
    with pytest.raises(ValueError, match="feature_dtype must be one of 'bf16', 'fp16', 'fp32'"):
        LoaderSpec.of("train", [2], feature_dtype=bad)


def test_feature_dtype_survives_the_protobuf_round_trip():
    for given in ("bf16", "fp16", "int8", None):
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


# ---- int8: quantized with the partition's per-column scales --------------------------------------------

def _assert_quantized(got, full, dequantized: bool = True) -> None:
    """``got`` equals ``full`` on every key but ``x``, which is within half a quantization step of ``full.x``
    (dequantized, float32) or int8 beside its ``x_scale`` / ``x_offset``."""
    extra = set() if dequantized else {"x_scale", "x_offset"}
    assert set(got.keys()) == set(full.keys()) | extra
    for key in full.keys():
        if key != "x":
            a, b = got[key], full[key]
            assert (a.dtype == b.dtype and torch.equal(a, b)) if torch.is_tensor(b) else a == b, key
    x = got.x if dequantized else (got.x.float() + 128) * got.x_scale + got.x_offset
    assert x.dtype == torch.float32 and (dequantized or got.x.dtype == torch.int8)
    if not dequantized:
        assert ((x - full.x).abs() <= got.x_scale / 2 + 1e-6).all()


def test_local_int8_batches_are_fp32_within_half_a_step(parts_dir):
    from graphfeed.server.partition.format.store import open_parts

    scale, _ = open_parts(parts_dir)[1][0].nodes("_N").quant_scales
    full = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    deq = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype="int8", **KW))
    raw = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype="int8", dequantize=False, **KW))
    assert len(deq) == len(raw) == len(full) > 1
    for a, q, b in zip(deq, raw, full):
        _assert_quantized(a, b)
        assert ((a.x - b.x).abs() <= scale / 2 + 1e-6).all(), "within the quantization bound of fp32"
        _assert_quantized(q, b, dequantized=False)
        assert torch.equal(q.x_scale, scale)
        assert q.x.numel() * q.x.element_size() * 4 == b.x.numel() * b.x.element_size(), "a quarter of fp32's bytes"


def test_int8_on_a_partition_without_scales_names_the_fix(tmp_path, shared_graph):
    from graphfeed.server.partition.build import builder
    from graphfeed.server.partition.format.layout import PartitionPaths
    from graphfeed.server.partition.format.quantize import add_scales

    ei, x, y, splits = shared_graph
    builder.partition_graph(builder.GraphInput(ei, x, y, splits), 2, tmp_path / "p", method="random")
    for k in range(2):
        for name in ("scale", "offset"):
            PartitionPaths(tmp_path / "p").quant_file(k, name).unlink()
    with pytest.raises(ValueError, match="feature_dtype='int8' needs the per-column scales stored at partition "
                                         "time.*run `graphfeed quantize"):
        LocalNeighborLoader(tmp_path / "p", FANOUTS, feature_dtype="int8", **KW)
    add_scales(tmp_path / "p")
    assert next(iter(LocalNeighborLoader(tmp_path / "p", FANOUTS, feature_dtype="int8", **KW))).x.dtype == torch.float32


def test_remote_int8_equals_local_and_sends_a_quarter_of_the_feature_bytes(parts_dir, shared_cluster, connect):
    full = list(LocalNeighborLoader(parts_dir, FANOUTS, **KW))
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, feature_dtype="int8", dequantize=False, **KW))
    x_bytes = sum(b.x.numel() * b.x.element_size() for b in full)
    scale_bytes = sum(2 * b.x_scale.numel() * 4 for b in local)
    addresses = [s.address for s in shared_cluster]
    with connect(addresses, timeout=60) as client:
        before = _bytes_served(addresses)
        list(client.neighbor_loader("train", FANOUTS, prefetch=2, **KW))
        mid = _bytes_served(addresses)
        got = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="int8", dequantize=False, **KW))
        after = _bytes_served(addresses)
        deq = list(client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype="int8", **KW))
    assert len(got) == len(local) == len(deq)
    for a, b, c, f in zip(got, local, deq, full):
        assert set(a.keys()) == set(b.keys()) and all(
            torch.equal(a[k], b[k]) if torch.is_tensor(b[k]) else a[k] == b[k] for k in b.keys())
        _assert_quantized(c, f)
    full_epoch, int8_epoch = mid - before, after - mid
    print(f"bytes per epoch: fp32 {full_epoch}, int8 {int8_epoch}; x alone {x_bytes} -> {x_bytes // 4}")
    assert full_epoch - int8_epoch == x_bytes * 3 // 4 - scale_bytes, (full_epoch, int8_epoch, x_bytes)


def test_online_int8_sample_equals_local(parts_dir, shared_cluster, connect):
    from graphfeed.server.loader.local import sample_nodes

    ids = torch.tensor([5, 900, 2999, 17])
    want = sample_nodes(parts_dir, ids, [3, 2], seed=4, feature_dtype="int8")
    with connect([s.address for s in shared_cluster], timeout=60) as client:
        got = client.sample(ids, [3, 2], seed=4, feature_dtype="int8")
    assert got.x.dtype == torch.float32 and set(got.keys()) == set(want.keys())
    for key in want.keys():
        assert torch.equal(got[key], want[key]) if torch.is_tensor(want[key]) else got[key] == want[key], key
