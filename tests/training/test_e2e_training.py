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

from pathlib import Path

import pytest
import torch
from helpers.gnn import SAGE, accuracy, train

import graphfeed.client as gf
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs import synth
from graphfeed.server.partition.inputs.reader import read_graph
from graphfeed.testing.cluster import running_cluster

pytestmark = pytest.mark.slow


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
