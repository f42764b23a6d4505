"""PyG's own loaders over graphfeed's stores, as a PyG script writes them (``graphfeed.pyg.loaders``).

``NeighborLoader`` / ``LinkNeighborLoader`` without ``neighbor_sampler`` pick :class:`GraphfeedSampler`; a plain
``edge_label_index`` tensor means the one edge type (a typed graph: a graphfeed ValueError naming the form);
batches started ahead are the loader's batches and keep graphfeed's seeding, however other calls interleave;
``graphfeed bench pyg`` reports both loaders' seeds/s.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch
from torch_geometric.loader import LinkNeighborLoader, NeighborLoader
from torch_geometric.sampler import NodeSamplerInput

from graphfeed.core.constants import DEFAULT_EDGE_TYPE
from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore, GraphfeedSampler

FANOUTS = [4, 3]
ONLY_GRAPHFEED = ("epoch", "seq", "batch_index")
ONLY_PYG = ("num_nodes",)


def _comparable(batch, drop=()):
    batch = batch.clone()
    for store in batch.stores:
        for key in (*ONLY_GRAPHFEED, *ONLY_PYG, *drop):
            if key in store:
                del store[key]
    return batch


def _count_calls(sampler, monkeypatch) -> list:
    """The sampler's one-at-a-time calls (a batch started ahead makes none)."""
    calls: list = []
    original = sampler._call
    monkeypatch.setattr(sampler, "_call", lambda *a: (calls.append(a[2]), original(*a))[1])
    return calls


def test_neighbor_loader_picks_graphfeeds_sampler_and_its_batches_ahead_are_the_loaders(pyg_cluster, connect,
                                                                                         monkeypatch):
    ids = torch.randperm(3000, generator=torch.Generator().manual_seed(4))[:600]
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
        loader = NeighborLoader((fs, gs), num_neighbors=FANOUTS, input_nodes=ids, batch_size=64, shuffle=False)
        sampler = loader.node_sampler
        assert isinstance(sampler, GraphfeedSampler) and sampler.feature_store is fs and sampler.prefetch > 0
        ours = client.neighbor_loader(input_nodes=ids, num_neighbors=FANOUTS, batch_size=64, shuffle=False, seed=0)
        calls = _count_calls(sampler, monkeypatch)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            got, want = list(loader), list(ours)
            assert len(got) == len(want) == 10
            for a, b in zip(got, want):
                assert_same_batch(_comparable(a), _comparable(b))
        assert calls == [], "every batch was started ahead and taken by the loader's own call"
        sampler.close()


def test_batches_ahead_keep_the_seeding_when_other_calls_interleave(pyg_cluster, connect, monkeypatch):
    """A sampler call for other seeds between the loader's batches takes the next batch number with or without
    batches ahead: the loader's batches after it are the same either way, and still started ahead."""
    ids = torch.arange(0, 3000, 7)
    other = NodeSamplerInput(input_id=None, node=torch.tensor([5, 6, 8]))
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
        runs = []
        for prefetch in (0, 3):
            sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=2, prefetch=prefetch)
            loader = NeighborLoader((fs, gs), num_neighbors=FANOUTS, input_nodes=ids, batch_size=50,
                                    neighbor_sampler=sampler)
            calls = _count_calls(sampler, monkeypatch)
            got = []
            for i, batch in enumerate(loader):
                got.append(batch)
                if i in (1, 4):
                    got.append(sampler.sample_from_nodes(other).node)
            runs.append(got)
            assert len(calls) == (11 if prefetch == 0 else 2)   # ahead: only the two calls between the loader's
            sampler.close()
        assert len(runs[0]) == len(runs[1]) == 9 + 2
        for a, b in zip(*runs):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, b)
            else:
                assert_same_batch(_comparable(a), _comparable(b))


def test_link_neighbor_loader_takes_a_plain_edge_label_index(pyg_cluster, pyg_graph, connect, monkeypatch):
    ei = torch.from_numpy(np.asarray(pyg_graph[0]))
    seed_edges = ei[:, ::11].contiguous()
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
        plain = LinkNeighborLoader((fs, gs), num_neighbors=FANOUTS, edge_label_index=seed_edges, batch_size=100,
                                   neg_sampling="binary")
        typed = LinkNeighborLoader((fs, gs), num_neighbors=FANOUTS, edge_label_index=(DEFAULT_EDGE_TYPE, seed_edges),
                                   batch_size=100, neg_sampling="binary")
        calls = _count_calls(plain.link_sampler, monkeypatch)
        got, want = list(plain), list(typed)
        assert calls == [], "a link loader's batches are started ahead too"
        assert len(got) == len(want) == -(-seed_edges.size(1) // 100)
        for a, b in zip(got, want):
            assert_same_batch(a, b)
        every = LinkNeighborLoader((fs, gs), num_neighbors=FANOUTS, edge_label_index=None, batch_size=4096)
        assert sum(int(b.input_id.numel()) for b in every) == ei.size(1)   # None: every edge, as over a Data
        for loader in (plain, typed, every):
            loader.link_sampler.close()


def test_plain_edge_label_index_on_a_typed_graph_names_the_typed_form(shared_mag_cluster, connect):
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
        with pytest.raises(ValueError, match=r"edge_label_index names no edge type and the graph has 5: pass "
                                             r"edge_label_index=\(\(src, rel, dst\), edge_label_index\)"):
            LinkNeighborLoader((fs, gs), num_neighbors=FANOUTS, edge_label_index=torch.tensor([[0], [1]]),
                               batch_size=4)
        papers = torch.arange(200)
        loader = NeighborLoader((fs, gs), num_neighbors=FANOUTS, input_nodes=("paper", papers), batch_size=50)
        ours = client.neighbor_loader(input_nodes=("paper", papers), num_neighbors=FANOUTS, batch_size=50,
                                      shuffle=False, seed=0, ordered=True)
        got, want = list(loader), list(ours)
        assert len(got) == len(want) == 4
        for a, b in zip(got, want):
            assert torch.equal(a["paper"].n_id, b["paper"].n_id) and torch.equal(a["paper"].x, b["paper"].x)
        loader.node_sampler.close()


def test_pyg_loaders_over_other_data_keep_pygs_sampler(pyg_graph):
    from torch_geometric.data import Data
    from torch_geometric.sampler import NeighborSampler

    ei, x, _, _ = pyg_graph
    data = Data(x=torch.from_numpy(np.asarray(x)), edge_index=torch.from_numpy(np.asarray(ei)), num_nodes=3000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # PyG's note on sampling without pyg-lib
        sampler = NeighborLoader(data, num_neighbors=FANOUTS, batch_size=8).node_sampler
    assert isinstance(sampler, NeighborSampler) and not isinstance(sampler, GraphfeedSampler)


def test_bench_pyg_reports_both_loaders(pyg_cluster):
    from graphfeed.bench.pyg import PygBenchConfig, bench_pyg

    cfg = PygBenchConfig(servers=tuple(s.address for s in pyg_cluster), num_neighbors=(4, 3), batch_size=100,
                         input_count=300, rounds=2)
    result = bench_pyg(cfg)
    assert set(result["seeds_per_s"]) == {"graphfeed", "pyg"}
    assert all(v["min"] > 0 for v in result["seeds_per_s"].values())
    assert len(result["ratios"]) == 2 and result["ratio"] > 0 and not result["typed"]
    assert len(result["load_avg_1m"]) == 2
