"""The trainer's hot-feature cache (``feature_cache_mb``): the schema helpers, the protobuf field, and
the remote loaders through 2 real daemons (METIS parts of a 3000-node graph): batches with the cache
equal batches without it on every key, the servers send fewer bytes, the budget holds, and a cache
that cannot be had falls back with one warning."""
from __future__ import annotations

import logging

import grpc
import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.client import feature_cache as client_cache
from graphfeed.core.feature_cache import MB, CachedIds, FeatureCache, drop_cached_rows
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.partition.format.store import Partition

N, F = 3000, 16
FANOUTS = [5, 3]
KW = dict(batch_size=64, shuffle=True, seed=3)
BUDGET_MB = 0.05          # 52428 bytes: 819 float32 rows of 16 features, 1638 bf16 rows (of 3000 nodes)


@pytest.fixture(scope="module")
def graph(shared_graph):
    return shared_graph


@pytest.fixture(scope="module")
def parts_dir(shared_parts):
    return shared_parts


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    return [s.address for s in shared_cluster]


def _bytes_served(addresses) -> int:
    total = 0
    for address in addresses:
        with grpc.insecure_channel(address) as ch:
            total += pb_grpc.ControlStub(ch).GetStats(pb.StatsRequest(), timeout=10).bytes_served_total
    return total


# ---- the schema's two halves and the wire field ---------------------------------------------------------

def _wire(n_id: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"x@_N": x.clone(), "n_id@_N": n_id, "meta": torch.zeros(5, dtype=torch.int64)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropped_rows_are_filled_back_exactly(dtype):
    x = torch.randn(10, 4).to(dtype)
    n_id = torch.tensor([7, 3, 9, 0, 12, 5, 1, 8, 2, 11])
    hot = torch.tensor([9, 1, 5, 100])          # cached in fetch order, one never sampled
    cache = FeatureCache.of("_N", hot, torch.stack([x[2], x[6], x[5], torch.zeros(4, dtype=dtype)]))
    wire = drop_cached_rows(_wire(n_id, x), cache.cached)
    assert wire["x_cached@_N"].tolist() == [2, 5, 6] and wire["x@_N"].shape == (7, 4)
    assert cache.fill(wire) == 3
    assert "x_cached@_N" not in wire and wire["x@_N"].dtype == dtype and torch.equal(wire["x@_N"], x)


def test_cached_ids_must_be_sorted_and_a_foreign_row_is_refused():
    with pytest.raises(ValueError, match="sorted and distinct"):
        CachedIds("_N", torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="twice"):
        FeatureCache.of("_N", torch.tensor([1, 1]), torch.zeros(2, 4))
    cache = FeatureCache.of("_N", torch.tensor([1, 2]), torch.zeros(2, 4))
    wire = drop_cached_rows(_wire(torch.tensor([5, 6]), torch.zeros(2, 4)), CachedIds("_N", torch.tensor([6])))
    with pytest.raises(ValueError, match="disagree on the cached set"):
        cache.fill(wire)


def test_feature_cache_survives_the_protobuf_round_trip():
    spec = LoaderSpec.of("train", [3, 2], batch_size=8)
    assert not open_session_request(spec, "g").HasField("feature_cache")
    cached = CachedIds("_N", torch.tensor([2, 5, 40]))
    back = loader_spec_from_proto(open_session_request(LoaderSpec.of("train", [3, 2]).__class__(
        spec.sampling, spec.input, batch_size=8, feature_cache=cached), "g")).feature_cache
    assert back is not None and back.node_type == "_N" and back.ids.tolist() == [2, 5, 40]
    req = open_session_request(spec, "g")
    req.feature_cache.CopyFrom(pb.FeatureCache(node_type="_N", node_ids=[5, 2]))
    with pytest.raises(ValueError, match="feature_cache: node_ids must be sorted"):
        loader_spec_from_proto(req)


def test_shares_split_the_rows_evenly_and_respect_part_sizes():
    assert client_cache._shares(10, [100, 100]) == [5, 5]
    assert client_cache._shares(11, [100, 3]) == [8, 3]
    assert client_cache._shares(50, [10, 20]) == [10, 20]


@pytest.mark.parametrize("bad", [-1, "8", float("nan"), True])
def test_bad_budget_names_the_argument(bad):
    with pytest.raises(ValueError, match="feature_cache_mb must be a number of megabytes"):
        client_cache.check_budget(bad)


# ---- through the servers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, channel", [(None, "auto"), ("bf16", "auto"), (None, "rpc")])
def test_cached_batches_equal_uncached_on_every_key_with_fewer_bytes(cluster, dtype, channel, connect):
    with connect(cluster, timeout=60, channel=channel) as client:
        assert client.group.channel.kind == ("shm" if channel == "auto" else client.group.calls.kind)
        plain = client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype=dtype, **KW)
        cached = client.neighbor_loader("train", FANOUTS, prefetch=2, feature_dtype=dtype,
                                        feature_cache_mb=BUDGET_MB, **KW)
        cache = cached.feature_cache
        assert cache is not None and cache.rows.dtype == (torch.bfloat16 if dtype else torch.float32)
        assert 0 < cache.num_rows * cache.row_bytes <= BUDGET_MB * MB < (cache.num_rows + 1) * cache.row_bytes
        for _ in range(2):   # two shuffled epochs
            before = _bytes_served(cluster)
            want = list(plain)
            mid = _bytes_served(cluster)
            got = list(cached)
            after = _bytes_served(cluster)
            assert len(got) == len(want) > 1
            for a, b in zip(got, want):
                assert_same_batch(a, b)
            stats = cached.stats()["feature_cache"]
            assert stats["rows_filled"] > 0 and stats["bytes_filled"] == stats["rows_filled"] * cache.row_bytes
            # on the wire: the filled rows' bytes less, plus 8 bytes (x_cached) per filled row
            assert (mid - before) - (after - mid) == stats["rows_filled"] * (cache.row_bytes - 8)


