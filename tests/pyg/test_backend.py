"""PyG's remote-backend contract over graphfeed (``graphfeed.pyg``) through 2 real daemons.

PyG's own ``NodeLoader`` / ``LinkLoader`` with :class:`GraphfeedSampler` and the graphfeed stores give the
batches graphfeed's remote loaders give for the same seeds (node, link with binary and triplet negatives,
typed seeds) on every key both have; the feature store serves a sampled batch's rows without a call; the
stores read rows by original id and edges by type (and refuse a topology over their bound in one line).
"""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch, same_value
from torch_geometric.loader import LinkLoader, NodeLoader
from torch_geometric.sampler import NegativeSampling

from graphfeed.core.constants import DEFAULT_EDGE_TYPE
from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore, GraphfeedSampler
from graphfeed.pyg import stores as pyg_stores

FANOUTS = [4, 3]
POSITION_KEYS = ("epoch", "seq", "batch_index")   # graphfeed's own batch position (PyG's loaders have none)


def _comparable(batch, drop=()):
    """``batch`` without the keys only one side has: graphfeed's position, PyG's ``num_nodes`` (and ``drop``)."""
    batch = batch.clone()
    for store in batch.stores:
        for key in (*POSITION_KEYS, "num_nodes", *drop):
            if key in store:
                del store[key]
    return batch


def _same(a, b) -> None:
    """:func:`assert_same_batch`, the order of a ``HeteroData``'s stores aside (PyG's filter adds the types with
    features first; graphfeed's batches sort them)."""
    if not hasattr(a, "node_types"):
        assert_same_batch(a, b)
        return
    da, db = a.to_dict(), b.to_dict()
    assert set(da) == set(db), (set(da) ^ set(db))
    for key, value in db.items():
        if isinstance(value, dict):
            assert set(da[key]) == set(value), (key, set(da[key]) ^ set(value))
            for name, v in value.items():
                assert same_value(da[key][name], v), (key, name)
        else:
            assert same_value(da[key], value), key


def _stores(client):
    fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
    return fs, gs


def _no_server_reads(fs, monkeypatch):
    """Count the feature store's reads from the servers (each is one node_rows call per server)."""
    reads = []
    original = fs._read
    monkeypatch.setattr(fs, "_read", lambda *a: (reads.append(a[0]), original(*a))[1])
    return reads


@pytest.mark.parametrize("options", [{}, {"disjoint": True, "replace": True, "direction": "out"}])
def test_node_loader_equals_graphfeed_loader_over_two_epochs(pyg_cluster, connect, monkeypatch, options):
    ids = torch.randperm(3000, generator=torch.Generator().manual_seed(1))[:700]
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, gs = _stores(client)
        sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=5, **options)
        loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=ids, batch_size=64, shuffle=False)
        ours = client.neighbor_loader(input_nodes=ids, num_neighbors=FANOUTS, batch_size=64, shuffle=False, seed=5,
                                      **options)
        reads = _no_server_reads(fs, monkeypatch)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            got, want = list(loader), list(ours)
            assert len(got) == len(want) == 11
            for i, (a, b) in enumerate(zip(got, want)):
                assert (b.epoch, b.batch_index) == (epoch, i)
                assert_same_batch(_comparable(a), _comparable(b))
                assert a.edge_index.size(1) > 0 and a.x.size(0) == a.n_id.numel()
                assert ("batch" in a) == bool(options.get("disjoint"))
        assert reads == [], "x and y came from the sampled batches, not from another call"
        sampler.close()


def test_feature_store_reads_rows_by_original_id_in_one_call_per_server(pyg_cluster, pyg_graph, connect):
    _, x, y, _ = pyg_graph
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, _ = _stores(client)
        assert {(a.group_name, a.attr_name) for a in fs.get_all_tensor_attrs()} == {(None, "x"), (None, "y")}
        index = torch.tensor([2999, 0, 17, 17, 1500])
        got_x, got_y = fs.multi_get_tensor([(None, "x", index), (None, "y", index)])
        assert torch.equal(got_x, torch.from_numpy(np.asarray(x)[index.numpy()]))
        assert torch.equal(got_y, torch.from_numpy(np.asarray(y)[index.numpy()]))
        assert fs.get_tensor_size(None, "x") == (3000, x.shape[1])
        with pytest.raises(IndexError, match="node id 3000 of type '_N' is not in the graph: original ids are 0..2999"):
            fs.get_tensor(None, "x", torch.tensor([3000]))
        with pytest.raises(KeyError, match="stores no 'time'"):
            fs.get_tensor(None, "time", index)
        with pytest.raises(TypeError, match="read-only"):
            fs.put_tensor(torch.zeros(1, 16), None, "x", torch.tensor([0]))


def test_graph_store_pulls_an_edge_type_and_refuses_one_over_its_bound(pyg_cluster, pyg_graph, connect):
    ei = np.asarray(pyg_graph[0])
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        _, gs = _stores(client)
        (attr,) = gs.get_all_edge_attrs()
        assert attr.edge_type == DEFAULT_EDGE_TYPE and attr.size == (3000, 3000)
        row, col = gs.get_edge_index(edge_type=DEFAULT_EDGE_TYPE, layout="coo")
        assert sorted(zip(row.tolist(), col.tolist())) == sorted(zip(ei[0].tolist(), ei[1].tolist()))
        small = GraphfeedGraphStore(client, max_edges=100)
        with pytest.raises(ValueError, match=r"has \d+ edges, more than the 100 this graph store pulls into one "
                                             r"process: keep the topology on the servers"):
            small.get_edge_index(edge_type=DEFAULT_EDGE_TYPE, layout="coo")
        with pytest.raises(ValueError, match="layout 'csr' is not offered"):
            gs.get_edge_index(edge_type=DEFAULT_EDGE_TYPE, layout="csr")


