"""End-to-end accuracy through the service: GraphSAGE trained on batches pulled from two real
``graphfeed serve`` daemons (loopback) through ``graphfeed.client``.

* synthetic ``tiny`` (METIS P=2), 3-layer GraphSAGE: >= 85% test accuracy (features alone ~29%).
* Cora (Planetoid public split, METIS P=2), 2-layer GraphSAGE: >= 78% test accuracy
  (skipped when ``../shared/data/cora`` is absent).

Seeds are fixed (torch seed, loader seed), so a run is reproducible; the remote batches equal
the local loader's, so these are the local-loader figures of ``test_training.py`` reached
through the servers.  The test split is evaluated once over every test node (checked).
Each test takes ~30 s on an idle 2-core box (servers included).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphfeed.client as gf
from graphfeed.server.partition import synth
from graphfeed.server.partition.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs import read_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers_cluster import running_cluster  # noqa: E402

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


def train(model, loader, epochs: int, lr: float, weight_decay: float = 0.0) -> list[float]:
    """Train; returns the mean loss of each epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(epochs):
        model.train()
        total = steps = 0
        for batch in loader:
            opt.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            opt.step()
            total, steps = total + loss.detach().item(), steps + 1
        losses.append(total / steps)
    return losses


@torch.no_grad()
def accuracy(model, loader, expected_nodes: np.ndarray) -> float:
    model.eval()
    correct, seen = 0, []
    for batch in loader:
        pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(1)
        correct += int((pred == batch.y[:batch.batch_size]).sum())
        seen.append(batch.n_id[:batch.batch_size])
    seen = torch.cat(seen)
    assert sorted(seen.tolist()) == sorted(np.asarray(expected_nodes).tolist()), "test split must be covered once"
    return correct / seen.numel()


def _train_through_servers(parts: Path, logs: Path, model, *, fanouts, batch_size, epochs, lr, weight_decay=0.0,
                           test_fanouts, test_nodes) -> tuple[float, list[float]]:
    with running_cluster(parts, log_dir=logs) as servers:
        assert len(servers) == 2
        with gf.connect([s.address for s in servers], timeout=60) as client:
            assert client.num_parts == 2
            loader = client.neighbor_loader("train", fanouts, batch_size=batch_size, shuffle=True, seed=0)
            losses = train(model, loader, epochs, lr, weight_decay)
            test = client.neighbor_loader("test", test_fanouts, batch_size=2048)
            return accuracy(model, test, test_nodes), losses


def test_tiny_synthetic_through_two_servers_reaches_85_percent(tmp_path):
    ei, x, y, splits = synth.generate_preset("tiny")
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, tmp_path / "tiny", method="metis", seed=0)
    torch.manual_seed(0)
    model = SAGE([x.shape[1], 64, 64, int(y.max()) + 1], dropout=0.5)
    acc, losses = _train_through_servers(tmp_path / "tiny", tmp_path, model, fanouts=[10, 10, 10], batch_size=64,
                                         epochs=25, lr=0.01, test_fanouts=[-1, -1, -1], test_nodes=splits["test"])
    assert losses[-1] < losses[0] / 2, f"training loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert acc >= 0.85, f"tiny synthetic test accuracy through 2 servers {acc:.3f} < 0.85"


@pytest.fixture(scope="module")
def cora(cora_dir) -> GraphInput:
    return read_graph(cora_dir)


def test_cora_through_two_servers_reaches_78_percent(cora, tmp_path):
    partition_graph(cora, 2, tmp_path / "cora", method="metis", seed=0)
    torch.manual_seed(0)
    model = SAGE([cora.x.shape[1], 64, int(cora.y.max()) + 1], dropout=0.5, normalize_rows=True)
    acc, losses = _train_through_servers(tmp_path / "cora", tmp_path, model, fanouts=[10, 10], batch_size=140,
                                         epochs=50, lr=0.01, weight_decay=5e-4, test_fanouts=[-1, -1],
                                         test_nodes=cora.splits["test"])
    assert losses[-1] < losses[0] / 2, f"training loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert acc >= 0.78, f"Cora test accuracy through 2 servers {acc:.3f} < 0.78"