def test_cache_holds_the_highest_degree_nodes_of_each_part(cluster, graph, parts_dir, monkeypatch, connect):
    monkeypatch.setattr(client_cache, "CHUNK_BYTES", 1000)   # 15 rows per hot_rows call: many chunks per part
    degree = torch.bincount(torch.from_numpy(graph[0][1]), minlength=N)   # in-degree, by original id
    x = torch.from_numpy(graph[1])
    with connect(cluster, timeout=60) as client:
        cache = client.neighbor_loader("train", FANOUTS, feature_cache_mb=BUDGET_MB, **KW).feature_cache
    assert cache is not None
    ids = cache.cached.ids
    assert torch.equal(cache.rows.index_select(0, cache.row_of), x[ids])   # each row is its node's features
    cached = torch.zeros(N, dtype=torch.bool)
    cached[ids] = True
    for part_id in range(2):
        owned = Partition(parts_dir, part_id).nodes("_N").orig_id.to(torch.int64)
        hot, cold = owned[cached[owned]], owned[~cached[owned]]
        assert hot.numel() in (cache.num_rows // 2, cache.num_rows - cache.num_rows // 2)   # the budget, split
        assert int(degree[hot].min()) >= int(degree[cold].max())


def test_link_loader_with_the_cache_equals_without(cluster, graph, connect):
    ei = graph[0]
    seeds = ei[:, ::7][:, :300]
    kw = dict(edge_label_index=seeds, neg_sampling="binary", batch_size=32, shuffle=True, seed=5, prefetch=2)
    with connect(cluster, timeout=60) as client:
        want = list(client.link_neighbor_loader(FANOUTS, **kw))
        loader = client.link_neighbor_loader(FANOUTS, feature_cache_mb=BUDGET_MB, **kw)
        got = list(loader)
        assert loader.stats()["feature_cache"]["rows_filled"] > 0
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert_same_batch(a, b)


def _fallback(client, caplog, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="graphfeed.client"):
        loader = client.neighbor_loader("train", FANOUTS, prefetch=2, **KW, **kw)
    warnings = [r for r in caplog.records if "feature cache" in r.getMessage()]
    assert loader.feature_cache is None and len(warnings) == 1
    return loader, warnings[0].getMessage()


def test_a_cache_that_cannot_be_had_falls_back_with_one_warning(cluster, caplog, monkeypatch, connect):
    with connect(cluster, timeout=60) as client:
        want = list(client.neighbor_loader("train", FANOUTS, prefetch=2, **KW))
        loader, why = _fallback(client, caplog, feature_cache_mb=1e-6)
        assert "holds no row" in why
        assert len(list(loader)) == len(want)

        def out_of_memory(num_rows, like):
            raise RuntimeError("out of memory")

        monkeypatch.setattr(client_cache, "_allocate", out_of_memory)
        _, why = _fallback(client, caplog, feature_cache_mb=BUDGET_MB)
        assert "cannot allocate" in why
        monkeypatch.undo()
        # a server that cannot serve rows (here: the worker answers the call with an error, as an older
        # graphfeed without hot_rows would)
        calls = client.group.calls
        monkeypatch.setattr(calls, "call", lambda part, name, args, timeout, real=calls.call:
                            real(part, "gather" if name == "hot_rows" else name, args, timeout))
        loader, why = _fallback(client, caplog, feature_cache_mb=BUDGET_MB)
        assert "cannot serve feature rows" in why
        for a, b in zip(loader, want):
            assert_same_batch(a, b)


def test_a_bad_cached_set_is_invalid_argument_and_the_servers_stay_up(cluster, connect):
    with connect(cluster, timeout=60) as client:
        req = open_session_request(LoaderSpec.of("train", FANOUTS, **KW), client.group.group_id)
        req.feature_cache.CopyFrom(pb.FeatureCache(node_type="_N", node_ids=[9, 4]))
        for server in client.servers:
            with pytest.raises(gf.InvalidRequest, match="feature_cache: node_ids must be sorted and distinct"):
                server.call("OpenSession", req, timeout=30)
        loader = client.neighbor_loader("train", FANOUTS, feature_cache_mb=BUDGET_MB, **KW)
        assert len(list(loader)) == len(loader) > 1
