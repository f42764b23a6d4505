"""``ordered=True``: seeds in input order (local and remote), and remote "every node" == local."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

FANOUTS = [3, 2]
NUM_NODES = 1200


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    ei, x, y, splits = synth.generate(NUM_NODES, 6, 8, 4)
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, fingerprint="ordered-1200")
    out = tmp_path_factory.mktemp("ordered") / "parts"
    builder.partition_graph(g, 2, out, method="metis")
    return out


@pytest.fixture(scope="module")
def client(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        with gf.connect([s.address for s in servers], timeout=60) as c:
            yield c


def _seeds(batches) -> torch.Tensor:
    return torch.cat([b.n_id[:b.batch_size] for b in batches])


def _input_ids(batches) -> torch.Tensor:
    return torch.cat([b.input_id for b in batches])


def _mixed_ids(parts_dir) -> torch.Tensor:
    """Ids interleaved from both parts (so every ordered batch spans the two partitions)."""
    _, parts = open_parts(parts_dir)
    a, b = parts[0].orig_id[:150], parts[1].orig_id[:150]
    return torch.stack([b, a], 1).reshape(-1)[torch.randperm(300, generator=torch.Generator().manual_seed(1))]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ordered_delivers_the_input_in_order_across_parts_remote_equals_local(client, parts_dir, drop_last):
    ids = _mixed_ids(parts_dir)
    common = dict(batch_size=32, shuffle=False, ordered=True, drop_last=drop_last, seed=4)
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=ids, **common))
    with client.neighbor_loader(ids, FANOUTS, **common) as loader:
        remote = list(loader)
        assert loader.state_dict() == _local_state(parts_dir, ids, common)
    assert len(remote) == len(local) == (300 // 32 if drop_last else 10)
    for r, l_ in zip(remote, local):
        assert_same_batch(r, l_)
    n = sum(b.batch_size for b in remote)
    assert torch.equal(_seeds(remote), ids[:n]) and torch.equal(_input_ids(remote), torch.arange(n))
    owners = open_parts(parts_dir)[1][0].to_global(ids[:32])[0]
    assert 0 < int(owners.sum()) < 32, "the first batch takes seeds of both partitions"


def _local_state(parts_dir, ids, common) -> dict:
    loader = LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=ids, **common)
    list(loader)
    return loader.state_dict()


def test_ordered_two_ranks_exactly_once_in_order(client, parts_dir):
    ids = _mixed_ids(parts_dir)
    ranks = []
    for rank in range(2):
        common = dict(batch_size=50, shuffle=False, ordered=True, rank=rank, world_size=2)
        with client.neighbor_loader(ids, FANOUTS, **common) as loader:
            remote = list(loader)
        local = list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=ids, **common))
        for r, l_ in zip(remote, local, strict=True):
            assert_same_batch(r, l_)
        ranks.append(remote)
    assert len(ranks[0]) == len(ranks[1]) == 3
    merged = [b for pair in zip(*ranks) for b in pair]       # batch i went to rank i mod 2
    assert torch.equal(_seeds(merged), ids) and torch.equal(_input_ids(merged), torch.arange(300))


def test_ordered_every_node_is_original_id_order(client, parts_dir):
    common = dict(batch_size=256, shuffle=False, ordered=True)
    remote = list(client.neighbor_loader(None, FANOUTS, **common))
    local = list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=None, **common))
    for r, l_ in zip(remote, local, strict=True):
        assert_same_batch(r, l_)
    assert torch.equal(_seeds(remote), torch.arange(NUM_NODES))
    assert torch.equal(_input_ids(remote), torch.arange(NUM_NODES))


def test_every_node_unordered_remote_equals_local_input_id_and_state(client, parts_dir):
    common = dict(batch_size=200, shuffle=True, seed=2)
    local_loader = LocalNeighborLoader(parts_dir, FANOUTS, input_nodes=None, **common)
    local = list(local_loader)
    with client.neighbor_loader(None, FANOUTS, **common) as loader:
        remote = list(loader)
        assert loader.state_dict() == local_loader.state_dict()
    for r, l_ in zip(remote, local, strict=True):
        assert_same_batch(r, l_)
    assert sorted(_input_ids(remote).tolist()) == list(range(NUM_NODES))
    assert sorted(_seeds(remote).tolist()) == list(range(NUM_NODES))


@pytest.mark.parametrize("kwargs, message", [
    (dict(input_nodes=torch.arange(10), shuffle=True), "use it with shuffle=False"),
    (dict(input_nodes="train"), "ordered=True needs input_nodes as ids .* the split 'train'"),
])
def test_ordered_refuses_shuffle_and_splits(client, parts_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LocalNeighborLoader(parts_dir, FANOUTS, ordered=True, **kwargs)
    with pytest.raises(ValueError, match=message):
        client.neighbor_loader(num_neighbors=FANOUTS, ordered=True, **kwargs)
