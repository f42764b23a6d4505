"""Link loader options of link-prediction practice, in one process: seed-edge exclusion
(``exclude_seed_edges``, homogeneous and typed), stored hard negatives (``num_hard_negatives``) and the
records' checks.  Through 2 servers: ``tests/client/test_link_options_remote.py``."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import partition_with_hard_negatives

from graphfeed.core.spec import LinkInput, LoaderSpec, NegativeSampling, SamplingSpec, reverse_edge_type
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE
from graphfeed.server.partition.inputs import synth

N = 800
FANOUTS = [4, 3]
HARD_K = 4
WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")


@pytest.fixture(scope="module")
def graph():
    """``(edge_index, x, y, splits, hard)``: 800 nodes, symmetric; ``hard`` [E, 4] hard negatives of the
    destination's class, none an edge of the source (``synth.hard_negatives``), every 5th row only 1 entry."""
    ei, x, y, splits = synth.generate(N, 6, 8, 3, seed=3)
    hard = synth.hard_negatives(ei, y, HARD_K, seed=1)
    hard[::5, 1:] = -1
    return ei, x, y, splits, hard


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory):
    return partition_with_hard_negatives(graph, tmp_path_factory.mktemp("linkopts") / "parts", "linkopts")


@pytest.fixture(scope="module")
def seed_edges(graph):
    return torch.from_numpy(graph[0][:, ::5].copy())


@pytest.fixture(scope="module")
def edge_set(graph):
    ei = graph[0]
    return set((ei[0] * N + ei[1]).tolist())


def _sampled_pairs(b, etype=None) -> set[tuple[int, int]]:
    """Original-id ``(src, dst)`` pairs of the batch's sampled edges (of ``etype`` in a HeteroData)."""
    if etype is None:
        ei, src_ids, dst_ids = b.edge_index, b.n_id, b.n_id
    else:
        ei, src_ids, dst_ids = b[etype].edge_index, b[etype[0]].n_id, b[etype[2]].n_id
    return set(zip(src_ids[ei[0]].tolist(), dst_ids[ei[1]].tolist()))


def _seed_pairs(b) -> list[tuple[int, int]]:
    k = b.input_id.numel()
    index = b.edge_label_index[:, :k]
    return list(zip(b.n_id[index[0]].tolist(), b.n_id[index[1]].tolist()))


# ---- the records -----------------------------------------------------------------------------------

def test_exclusion_and_hard_negative_options_are_checked_and_survive_protobuf():
    spec = LoaderSpec.of(LinkInput.of(torch.tensor([[0], [1]]), neg_sampling=dict(mode="binary", amount=3),
                                      num_hard_negatives=2), [3, 2], exclude_seed_edges=True,
                         reverse_edge_types={WRITES: WRITTEN_BY})
    assert spec.sampling.exclude_seed_edges and spec.sampling.reverse_edge_types == ((WRITES, WRITTEN_BY),)
    assert spec.input.neg == NegativeSampling("binary", 3.0, True, 2)
    assert loader_spec_from_proto(open_session_request(spec, "g")) == spec
    with pytest.raises(ValueError, match="exclude_seed_edges removes a link batch's seed edges.*not node loaders"):
        LoaderSpec.of("train", [2], exclude_seed_edges=True)
    with pytest.raises(ValueError, match="reverse_edge_types is given but exclude_seed_edges is not"):
        SamplingSpec([2], reverse_edge_types={WRITES: WRITTEN_BY})
    with pytest.raises(ValueError, match="a reverse edge type goes from 'paper' to 'author'"):
        SamplingSpec([2], exclude_seed_edges=True, reverse_edge_types={WRITES: WRITES})
    with pytest.raises(ValueError, match="num_hard_negatives=3 is more than neg_sampling's amount 2"):
        LinkInput.of(torch.tensor([[0], [1]]), neg_sampling=dict(mode="triplet", amount=2), num_hard_negatives=3)
    with pytest.raises(ValueError, match="num_hard_negatives needs negatives: pass neg_sampling"):
        LinkInput.of(torch.tensor([[0], [1]]), num_hard_negatives=1)


def test_reverse_edge_type_takes_the_map_then_pyg_rev_names():
    types = [("u", "rates", "i"), ("i", "rev_rates", "u"), ("u", "follows", "u")]
    assert reverse_edge_type(("u", "rates", "i"), types) == ("i", "rev_rates", "u")
    assert reverse_edge_type(("i", "rev_rates", "u"), types) == ("u", "rates", "i")
    assert reverse_edge_type(("u", "follows", "u"), types) is None
    given = ((("u", "follows", "u"), ("u", "follows", "u")),)
    assert reverse_edge_type(("u", "follows", "u"), types, given) == ("u", "follows", "u")


# ---- exclusion -------------------------------------------------------------------------------------

