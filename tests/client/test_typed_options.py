"""Weighted and temporal sampling on typed (heterogeneous) graphs: storage, local and remote loaders, errors.

A hand-made typed graph (users, items; 4 edge types) carries per edge type ``edge_weight``,
``edge_time`` and (one type) ``edge_attr``, and per node type ``node_time``; one edge type
(``similar``) carries none of them.  User 0 is the centre of two stars (in-edges from items 1..5
and users 1..5 with known weights), so the weighted frequencies of each edge type are checked by a
chi-square test.  Temporal batches are checked edge by edge against the input arrays: every
sampled edge is an edge of its relation, subgraphs share no node, and no sampled neighbour
(``"time"``) or edge (``"edge_time"``) is later than its subgraph's seed time (node batches, and
binary link batches whose seed edges carry their times).  Remote batches (2 servers) equal the local
loader's; an edge type without the named column is a one-line error naming it (INVALID_ARGUMENT
through the servers, which stay up).
"""
from __future__ import annotations

import re

import grpc
import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch, check_typed_batch, save_typed_folder

import graphfeed.client as gf
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto.convert import open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.layout import edge_type_dirname
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs.reader import InputError, read_graph
from graphfeed.server.partition.inputs.typed import write_typed_folder
from graphfeed.server.sampling import dispatch
from graphfeed.testing.cluster import SERVING, health_status, running_cluster

USERS, ITEMS = 60, 40
RATED, RATES = ("item", "rated", "user"), ("user", "rates", "item")
FOLLOWS, SIMILAR = ("user", "follows", "user"), ("item", "similar", "item")
STAR_WEIGHTS = {RATED: [1.0, 2.0, 3.0, 4.0, 10.0], FOLLOWS: [8.0, 1.0, 4.0, 2.0, 5.0]}   # sources 1..5 -> user 0
WITH_OPTIONS = (RATED, RATES, FOLLOWS)       # the edge types with weights and edge times
FANOUTS = {RATED: [3, 2], RATES: [3, 2], FOLLOWS: [3, 2]}   # SIMILAR (no weights, no edge times) not sampled
DRAWS = 2000
CHI2_DF4_P001 = 18.47                   # chi-square critical value, 4 degrees of freedom, p = 0.001


def _arrays() -> dict:
    """The typed graph's arrays in :func:`save_typed_folder`'s layout (node times as ``node_time``)."""
    rng = np.random.default_rng(3)

    def star_plus_random(etype, n_src, n_dst, k):
        """In-edges 1..5 -> 0 (the star, weights STAR_WEIGHTS) then ``k`` random edges into 1..n_dst-1."""
        src = np.concatenate([np.arange(1, 6), rng.integers(0, n_src, k)])
        dst = np.concatenate([np.zeros(5, np.int64), rng.integers(1, n_dst, k)])
        weight = np.concatenate([STAR_WEIGHTS[etype], rng.uniform(0.5, 2.0, k)])
        return np.stack([src, dst]), weight

    rated, rated_w = star_plus_random(RATED, ITEMS, USERS, 240)
    follows, follows_w = star_plus_random(FOLLOWS, USERS, USERS, 240)
    rates = rated[::-1, 5:].copy()
    edges = {RATED: {"edge_index": rated, "edge_weight": rated_w,
                     "edge_attr": np.stack([np.zeros_like(rated_w), rated_w], axis=1).astype(np.float32)},
             FOLLOWS: {"edge_index": follows, "edge_weight": follows_w.astype(np.float32)},
             RATES: {"edge_index": rates, "edge_weight": rng.uniform(0.5, 2.0, rates.shape[1])},
             SIMILAR: {"edge_index": rng.integers(0, ITEMS, (2, 80))}}
    for etype in WITH_OPTIONS:
        edges[etype]["edge_time"] = rng.integers(0, 1000, edges[etype]["edge_index"].shape[1])
    nodes = {"user": {"x": rng.standard_normal((USERS, 3)).astype(np.float32), "y": rng.integers(0, 3, USERS),
                      "train_idx": np.arange(USERS), "node_time": rng.integers(0, 1000, USERS)},
             "item": {"x": rng.standard_normal((ITEMS, 2)).astype(np.float32),
                      "node_time": rng.integers(0, 1000, ITEMS)}}
    return {"nodes": nodes, "edges": edges}


