"""Disjoint subgraphs and temporal sampling (``disjoint``, ``time_attr``, ``input_time``,
``temporal_strategy``, ``edge_label_time``): node and link loaders, local and through 2 servers.

Times are stored at partition time (``node_time.npy`` / ``edge_time.npy``, here through
``GraphInput``).  Every check walks each sampled edge back to its subgraph's seed: the subgraphs
share no node (every local node has one subgraph and no edge crosses two), every sampled edge is
an edge of the input graph within the fanout, and with ``time_attr`` no sampled neighbour
(``"time"``) or edge (``"edge_time"``) is later than its subgraph's seed time.
"""
from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status, running_cluster

N = 600
FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def graph():
    ei, x, y, splits = synth.generate(N, 6, 8, 3, seed=5)
    rng = np.random.default_rng(1)
    return ei, x, y, splits, rng.integers(0, 1000, N), rng.integers(0, 1000, ei.shape[1])


def _partition(graph, out, times: bool):
    ei, x, y, splits, node_time, edge_time = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3,
                           fingerprint=f"temporal-{N}-{times}", node_time=node_time if times else None,
                           edge_time=edge_time if times else None)
    builder.partition_graph(g, 2, out, method="metis", topologies=("csc",))
    return out


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory):
    return _partition(graph, tmp_path_factory.mktemp("temporal") / "parts", True)


@pytest.fixture(scope="module")
def plain_dir(graph, tmp_path_factory):
    return _partition(graph, tmp_path_factory.mktemp("untimed") / "parts", False)


def check_disjoint(b, ei, fanouts, num_subgraphs: int) -> None:
    """Subgraphs share no node, edges stay in their subgraph, exist in the input, and respect the fanouts."""
    assert b.batch.shape == b.n_id.shape and set(b.batch.tolist()) == set(range(num_subgraphs))
    pairs = set(zip(b.batch.tolist(), b.n_id.tolist()))
    assert len(pairs) == b.n_id.numel(), "a node appears once per subgraph"
    row, col = b.edge_index
    assert torch.equal(b.batch[row], b.batch[col]), "no edge crosses two subgraphs"
    assert torch.equal(torch.from_numpy(ei[0])[b.e_id], b.n_id[row])
    assert torch.equal(torch.from_numpy(ei[1])[b.e_id], b.n_id[col])
    assert int(torch.bincount(col).max()) <= max(fanouts), "no node got more in-edges than the fanout"
    assert row.numel() > 0


def check_temporal(b, ei, node_time, edge_time, time_attr: str, seed_time: torch.Tensor) -> None:
    """No sampled neighbour (or edge) later than the seed time of its subgraph (inherited by every hop)."""
    row, col = b.edge_index
    limit = seed_time[b.batch[col]]
    when = torch.from_numpy(node_time)[b.n_id[row]] if time_attr == "time" else torch.from_numpy(edge_time)[b.e_id]
    assert bool((when <= limit).all()), "a sampled neighbour is later than its seed's time"


def _node_seed_time(b, node_time, input_time=None):
    seeds = b.n_id[:b.batch_size]
    return torch.from_numpy(node_time)[seeds] if input_time is None else input_time[b.input_id]


def test_disjoint_node_batches_are_one_subgraph_per_seed(parts_dir, graph):
    ei = graph[0]
    loader = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True, disjoint=True)
    plain = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True)
    repeated = 0
    for b, p in zip(loader, plain, strict=True):
        check_disjoint(b, ei, FANOUTS, b.batch_size)
        assert torch.equal(b.batch[:b.batch_size], torch.arange(b.batch_size)) and torch.equal(b.input_id, p.input_id)
        repeated += b.n_id.numel() - b.n_id.unique().numel()
    assert repeated > 0, "PyG semantics: a node reached from two seeds is in both subgraphs (n_id repeats)"


