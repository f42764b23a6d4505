"""The typed multi-hop driver (``neighbor.sample_typed``): PyG's heterogeneous sampling semantics.

Typed graphs are built here directly as one CSC and one CSR :class:`Topology` per edge type
(one part holding every node: row = global id), from random edge lists with three node types,
five edge types, a self-relation, parallel edges and isolated nodes.  Every check is made
against the input edge lists.  The homogeneous driver (``sample_subgraph``) is the one-type
call of the same code; it is checked against the committed version it replaced and the fused
native op.
"""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ROOT
from test_sampler import SPECS, _cycle, _random_multigraph, _star

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE
from graphfeed.server.partition.format.store import Topology
from graphfeed.server.sampling import dispatch, reference
from graphfeed.server.sampling.neighbor import sample_subgraph, sample_typed, stitch
from graphfeed.server.sampling.types import OneHop, TypedSubgraph

IMPLEMENTATIONS = ["reference"] + (["native"] if dispatch.IMPLEMENTATION == "native" else [])
needs_native = pytest.mark.skipif(dispatch.IMPLEMENTATION != "native", reason="native op library not built")


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request, monkeypatch):
    """The reference and, when it is built, the native op library (hops and relabelling alike)."""
    if request.param == "reference":
        monkeypatch.setattr(dispatch, "_NATIVE", None)
    return request.param


# ---------------------------------------------------------------------------------- graphs

def compressed(keys: np.ndarray, others: np.ndarray, n: int) -> Topology:
    """CSC (``keys`` = destinations) or CSR (``keys`` = sources) over ``n`` nodes; eid = edge position."""
    order = np.argsort(keys, kind="stable")
    indptr = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=n))])
    return Topology(torch.from_numpy(indptr), torch.from_numpy(others[order]), torch.from_numpy(order))


class TypedGraph:
    """Per-edge-type edge lists (``[2, E]``, original edge ids = positions) and their CSC/CSR."""

    def __init__(self, num_nodes: dict[str, int], edges: dict[tuple, np.ndarray]):
        self.num_nodes = num_nodes
        self.edges = {e: np.asarray(ei, dtype=np.int64).reshape(2, -1) for e, ei in edges.items()}
        self.csc = {e: compressed(ei[1], ei[0], num_nodes[e[2]]) for e, ei in self.edges.items()}
        self.csr = {e: compressed(ei[0], ei[1], num_nodes[e[0]]) for e, ei in self.edges.items()}

    def degree(self, etype, direction: str) -> torch.Tensor:
        """In-degree of ``etype``'s destinations ("in") or out-degree of its sources ("out")."""
        side = 1 if direction == "in" else 0
        return torch.from_numpy(np.bincount(self.edges[etype][side], minlength=self.num_nodes[etype[2 * side]]))

    def hop_fn(self, direction: str, replace: bool, seed: int, one_hop=dispatch.one_hop, split: bool = False):
        """A typed ``one_hop_fn``: ``one_hop`` on the edge type's topology; ``split`` samples the
        frontier's even and odd ids separately and stitches them, as the multi-part driver does."""
        topos = self.csc if direction == "in" else self.csr

        def fn(etype, gids, fanout, rng_hop) -> OneHop:
            topo = topos[etype]
            if not split:
                return one_hop(topo, gids, gids, fanout, replace, seed, rng_hop)
            pieces = []
            for parity in (1, 0):
                pos = torch.nonzero(gids % 2 == parity).view(-1)
                if pos.numel():
                    pieces.append((pos, one_hop(topo, gids[pos], gids[pos], fanout, replace, seed, rng_hop)))
            return stitch(gids.numel(), pieces)

        return fn


def reference_one_hop(topo, local_nodes, gids, fanout, replace, seed, hop) -> OneHop:
    return reference.one_hop(topo.indptr, topo.indices, topo.eid, local_nodes, gids, fanout, replace, seed, hop)


WRITES, REV_WRITES = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
CITES, TOPIC, KNOWS = ("paper", "cites", "paper"), ("paper", "has_topic", "field"), ("author", "knows", "author")
NUM_NODES = {"author": 40, "field": 8, "paper": 60}