def _hetero_data(arrays: dict):
    """The same graph as a PyG ``HeteroData`` (node times as PyG's ``time``)."""
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for ntype, named in arrays["nodes"].items():
        for name, value in named.items():
            data[ntype]["time" if name == "node_time" else name] = torch.from_numpy(value)
    for etype, named in arrays["edges"].items():
        for name, value in named.items():
            data[etype][name] = torch.from_numpy(value)
    return data


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """``(parts folder, GraphInput, arrays)``: the graph read from a saved ``HeteroData`` (in memory, so the
    checks can index its arrays), METIS into 2 parts."""
    root = tmp_path_factory.mktemp("typed_options")
    arrays = _arrays()
    torch.save(_hetero_data(arrays), root / "g.pt")
    graph = read_graph(root / "g.pt")
    builder.partition_graph(graph, 2, root / "parts", method="metis", topologies=("csc", "csr"), seed=0)
    return root / "parts", graph, arrays


def _orig(parts, ntype: str) -> torch.Tensor:
    """Original ids of every global id of ``ntype`` (the parts' ranges one after another)."""
    return torch.cat([p.nodes(ntype).orig_id for p in parts])


# ---------------------------------------------------------------------------------------- storage

def test_weights_and_times_are_read_from_both_inputs_and_stored_per_part_and_edge_type(typed, tmp_path):
    parts_dir, graph, arrays = typed
    from_npy = read_graph(save_typed_folder(tmp_path / "g", arrays))
    assert graph.dropped == from_npy.dropped == [] and graph.fingerprint == from_npy.fingerprint
    (tmp_path / "written").mkdir()
    write_typed_folder(tmp_path / "written", graph)      # what `graphfeed generate` writes keeps them
    assert read_graph(tmp_path / "written").fingerprint == graph.fingerprint
    untimed = _arrays()
    del untimed["nodes"]["item"]["node_time"]
    assert read_graph(save_typed_folder(tmp_path / "untimed", untimed)).fingerprint != graph.fingerprint
    meta, parts = open_parts(parts_dir)
    assert sorted(meta.edge_weights) == sorted(meta.edge_times) == sorted(map(edge_type_dirname, WITH_OPTIONS))
    orig = {t: _orig(parts, t) for t in ("user", "item")}
    node_time = {t: torch.from_numpy(arrays["nodes"][t]["node_time"]) for t in orig}
    for part in parts:
        for ntype in orig:
            assert torch.equal(part.nodes(ntype).time, node_time[ntype][part.nodes(ntype).orig_id])
        for etype in WITH_OPTIONS:
            named, store = arrays["edges"][etype], part.edges(etype)
            for kind in ("csc", "csr"):
                topo = store.topology(kind)
                weight = torch.from_numpy(named["edge_weight"]).to(torch.float64)[topo.eid]
                assert torch.equal(part.edge_weights(etype, kind, "edge_weight"), weight)
                edge_time = torch.from_numpy(named["edge_time"])[topo.eid]
                assert torch.equal(part.edge_times(etype, kind, "edge_time"), edge_time)
                nbr_type = etype[0] if kind == "csc" else etype[2]
                nbr = node_time[nbr_type][orig[nbr_type][topo.indices]]
                assert torch.equal(part.edge_times(etype, kind, "time"), nbr), "a neighbour's node time per edge"
        assert part.edges(SIMILAR).edge_weight() is None and part.edges(SIMILAR).stored_times() == ["time"]


@pytest.mark.parametrize("where, name, value, match", [
    ("edges", "edge_weight", lambda a: a[:-1], r"edge type \('item', 'rated', 'user'\): .*edge_weight\.npy has "
                                               r"shape \[244\], edge_index has 245 edges: give one weight per edge"),
    ("edges", "edge_time", lambda a: a.astype(np.float64), r"edge type \('item', 'rated', 'user'\): .*edge_time\.npy "
                                                          r"must be integer timestamps, one per row"),
    ("nodes", "node_time", lambda a: a[:3], r"node type 'item': .*node_time\.npy must be integer timestamps, one per "
                                            r"row \(node type 'item' has 40\)"),
])
def test_bad_weight_and_time_arrays_are_one_line_errors_naming_the_array(tmp_path, where, name, value, match):
    arrays = _arrays()
    named = arrays[where]["item" if where == "nodes" else RATED]
    named[name] = value(named[name])
    with pytest.raises(InputError, match=match) as info:
        read_graph(save_typed_folder(tmp_path / "g", arrays))
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match=r"data\[.*\]\.(edge_weight|edge_time|time)"):   # HeteroData: its names
        torch.save(_hetero_data(arrays), tmp_path / "g.pt")
        read_graph(tmp_path / "g.pt")


# ---------------------------------------------------------------------------------------- weighted

