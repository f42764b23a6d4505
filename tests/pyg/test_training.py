"""A PyG training script written against ``NodeLoader`` trains on graphfeed's servers to the accuracy graphfeed's
own loader reaches: with the same seeds, batches and torch seed, the two runs are the same run."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from helpers.gnn import SAGE
from torch_geometric.loader import NodeLoader

from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore, GraphfeedSampler

EPOCHS, FANOUTS = 8, [10, 5]


def pyg_script(client, train_ids: torch.Tensor, test_ids: torch.Tensor) -> tuple[float, list[float]]:
    """What a PyG user writes (``NodeLoader`` over a feature and graph store), with graphfeed's pieces."""
    fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
    sampler = GraphfeedSampler(client, FANOUTS, feature_store=fs, seed=0)
    train_loader = NodeLoader((fs, gs), node_sampler=sampler, input_nodes=train_ids, batch_size=32)
    test_loader = NodeLoader((fs, gs), node_sampler=GraphfeedSampler(client, [-1, -1], feature_store=fs),
                             input_nodes=test_ids, batch_size=1000)

    def each_epoch(e):
        sampler.set_epoch(e)   # batch i of epoch e gets graphfeed's batch seed (seed, e, i)
        return train_loader

    model, losses = _train(each_epoch)
    return _accuracy(model, test_loader), losses


def graphfeed_script(client, train_ids: torch.Tensor, test_ids: torch.Tensor) -> tuple[float, list[float]]:
    train_loader = client.neighbor_loader(input_nodes=train_ids, num_neighbors=FANOUTS, batch_size=32, seed=0)
    test_loader = client.neighbor_loader(input_nodes=test_ids, num_neighbors=[-1, -1], batch_size=1000)
    model, losses = _train(lambda e: train_loader)
    return _accuracy(model, test_loader), losses


def _train(loader_of_epoch) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    model = SAGE([16, 64, 4], dropout=0.5)
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


def test_pyg_node_loader_training_reaches_graphfeed_loader_accuracy(pyg_cluster, pyg_graph, connect):
    splits = pyg_graph[3]
    train_ids, test_ids = (torch.from_numpy(np.asarray(splits[k])) for k in ("train", "test"))
    with connect([s.address for s in pyg_cluster], timeout=60) as client:
        pyg_acc, pyg_losses = pyg_script(client, train_ids, test_ids)
        ours_acc, ours_losses = graphfeed_script(client, train_ids, test_ids)
    print(f"test accuracy: PyG NodeLoader {pyg_acc:.4f}, graphfeed loader {ours_acc:.4f}")
    assert pyg_losses == ours_losses, "the same batches give the same training run"
    assert pyg_acc == ours_acc
    assert pyg_acc >= 0.6, f"test accuracy {pyg_acc:.3f} (4 classes: chance 0.25)"
    assert pyg_losses[-1] < pyg_losses[0]
