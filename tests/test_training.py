"""End-to-end: GraphSAGE trained through LocalNeighborLoader reaches the expected accuracy.

* Cora (public Planetoid split, METIS P=2): >= 78% test accuracy (published GCN: 81.5%;
  this setup measured 80.3-81.4% over torch seeds 0-4).
* synthetic ``tiny`` (random P=2): >= 85% test accuracy (features alone: ~29%; full-batch
  3-layer SAGE tops out near 87%; this setup measured 86.8-87.0% over seeds 0-2).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition import synth
from graphfeed.server.partition.builder import GraphInput, partition_graph

CORA = Path("/work/shared/data/cora")

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread():
    """Small models on shared cores: one intra-op thread is faster and reproducible."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class SAGE(torch.nn.Module):
    def __init__(self, dims: list[int], dropout: float, normalize_rows: bool = False):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.convs = torch.nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout, self.normalize_rows = dropout, normalize_rows

    def forward(self, x, edge_index):
        if self.normalize_rows:  # bag-of-words rows sum to 1 (PyG's NormalizeFeatures)
            x = x / x.sum(1, keepdim=True).clamp(min=1)
        for i, conv in enumerate(self.convs):
            if i or self.normalize_rows:
                x = F.dropout(x, self.dropout, self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def train(model, loader, epochs: int, lr: float, weight_decay: float = 0.0) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        model.train()
        for batch in loader:
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
    return float(loss.detach())


@torch.no_grad()
def accuracy(model, loader, expected_nodes: np.ndarray) -> float:
    model.eval()
    correct, seen = 0, []
    for batch in loader:
        pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        seen.append(batch.n_id[:batch.batch_size])
    seen = torch.cat(seen)
    assert sorted(seen.tolist()) == sorted(expected_nodes.tolist()), "evaluation must cover the test split once"
    return correct / seen.numel()


@pytest.mark.skipif(not (CORA / "edge_index.npy").exists(), reason=f"Cora not found at {CORA}")
def test_cora_graphsage_reaches_78_percent(tmp_path):
    load = lambda name: np.load(CORA / f"{name}.npy")  # noqa: E731
    splits = {s: load(f"{s}_idx") for s in ("train", "val", "test")}
    graph = GraphInput(load("edge_index"), load("x").astype(np.float32), load("y"), splits, name="cora")
    partition_graph(graph, 2, tmp_path / "cora", method="metis")
    torch.manual_seed(0)
    model = SAGE([graph.x.shape[1], 64, 7], dropout=0.5, normalize_rows=True)
    loader = LocalNeighborLoader(tmp_path / "cora", [10, 10], batch_size=140, shuffle=True, seed=0)
    train(model, loader, epochs=50, lr=0.01, weight_decay=5e-4)
    test = LocalNeighborLoader(tmp_path / "cora", [-1, -1], batch_size=1000, input_nodes="test")
    acc = accuracy(model, test, splits["test"])
    assert acc >= 0.78, f"Cora test accuracy {acc:.3f} < 0.78"


def test_tiny_synthetic_graphsage_reaches_85_percent(tmp_path):
    ei, x, y, splits = synth.generate_preset("tiny")
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, tmp_path / "tiny", method="random")
    torch.manual_seed(0)
    model = SAGE([x.shape[1], 64, 64, int(y.max()) + 1], dropout=0.5)
    loader = LocalNeighborLoader(tmp_path / "tiny", [10, 10, 10], batch_size=64, shuffle=True, seed=0)
    train(model, loader, epochs=25, lr=0.01)
    test = LocalNeighborLoader(tmp_path / "tiny", [-1, -1, -1], batch_size=3000, input_nodes="test")
    acc = accuracy(model, test, splits["test"])
    assert acc >= 0.85, f"tiny synthetic test accuracy {acc:.3f} < 0.85"