def test_exclusion_leaves_every_seed_edge_and_its_reverse_out_of_its_batch(parts_dir, seed_edges, edge_set):
    kw = dict(edge_label_index=seed_edges, neg_sampling="binary", batch_size=40, shuffle=True, seed=2)
    kept = removed = 0
    for b_off, b_on in zip(LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw),
                           LocalLinkNeighborLoader(parts_dir, FANOUTS, exclude_seed_edges=True, **kw), strict=True):
        assert torch.equal(b_on.input_id, b_off.input_id)
        seeds, on, off = _seed_pairs(b_on), _sampled_pairs(b_on), _sampled_pairs(b_off)
        kept += sum((u, v) in off or (v, u) in off for u, v in seeds)
        removed += sum((u, v) in on or (v, u) in on for u, v in seeds)
        assert all(s * N + d in edge_set for s, d in on), "every sampled edge is an edge of the graph"
        hop0 = b_on.num_sampled_edges[0]
        assert hop0 <= FANOUTS[0] * b_on.batch_size, "fanout bound at hop 0"
    assert removed == 0, f"{removed} seed edges (or reverses) sampled with exclude_seed_edges=True"
    assert kept > 50, "without exclusion a seed edge is in its own neighbourhood (the test is real)"


def test_exclusion_drops_only_seed_pairs_from_the_first_hop(parts_dir, seed_edges):
    """The first hop of a batch with exclusion is the same draw minus the seed pairs (nothing redrawn)."""
    kw = dict(edge_label_index=seed_edges, batch_size=40, seed=2)
    b_off = next(iter(LocalLinkNeighborLoader(parts_dir, [4], **kw)))
    b_on = next(iter(LocalLinkNeighborLoader(parts_dir, [4], exclude_seed_edges=True, **kw)))
    seeds = {p for s in _seed_pairs(b_on) for p in (s, s[::-1])}
    off, on = _sampled_pairs(b_off), _sampled_pairs(b_on)
    assert on == off - seeds and off & seeds


def test_typed_exclusion_uses_the_reverse_edge_type(shared_mag):
    parts, graph = shared_mag
    ei = torch.from_numpy(np.asarray(graph.edges[WRITES].edge_index)[:, ::9].copy())
    fanouts = {WRITES: [4, 2], WRITTEN_BY: [4, 2], ("paper", "cites", "paper"): [3, 2]}
    kw = dict(edge_label_index=(WRITES, ei), batch_size=64, seed=1)
    found = {True: 0, False: 0}
    for exclude in (False, True):
        extra = dict(exclude_seed_edges=True, reverse_edge_types={WRITES: WRITTEN_BY}) if exclude else {}
        for b in LocalLinkNeighborLoader(parts, fanouts, **kw, **extra):
            store = b[WRITES]
            k = store.input_id.numel()
            seeds = list(zip(b["author"].n_id[store.edge_label_index[0, :k]].tolist(),
                             b["paper"].n_id[store.edge_label_index[1, :k]].tolist()))
            writes, written = _sampled_pairs(b, WRITES), _sampled_pairs(b, WRITTEN_BY)
            found[exclude] += sum((a, p) in writes or (p, a) in written for a, p in seeds)
    assert found[True] == 0 and found[False] > 20, found


# ---- hard negatives --------------------------------------------------------------------------------

def _hard_lists(graph) -> dict[tuple[int, int], set[int]]:
    """``(src, dst)`` -> the stored list of the first input edge with those ends (original ids)."""
    ei, hard = graph[0], graph[4]
    out: dict[tuple[int, int], set[int]] = {}
    for (u, v), row in zip(ei.T.tolist(), hard.tolist()):
        out.setdefault((u, v), {w for w in row if w >= 0})
    return out


@pytest.mark.parametrize("neg, hard", [(dict(mode="binary", amount=3), 2), (dict(mode="triplet", amount=3), 3),
                                       (dict(mode="binary", amount=1.5), 1)])