def _star_picks(parts_dir, draws: int, weight_attr: str, etypes) -> dict:
    """Original id of the neighbour of user 0 sampled per edge type of ``etypes`` (fanout 1) under batch seeds
    0..draws-1, through the loader's own sampler."""
    loader = LocalNeighborLoader(parts_dir, {e: [1] for e in etypes}, input_nodes=("user", torch.tensor([0])),
                                 weight_attr=weight_attr)
    graph = loader.graph
    center = graph.to_global(torch.tensor([0]), "user")
    orig = {t: _orig(graph.parts, t) for t in ("user", "item")}
    picks: dict = {e: [] for e in etypes}
    for seed in range(draws):
        sub = graph.sample_typed({"user": center}, loader.spec.sampling, seed, "user")
        for etype in etypes:
            src = sub.nodes[etype[0]].index_select(0, sub.row[etype])
            assert src.numel() == 1 and sub.col[etype].tolist() == [0]
            picks[etype].append(int(orig[etype[0]][src[0]]))
    return picks


def _chi2(picks: list[int], weights: list[float]) -> float:
    counts = np.bincount(picks, minlength=6)[1:6]
    assert counts.sum() == len(picks), "only the star's sources are sampled"
    expected = np.array(weights) / sum(weights) * len(picks)
    return float(((counts - expected) ** 2 / expected).sum())


def test_weighted_frequencies_follow_each_edge_types_weights_and_native_equals_reference(typed, monkeypatch):
    parts_dir = typed[0]
    picks = _star_picks(parts_dir, DRAWS, "edge_weight", (RATED, FOLLOWS))
    for etype in (RATED, FOLLOWS):
        chi2 = _chi2(picks[etype], STAR_WEIGHTS[etype])
        assert chi2 < CHI2_DF4_P001, f"{etype}: chi2 {chi2:.1f} against weights {STAR_WEIGHTS[etype]}"
    by_column = _star_picks(parts_dir, DRAWS, "edge_attr:1", (RATED,))[RATED]   # the same weights, as edge_attr
    assert _chi2(by_column, STAR_WEIGHTS[RATED]) < CHI2_DF4_P001
    if dispatch.IMPLEMENTATION != "native":
        pytest.skip("the native ops are not loaded: no native == reference check")
    monkeypatch.setattr(dispatch, "_NATIVE", None)     # the pure-torch reference from here on
    assert _star_picks(parts_dir, 300, "edge_weight", (RATED, FOLLOWS)) == {e: p[:300] for e, p in picks.items()}


def test_weighted_typed_batches_hold_the_sampler_invariants_native_equals_reference(typed, monkeypatch):
    parts_dir, graph, _ = typed
    args = dict(batch_size=16, input_nodes=("user", "train"), shuffle=True, seed=4, weight_attr="edge_weight")
    native = list(LocalNeighborLoader(parts_dir, FANOUTS, **args))
    for batch in native:
        check_typed_batch(batch, graph, {e: FANOUTS.get(e, [0, 0]) for e in graph.edge_types})
    assert sum(batch[RATES].e_id.numel() for batch in native) > 0, "the second hop expands items"
    monkeypatch.setattr(dispatch, "_NATIVE", None)
    reference = list(LocalNeighborLoader(parts_dir, FANOUTS, **args))
    assert len(native) == len(reference) > 1
    for a, b in zip(native, reference, strict=True):
        assert_same_batch(a, b)


def test_weighted_typed_batches_of_a_one_part_graph_skip_the_uniform_fused_op(typed, tmp_path, monkeypatch):
    """One part holds every node: the fused typed op samples uniformly, so weighted batches take the driver."""
    _, graph, _ = typed
    builder.partition_graph(graph, 1, tmp_path / "one", method="random", topologies=("csc",))
    calls = []
    monkeypatch.setattr(dispatch, "fused_sample_typed", lambda *a, **k: calls.append(a))
    loader = LocalNeighborLoader(tmp_path / "one", FANOUTS, batch_size=20, input_nodes=("user", "train"),
                                 weight_attr="edge_weight")
    batches = list(loader)
    for batch in batches:
        check_typed_batch(batch, graph, {e: FANOUTS.get(e, [0, 0]) for e in graph.edge_types})
    assert len(batches) == 3 and calls == []


# ---------------------------------------------------------------------------------------- temporal