@pytest.mark.parametrize("time_attr, strategy", [("time", "uniform"), ("edge_time", "uniform"), ("time", "last")])
def test_temporal_node_batches_never_sample_the_future(parts_dir, graph, time_attr, strategy):
    ei, _, _, _, node_time, edge_time = graph
    loader = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, time_attr=time_attr,
                                 temporal_strategy=strategy, shuffle=True)
    plain = sum(b.edge_index.size(1) for b in LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, disjoint=True))
    edges = 0
    for b in loader:
        check_disjoint(b, ei, FANOUTS, b.batch_size)
        check_temporal(b, ei, node_time, edge_time, time_attr, _node_seed_time(b, node_time))
        assert torch.equal(b.seed_time, _node_seed_time(b, node_time)), "PyG's seed_time: each seed's time"
        edges += b.edge_index.size(1)
    assert 0 < edges < plain, "the time limit removed some neighbours"


def test_last_strategy_takes_the_most_recent_edges(parts_dir, graph):
    ei, _, _, _, _, edge_time = graph
    ids = torch.arange(0, N, 3)
    input_time = torch.full((ids.numel(),), 600, dtype=torch.int64)
    loader = LocalNeighborLoader(parts_dir, [2], batch_size=50, input_nodes=ids, input_time=input_time,
                                 time_attr="edge_time", temporal_strategy="last")
    for b in loader:
        for i, v in enumerate(b.n_id[:b.batch_size].tolist()):
            eligible = [e for e in np.nonzero(ei[1] == v)[0].tolist() if edge_time[e] <= 600]
            want = sorted(eligible, key=lambda e: (edge_time[e], e))[-2:]   # ties: the later list position
            got = b.e_id[b.edge_index[1] == i].tolist()
            assert sorted(edge_time[got].tolist()) == sorted(edge_time[want].tolist()), v


def test_temporal_strategy_per_hop(parts_dir, graph):
    """``["last", "uniform"]``: hop 0 takes each seed's most recent edges (as "last" for every hop does), hop 1
    draws uniformly among its frontier's eligible edges (not what "last" takes there)."""
    ei, _, _, _, node_time, edge_time = graph
    kw = dict(batch_size=32, time_attr="edge_time", shuffle=True, seed=4)
    per_hop = LocalNeighborLoader(parts_dir, FANOUTS, temporal_strategy=["last", "uniform"], **kw)
    last = LocalNeighborLoader(parts_dir, FANOUTS, temporal_strategy="last", **kw)
    assert per_hop.spec.sampling.temporal_strategy == ("last", "uniform")
    hop1_differs = 0
    for b, a in zip(per_hop, last, strict=True):
        check_disjoint(b, ei, FANOUTS, b.batch_size)
        check_temporal(b, ei, node_time, edge_time, "edge_time", _node_seed_time(b, node_time))
        k0 = b.num_sampled_edges[0]
        assert k0 == a.num_sampled_edges[0] and torch.equal(b.e_id[:k0], a.e_id[:k0]), "hop 0 is 'last'"
        hop1_differs += not torch.equal(b.e_id[k0:].sort().values, a.e_id[k0:].sort().values)
    assert hop1_differs > 0, "hop 1 is uniform, not 'last'"
    assert LocalNeighborLoader(parts_dir, FANOUTS, temporal_strategy=["last", "last"], time_attr="time") \
        .spec.sampling.temporal_strategy == "last", "the same for every hop is stored as one value"
    with pytest.raises(ValueError, match=r"temporal_strategy has 1 entries for 2 hops"):
        LocalNeighborLoader(parts_dir, FANOUTS, temporal_strategy=["last"], time_attr="time")
    with pytest.raises(ValueError, match=r"temporal_strategy must be 'uniform' or 'last' or a list of one per hop"):
        LocalNeighborLoader(parts_dir, FANOUTS, temporal_strategy=["last", "first"], time_attr="time")