def _random_edges(n_src: int, n_dst: int, e: int, r: np.random.Generator) -> np.ndarray:
    """Random edges over all but the last 2 nodes of each side (isolated), 1 in 5 repeated (parallel)."""
    src, dst = r.integers(0, n_src - 2, e), r.integers(0, n_dst - 2, e)
    dup = r.integers(0, e, e // 5)
    return np.stack([np.concatenate([src, src[dup]]), np.concatenate([dst, dst[dup]])])


@pytest.fixture(scope="module")
def graph() -> TypedGraph:
    r = np.random.default_rng(9)
    writes = _random_edges(NUM_NODES["author"], NUM_NODES["paper"], 150, r)
    edges = {WRITES: writes, REV_WRITES: writes[::-1].copy(),
             CITES: _random_edges(NUM_NODES["paper"], NUM_NODES["paper"], 300, r),
             TOPIC: _random_edges(NUM_NODES["paper"], NUM_NODES["field"], 80, r),
             KNOWS: _random_edges(NUM_NODES["author"], NUM_NODES["author"], 50, r)}
    return TypedGraph(NUM_NODES, edges)


FANOUTS = {
    "list-4-3": [4, 3],
    "list-all": [-1],
    "list-1-1-1": [1, 1, 1],
    "dict-zeros-all": {WRITES: [3, 0], REV_WRITES: [0, 2], CITES: [-1, 2], TOPIC: [2, 2], KNOWS: [0, 0]},
    "dict-all-then-2": {WRITES: [-1, 2], REV_WRITES: [2, -1], CITES: [0, 3], TOPIC: [0, 0], KNOWS: [5, 1]},
}


def per_type(num_neighbors, graph: TypedGraph) -> dict:
    """PyG's ``num_neighbors`` as the driver takes it: one list applies to every edge type."""
    return dict(num_neighbors) if isinstance(num_neighbors, dict) else {e: num_neighbors for e in graph.edges}


def _seeds(gen_seed: int, batch: int, ntype: str = "paper") -> dict[str, torch.Tensor]:
    return {ntype: torch.randperm(NUM_NODES[ntype], generator=torch.Generator().manual_seed(gen_seed))[:batch]}


# ---------------------------------------------------------------------------------- checks

def check_typed(graph: TypedGraph, seeds, fanouts, direction: str, replace: bool, sub: TypedSubgraph) -> None:
    """Every invariant of one typed sample (see TypedSubgraph and sample_typed's docstrings)."""
    hops = len(next(iter(fanouts.values())))
    assert set(sub.nodes) == set(graph.num_nodes) and set(sub.row) == set(fanouts)
    for ntype, n in graph.num_nodes.items():
        _check_nodes(sub, ntype, seeds.get(ntype, torch.empty(0, dtype=torch.int64)), n, hops)
    for etype, ks in fanouts.items():
        _check_edges(graph, sub, etype, ks, direction, replace)
    _check_first_appearance(sub, sorted(fanouts), hops, direction)


def _check_nodes(sub: TypedSubgraph, ntype: str, seeds: torch.Tensor, n: int, hops: int) -> None:
    nodes, counts = sub.nodes[ntype], sub.num_sampled_nodes[ntype]
    assert torch.equal(nodes[:seeds.numel()], seeds), f"{ntype}: the seeds must come first"
    assert torch.unique(nodes).numel() == nodes.numel(), f"{ntype}: a node is listed twice"
    assert bool(((nodes >= 0) & (nodes < n)).all())
    assert len(counts) == hops + 1 and counts[0] == seeds.numel() and sum(counts) == nodes.numel()


def _check_edges(graph: TypedGraph, sub: TypedSubgraph, etype, ks, direction: str, replace: bool) -> None:
    src_t, _, dst_t = etype
    row, col, eids, counts = sub.row[etype], sub.col[etype], sub.eids[etype], sub.num_sampled_edges[etype]
    assert len(counts) == len(ks) and sum(counts) == row.numel() == col.numel() == eids.numel()
    assert sub.edge_index(etype).shape == (2, row.numel())
    # Every sampled edge is an edge of its relation, in its true direction, with its own edge id.
    ei = torch.from_numpy(graph.edges[etype])
    assert bool(((eids >= 0) & (eids < ei.size(1))).all())
    assert torch.equal(ei[0, eids], sub.nodes[src_t][row]), f"{etype}: edge source differs from the input edge"
    assert torch.equal(ei[1, eids], sub.nodes[dst_t][col]), f"{etype}: edge target differs from the input edge"
    center_t, other_t = (dst_t, src_t) if direction == "in" else (src_t, dst_t)
    center, other = (col, row) if direction == "in" else (row, col)
    node_bounds = {t: np.cumsum([0] + sub.num_sampled_nodes[t]) for t in (center_t, other_t)}
    edge_bounds = np.cumsum([0] + counts)
    deg = graph.degree(etype, direction)
    for hop, k in enumerate(ks):
        lo, hi = edge_bounds[hop], edge_bounds[hop + 1]
        f_lo, f_hi = node_bounds[center_t][hop], node_bounds[center_t][hop + 1]
        assert bool(((center[lo:hi] >= f_lo) & (center[lo:hi] < f_hi)).all()), f"{etype} hop {hop}: off-frontier"
        assert bool((other[lo:hi] < node_bounds[other_t][hop + 2]).all()), f"{etype} hop {hop}: neighbor unnumbered"
        got = torch.bincount(center[lo:hi] - f_lo, minlength=f_hi - f_lo)
        assert torch.equal(got, _want_counts(deg[sub.nodes[center_t][f_lo:f_hi]], k, replace)), \
            f"{etype} hop {hop}: per-node sample counts differ from the fanout rule"
    if not replace:
        # Frontiers of one type are disjoint across hops: without replacement no edge repeats at all.
        assert torch.unique(eids).numel() == eids.numel(), f"{etype}: an edge was sampled twice"


def _want_counts(deg: torch.Tensor, k: int, replace: bool) -> torch.Tensor:
    if k == 0:
        return torch.zeros_like(deg)
    if k < 0:
        return deg
    return torch.where(deg > 0, k, 0) if replace else deg.clamp(max=k)


def _check_first_appearance(sub: TypedSubgraph, etypes, hops: int, direction: str) -> None:
    """A type's nodes new at a hop are numbered in order of first appearance over the edge types in sorted order."""
    other_side = 0 if direction == "in" else 2
    for ntype, counts in sub.num_sampled_nodes.items():
        bounds = np.cumsum([0] + counts)
        for hop in range(hops):
            seen = []
            for etype in etypes:
                if etype[other_side] == ntype:
                    lo = sum(sub.num_sampled_edges[etype][:hop])
                    ids = (sub.row if direction == "in" else sub.col)[etype]
                    seen.extend(ids[lo:lo + sub.num_sampled_edges[etype][hop]].tolist())
            new = [v for v in dict.fromkeys(seen) if v >= bounds[hop + 1]]
            assert new == list(range(bounds[hop + 1], bounds[hop + 2])), f"{ntype} hop {hop}: numbering order"


def assert_same(a: TypedSubgraph, b: TypedSubgraph) -> None:
    for f in ("nodes", "row", "col", "eids"):
        da, db = getattr(a, f), getattr(b, f)
        assert da.keys() == db.keys()
        for key in da:
            assert torch.equal(da[key], db[key]), f"{f}[{key}]"
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    assert (a.batch_size, a.input_type) == (b.batch_size, b.input_type)


# ------------------------------------------------------------------------------- invariants

@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("name", list(FANOUTS))
def test_invariants(graph, impl, name, direction, replace):
    fanouts = per_type(FANOUTS[name], graph)
    for gen_seed, batch in [(0, 1), (1, 9), (2, 35), (3, NUM_NODES["paper"])]:
        seeds = _seeds(gen_seed, batch)
        sub = sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, replace, seed=gen_seed))
        check_typed(graph, seeds, fanouts, direction, replace, sub)
        assert sub.input_type == "paper" and sub.batch_size == batch


