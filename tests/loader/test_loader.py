"""LocalNeighborLoader over a partitioned synthetic `tiny` graph."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs import synth

FANOUT = [10, 5]


@pytest.fixture(scope="module")
def tiny():
    ei, x, y, splits = synth.generate_preset("tiny")
    return {"edge_index": ei, "x": x, "y": y, "splits": splits}


@pytest.fixture(scope="module", params=[1, 2], ids=lambda p: f"P{p}")
def parts(request, tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tiny{request.param}") / "parts"
    method = "metis" if request.param > 1 else "random"
    partition_graph(GraphInput(tiny["edge_index"], tiny["x"], tiny["y"], tiny["splits"], name="tiny"),
                    request.param, root, method=method)
    return root


def _seeds(batch) -> list[int]:
    return batch.n_id[:batch.batch_size].tolist()


@pytest.mark.parametrize("shuffle", [False, True])
def test_one_epoch_delivers_every_train_node_once(parts, tiny, shuffle):
    loader = LocalNeighborLoader(parts, FANOUT, batch_size=128, shuffle=shuffle, seed=1)
    batches = list(loader)
    assert len(batches) == len(loader)
    seeds = [s for b in batches for s in _seeds(b)]
    assert sorted(seeds) == tiny["splits"]["train"].tolist()
    assert all(1 <= b.batch_size <= 128 for b in batches)
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert {b.epoch for b in batches} == {0}


def test_batches_are_pyg_data_with_original_features(parts, tiny):
    from torch_geometric.data import Data

    ei = torch.from_numpy(tiny["edge_index"])
    loader = LocalNeighborLoader(parts, FANOUT, batch_size=200, shuffle=True)
    for b in loader:
        assert isinstance(b, Data)
        n = b.n_id.numel()
        assert b.x.shape == (n, tiny["x"].shape[1]) and b.x.dtype == torch.float32
        assert torch.equal(b.x, torch.from_numpy(tiny["x"][b.n_id.numpy()]))
        assert torch.equal(b.y, torch.from_numpy(tiny["y"][b.n_id.numpy()]))
        assert b.num_nodes == n and sum(b.num_sampled_nodes) == n
        assert b.edge_index.size(1) == b.e_id.numel() == sum(b.num_sampled_edges)
        assert int(b.edge_index.max()) < n
        # edge_index in local ids, true direction: e_id's input edge joins the same original nodes.
        assert torch.equal(ei[0, b.e_id], b.n_id[b.edge_index[0]])
        assert torch.equal(ei[1, b.e_id], b.n_id[b.edge_index[1]])
        # Hop 1 edges point into the seeds (PyG's in-edge convention).
        assert bool((b.edge_index[1, :b.num_sampled_edges[0]] < b.batch_size).all())


def test_epochs_advance_and_set_epoch(parts):
    loader = LocalNeighborLoader(parts, FANOUT, batch_size=256, shuffle=True, seed=4)
    e0, e1 = list(loader), list(loader)
    assert {b.epoch for b in e0} == {0} and {b.epoch for b in e1} == {1}
    assert [_seeds(b) for b in e0] != [_seeds(b) for b in e1]
    loader.set_epoch(0)
    again = list(loader)
    assert [_seeds(b) for b in again] == [_seeds(b) for b in e0]
    assert all(torch.equal(a.edge_index, b.edge_index) and torch.equal(a.n_id, b.n_id) for a, b in zip(again, e0))


def test_same_arguments_same_batches(parts):
    a = list(LocalNeighborLoader(parts, FANOUT, batch_size=300, shuffle=True, seed=9))
    b = list(LocalNeighborLoader(parts, FANOUT, batch_size=300, shuffle=True, seed=9))
    c = list(LocalNeighborLoader(parts, FANOUT, batch_size=300, shuffle=True, seed=10))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in ("n_id", "e_id", "edge_index", "x", "y"):
            assert torch.equal(x[key], y[key])
    assert [_seeds(x) for x in a] != [_seeds(x) for x in c]


def test_input_nodes_tensor_of_original_ids(parts, tiny):
    ids = torch.from_numpy(tiny["splits"]["test"][::37].copy())
    loader = LocalNeighborLoader(parts, [-1], batch_size=50, input_nodes=ids)
    batches = list(loader)
    assert sorted(s for b in batches for s in _seeds(b)) == sorted(ids.tolist())
    # fanout -1: every in-edge of each seed is present.
    in_deg = np.bincount(tiny["edge_index"][1], minlength=tiny["x"].shape[0])
    assert sum(b.edge_index.size(1) for b in batches) == int(in_deg[ids.numpy()].sum())


@pytest.mark.parametrize("split", ["val", "test"])
def test_input_nodes_split_name(parts, tiny, split):
    loader = LocalNeighborLoader(parts, [2], batch_size=4096, input_nodes=split)
    assert sorted(s for b in loader for s in _seeds(b)) == tiny["splits"][split].tolist()


def test_input_nodes_none_means_all_nodes(parts, tiny):
    loader = LocalNeighborLoader(parts, [1], batch_size=4096, input_nodes=None)
    assert sorted(s for b in loader for s in _seeds(b)) == list(range(tiny["x"].shape[0]))


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_equal_disjoint_batches_covering_train(parts, tiny, world):
    per_rank = [list(LocalNeighborLoader(parts, FANOUT, batch_size=100, shuffle=True, seed=2, rank=r,
                                         world_size=world)) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1
    seeds = [set(s for b in batches for s in _seeds(b)) for batches in per_rank]
    for i in range(world):
        for j in range(i + 1, world):
            assert not seeds[i] & seeds[j]
    assert sorted(set().union(*seeds)) == tiny["splits"]["train"].tolist()
    assert sum(len(s) for s in seeds) == len(tiny["splits"]["train"])


def test_drop_last_yields_only_full_batches(parts, tiny):
    loader = LocalNeighborLoader(parts, FANOUT, batch_size=128, shuffle=True, drop_last=True, rank=1, world_size=2)
    batches = list(loader)
    assert batches and all(b.batch_size == 128 for b in batches)
    assert len(batches) == len(loader)


def test_replace_and_out_direction_arguments(parts):
    b = next(iter(LocalNeighborLoader(parts, [3], batch_size=64, replace=True)))
    # with replacement every seed with in-edges gets exactly 3 draws
    assert b.num_sampled_edges[0] == 3 * int((torch.bincount(b.edge_index[1], minlength=64)[:64] > 0).sum())
    with pytest.raises(Exception, match="(?i)csr"):
        next(iter(LocalNeighborLoader(parts, [3], batch_size=64, direction="out")))


def test_bad_arguments_are_clear_errors(parts, tiny):
    with pytest.raises(ValueError, match="not in the graph"):
        LocalNeighborLoader(parts, FANOUT, input_nodes=torch.tensor([0, 10_000_000]))
    mask = torch.zeros(tiny["x"].shape[0], dtype=torch.bool)
    mask[[3, 70, 900]] = True       # a boolean mask is PyG's other form: its True positions are the seeds
    seeds = [s for b in LocalNeighborLoader(parts, FANOUT, input_nodes=mask, batch_size=8)
             for s in b.n_id[:b.batch_size].tolist()]
    assert sorted(seeds) == [3, 70, 900]
    with pytest.raises(ValueError, match="integer node ids"):
        LocalNeighborLoader(parts, FANOUT, input_nodes=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="1 repeated id"):
        LocalNeighborLoader(parts, FANOUT, input_nodes=torch.tensor([5, 7, 5]))
    with pytest.raises(ValueError, match="unknown split"):
        LocalNeighborLoader(parts, FANOUT, input_nodes="training")
    with pytest.raises(ValueError, match="list of per-hop fanouts"):
        LocalNeighborLoader(parts, 10)
    with pytest.raises(ValueError, match="invalid fanout"):
        LocalNeighborLoader(parts, [10, 0])
    with pytest.raises(ValueError, match="batch_size"):
        LocalNeighborLoader(parts, FANOUT, batch_size=0)
    with pytest.raises(ValueError, match="world_size"):
        LocalNeighborLoader(parts, FANOUT, rank=2, world_size=2)
    with pytest.raises(ValueError, match="direction"):
        LocalNeighborLoader(parts, FANOUT, direction="both")
