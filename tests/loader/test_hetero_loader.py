"""Typed (heterogeneous) batches through the local loader and the partitioned graph (``mag-tiny``, 2 parts).

Every check is made against the generated graph's original arrays: sampled edges exist in
their relation, per-type fanout bounds hold exactly, features/labels are the original rows,
every seed is delivered once per epoch (``input_id`` included).  Bad input is a one-line
ValueError naming the type and the fix.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch, check_typed_batch, mag_tiny_parts

from graphfeed.core.spec import NodeInput, SamplingSpec
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.graph import PartitionedGraph

WRITES, CITES, TOPIC_OF = ("author", "writes", "paper"), ("paper", "cites", "paper"), ("field", "topic_of", "paper")


@pytest.fixture(scope="module")
def mag(shared_mag):
    """``(parts folder, graph)``: mag-tiny, METIS into 2 parts, CSC + CSR."""
    return shared_mag


def _all_fanouts(graph, hops):
    return {e: list(hops) for e in graph.edge_types}


@pytest.mark.parametrize("direction,replace", [("in", False), ("out", False), ("in", True)])
def test_typed_batches_hold_the_sampler_invariants_and_cover_the_split_once(mag, direction, replace):
    parts, graph = mag
    loader = LocalNeighborLoader(parts, [4, 3], batch_size=128, input_nodes=("paper", "train"), shuffle=True,
                                 seed=3, direction=direction, replace=replace)
    seeds, positions = [], []
    for batch in loader:
        assert sorted(batch.node_types) == ["author", "field", "paper"] and len(batch.edge_types) == 5
        size = batch["paper"].batch_size
        assert batch["paper"].input_id.numel() == size and batch["paper"].num_sampled_nodes[0] == size
        check_typed_batch(batch, graph, _all_fanouts(graph, [4, 3]), direction=direction, replace=replace)
        seeds.append(batch["paper"].n_id[:size])
        positions.append(batch["paper"].input_id)
    train = graph.splits["train"]
    assert sorted(torch.cat(seeds).tolist()) == sorted(train.tolist()), "every train paper is a seed once"
    assert sorted(torch.cat(positions).tolist()) == list(range(train.size)), "input_id covers the input once"


def test_dict_fanouts_sample_only_the_named_edge_types(mag):
    parts, graph = mag
    fanouts = {WRITES: [3, 2], CITES: [2, 0], TOPIC_OF: [-1, 0]}
    loader = LocalNeighborLoader(parts, fanouts, batch_size=200, input_nodes=("paper", "val"))
    full = {e: fanouts.get(e, [0, 0]) for e in graph.edge_types}
    sampled = {e: 0 for e in graph.edge_types}
    for batch in loader:
        check_typed_batch(batch, graph, full)
        for e in graph.edge_types:
            sampled[e] += batch[e].edge_index.size(1)
    assert all(sampled[e] > 0 for e in fanouts), sampled
    assert all(sampled[e] == 0 for e in graph.edge_types if e not in fanouts), sampled


def test_id_input_of_another_type_and_input_id_are_positions_in_the_ids(mag):
    parts, graph = mag
    ids = torch.from_numpy(np.random.default_rng(1).permutation(graph.nodes["author"].num_nodes)[:300])
    loader = LocalNeighborLoader(parts, {("paper", "written_by", "author"): [5], WRITES: [0]}, batch_size=64,
                                 input_nodes=("author", ids), shuffle=True, seed=2)
    seen = []
    for batch in loader:
        size = batch["author"].batch_size
        assert torch.equal(ids[batch["author"].input_id], batch["author"].n_id[:size])
        assert "batch_size" not in batch["paper"]
        check_typed_batch(batch, graph, {e: [5] if e[2] == "author" else [0] for e in graph.edge_types})
        seen.append(batch["author"].input_id)
    assert sorted(torch.cat(seen).tolist()) == list(range(300))


def test_epochs_are_deterministic_and_ranks_split_the_seeds(mag):
    parts, graph = mag
    args = dict(batch_size=100, input_nodes=("paper", "train"), shuffle=True, seed=5)
    a, b = LocalNeighborLoader(parts, [3, 2], **args), LocalNeighborLoader(parts, [3, 2], **args)
    for x, y in zip(a, b):
        assert_same_batch(x, y)
    ranks = [LocalNeighborLoader(parts, [3, 2], rank=r, world_size=2, **args) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    seeds = [torch.cat([bt["paper"].n_id[:bt["paper"].batch_size] for bt in r]).tolist() for r in ranks]
    assert not set(seeds[0]) & set(seeds[1])
    assert sorted(seeds[0] + seeds[1]) == sorted(graph.splits["train"].tolist())


def test_typed_sample_does_not_depend_on_the_seed_order(mag):
    """A typed sample over 2 parts has the same edges whatever the seeds' order (every choice is keyed
    by node, not by frontier position); the homogeneous shortcut refuses a typed sample."""
    parts, _ = mag
    graph = PartitionedGraph.in_process(open_parts(parts)[1])
    spec = SamplingSpec([4, 2])
    seeds = graph.parts[0].input_nodes(NodeInput(split="train", node_type="paper"))[:50]
    a = graph.sample_typed({"paper": seeds}, spec, 11)
    b = graph.sample_typed({"paper": seeds.flip(0)}, spec, 11)
    for e in a.row:   # same edges, whatever the seeds' order (per-node RNG)
        pairs_a = set(zip(a.nodes[e[0]][a.row[e]].tolist(), a.nodes[e[2]][a.col[e]].tolist(), a.eids[e].tolist()))
        pairs_b = set(zip(b.nodes[e[0]][b.row[e]].tolist(), b.nodes[e[2]][b.col[e]].tolist(), b.eids[e].tolist()))
        assert pairs_a == pairs_b, e
    with pytest.raises(ValueError, match="only a sample with one node type"):
        graph.sample(seeds, spec, 11)


@pytest.mark.parametrize("input_nodes,num_neighbors,match", [
    (("venue", "train"), [3], "node type 'venue', which the graph does not have"),
    (("author", "train"), [3], "node type 'author' has no splits"),
    (("paper", "train"), {("paper", "likes", "paper"): [3]}, r"edge type \('paper', 'likes', 'paper'\)"),
    (("paper", torch.tensor([0, 10 ** 6])), [3], "not in the graph"),
])
def test_bad_typed_input_is_one_line_naming_the_type(mag, input_nodes, num_neighbors, match):
    parts, _ = mag
    with pytest.raises(ValueError, match=match) as info:
        LocalNeighborLoader(parts, num_neighbors, batch_size=8, input_nodes=input_nodes)
    assert "\n" not in str(info.value)


def test_one_part_typed_graph_fused_op_equals_the_driver(tmp_path, monkeypatch):
    """One part holds every node: the fused native typed op (when the op library is loaded) gives the
    driver's batches on every key, and both hold the sampler invariants."""
    graph = mag_tiny_parts(tmp_path / "p", parts=1, method="random")
    args = dict(batch_size=128, input_nodes=("paper", "val"), shuffle=True, seed=2)
    calls = []
    op = dispatch.fused_sample_typed
    monkeypatch.setattr(dispatch, "fused_sample_typed", lambda *a, **k: calls.append(1) or op(*a, **k))
    fused = list(LocalNeighborLoader(tmp_path / "p", [4, 3], **args))
    assert len(calls) == (len(fused) if dispatch.has_fused_typed_sampler() else 0)
    for batch in fused:
        check_typed_batch(batch, graph, {e: [4, 3] for e in graph.edge_types})
    monkeypatch.setattr(dispatch, "has_fused_typed_sampler", lambda topos=None: False)
    driver = list(LocalNeighborLoader(tmp_path / "p", [4, 3], **args))
    assert len(fused) == len(driver) > 1
    for a, b in zip(fused, driver):
        assert_same_batch(a, b)


def test_weighted_loaders_without_weights_and_untyped_link_seeds_are_one_line_errors(mag):
    """mag-tiny has no edge weights (the first sampled edge type is named), and link seeds on a typed graph
    need their edge type: a clear one-line ValueError, not a wrong batch."""
    from graphfeed.server.loader.link import LocalLinkNeighborLoader

    parts, _ = mag
    with pytest.raises(ValueError, match=r"weight_attr='edge_attr': edge type \('author', 'writes', 'paper'\) "
                                         r"has no edge features; partition the graph with "
                                         r"author__writes__paper/edge_attr.npy") as info:
        LocalNeighborLoader(parts, [3], batch_size=8, input_nodes=("paper", "train"), weight_attr="edge_attr")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"on a typed graph needs its edge type: pass \(\(src, rel, dst\), index\)") \
            as info:
        LocalLinkNeighborLoader(parts, [3], edge_label_index=torch.tensor([[0, 1], [1, 2]]), batch_size=2)
    assert "\n" not in str(info.value)