def check_temporal_typed(batch, graph, arrays, time_attr: str, seed_time: torch.Tensor) -> int:
    """Per edge type: every sampled edge is edge ``e_id`` of its relation, stays in its subgraph and is not
    later (``"edge_time"``: the edge, ``"time"``: its source neighbour) than its subgraph's seed time; per node
    type a node appears once per subgraph.  Returns the number of sampled edges."""
    for ntype in batch.node_types:
        pairs = set(zip(batch[ntype].batch.tolist(), batch[ntype].n_id.tolist()))
        assert len(pairs) == batch[ntype].n_id.numel(), f"{ntype}: a node appears twice in one subgraph"
    edges = 0
    for etype in batch.edge_types:
        src, _, dst = etype
        (row, col), e_id = batch[etype].edge_index, batch[etype].e_id
        if e_id.numel() == 0:    # an edge type the fanouts leave out
            continue
        orig = torch.from_numpy(graph.edges[etype].edge_index)
        assert torch.equal(batch[src].n_id[row], orig[0, e_id]) and torch.equal(batch[dst].n_id[col], orig[1, e_id])
        assert torch.equal(batch[src].batch[row], batch[dst].batch[col]), f"{etype}: an edge crosses subgraphs"
        limit = seed_time[batch[dst].batch[col]]
        when = (torch.from_numpy(arrays["nodes"][src]["node_time"])[batch[src].n_id[row]] if time_attr == "time"
                else torch.from_numpy(arrays["edges"][etype]["edge_time"])[e_id])
        assert bool((when <= limit).all()), f"{etype}: a sampled neighbour is later than its seed's time"
        edges += e_id.numel()
    return edges


@pytest.mark.parametrize("time_attr, strategy, fanouts", [
    ("time", "uniform", [3, 2]), ("edge_time", "uniform", FANOUTS), ("time", "last", [3, 2]),
    ("edge_time", "last", FANOUTS)])
def test_temporal_typed_batches_never_sample_the_future(typed, time_attr, strategy, fanouts):
    parts_dir, graph, arrays = typed
    args = dict(batch_size=16, input_nodes=("user", "train"), shuffle=True, seed=2)
    loader = LocalNeighborLoader(parts_dir, fanouts, time_attr=time_attr, temporal_strategy=strategy, **args)
    user_time = torch.from_numpy(arrays["nodes"]["user"]["node_time"])
    edges, seeds = 0, []
    for batch in loader:
        size = batch["user"].batch_size
        assert torch.equal(batch["user"].batch[:size], torch.arange(size))
        assert torch.equal(batch["user"].seed_time, user_time[batch["user"].n_id[:size]]), "the seeds' node times"
        edges += check_temporal_typed(batch, graph, arrays, time_attr, batch["user"].seed_time)
        seeds.append(batch["user"].input_id)
    assert sorted(torch.cat(seeds).tolist()) == list(range(USERS))
    untimed = sum(b[e].e_id.numel() for b in LocalNeighborLoader(parts_dir, fanouts, disjoint=True, **args)
                  for e in b.edge_types)
    assert 0 < edges < untimed, "the time limit removed some neighbours"


def test_temporal_typed_input_time_limits_every_hop_and_native_equals_reference(typed, monkeypatch):
    parts_dir, graph, arrays = typed
    ids = torch.arange(0, USERS, 2)
    input_time = torch.full((ids.numel(),), 400, dtype=torch.int64)
    args = dict(batch_size=8, input_nodes=("user", ids), input_time=input_time, time_attr="edge_time",
                shuffle=True, seed=5)
    native = list(LocalNeighborLoader(parts_dir, FANOUTS, **args))
    for batch in native:
        assert torch.equal(batch["user"].seed_time, input_time[batch["user"].input_id])
        assert check_temporal_typed(batch, graph, arrays, "edge_time", batch["user"].seed_time) > 0
    monkeypatch.setattr(dispatch, "_NATIVE", None)
    reference = list(LocalNeighborLoader(parts_dir, FANOUTS, **args))
    assert len(native) == len(reference) > 1
    for a, b in zip(native, reference, strict=True):
        assert_same_batch(a, b)


def _link_args(arrays) -> dict:
    """Temporal binary link seeds: every 4th ``follows`` edge, at its own edge time."""
    index = torch.from_numpy(arrays["edges"][FOLLOWS]["edge_index"])[:, ::4].contiguous()
    when = torch.from_numpy(arrays["edges"][FOLLOWS]["edge_time"])[::4].contiguous()
    return dict(edge_label_index=(FOLLOWS, index), edge_label_time=when, time_attr="edge_time",
                neg_sampling="binary", batch_size=8, shuffle=True, seed=6)


