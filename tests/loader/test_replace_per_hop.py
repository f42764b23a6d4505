"""Per-hop ``replace`` (``replace=[False, True]``): the option added end to end through the options table.

Sampled edges exist in the graph, each hop keeps its fanout bound (with replacement a node with
neighbours gets exactly ``fanout`` draws, repeats allowed; without, ``min(degree, fanout)`` distinct
ones), the local loader equals the remote one batch for batch, and bad values are one-line errors.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.core.spec import LoaderSpec, SamplingSpec
from graphfeed.proto.convert import sampling_from_proto, sampling_to_proto
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

NUM_NODES = 600
FANOUTS = [4, 6]
REPLACE = [False, True]


@pytest.fixture(scope="module")
def graph():
    return synth.generate(NUM_NODES, 5, 8, 3)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    ei, x, y, splits = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3, fingerprint="replace-per-hop")
    out = tmp_path_factory.mktemp("replace_per_hop") / "parts"
    builder.partition_graph(g, 2, out, method="random", topologies=("csc",))
    return out


def _in_neighbors(graph) -> dict[int, set[int]]:
    ei = graph[0]
    out: dict[int, set[int]] = {}
    for s, d in zip(ei[0].tolist(), ei[1].tolist()):
        out.setdefault(d, set()).add(s)
    return out


def test_spec_stores_per_hop_replace_and_round_trips_the_control_plane():
    spec = SamplingSpec((4, 6), replace=[False, True])
    assert spec.replace == (False, True) and spec.per_hop
    assert [spec.replace_at(h) for h in range(2)] == [False, True]
    assert spec.at_hop(1).replace is True and not spec.at_hop(1).per_hop
    assert SamplingSpec((4, 6), replace=[True, True]).replace is True   # the same for every hop: one bool
    assert sampling_from_proto(sampling_to_proto(spec)) == spec
    with pytest.raises(ValueError, match="replace has 3 entries for 2 hops"):
        SamplingSpec((4, 6), replace=[True, False, True])
    with pytest.raises(ValueError, match="replace must be a bool or a list of one per hop"):
        LoaderSpec.of("train", [4, 6], replace=[1, 0], rank=0, world_size=1)


def test_local_batches_keep_each_hops_bound_and_sample_real_edges(parts_dir, graph):
    nbrs = _in_neighbors(graph)
    loader = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=16, replace=REPLACE, seed=3, input_nodes=None)
    repeats = 0
    for batch in loader:
        n_id, (src, dst) = batch.n_id, batch.edge_index
        hop_edges = batch.num_sampled_edges
        hop_nodes = batch.num_sampled_nodes
        start = 0
        for hop, (count, fanout) in enumerate(zip(hop_edges, FANOUTS)):
            s, d = src[start:start + count], dst[start:start + count]
            start += count
            centers = n_id[d].tolist()
            for center in set(centers):
                drawn = [int(n_id[v]) for v, c in zip(s.tolist(), centers) if c == center]
                assert set(drawn) <= nbrs.get(center, set()), "a sampled edge is not in the graph"
                if REPLACE[hop]:
                    assert len(drawn) == fanout     # with replacement: exactly fanout draws
                    repeats += len(drawn) - len(set(drawn))
                else:
                    assert len(drawn) == len(set(drawn)) == min(fanout, len(nbrs[center]))
        assert sum(hop_nodes) == n_id.numel()
    assert repeats > 0, "the replace hop never drew a neighbour twice"


def test_same_batches_as_one_replace_for_every_hop_when_the_list_agrees(parts_dir):
    a = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, replace=[True, True], seed=5)
    b = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, replace=True, seed=5)
    for x, y in zip(a, b):
        assert_same_batch(x, y)


def test_remote_equals_local(parts_dir, tmp_path):
    local = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, replace=REPLACE, shuffle=True, seed=11)
    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers:
        with gf.connect([s.address for s in servers], timeout=60) as client:
            remote = client.neighbor_loader("train", FANOUTS, batch_size=32, replace=REPLACE, shuffle=True, seed=11)
            got, want = list(remote), list(local)
            assert len(got) == len(want) > 0
            for a, b in zip(got, want):
                assert_same_batch(a, b)
            sample = client.sample(np.arange(5), FANOUTS, replace=REPLACE, seed=2)
            assert sample.n_id[:5].tolist() == list(range(5))
            with pytest.raises(ValueError, match="replace has 1 entries for 2 hops"):
                client.neighbor_loader("train", FANOUTS, replace=[True])
    assert torch.is_tensor(got[0].n_id)
