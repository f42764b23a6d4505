"""``--method hotness``: access counts from pre-sampling, METIS balancing them, the round trip, the CLI.

The access counts are checked against a breadth-first search on hand-made graphs (fanout -1
samples every in-neighbour, so a node's count is known without the sampler); the balance on
a graph whose hot nodes sit in one community; the round-trip invariants with the same checks
as the other partitioners (:func:`test_partition.assert_round_trip`).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import hand_made_typed_arrays, save_typed_folder
from test_partition import assert_round_trip

from graphfeed.cli.main import main
from graphfeed.server.partition.build.builder import assign_parts, graph_edge_cut, partition_graph
from graphfeed.server.partition.format.layout import read_meta
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs.graph import GraphInput
from graphfeed.server.sampling.access import AccessSampling, count_accesses

FEW = AccessSampling((10, 5), batch_size=256, epochs=1)   # the tiny preset: 800 training nodes, 4 batches


def _graph(edges: list[tuple[int, int]], n: int, train: list[int]) -> GraphInput:
    ei = np.array(edges, dtype=np.int64).T.reshape(2, -1)
    return GraphInput(ei, np.arange(n, dtype=np.float32)[:, None], np.zeros(n, dtype=np.int64),
                      {"train": np.array(train, dtype=np.int64)}, num_classes=1)


def _in_hops(edges: list[tuple[int, int]], seeds: set[int], hops: int) -> set[int]:
    """Every node within ``hops`` in-edges of ``seeds`` (seeds included): what fanout -1 samples."""
    reached, frontier = set(seeds), set(seeds)
    for _ in range(hops):
        frontier = {s for s, d in edges if d in frontier} - reached
        reached |= frontier
    return reached


# ---------------------------------------------------------------------------------- access counts

HAND_MADE = [(1, 0), (2, 0), (3, 1), (4, 3), (5, 4), (0, 6), (6, 7), (7, 2), (8, 8)]   # 9 nodes, a self loop


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_one_seed_batches_count_every_seed_whose_neighbourhood_holds_the_node(hops):
    train = [0, 2, 4, 8]
    graph = _graph(HAND_MADE, 9, train)
    counts = count_accesses(graph, AccessSampling((-1,) * hops, batch_size=1, epochs=3))
    want = np.zeros(9, dtype=np.int64)
    for s in train:   # batches of one seed: the order does not matter
        want[sorted(_in_hops(HAND_MADE, {s}, hops))] += 3
    np.testing.assert_array_equal(counts, want)


def test_one_batch_counts_each_node_once_per_epoch():
    train = [0, 1, 5]
    graph = _graph(HAND_MADE, 9, train)
    counts = count_accesses(graph, AccessSampling((-1, -1), batch_size=8, epochs=2))
    want = np.zeros(9, dtype=np.int64)
    want[sorted(_in_hops(HAND_MADE, set(train), 2))] = 2
    np.testing.assert_array_equal(counts, want)


def test_sampled_counts_are_bounded_and_deterministic(tiny_graph):
    counts = count_accesses(tiny_graph, FEW, seed=3)
    train = tiny_graph.splits["train"]
    batches = -(-train.size // FEW.batch_size)
    assert counts.shape == (tiny_graph.num_nodes,) and counts.dtype == np.int64
    assert counts.min() >= 0 and counts.max() <= batches
    assert np.all(counts[train] >= 1)                    # every seed is in its own batch
    # fanouts bound each batch's nodes: seeds * (1 + 10 + 10 * 5)
    assert counts.sum() <= train.size * (1 + 10 + 50)
    np.testing.assert_array_equal(counts, count_accesses(tiny_graph, FEW, seed=3))
    assert not np.array_equal(counts, count_accesses(tiny_graph, FEW, seed=4))


def test_counting_refuses_bad_settings_and_graphs():
    with pytest.raises(ValueError, match="--hotness-epochs must be between 1 and 10"):
        AccessSampling(epochs=11)
    with pytest.raises(ValueError, match="--batch-size must be at least 1"):
        AccessSampling(batch_size=0)
    with pytest.raises(ValueError, match="--num-neighbors"):
        AccessSampling(num_neighbors=(5, -2))
    with pytest.raises(ValueError, match="has none .no train_idx.; use --method metis"):
        count_accesses(_graph(HAND_MADE, 9, []), AccessSampling())


# ---------------------------------------------------------------------------------- balance

def _hub_graph(n: int = 2000, hubs: int = 20, seed: int = 0) -> GraphInput:
    """Two communities of n/2 nodes (6 random edges per node inside, n/50 bridges), training nodes
    spread evenly, and ``hubs`` nodes of community 0 linked to 300 of its nodes each: the hubs are in
    almost every batch, so community 0 is hot although both hold as many nodes and seeds."""
    rng = np.random.default_rng(seed)
    half = n // 2
    src = [rng.integers(lo, lo + half, half * 6) for lo in (0, half)] + [rng.integers(0, half, n // 50)]
    dst = [rng.integers(lo, lo + half, half * 6) for lo in (0, half)] + [rng.integers(half, n, n // 50)]
    src += [np.full(300, h) for h in range(hubs)]
    dst += [rng.integers(0, half, 300) for _ in range(hubs)]
    s, d = np.concatenate(src), np.concatenate(dst)
    s, d = s[s != d], d[s != d]
    ei = np.stack([np.concatenate([s, d]), np.concatenate([d, s])])
    train = np.sort(rng.choice(n, n // 5, replace=False))
    return GraphInput(ei, np.zeros((n, 4), np.float32), np.zeros(n, np.int64), {"train": train}, num_classes=1)


def _mass_ratio(parts: np.ndarray, counts: np.ndarray, num_parts: int) -> float:
    mass = np.bincount(parts, weights=counts, minlength=num_parts)
    return float(mass.max() / mass.mean())


def test_hotness_balances_the_access_mass_that_metis_leaves_skewed():
    graph = _hub_graph()
    counts = count_accesses(graph, AccessSampling((10, 5), batch_size=32, epochs=5))
    metis = assign_parts(graph, 2, "metis", 0)
    hot = assign_parts(graph, 2, "hotness", 0, counts)
    # measured: METIS 1.11x the mean part's mass, hotness 1.02x (METIS's default 3% imbalance + the +1s)
    assert _mass_ratio(metis, counts, 2) > 1.08
    assert _mass_ratio(hot, counts, 2) < 1.04
    # locality is kept: far fewer cut edges than a random assignment
    random_cut = graph_edge_cut(graph, assign_parts(graph, 2, "random", 0))
    assert graph_edge_cut(graph, hot) < 0.5 * random_cut


# ---------------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("num_parts", [1, 2, 4])
def test_round_trip_tiny(tiny_graph, tmp_path, num_parts):
    counts = count_accesses(tiny_graph, FEW)
    meta = partition_graph(tiny_graph, num_parts, tmp_path / "p", method="hotness", topologies=("csc", "csr"),
                           node_weights=counts, method_settings=FEW.settings())
    assert meta.method == "hotness" and meta.num_parts == num_parts
    assert_round_trip(tmp_path / "p", tiny_graph)
    meta, parts = open_parts(tmp_path / "p")
    assert meta.method_settings == {"num_neighbors": [10, 5], "batch_size": 256, "epochs": 1}
    assert meta.access_mass == [int(counts[p.orig_id.numpy()].sum()) for p in parts]
    assert sum(meta.access_mass) == int(counts.sum())


def test_builder_refuses_hotness_without_counts_or_on_typed_graphs(tiny_graph, tmp_path):
    with pytest.raises(ValueError, match="needs one access count per node"):
        partition_graph(tiny_graph, 2, tmp_path / "p", method="hotness")
    with pytest.raises(ValueError, match="access counts must be >= 0"):
        partition_graph(tiny_graph, 2, tmp_path / "p", method="hotness",
                        node_weights=np.full(tiny_graph.num_nodes, -1))
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------------- CLI

def test_cli_hotness_records_settings_and_checks_them(tiny_graph_dir, tmp_path, capsys):
    out = tmp_path / "p"
    args = ["partition", str(tiny_graph_dir), "-p", "2", "--method", "hotness", "-o", str(out), "--quiet",
            "--num-neighbors", "10,5", "--batch-size", "256"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    meta = read_meta(out)
    assert meta.method == "hotness" and meta.method_settings == FEW.settings()
    assert f"access mass per part: {meta.access_mass[0]:,}, {meta.access_mass[1]:,}" in printed
    assert main(args) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(args + ["--hotness-epochs", "2"]) == 2
    assert "(hotness epochs 1 -> 2); pass --overwrite" in capsys.readouterr().err
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "hotness (seed 0), 2 part(s)" in info and "epochs 1, num_neighbors [10, 5]" in info
    assert f"{meta.access_mass[0]:,} / {meta.access_mass[1]:,} pre-sampled accesses per part" in info


@pytest.mark.parametrize("extra, error", [
    (["--hotness-epochs", "0"], "--hotness-epochs must be between 1 and 10, got 0"),
    (["--link-split", "val=0.1"], "does not combine with --link-split; use --method metis"),
])
def test_cli_hotness_bad_settings_are_one_line_errors(tiny_graph_dir, tmp_path, capsys, extra, error):
    args = ["partition", str(tiny_graph_dir), "-p", "2", "--method", "hotness", "-o", str(tmp_path / "p"), "-q"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert error in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_cli_hotness_refuses_a_typed_graph(tmp_path, capsys):
    folder = save_typed_folder(tmp_path / "shop", hand_made_typed_arrays())
    assert main(["partition", str(folder), "-p", "2", "--method", "hotness", "-o", str(tmp_path / "p"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "--method hotness needs a homogeneous graph (typed graphs: use --method metis)" in err
    assert err.count("\n") == 1 and not (tmp_path / "p").exists()


def test_counts_do_not_depend_on_the_native_sampler(tiny_graph, monkeypatch):
    """The pure-torch driver gives the same counts as the fused op (when it is loaded)."""
    from graphfeed.server.sampling import dispatch

    native = count_accesses(tiny_graph, FEW)
    monkeypatch.setattr(dispatch, "has_fused_sampler", lambda: False)
    np.testing.assert_array_equal(count_accesses(tiny_graph, FEW), native)
    assert torch.from_numpy(native).sum() > 0
