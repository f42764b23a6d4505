"""A PyG training script written against ``NodeLoader`` trains on graphfeed's servers (the synthetic ``tiny``
graph, 2 daemons) to the accuracy graphfeed's own loader reaches: with the same seeds, batches and torch seed,
the two runs are the same run."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.gnn import SAGE
from helpers.shared import serving
from torch_geometric.loader import NodeLoader

from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore, GraphfeedSampler

EPOCHS, FANOUTS = 15, [10, 10, 10]


@pytest.fixture(scope="module")
def tiny_cluster(tiny_parts_dir, tmp_path_factory):
    with serving(tiny_parts_dir, log_dir=tmp_path_factory.mktemp("pyg_tiny_logs")) as servers:
        yield servers


def pyg_script(client, train_ids: torch.Tensor, test_ids: torch.Tensor) -> tuple[float, list[float]]:
    """What a PyG user writes (``NodeLoader`` over a feature and graph store), with graphfeed's pieces."""
    fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
    sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=0)
    train_loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=train_ids, batch_size=64)
    test_loader = NodeLoader((fs, gs), node_sampler=GraphfeedSampler(client, [-1, -1, -1], feature_store=fs),
                             input_nodes=test_ids, batch_size=1000)

    def each_epoch(e):
        sampler.set_epoch(e)   # batch i of epoch e gets graphfeed's batch seed (seed, e, i)
        return train_loader

    model, losses = _train(each_epoch)
    return _accuracy(model, test_loader), losses


def graphfeed_script(client, train_ids: torch.Tensor, test_ids: torch.Tensor) -> tuple[float, list[float]]:
    train_loader = client.neighbor_loader(input_nodes=train_ids, num_neighbors=FANOUTS, batch_size=64, seed=0)
    test_loader = client.neighbor_loader(input_nodes=test_ids, num_neighbors=[-1, -1, -1], batch_size=1000)
    model, losses = _train(lambda e: train_loader)
    return _accuracy(model, test_loader), losses


def _train(loader_of_epoch) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    # no dropout: PyG's DataLoader draws from torch's global generator at every iter(), graphfeed's loader does
    # not, so dropout masks would differ although the batches are the same
    model = SAGE([32, 64, 64, 8], dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for epoch in range(EPOCHS):
        model.train()
        total = 0.0
        for batch in loader_of_epoch(epoch):
            opt.zero_grad()
            loss = F.cross_entropy(model(batch.x, batch.edge_index)[:batch.batch_size], batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total)
    return model, losses


@torch.no_grad()
def _accuracy(model, loader) -> float:
    model.eval()
    correct = seen = 0
    for batch in loader:
        pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        seen += batch.batch_size
    return correct / seen


def test_pyg_node_loader_training_reaches_graphfeed_loader_accuracy(tiny_cluster, tiny_graph, connect):
    splits = tiny_graph.splits
    train_ids, test_ids = (torch.from_numpy(np.array(splits[k], dtype=np.int64)) for k in ("train", "test"))
    with connect([s.address for s in tiny_cluster], timeout=60) as client:
        pyg_acc, pyg_losses = pyg_script(client, train_ids, test_ids)
        ours_acc, ours_losses = graphfeed_script(client, train_ids, test_ids)
    print(f"test accuracy: PyG NodeLoader {pyg_acc:.4f}, graphfeed loader {ours_acc:.4f}")
    assert pyg_losses == ours_losses, "the same batches give the same training run"
    assert pyg_acc == ours_acc
    # measured 0.770 (no dropout, 15 epochs, in-order batches; graphfeed's own bar with dropout, shuffling and
    # 25 epochs is 0.85); features alone reach ~29%
    assert pyg_acc >= 0.75, f"test accuracy {pyg_acc:.3f} (features alone: ~29%)"
    assert pyg_losses[-1] < pyg_losses[0]