def test_temporal_link_batches_inherit_the_seed_edge_time(parts_dir, graph):
    ei, _, _, _, node_time, edge_time = graph
    seeds = torch.from_numpy(ei[:, ::9]).contiguous()
    when = torch.from_numpy(edge_time[::9]).contiguous()
    loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=seeds, edge_label_time=when,
                                     time_attr="time", neg_sampling="binary", batch_size=20, shuffle=True)
    for b in loader:
        k = b.input_id.numel()
        check_disjoint(b, ei, FANOUTS, 2 * k)
        sub_time = torch.cat([when[b.input_id], when[b.input_id]])   # binary negative j: seed edge j's time
        check_temporal(b, ei, node_time, edge_time, "time", sub_time)
        assert torch.equal(b.edge_label_time, sub_time), "PyG's edge_label_time, aligned with edge_label_index"
        ends = b.edge_label_index
        assert torch.equal(b.batch[ends[0]], torch.arange(2 * k)) and torch.equal(b.batch[ends[1]], torch.arange(2 * k))


def test_temporal_errors_name_the_argument(parts_dir, plain_dir):
    with pytest.raises(ValueError, match=r"time_attr='edge_time' names no stored time column \(it stores no "):
        LocalNeighborLoader(plain_dir, FANOUTS, time_attr="edge_time", input_nodes=torch.arange(4),
                            input_time=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="input_time has 3 entries for 4 input nodes: give one time per input node"):
        LocalNeighborLoader(parts_dir, FANOUTS, time_attr="time", input_nodes=torch.arange(4),
                            input_time=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="temporal_strategy must be 'uniform' or 'last', got 'first'"):
        LocalNeighborLoader(parts_dir, FANOUTS, time_attr="time", temporal_strategy="first")
    with pytest.raises(ValueError, match="time_attr must name a stored time column"):
        LocalNeighborLoader(parts_dir, FANOUTS, time_attr="stamp")
    with pytest.raises(ValueError, match="needs edge_label_time"):
        LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=torch.tensor([[0], [1]]), time_attr="time")
    spec = LoaderSpec.of(torch.arange(5), FANOUTS, time_attr="edge_time", temporal_strategy="last",
                         input_time=torch.arange(5))
    assert spec.sampling.disjoint and loader_spec_from_proto(open_session_request(spec, "g")) == spec


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def test_remote_disjoint_and_temporal_batches_equal_local(cluster, parts_dir, graph):
    ei, _, _, _, node_time, edge_time = graph
    ids = torch.arange(1, N, 2)
    cases = [dict(input_nodes="train", disjoint=True),
             dict(input_nodes="train", time_attr="time"),
             dict(input_nodes=ids, time_attr="edge_time", temporal_strategy="last",
                  input_time=torch.from_numpy(node_time[1::2]) + 100),
             dict(input_nodes="train", time_attr="edge_time", temporal_strategy=["last", "uniform"])]
    with gf.connect([s.address for s in cluster], timeout=60) as client:
        for kw in cases:
            local = list(LocalNeighborLoader(parts_dir, FANOUTS, batch_size=40, shuffle=True, seed=3, **kw))
            remote = list(client.neighbor_loader(num_neighbors=FANOUTS, batch_size=40, shuffle=True, seed=3,
                                                 prefetch=2, **kw))
            assert len(remote) == len(local) > 1
            for a, b in zip(remote, local, strict=True):
                assert_same_batch(a, b)
                check_disjoint(a, ei, FANOUTS, a.batch_size)
        seeds = torch.from_numpy(ei[:, ::11]).contiguous()
        kw = dict(edge_label_index=seeds, edge_label_time=torch.from_numpy(edge_time[::11]).contiguous(),
                  time_attr="edge_time", neg_sampling={"mode": "triplet", "amount": 2}, batch_size=16, seed=2)
        local = list(LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw))
        remote = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **kw))
        assert len(remote) == len(local) > 1
        for a, b in zip(remote, local, strict=True):
            assert_same_batch(a, b)
        good = open_session_request(LoaderSpec.of(ids, FANOUTS, time_attr="time", input_time=ids), "")
        for change, match in [(lambda r: r.input_time.pop(), "input_time has 299 entries for 300 input nodes"),
                              (lambda r: setattr(r.spec, "temporal_strategy", "first"), "temporal_strategy must be"),
                              (lambda r: setattr(r.spec, "time_attr", "stamp"), "time_attr must name a stored")]:
            req = open_session_request(LoaderSpec.of(ids, FANOUTS), client.group.group_id)
            req.CopyFrom(good)
            req.group_id = client.group.group_id
            change(req)
            with pytest.raises(grpc.RpcError) as info:
                client.servers[0].stub.OpenSession(req, timeout=30, metadata=client.servers[0].metadata)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in info.value.details()
        assert len(list(client.neighbor_loader(num_neighbors=FANOUTS, batch_size=200, time_attr="time"))) > 0
    for s in cluster:
        assert health_status(s.address) == SERVING and s.proc.poll() is None


