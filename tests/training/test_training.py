"""End-to-end: GraphSAGE trained through LocalNeighborLoader reaches the expected accuracy.

* Cora (public Planetoid split, METIS P=2): >= 78% test accuracy (published GCN: 81.5%;
  this setup measured 80.3-81.4% over torch seeds 0-4).
* synthetic ``tiny`` (random P=2): >= 85% test accuracy (features alone: ~29%; full-batch
  3-layer SAGE tops out near 87%; this setup measured 86.8-87.0% over seeds 0-2).
"""
from __future__ import annotations

import pytest
import torch
from helpers.gnn import SAGE, accuracy, train

from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs import synth
from graphfeed.server.partition.inputs.reader import read_graph

pytestmark = pytest.mark.slow


def test_cora_graphsage_reaches_78_percent(cora_dir, tmp_path):
    graph = read_graph(cora_dir)
    splits = graph.splits
    partition_graph(graph, 2, tmp_path / "cora", method="metis")
    torch.manual_seed(0)
    model = SAGE([graph.x.shape[1], 64, 7], dropout=0.5, normalize_rows=True)
    loader = LocalNeighborLoader(tmp_path / "cora", [10, 10], batch_size=140, shuffle=True, seed=0)
    train(model, loader, epochs=50, lr=0.01, weight_decay=5e-4)
    test = LocalNeighborLoader(tmp_path / "cora", [-1, -1], batch_size=1000, input_nodes="test")
    acc = accuracy(model, test, splits["test"])
    assert acc >= 0.78, f"Cora test accuracy {acc:.3f} < 0.78"


@pytest.mark.parametrize("feature_dtype", [None, "bf16", "int8"])
def test_tiny_synthetic_graphsage_reaches_85_percent(tmp_path, feature_dtype):
    """The same bar with features sent as bfloat16 (train and test; the model upcasts them):
    measured over torch seeds 0 and 1 in one run: bf16 87.1%, 87.6%; float32 86.8%, 87.1%.  And as int8
    (per-column scales stored at partition time, dequantized by the loader): seed 0 86.6% vs float32 86.8%."""
    ei, x, y, splits = synth.generate_preset("tiny")
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, tmp_path / "tiny", method="random")
    torch.manual_seed(0)
    model = SAGE([x.shape[1], 64, 64, int(y.max()) + 1], dropout=0.5)
    loader = LocalNeighborLoader(tmp_path / "tiny", [10, 10, 10], batch_size=64, shuffle=True, seed=0,
                                 feature_dtype=feature_dtype)
    train(model, loader, epochs=25, lr=0.01)
    test = LocalNeighborLoader(tmp_path / "tiny", [-1, -1, -1], batch_size=3000, input_nodes="test",
                               feature_dtype=feature_dtype)
    assert next(iter(test)).x.dtype == (torch.bfloat16 if feature_dtype == "bf16" else torch.float32)
    acc = accuracy(model, test, splits["test"])
    print(f"tiny synthetic test accuracy {acc:.4f} (feature_dtype={feature_dtype})")
    assert acc >= 0.85, f"tiny synthetic test accuracy {acc:.3f} < 0.85 (feature_dtype={feature_dtype})"