def test_temporal_typed_link_batches_inherit_the_seed_edge_time(typed):
    parts_dir, graph, arrays = typed
    args = _link_args(arrays)
    when = args["edge_label_time"]
    edges, seen = 0, []
    for batch in LocalLinkNeighborLoader(parts_dir, FANOUTS, **args):
        sub_time = torch.cat([when[batch[FOLLOWS].input_id]] * 2)   # binary negative j: seed edge j's time
        assert torch.equal(batch[FOLLOWS].edge_label_time, sub_time)
        edges += check_temporal_typed(batch, graph, arrays, "edge_time", sub_time)
        seen.append(batch[FOLLOWS].input_id)
    assert edges > 0 and sorted(torch.cat(seen).tolist()) == list(range(when.numel()))


# ---------------------------------------------------------------------------------------- errors

ERRORS = [
    (dict(weight_attr="edge_weight"), [2],
     r"weight_attr='edge_weight': edge type \('item', 'similar', 'item'\) has no edge weights; partition the graph "
     r"with item__similar__item/edge_weight.npy"),
    (dict(weight_attr="edge_attr:1"), {FOLLOWS: [2]},
     r"weight_attr='edge_attr:1': edge type \('user', 'follows', 'user'\) has no edge features"),
    (dict(weight_attr="edge_attr:2"), {RATED: [2]},
     r"the edge features of edge type \('item', 'rated', 'user'\) have shape \[2\]; name one column"),
    (dict(time_attr="edge_time"), [2],
     r"time_attr='edge_time' names no stored time column of edge type \('item', 'similar', 'item'\) \(it stores "
     r"'time'\): partition the graph with item__similar__item/edge_time.npy"),
]


@pytest.mark.parametrize("options, fanouts, match", ERRORS)
def test_an_edge_type_without_the_column_is_a_one_line_error_naming_it(typed, options, fanouts, match):
    with pytest.raises(ValueError, match=match) as info:
        LocalNeighborLoader(typed[0], fanouts, batch_size=8, input_nodes=("user", "train"), **options)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------- remote

@pytest.fixture(scope="module")
def cluster(typed, tmp_path_factory):
    with running_cluster(typed[0], log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def test_remote_weighted_and_temporal_typed_batches_equal_local_and_errors_keep_serving(cluster, typed):
    parts_dir, graph, arrays = typed
    ids = torch.arange(1, USERS, 2)
    cases = [(FANOUTS, dict(input_nodes=("user", "train"), weight_attr="edge_weight")),
             ({RATED: [3, 2]}, dict(input_nodes=("user", "train"), weight_attr="edge_attr:1",
                                                    replace=True)),
             ([3, 2], dict(input_nodes=("user", "train"), time_attr="time")),
             (FANOUTS, dict(input_nodes=("user", ids), time_attr="edge_time", temporal_strategy="last",
                            input_time=torch.full((ids.numel(),), 500, dtype=torch.int64)))]
    addresses = [s.address for s in cluster]
    with gf.connect(addresses, timeout=60) as client:
        for fanouts, kw in cases:
            local = list(LocalNeighborLoader(parts_dir, fanouts, batch_size=12, shuffle=True, seed=3, **kw))
            remote = list(client.neighbor_loader(num_neighbors=fanouts, batch_size=12, shuffle=True, seed=3,
                                                 prefetch=2, **kw))
            assert len(remote) == len(local) > 1
            for a, b in zip(remote, local, strict=True):
                assert_same_batch(a, b)
            if "time_attr" in kw:
                for a in remote:
                    check_temporal_typed(a, graph, arrays, kw["time_attr"], a["user"].seed_time)
        local_links = list(LocalLinkNeighborLoader(parts_dir, FANOUTS, **_link_args(arrays)))
        remote_links = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **_link_args(arrays)))
        assert len(remote_links) == len(local_links) > 1
        for a, b in zip(remote_links, local_links, strict=True):
            assert_same_batch(a, b)
        for options, fanouts, match in ERRORS:
            spec = LoaderSpec.of(("user", "train"), fanouts, batch_size=8, **options)
            with pytest.raises(grpc.RpcError) as info:
                client.servers[0].stub.OpenSession(open_session_request(spec, client.group.group_id), timeout=30,
                                                   metadata=client.servers[0].metadata)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert re.search(match, info.value.details()), info.value.details()
            with pytest.raises(ValueError, match=match) as err:
                client.neighbor_loader(("user", "train"), fanouts, batch_size=8, **options)
            assert "\n" not in str(err.value)
        after = client.neighbor_loader(("user", "train"), FANOUTS, batch_size=30, weight_attr="edge_weight")
        assert len(list(after)) == len(after) > 0   # still serving
    for s in cluster:
        assert health_status(s.address) == SERVING and s.proc.poll() is None