def test_seeds_of_several_types(graph, impl):
    seeds = {**_seeds(4, 12, "author"), **_seeds(5, 3, "field")}
    fanouts = per_type([3, 2], graph)
    for direction in ("in", "out"):
        sub = sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, False, 1), input_type="field")
        check_typed(graph, seeds, fanouts, direction, False, sub)
        assert (sub.input_type, sub.batch_size) == ("field", 3)


def test_all_neighbors_takes_every_edge_of_the_seeds(graph, impl):
    seeds = _seeds(6, 20)
    fanouts = per_type([-1], graph)
    for direction, side in (("in", 1), ("out", 0)):
        sub = sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, False, 3))
        for etype, ei in graph.edges.items():
            center_t = etype[2 * side]
            want = np.flatnonzero(np.isin(ei[side], seeds[center_t].numpy())) if center_t == "paper" else []
            assert sorted(sub.eids[etype].tolist()) == list(want), f"{etype} {direction}"


def test_isolated_seeds_sample_nothing(graph, impl):
    seeds = {"paper": torch.tensor([NUM_NODES["paper"] - 1, NUM_NODES["paper"] - 2])}
    fanouts = per_type([-1, 3], graph)
    sub = sample_typed(seeds, fanouts, "in", graph.hop_fn("in", False, 0))
    assert torch.equal(sub.nodes["paper"], seeds["paper"])
    assert all(sub.num_sampled_edges[e] == [0, 0] for e in fanouts)
    assert sub.num_sampled_nodes == {"author": [0, 0, 0], "field": [0, 0, 0], "paper": [2, 0, 0]}