@pytest.mark.parametrize("neg", [NegativeSampling("binary", 1.5), NegativeSampling("triplet", 2), None])
def test_link_loader_equals_graphfeed_link_loader(pyg_cluster, pyg_graph, connect, neg):
    ei = torch.from_numpy(np.asarray(pyg_graph[0]))
    seed_edges = ei[:, ::9].contiguous()
    edge_set = set((ei[0] * 3000 + ei[1]).tolist())
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, gs = _stores(client)
        mode = None if neg is None else dict(mode=neg.mode.value, amount=neg.amount)
        ours = list(client.link_neighbor_loader(FANOUTS, edge_label_index=seed_edges, neg_sampling=mode,
                                                batch_size=48, shuffle=True, seed=3))
        # the same seed edges at the same input positions, batch for batch (graphfeed's batches come part by part)
        order = torch.cat([b.input_id for b in ours])
        bounds = np.cumsum([0] + [b.input_id.numel() for b in ours])
        batches = [list(range(s, e)) for s, e in zip(bounds[:-1], bounds[1:])]
        sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=3)
        # PyG's loaders over (feature store, graph store) name the edge type, also of a homogeneous graph
        loader = LinkLoader((fs, gs), link_sampler=sampler, edge_label_index=(DEFAULT_EDGE_TYPE, seed_edges[:, order]),
                            input_id=order,
                            neg_sampling=neg, batch_sampler=batches)
        got = list(loader)
        assert len(got) == len(ours) > 4
        for i, (a, b) in enumerate(zip(got, ours)):
            assert b.batch_index == i
            assert_same_batch(_comparable(a), _comparable(b, drop=("batch_size",)))
            if neg is not None and neg.is_binary():
                pairs = a.n_id[a.edge_label_index[:, a.input_id.numel():]]
                assert not any(int(s) * 3000 + int(d) in edge_set for s, d in pairs.t())   # strict negatives
        sampler.close()


def test_typed_node_and_link_loaders_equal_graphfeed_loaders(shared_mag_cluster, shared_mag, connect):
    parts, graph = shared_mag
    writes = ("author", "writes", "paper")
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        papers = torch.randperm(client.num_nodes_of("paper"), generator=torch.Generator().manual_seed(2))[:150]
        fs, gs = _stores(client)
        assert {a.group_name for a in fs.get_all_tensor_attrs()} <= set(client.node_types)
        sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=9)
        loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=("paper", papers), batch_size=40)
        ours = client.neighbor_loader(input_nodes=("paper", papers), num_neighbors=FANOUTS, batch_size=40,
                                      shuffle=False, seed=9, ordered=True)
        got, want = list(loader), list(ours)
        assert len(got) == len(want) == 4
        for a, b in zip(got, want):
            _same(_comparable(a), _comparable(b))
        edges = gs.get_edge_index(edge_type=writes, layout="coo")
        want = np.asarray(graph.edges[writes].edge_index)
        assert sorted(zip(*(t.tolist() for t in edges))) == sorted(zip(want[0].tolist(), want[1].tolist()))
        assert {a.edge_type for a in gs.get_all_edge_attrs()} == set(map(tuple, client.edge_types))
        x = fs.get_tensor("paper", "x", papers[:10])
        assert torch.equal(x, torch.from_numpy(np.asarray(graph.nodes["paper"].x)[papers[:10].numpy()]))
        seed_edges = torch.stack(edges)[:, ::50].contiguous()
        mine = list(client.link_neighbor_loader(FANOUTS, edge_label_index=(writes, seed_edges), neg_sampling="binary",
                                                batch_size=32, seed=9))
        order = torch.cat([b[writes].input_id for b in mine])
        bounds = np.cumsum([0] + [b[writes].input_id.numel() for b in mine])
        link = LinkLoader((fs, gs), link_sampler=GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=9),
                          edge_label_index=(writes, seed_edges[:, order]), input_id=order,
                          neg_sampling=NegativeSampling("binary"),
                          batch_sampler=[list(range(s, e)) for s, e in zip(bounds[:-1], bounds[1:])])
        got = list(link)
        assert len(got) == len(mine) > 1
        for a, b in zip(got, mine):
            _same(_comparable(a), _comparable(b, drop=("batch_size",)))


def test_refusals_are_one_line(pyg_cluster, connect):
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        with pytest.raises(ValueError, match="subgraph_type='induced' is not offered"):
            GraphfeedSampler(client, FANOUTS, subgraph_type="induced")
        with pytest.raises(ValueError, match="temporal sampling"):
            GraphfeedSampler(client, FANOUTS, time_attr="time")
        fs, gs = _stores(client)
        sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs)
        loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=torch.tensor([1, 2, 5000]), batch_size=3)
        with pytest.raises(ValueError, match="5000 is outside the graph: original node ids are 0..2999"):
            next(iter(loader))
        ok = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=torch.tensor([1, 2]), batch_size=2)
        assert next(iter(ok)).n_id[:2].tolist() == [1, 2]   # the server is still up
        assert pyg_stores.KEPT_BATCHES >= 1
        sampler.close()
        # a sampler dropped without close() hands its sessions to the client, which closes them
        dropped = GraphfeedSampler(client, FANOUTS)
        dropped._open_sessions()
        before = len(client._orphans)
        del dropped
        gc.collect()
        assert len(client._orphans) == before + len(client.servers)
