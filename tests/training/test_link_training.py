"""Link prediction on Cora through 2 real servers: GraphSAGE + dot-product decoder beats features alone.

10% of Cora's undirected edges are held out as test positives (both directions removed from the
graph the servers hold), with as many uniform non-edges as test negatives.  Training seeds are
the remaining edges (both directions) with binary strict negatives (ratio 1), through
``client.link_neighbor_loader`` on 2 servers (METIS, 2 parts); the test edges go through a
second link loader with their labels.  The features-only baseline is the same encoder with
``Linear`` layers instead of ``SAGEConv`` (no message passing), trained on the same batches.

Measured (torch seed 0, shared 2-core machine; the runs are deterministic): 10 epochs --
GraphSAGE test ROC-AUC 0.868, MLP baseline 0.801; 20 epochs -- 0.909 vs 0.848.  For scale, the
same MLP trained full-batch in-process for the same 190 steps reaches 0.845: Cora's features
alone predict links well, so the margin asserted is GraphSAGE >= 0.84 and >= baseline + 0.04.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import graphfeed.client as gf
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs.reader import read_graph
from graphfeed.testing.cluster import running_cluster

pytestmark = pytest.mark.slow

EPOCHS = 10
FANOUTS = [10, 5]


class Encoder(torch.nn.Module):
    """Two layers: SAGEConv (message passing) or Linear (features only); rows normalized to sum 1."""

    def __init__(self, dims: list[int], graph: bool):
        from torch_geometric.nn import SAGEConv

        super().__init__()
        self.graph = graph
        self.layers = torch.nn.ModuleList(SAGEConv(a, b) if graph else torch.nn.Linear(a, b)
                                          for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x, edge_index):
        x = x / x.sum(1, keepdim=True).clamp(min=1)
        for i, layer in enumerate(self.layers):
            x = F.dropout(x, 0.3, self.training)
            x = layer(x, edge_index) if self.graph else layer(x)
            if i < len(self.layers) - 1:
                x = x.relu()
        return x


def _scores(model, batch) -> torch.Tensor:
    h = model(batch.x, batch.edge_index)
    return (h[batch.edge_label_index[0]] * h[batch.edge_label_index[1]]).sum(-1)


def _fit(model, loader) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(EPOCHS):
        model.train()
        for batch in loader:
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(_scores(model, batch), batch.edge_label.float())
            loss.backward()
            opt.step()


@torch.no_grad()
def _auc(model, loader, num_test: int) -> float:
    """ROC-AUC over the loader's labelled edges (rank statistic; every test edge seen once)."""
    model.eval()
    scores, labels, seen = [], [], []
    for batch in loader:
        scores.append(_scores(model, batch))
        labels.append(batch.edge_label)
        seen.append(batch.input_id)
    assert sorted(torch.cat(seen).tolist()) == list(range(num_test)), "every test edge scored once"
    return _roc_auc(torch.cat(scores), torch.cat(labels).bool())


def _roc_auc(s: torch.Tensor, y: torch.Tensor) -> float:
    """ROC-AUC of scores ``s`` for boolean labels ``y`` (Mann-Whitney rank statistic)."""
    ranks = torch.empty_like(s).scatter_(0, s.argsort(), torch.arange(1, s.numel() + 1, dtype=s.dtype))
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _split_edges(edge_index: np.ndarray, num_nodes: int, rng: np.random.Generator):
    """(train edges both directions, test positives, test negatives) with 10% of undirected edges held out."""
    u, v = edge_index
    pairs = np.unique(np.stack([np.minimum(u, v), np.maximum(u, v)]), axis=1)
    pairs = pairs[:, pairs[0] != pairs[1]]
    perm = rng.permutation(pairs.shape[1])
    n_test = pairs.shape[1] // 10
    test, train = pairs[:, perm[:n_test]], pairs[:, perm[n_test:]]
    known = set((pairs[0] * num_nodes + pairs[1]).tolist())
    neg = []
    while len(neg) < n_test:
        a, b = (int(t) for t in rng.integers(0, num_nodes, 2))
        if a != b and min(a, b) * num_nodes + max(a, b) not in known:
            neg.append((a, b))
    return np.concatenate([train, train[::-1]], axis=1), test, np.asarray(neg).T


def test_cora_link_prediction_through_two_servers_beats_features_only(cora_dir, tmp_path):
    cora = read_graph(cora_dir)
    x, y, n = np.asarray(cora.x), np.asarray(cora.y), cora.num_nodes
    train_ei, test_pos, test_neg = _split_edges(np.asarray(cora.edge_index), n, np.random.default_rng(0))
    graph = GraphInput(train_ei, x, y, {k: np.asarray(v) for k, v in cora.splits.items()}, name="cora-link",
                       num_classes=cora.num_classes)
    partition_graph(graph, 2, tmp_path / "parts", method="metis")
    test_index = torch.from_numpy(np.concatenate([test_pos, test_neg], axis=1))
    test_label = torch.cat([torch.ones(test_pos.shape[1]), torch.zeros(test_neg.shape[1])])
    results = {}
    with running_cluster(tmp_path / "parts", log_dir=tmp_path / "logs") as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        train = client.link_neighbor_loader(FANOUTS, edge_label_index=torch.from_numpy(train_ei),
                                            neg_sampling="binary", batch_size=512, shuffle=True, seed=0)
        test = client.link_neighbor_loader(FANOUTS, edge_label_index=test_index, edge_label=test_label,
                                           batch_size=1024)
        for name, graph_layers in (("sage", True), ("mlp", False)):
            torch.manual_seed(0)
            model = Encoder([x.shape[1], 128, 64], graph_layers)
            t0 = time.perf_counter()
            _fit(model, train)
            results[name] = _auc(model, test, test_index.size(1))
            print(f"{name}: test ROC-AUC {results[name]:.3f} ({time.perf_counter() - t0:.1f} s)")
    assert results["sage"] >= 0.84, f"GraphSAGE link prediction test ROC-AUC {results['sage']:.3f} < 0.84"
    assert results["sage"] >= results["mlp"] + 0.04, f"GraphSAGE {results['sage']:.3f} vs features only {results}"