def test_hand_worked_example(impl):
    # a0->b0, a1->b0, a2->b1 (x); b1->b0, b2->b1 (y); c0->a1 (w).  In-edges from seed b0, all neighbors.
    x, y, w = ("a", "x", "b"), ("b", "y", "b"), ("c", "w", "a")
    g = TypedGraph({"a": 3, "b": 3, "c": 1}, {x: [[0, 1, 2], [0, 0, 1]], y: [[1, 2], [0, 1]], w: [[0], [1]]})
    fanouts = {w: [-1, -1], x: [-1, -1], y: [-1, -1]}
    sub = sample_typed({"b": torch.tensor([0])}, fanouts, "in", g.hop_fn("in", False, 0))
    # hop 0 (x, y, w in that order): x gives a0, a1; y gives b1; w has no frontier (no a seeds).
    # hop 1: x from b1 gives a2; y from b1 gives b2; w from a0, a1 gives c0.
    assert {t: v.tolist() for t, v in sub.nodes.items()} == {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0]}
    assert sub.num_sampled_nodes == {"a": [0, 2, 1], "b": [1, 1, 1], "c": [0, 0, 1]}
    assert sub.edge_index(x).tolist() == [[0, 1, 2], [0, 0, 1]] and sub.eids[x].tolist() == [0, 1, 2]
    assert sub.edge_index(y).tolist() == [[1, 2], [0, 1]] and sub.eids[y].tolist() == [0, 1]
    assert sub.edge_index(w).tolist() == [[0], [1]] and sub.eids[w].tolist() == [0]
    assert sub.num_sampled_edges == {w: [0, 1], x: [2, 1], y: [1, 1]}
    # Out-edges from a1: x reaches b0 at hop 0; b0 has no out-edges in y; no edge type leaves c.
    out = sample_typed({"a": torch.tensor([1])}, fanouts, "out", g.hop_fn("out", False, 0))
    assert {t: v.tolist() for t, v in out.nodes.items()} == {"a": [1], "b": [0], "c": []}
    assert out.edge_index(x).tolist() == [[0], [0]] and out.eids[x].tolist() == [1]
    assert out.num_sampled_edges == {w: [0, 0], x: [1, 0], y: [0, 0]}


# ------------------------------------------------------------------------------ the RNG key

def test_rng_hop_is_hop_times_edge_types_plus_position(graph):
    calls = []
    inner = graph.hop_fn("in", False, 5)

    def recording(etype, gids, fanout, rng_hop):
        calls.append((etype, fanout, rng_hop))
        return inner(etype, gids, fanout, rng_hop)

    fanouts = per_type(FANOUTS["dict-zeros-all"], graph)
    sample_typed(_seeds(7, 30), fanouts, "in", recording)
    # Sorted: knows, writes, cites, has_topic, rev_writes (E = 5).  Paper seeds, in-edges: hop 0 expands
    # the types into paper (writes, cites); hop 1 skips writes (0) and expands cites and rev_writes (from
    # the authors of hop 0); has_topic has no field frontier, knows is 0 at both hops.
    want = [(WRITES, 3, 0 * 5 + 1), (CITES, -1, 0 * 5 + 2), (CITES, 2, 1 * 5 + 2), (REV_WRITES, 2, 1 * 5 + 4)]
    assert calls == want