@pytest.mark.parametrize("kw", [dict(disjoint=True), dict(time_attr="edge_time"),
                                dict(time_attr="time", temporal_strategy="last")])
def test_native_equals_reference_for_disjoint_and_temporal_batches(parts_dir, monkeypatch, kw):
    from graphfeed.server.sampling import dispatch

    if dispatch._NATIVE is None:
        pytest.skip("the native ops are not loaded")
    native = list(LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True, seed=9, **kw))
    monkeypatch.setattr(dispatch, "_NATIVE", None)     # the pure-torch reference from here on
    reference = list(LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True, seed=9, **kw))
    assert len(native) == len(reference) > 1
    for a, b in zip(native, reference, strict=True):
        assert_same_batch(a, b)


def test_times_are_read_from_npy_folders_and_pyg_data_and_stored_per_topology(graph, tmp_path):
    from torch_geometric.data import Data

    from graphfeed.server.partition.format.store import open_parts
    from graphfeed.server.partition.inputs.reader import InputError, read_graph

    ei, x, y, splits, node_time, edge_time = graph
    folder = tmp_path / "g"
    folder.mkdir()
    for name, array in dict(edge_index=ei, x=x, y=y, train_idx=splits["train"], node_time=node_time,
                            edge_time=edge_time).items():
        np.save(folder / f"{name}.npy", array)
    from_npy = read_graph(folder)
    data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y), edge_index=torch.from_numpy(ei),
                train_idx=torch.from_numpy(splits["train"]), time=torch.from_numpy(node_time),
                edge_time=torch.from_numpy(edge_time))
    torch.save(data, tmp_path / "g.pt")
    from_pyg = read_graph(tmp_path / "g.pt")
    assert from_npy.dropped == [] and from_pyg.dropped == [] and from_npy.fingerprint == from_pyg.fingerprint
    builder.partition_graph(from_npy, 2, tmp_path / "p", method="metis", topologies=("csc", "csr"))
    meta, parts = open_parts(tmp_path / "p")
    assert meta.edge_times == ["_N__to___N"]   # edge_type_dirname(("_N", "to", "_N"))
    for part in parts:   # stored times are the input's: per node, per edge (by e_id), per neighbour
        assert torch.equal(part.nodes("_N").time, torch.from_numpy(node_time)[part.orig_id])
        for kind in ("csc", "csr"):
            topo = part.topology(kind)
            assert torch.equal(part.edge_times(part.etype, kind, "edge_time"), torch.from_numpy(edge_time)[topo.eid])
            nbr = torch.from_numpy(node_time)[_orig_of(parts, topo.indices)]
            assert torch.equal(part.edge_times(part.etype, kind, "time"), nbr)
    np.save(folder / "edge_time.npy", edge_time[:-1])
    with pytest.raises(InputError, match="edge_time.npy must be integer timestamps, one per row"):
        read_graph(folder)


def _orig_of(parts, gids: torch.Tensor) -> torch.Tensor:
    """Original ids of global ids (the parts' orig_id arrays one after another)."""
    return torch.cat([p.orig_id for p in parts])[gids]
