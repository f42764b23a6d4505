"""Weighted neighbor sampling through the loaders (``weight_attr``): frequencies, native == reference, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition import builder
from graphfeed.server.sampling import dispatch

WEIGHTS = [1.0, 2.0, 3.0, 4.0, 10.0]     # of the in-edges 1..5 -> 0 of the star
EPOCHS = 2000
CHI2_DF4_P001 = 18.47                   # chi-square critical value, 4 degrees of freedom, p = 0.001


def _star(tmp_path, weights, name="star"):
    """Node 0 with in-edges from 1..5 (edge_attr column 1 = the weights), plus a 6-7 pair."""
    k = len(weights)
    src = np.array(list(range(1, k + 1)) + [6, 7])
    dst = np.array([0] * k + [7, 6])
    attr = np.stack([np.zeros(k + 2), np.array(list(weights) + [1.0, 1.0])], axis=1).astype(np.float32)
    g = builder.GraphInput(edge_index=np.stack([src, dst]), x=np.ones((8, 2), np.float32),
                           y=np.zeros(8, np.int64), splits={"train": np.arange(8)}, num_classes=1, edge_attr=attr)
    builder.partition_graph(g, 2, tmp_path / name, method="random", topologies=("csc",))
    return tmp_path / name


def _picks(parts, n: int = EPOCHS) -> list[int]:
    """The neighbor of node 0 sampled (fanout 1) under batch seeds 0..n-1, and the loader's first batch's."""
    loader = LocalNeighborLoader(parts, [1], input_nodes=torch.tensor([0]), weight_attr="edge_attr:1")
    graph, center = loader.graph, loader.graph.to_global(torch.tensor([0]))
    orig = torch.cat([p.orig_id for p in graph.parts])
    picks = [int(orig[graph.sample(center, loader.spec.sampling, seed).nodes[1]]) for seed in range(n)]
    first = next(iter(loader))
    assert first.e_id.tolist() == [int(first.n_id[1]) - 1], "the loader samples through the same path"
    return picks


def test_frequencies_follow_the_weights_and_native_equals_reference(tmp_path, monkeypatch):
    parts = _star(tmp_path, WEIGHTS)
    picks = _picks(parts)
    counts = np.bincount(picks, minlength=6)[1:6]
    expected = np.array(WEIGHTS) / sum(WEIGHTS) * EPOCHS
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_DF4_P001, f"counts {counts.tolist()} vs expected {expected.round(1).tolist()}: chi2 {chi2:.1f}"
    if dispatch.IMPLEMENTATION == "native":
        monkeypatch.setattr(dispatch, "_NATIVE", None)     # the pure-torch reference from here on
        assert _picks(parts, 300) == picks[:300], "the reference sampler picks what the native op picks"


@pytest.mark.parametrize("weights, attr, problem", [
    ([1.0, -1.0, 1.0, 1.0, 1.0], "edge_attr:1", "must be finite and >= 0"),
    ([1.0, float("nan"), 1.0, 1.0, 1.0], "edge_attr:1", "must be finite and >= 0"),
    ([0.0, 0.0, 0.0, 0.0, 0.0], "edge_attr:1", "1 node.s. have in-edges whose weights are all zero"),
    (WEIGHTS, "edge_attr", "name one column as 'edge_attr:K' with K in 0..1"),
    (WEIGHTS, "edge_attr:2", "name one column"),
    (WEIGHTS, "weight", "weight_attr must name an edge feature column"),
])
def test_bad_weights_are_one_line_errors_naming_weight_attr(tmp_path, weights, attr, problem):
    parts = _star(tmp_path, weights)
    with pytest.raises(ValueError, match=problem) as err:
        LocalNeighborLoader(parts, [1], input_nodes=torch.tensor([0]), weight_attr=attr)
    assert "\n" not in str(err.value)