def test_edge_types_draw_independent_streams(impl):
    # Two relations with the same edges: the same node samples them with different draws.
    r = np.random.default_rng(3)
    ei = np.stack([r.integers(0, 30, 600), r.integers(0, 30, 600)])
    a, b = ("n", "a", "n"), ("n", "b", "n")
    g = TypedGraph({"n": 30}, {a: ei, b: ei})
    seeds = {"n": torch.arange(30)}
    sub = sample_typed(seeds, {a: [3], b: [3]}, "in", g.hop_fn("in", False, 8))
    per_node = [(sorted(sub.eids[e][sub.col[e] == i].tolist()) for e in (a, b)) for i in range(30)]
    same = sum(x == y for x, y in per_node)
    assert same <= 3, f"{same} of 30 nodes drew the same 3 of ~20 edges in both relations"
    alone = sample_typed(seeds, {a: [3]}, "in", g.hop_fn("in", False, 8))
    assert torch.equal(alone.eids[a], sample_subgraph(seeds["n"], SamplingSpec((3,)), _untyped(g, a)).eids)


def _untyped(g: TypedGraph, etype):
    fn = g.hop_fn("in", False, 8)
    return lambda gids, fanout, hop: fn(etype, gids, fanout, hop)


# ---------------------------------------------------------------- implementations and splits

@needs_native
@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("name", list(FANOUTS))
def test_native_equals_reference_and_split_equals_whole(graph, monkeypatch, name, direction, replace):
    fanouts = per_type(FANOUTS[name], graph)
    seeds = _seeds(11, 25)
    native = sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, replace, 2))
    check_typed(graph, seeds, fanouts, direction, replace, native)
    variants = {"reference hops": graph.hop_fn(direction, replace, 2, one_hop=reference_one_hop),
                "split by parity": graph.hop_fn(direction, replace, 2, split=True)}
    for fn in variants.values():
        assert_same(native, sample_typed(seeds, fanouts, direction, fn))
    monkeypatch.setattr(dispatch, "_NATIVE", None)   # the reference hop and relabel throughout
    for fn in variants.values():
        assert_same(native, sample_typed(seeds, fanouts, direction, fn))


def test_split_equals_whole(graph, impl):
    fanouts = per_type(FANOUTS["dict-all-then-2"], graph)
    for direction in ("in", "out"):
        seeds = _seeds(12, 17)
        whole = sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, True, 4))
        assert_same(whole, sample_typed(seeds, fanouts, direction, graph.hop_fn(direction, True, 4, split=True)))


# --------------------------------------------------------------------- the homogeneous case

PINNED = "35a5a28f2c790d870d265b67bc7d900427ce0fea"   # the last commit with the homogeneous-only driver


