"""Weighted neighbor sampling through the loaders (``weight_attr``): frequencies, native == reference, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
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


def _picks(parts, n: int = EPOCHS, weight_attr: str = "edge_attr:1") -> list[int]:
    """The neighbor of node 0 sampled (fanout 1) under batch seeds 0..n-1, and the loader's first batch's."""
    loader = LocalNeighborLoader(parts, [1], input_nodes=torch.tensor([0]), weight_attr=weight_attr)
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


def _star_with_edge_weight(tmp_path, weights, name="star_w"):
    """The same star, its weights given as the input's edge_weight.npy (read by `graphfeed partition`'s reader)."""
    from graphfeed.server.partition.inputs.reader import read_graph

    k = len(weights)
    folder = tmp_path / f"{name}_input"
    folder.mkdir()
    np.save(folder / "edge_index.npy", np.stack([np.array(list(range(1, k + 1)) + [6, 7]),
                                                 np.array([0] * k + [7, 6])]))
    np.save(folder / "x.npy", np.ones((8, 2), np.float32))
    np.save(folder / "train_idx.npy", np.arange(8))
    np.save(folder / "edge_weight.npy", np.array(list(weights) + [1.0, 1.0], np.float64))
    graph = read_graph(folder)
    assert graph.dropped == [], "edge_weight.npy is stored, not dropped"
    builder.partition_graph(graph, 2, tmp_path / name, method="random", topologies=("csc",))
    return tmp_path / name


def test_edge_weight_npy_is_stored_per_part_and_sampled_as_weights(tmp_path, monkeypatch):
    from graphfeed.server.partition.format.store import open_parts

    parts = _star_with_edge_weight(tmp_path, WEIGHTS)
    meta, stored = open_parts(parts)
    assert meta.edge_weights == ["_N__to___N"]
    want = torch.tensor(WEIGHTS + [1.0, 1.0], dtype=torch.float64)
    for p in stored:   # aligned with the CSC like edge_attr: row i is the weight of edge eid[i]
        assert torch.equal(p.edges(p.etype).edge_weight("csc"), want[p.topology("csc").eid])
    picks = _picks(parts, weight_attr="edge_weight")
    counts = np.bincount(picks, minlength=6)[1:6]
    expected = np.array(WEIGHTS) / sum(WEIGHTS) * EPOCHS
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < CHI2_DF4_P001, f"counts {counts.tolist()} vs expected {expected.round(1).tolist()}: chi2 {chi2:.1f}"
    assert picks == _picks(_star(tmp_path, WEIGHTS, "same"), weight_attr="edge_attr:1"), \
        "edge_weight samples exactly as the same weights in an edge_attr column (one weighted path)"
    if dispatch.IMPLEMENTATION == "native":
        monkeypatch.setattr(dispatch, "_NATIVE", None)
        assert _picks(parts, 300, weight_attr="edge_weight") == picks[:300], "native == reference"


@pytest.mark.parametrize("weights, problem", [
    ([1.0, -1.0, 1.0, 1.0, 1.0], "weight_attr='edge_weight': edge weights must be finite and >= 0.*edge_weight$"),
    ([1.0, float("nan"), 1.0, 1.0, 1.0], "must be finite and >= 0"),
    ([0.0, 0.0, 0.0, 0.0, 0.0], "1 node.s. have in-edges whose weights are all zero"),
])
def test_bad_edge_weights_are_one_line_errors(tmp_path, weights, problem):
    parts = _star_with_edge_weight(tmp_path, weights)
    with pytest.raises(ValueError, match=problem) as err:
        LocalNeighborLoader(parts, [1], input_nodes=torch.tensor([0]), weight_attr="edge_weight")
    assert "\n" not in str(err.value)


def test_edge_weight_missing_names_the_input_file(tmp_path):
    parts = _star(tmp_path, WEIGHTS)
    with pytest.raises(ValueError, match="the graph has no edge weights; partition it with edge_weight.npy"):
        LocalNeighborLoader(parts, [1], input_nodes=torch.tensor([0]), weight_attr="edge_weight")


def test_pyg_data_edge_weight_is_read_and_stored(tmp_path):
    from torch_geometric.data import Data

    from graphfeed.server.partition.format.store import open_parts
    from graphfeed.server.partition.inputs.reader import read_graph

    ei = torch.tensor([[1, 2, 3, 0], [0, 0, 0, 1]])
    data = Data(x=torch.ones(4, 2), edge_index=ei, edge_weight=torch.tensor([1.0, 2.0, 3.0, 4.0]),
                train_mask=torch.ones(4, dtype=torch.bool))
    torch.save(data, tmp_path / "g.pt")
    graph = read_graph(tmp_path / "g.pt")
    assert graph.dropped == [] and graph.edge_weight.tolist() == [1.0, 2.0, 3.0, 4.0]
    builder.partition_graph(graph, 1, tmp_path / "parts", method="random")
    part = open_parts(tmp_path / "parts")[1][0]
    assert torch.equal(part.weights.get("csc", "edge_weight"), data.edge_weight.double()[part.topology("csc").eid])