def test_hard_negatives_come_from_the_seed_edges_lists_counted_per_positive(parts_dir, graph, seed_edges, edge_set,
                                                                            neg, hard):
    lists = _hard_lists(graph)
    loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=seed_edges, neg_sampling=neg,
                                     num_hard_negatives=hard, batch_size=32, shuffle=True, seed=5)
    total_hard = 0
    for b in loader:
        seeds = _seed_pairs(b) if "edge_label_index" in b.keys() else \
            list(zip(b.n_id[b.src_index].tolist(), b.n_id[b.dst_pos_index].tolist()))
        k = len(seeds)
        if neg["mode"] == "binary":
            negs = b.edge_label_index[:, k:]
            src, dst, is_hard = b.n_id[negs[0]], b.n_id[negs[1]], b.neg_is_hard
            owner = torch.arange(negs.size(1)) % k
        else:
            dst, is_hard = b.n_id[b.dst_neg_index].reshape(-1), b.neg_is_hard.reshape(-1)
            owner = torch.arange(k).repeat_interleave(int(neg["amount"]))
            src = b.n_id[b.src_index][owner]
            assert b.neg_is_hard.shape == b.dst_neg_index.shape
        assert is_hard.dtype == torch.bool and is_hard.numel() == dst.numel()
        assert all(s * N + d not in edge_set for s, d in zip(src.tolist(), dst.tolist())), "strict holds"
        per_seed = torch.bincount(owner[is_hard], minlength=k)
        for i, (u, v) in enumerate(seeds):
            mine = dst[(owner == i) & is_hard].tolist()
            assert set(mine) <= lists[(u, v)], "every hard negative comes from the seed edge's stored list"
            assert len(set(mine)) == len(mine)
            drawn = int(((owner == i) & (torch.arange(dst.numel()) // k < hard)).sum()) \
                if neg["mode"] == "binary" else hard
            assert int(per_seed[i]) == min(drawn, len(lists[(u, v)])), (i, lists[(u, v)], mine)
        total_hard += int(is_hard.sum())
    assert total_hard > 0


def test_hard_negatives_that_are_edges_are_redrawn_by_strict(tmp_path, graph):
    """Lists made of the source's own neighbours: strict replaces every one, none stays marked hard."""
    ei, x, y, splits, _ = graph
    order = np.argsort(ei[0], kind="stable")
    first = np.full(N, -1)
    first[ei[0, order][::-1]] = ei[1, order][::-1]   # one neighbour of every node
    hard = np.stack([first[ei[0]], np.full(ei.shape[1], -1)], axis=1)
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3, fingerprint="linkopts-edges")
    g.edges[DEFAULT_EDGE_TYPE].hard_neg_dst = hard
    builder.partition_graph(g, 2, tmp_path / "p", method="random", topologies=("csc",))
    seeds = torch.from_numpy(ei[:, ::11].copy())
    for strict, want_hard in ((False, True), (True, False)):
        b = next(iter(LocalLinkNeighborLoader(tmp_path / "p", [2], edge_label_index=seeds, batch_size=64,
                                              neg_sampling=dict(mode="binary", amount=1, strict=strict),
                                              num_hard_negatives=1)))
        assert bool(b.neg_is_hard.all()) is want_hard


def test_hard_negatives_need_stored_lists(tmp_path, graph, seed_edges):
    ei, x, y, splits, _ = graph
    builder.partition_graph(builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3),
                            2, tmp_path / "p", method="random")
    with pytest.raises(ValueError, match="num_hard_negatives=1 needs hard negatives stored with the partition.*"
                                         "hard_neg_dst.npy"):
        LocalLinkNeighborLoader(tmp_path / "p", FANOUTS, edge_label_index=seed_edges, neg_sampling="binary",
                                num_hard_negatives=1)


def test_typed_hard_negatives_are_the_edge_types_lists(tmp_path):
    graph = synth.generate_mag_preset("mag-tiny", seed=0)
    writes = graph.edges[WRITES]
    hard = np.random.default_rng(2).integers(-1, graph.nodes["paper"].num_nodes, size=(writes.num_edges, 3))
    writes.hard_neg_dst = hard
    builder.partition_graph(graph, 2, tmp_path / "p", method="random", topologies=("csc", "csr"))
    lists: dict[tuple[int, int], set[int]] = {}
    for (u, v), row in zip(writes.edge_index.T.tolist(), hard.tolist()):
        lists.setdefault((u, v), {w for w in row if w >= 0})
    ei = torch.from_numpy(np.asarray(writes.edge_index)[:, ::17].copy())
    loader = LocalLinkNeighborLoader(tmp_path / "p", {WRITES: [2], WRITTEN_BY: [2]}, edge_label_index=(WRITES, ei),
                                     neg_sampling=dict(mode="triplet", amount=3), num_hard_negatives=2,
                                     batch_size=50, seed=3)
    total = 0
    for b in loader:
        src = b["author"].n_id[b["author"].src_index]
        pos = b["paper"].n_id[b["paper"].dst_pos_index]
        neg = b["paper"].n_id[b["paper"].dst_neg_index]
        is_hard = b[WRITES].neg_is_hard     # on the edge type, as input_id
        assert is_hard.shape == neg.shape == (src.numel(), 3) and not is_hard[:, 2].any()
        for u, v, row, flags in zip(src.tolist(), pos.tolist(), neg.tolist(), is_hard.tolist()):
            mine = [w for w, f in zip(row, flags) if f]
            assert set(mine) <= lists[(u, v)] and len(mine) <= min(2, len(lists[(u, v)]))
            total += len(mine)
    assert total > 0