def _committed_sample_subgraph(tmp_path: Path):
    """``sample_subgraph`` as committed in ``PINNED`` (read from git; skip without the history)."""
    try:
        src = subprocess.run(["git", "show", f"{PINNED}:server/sampling/neighbor.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip(f"git history with commit {PINNED[:8]} is not available")
    path = tmp_path / "neighbor_committed.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("graphfeed.server.sampling._neighbor_committed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sample_subgraph


HOMOGENEOUS = {"random": (_random_multigraph(300, 3000, 1), 300), "star": (_star(40), 41), "cycle": (_cycle(12), 12)}


def _homogeneous(name: str) -> TypedGraph:
    ei, n = HOMOGENEOUS[name]
    return TypedGraph({DEFAULT_NODE_TYPE: n}, {DEFAULT_EDGE_TYPE: ei})


def _hom_cases(name: str):
    n = HOMOGENEOUS[name][1]
    for seed, batch in [(0, 1), (1, 17), (2, 64), (3, n - 5)]:
        yield seed, torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:min(batch, n)]


def _hom_hop_fn(g: TypedGraph, spec: SamplingSpec, seed: int):
    fn = g.hop_fn(spec.direction, spec.replace, seed)
    return lambda gids, fanout, hop: fn(DEFAULT_EDGE_TYPE, gids, fanout, hop)


def _assert_same_subgraph(a, b) -> None:
    for f in ("nodes", "row", "col", "eids"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert (a.batch_size, a.num_sampled_nodes, a.num_sampled_edges) == \
        (b.batch_size, b.num_sampled_nodes, b.num_sampled_edges)


@pytest.mark.parametrize("name", list(HOMOGENEOUS))
def test_one_type_equals_the_committed_homogeneous_driver(impl, tmp_path, name):
    committed = _committed_sample_subgraph(tmp_path)
    g = _homogeneous(name)
    for spec in SPECS:
        for seed, seeds in _hom_cases(name):
            hop_fn = _hom_hop_fn(g, spec, seed)
            now = sample_subgraph(seeds, spec, hop_fn)
            _assert_same_subgraph(now, committed(seeds, spec, hop_fn))
            typed = sample_typed({DEFAULT_NODE_TYPE: seeds}, {DEFAULT_EDGE_TYPE: spec.num_neighbors},
                                 spec.direction, g.hop_fn(spec.direction, spec.replace, seed))
            _assert_same_subgraph(now, typed.homogeneous())


@needs_native
@pytest.mark.parametrize("name", list(HOMOGENEOUS))
def test_one_type_equals_the_fused_native_op(name):
    g = _homogeneous(name)
    for spec in SPECS:
        topo = (g.csc if spec.direction == "in" else g.csr)[DEFAULT_EDGE_TYPE]
        for seed, seeds in _hom_cases(name):
            fused = dispatch.fused_sample_subgraph(topo, 0, seeds, spec, seed)
            _assert_same_subgraph(sample_subgraph(seeds, spec, _hom_hop_fn(g, spec, seed)), fused)


def test_dict_fanouts_of_the_one_edge_type_equal_the_list(impl):
    g = _homogeneous("random")
    for spec in (SamplingSpec((5, 3)), SamplingSpec((-1, 2), replace=True, direction="out")):
        as_dict = SamplingSpec({DEFAULT_EDGE_TYPE: spec.num_neighbors}, spec.replace, spec.direction)
        for seed, seeds in _hom_cases("random"):
            _assert_same_subgraph(sample_subgraph(seeds, spec, _hom_hop_fn(g, spec, seed)),
                                  sample_subgraph(seeds, as_dict, _hom_hop_fn(g, spec, seed)))


def test_results_do_not_alias_the_inputs(graph):
    seeds = _seeds(1, 5)
    sub = sample_typed(seeds, {CITES: [0]}, "in", graph.hop_fn("in", False, 0))
    sub.nodes["paper"][0] = -7
    assert int(seeds["paper"][0]) != -7


# ------------------------------------------------------------------------------------ errors

def test_fanout_errors(graph):
    fn = graph.hop_fn("in", False, 0)
    with pytest.raises(ValueError, match="same number"):
        sample_typed(_seeds(0, 3), {CITES: [2, 2], WRITES: [2]}, "in", fn)
    with pytest.raises(ValueError, match=r"invalid fanout\(s\) \[-2\]"):
        sample_typed(_seeds(0, 3), {CITES: [2, -2]}, "in", fn)
    with pytest.raises(ValueError, match="fanouts is empty"):
        sample_typed(_seeds(0, 3), {}, "in", fn)


def test_seed_and_direction_errors(graph):
    fn, fanouts = graph.hop_fn("in", False, 0), per_type([2], graph)
    with pytest.raises(ValueError, match="node type 'venue', which no edge type"):
        sample_typed({"venue": torch.tensor([0])}, fanouts, "in", fn)
    with pytest.raises(ValueError, match="name the input_type"):
        sample_typed({**_seeds(0, 2), **_seeds(0, 2, "author")}, fanouts, "in", fn)
    with pytest.raises(ValueError, match="input_type 'field' has no seeds"):
        sample_typed(_seeds(0, 2), fanouts, "in", fn, input_type="field")
    with pytest.raises(ValueError, match="direction must be 'in' or 'out'"):
        sample_typed(_seeds(0, 2), fanouts, "both", fn)
    sub = sample_typed(_seeds(0, 2), fanouts, "in", fn)
    with pytest.raises(ValueError, match="one node type and one edge type"):
        sub.homogeneous()
