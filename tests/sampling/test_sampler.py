"""Invariants of the reference neighbor sampler (the oracle of the native kernels).

Graphs are partitioned into temporary folders here (not through conftest fixtures) and
sampled through :class:`PartitionedGraph`; every check is made in original ids against the
input ``edge_index``, so the partition renumbering is exercised too.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch

from graphfeed.core.seeding import MASK64, mix64_int
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.format.book import RangePartitionBook
from graphfeed.server.partition.format.store import Topology, open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling import dispatch, reference, rng
from graphfeed.server.sampling.graph import PartitionedGraph
from graphfeed.server.sampling.neighbor import sample_subgraph

# ------------------------------------------------------------------------ implementations

IMPLEMENTATIONS = ["reference"] + (["native"] if dispatch.IMPLEMENTATION == "native" else [])


@pytest.fixture(autouse=True, params=IMPLEMENTATIONS)
def impl(request, monkeypatch):
    """Run every test against the reference and, when it is built, the native op library."""
    if request.param == "reference":
        monkeypatch.setattr(dispatch, "_NATIVE", None)
    return request.param


# ---------------------------------------------------------------------------------- graphs

def _graph_input(edge_index, num_nodes: int) -> GraphInput:
    ei = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
    x = np.arange(num_nodes * 2, dtype=np.float32).reshape(num_nodes, 2)
    y = np.arange(num_nodes, dtype=np.int64) % 3
    return GraphInput(ei, x, y, {"train": np.arange(num_nodes, dtype=np.int64)})


class Case:
    """A partitioned graph plus the facts about its input that the checks need."""

    def __init__(self, root, edge_index, num_nodes: int):
        self.edge_index = np.asarray(edge_index, dtype=np.int64).reshape(2, -1)
        self.num_nodes = num_nodes
        self.graph = PartitionedGraph.in_process(open_parts(root)[1])
        orig = torch.cat([p.orig_id for p in self.graph.parts])
        self.gid_of_orig = torch.empty(num_nodes, dtype=torch.int64)
        self.gid_of_orig[orig] = torch.arange(num_nodes)
        self.in_deg = np.bincount(self.edge_index[1], minlength=num_nodes)
        self.out_deg = np.bincount(self.edge_index[0], minlength=num_nodes)

    def orig(self, gids: torch.Tensor) -> torch.Tensor:
        return self.graph.gather(gids).n_id

    def sample(self, seeds_orig, spec: SamplingSpec, seed: int = 7):
        seeds = self.gid_of_orig[torch.as_tensor(seeds_orig, dtype=torch.int64)]
        return self.graph.sample(seeds, spec, seed)


def _partition(tmp_path_factory, name, edge_index, num_nodes, parts, method="random"):
    root = tmp_path_factory.mktemp(name) / "parts"
    partition_graph(_graph_input(edge_index, num_nodes), parts, root, method=method, topologies=("csc", "csr"))
    return Case(root, edge_index, num_nodes)


def _random_multigraph(n: int, e: int, seed: int) -> np.ndarray:
    """Random directed edges with self loops and repeated (multi-)edges, some isolated nodes."""
    r = np.random.default_rng(seed)
    src = r.integers(0, n - 5, e)          # the last 5 nodes have no out-edges ...
    dst = r.integers(0, n - 5, e)          # ... and no in-edges: isolated
    dup = r.integers(0, e, e // 10)
    return np.stack([np.concatenate([src, src[dup]]), np.concatenate([dst, dst[dup]])])


STAR_LEAVES = 40


def _star(leaves: int) -> np.ndarray:
    """Center 0, leaves 1..L, edges both ways."""
    leaf = np.arange(1, leaves + 1)
    return np.stack([np.concatenate([leaf, np.zeros(leaves, np.int64)]),
                     np.concatenate([np.zeros(leaves, np.int64), leaf])])


def _cycle(n: int) -> np.ndarray:
    a = np.arange(n)
    return np.stack([a, (a + 1) % n])


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda p: f"P{p}")
def rand_case(request, tmp_path_factory):
    return _partition(tmp_path_factory, f"rand{request.param}", _random_multigraph(300, 3000, 1), 300, request.param)


@pytest.fixture(scope="module")
def star_case(tmp_path_factory):
    return _partition(tmp_path_factory, "star", _star(STAR_LEAVES), STAR_LEAVES + 1, 2)


@pytest.fixture(scope="module")
def cycle_case(tmp_path_factory):
    return _partition(tmp_path_factory, "cycle", _cycle(12), 12, 3)


# ---------------------------------------------------------------------------------- checks

def check_subgraph(case: Case, seeds_orig, spec: SamplingSpec, sub) -> None:
    """Every structural invariant of one sample (see SampledSubgraph / reference docstrings)."""
    seeds_orig = torch.as_tensor(seeds_orig, dtype=torch.int64)
    n_id = case.orig(sub.nodes)
    row, col, e_id = sub.row, sub.col, sub.eids
    # Seeds first, every node once, counts add up.
    assert sub.batch_size == seeds_orig.numel()
    assert torch.equal(n_id[:sub.batch_size], seeds_orig)
    assert torch.unique(sub.nodes).numel() == sub.nodes.numel()
    assert sum(sub.num_sampled_nodes) == sub.nodes.numel()
    assert sub.num_sampled_nodes[0] == sub.batch_size
    assert len(sub.num_sampled_nodes) == len(spec.num_neighbors) + 1
    assert len(sub.num_sampled_edges) == len(spec.num_neighbors)
    assert sum(sub.num_sampled_edges) == row.numel() == col.numel() == e_id.numel()
    assert sub.edge_index.shape == (2, row.numel())
    # Every sampled edge exists, in its true direction, with its own edge id.
    ei = torch.from_numpy(case.edge_index)
    assert bool((e_id >= 0).all()) and bool((e_id < ei.size(1)).all())
    assert torch.equal(ei[0, e_id], n_id[row]), "edge source does not match the input edge of e_id"
    assert torch.equal(ei[1, e_id], n_id[col]), "edge target does not match the input edge of e_id"
    # Per hop: edges hang off that hop's frontier, neighbors are known by the end of the hop.
    node_bounds = np.cumsum([0] + list(sub.num_sampled_nodes))
    edge_bounds = np.cumsum([0] + list(sub.num_sampled_edges))
    deg = case.in_deg if spec.direction == "in" else case.out_deg
    for hop, k in enumerate(spec.num_neighbors):
        lo, hi = edge_bounds[hop], edge_bounds[hop + 1]
        center = (col if spec.direction == "in" else row)[lo:hi]
        other = (row if spec.direction == "in" else col)[lo:hi]
        f_lo, f_hi = node_bounds[hop], node_bounds[hop + 1]
        assert bool(((center >= f_lo) & (center < f_hi)).all()), f"hop {hop}: edge centered off the frontier"
        assert bool((other < node_bounds[hop + 2]).all()), f"hop {hop}: neighbor not numbered by this hop"
        got = torch.bincount(center - f_lo, minlength=f_hi - f_lo)
        d = torch.from_numpy(deg)[n_id[f_lo:f_hi]]
        if k < 0:
            want = d
        elif spec.replace:
            want = torch.where(d > 0, k, 0)
        else:
            want = d.clamp(max=k)
        assert torch.equal(got, want), f"hop {hop}: per-node sample counts differ from min(deg, fanout)"
        if k < 0 or (not spec.replace):
            # Without replacement each position (edge) is taken at most once per node; the
            # frontiers of different hops are disjoint, so edge ids are distinct per hop.
            assert torch.unique(e_id[lo:hi]).numel() == hi - lo, f"hop {hop}: an edge was sampled twice"
    if not spec.replace:
        assert torch.unique(e_id).numel() == e_id.numel()
    if any(k < 0 for k in spec.num_neighbors) and len(spec.num_neighbors) == 1:
        want_edges = np.flatnonzero(np.isin(case.edge_index[1 if spec.direction == "in" else 0], seeds_orig.numpy()))
        assert sorted(e_id.tolist()) == want_edges.tolist(), "fanout -1 must take every edge of the seeds"


SPECS = [
    SamplingSpec((5, 3)),
    SamplingSpec((5, 3), replace=True),
    SamplingSpec((-1,)),
    SamplingSpec((-1, 2)),
    SamplingSpec((1, 1, 1, 1)),
    SamplingSpec((4, 4), direction="out"),
    SamplingSpec((3, -1), replace=True, direction="out"),
    SamplingSpec((50,)),
]


def _spec_id(s):
    return f"{s.num_neighbors}-{'rep' if s.replace else 'norep'}-{s.direction}"


@pytest.mark.parametrize("spec", SPECS, ids=_spec_id)
def test_invariants_random_multigraph(rand_case, spec):
    for seed, batch in [(0, 1), (1, 17), (2, 64), (3, 295)]:
        seeds = torch.randperm(rand_case.num_nodes, generator=torch.Generator().manual_seed(seed))[:batch]
        sub = rand_case.sample(seeds, spec, seed=seed)
        check_subgraph(rand_case, seeds, spec, sub)


def test_isolated_seeds_have_no_edges(rand_case):
    isolated = torch.arange(rand_case.num_nodes - 5, rand_case.num_nodes)
    for spec in (SamplingSpec((5, 5)), SamplingSpec((-1,), direction="out"), SamplingSpec((3,), replace=True)):
        sub = rand_case.sample(isolated, spec)
        check_subgraph(rand_case, isolated, spec, sub)
        assert sub.row.numel() == 0
        assert sub.num_sampled_nodes == [5] + [0] * len(spec.num_neighbors)
        assert torch.equal(rand_case.orig(sub.nodes), isolated)


def test_multi_edges_keep_distinct_edge_ids(tmp_path_factory):
    # Node 0 has 6 in-edges, all from node 1: the neighbor repeats, edge ids must not.
    ei = np.array([[1] * 6 + [2], [0] * 6 + [1]])
    case = _partition(tmp_path_factory, "multi", ei, 3, 2)
    spec = SamplingSpec((4, 2))
    sub = case.sample([0], spec)
    check_subgraph(case, [0], spec, sub)
    assert sub.num_sampled_edges == [4, 1]
    assert case.orig(sub.nodes).tolist() == [0, 1, 2]
    assert torch.unique(sub.eids[:4]).numel() == 4 and bool((sub.eids[:4] < 6).all())
    rep = case.sample([0], SamplingSpec((20,), replace=True))
    assert rep.num_sampled_edges == [20] and rep.nodes.numel() == 2


def test_cycle_is_a_path_backwards(cycle_case):
    # In-neighbor of i on the cycle i -> i+1 is i-1: three hops from 5 visit 5, 4, 3, 2.
    spec = SamplingSpec((3, 3, 3))
    sub = cycle_case.sample([5], spec)
    check_subgraph(cycle_case, [5], spec, sub)
    assert cycle_case.orig(sub.nodes).tolist() == [5, 4, 3, 2]
    assert sub.num_sampled_edges == [1, 1, 1]
    out = cycle_case.sample([5], SamplingSpec((3, 3, 3), direction="out"))
    assert cycle_case.orig(out.nodes).tolist() == [5, 6, 7, 8]
    # Full loop: after 12 hops every node is known and the 12th hop only closes the cycle.
    full = cycle_case.sample([0], SamplingSpec((1,) * 12))
    assert full.num_sampled_nodes == [1] * 12 + [0]
    assert full.num_sampled_edges == [1] * 12
    assert full.row[-1].item() == 0 and full.col[-1].item() == 11


def test_star_fanout_all_and_bounds(star_case):
    for spec in (SamplingSpec((-1,)), SamplingSpec((7, 2)), SamplingSpec((7, 2), replace=True),
                 SamplingSpec((-1, -1), direction="out")):
        sub = star_case.sample([0, 3], spec)
        check_subgraph(star_case, [0, 3], spec, sub)
    sub = star_case.sample([0], SamplingSpec((-1,)))
    assert sorted(star_case.orig(sub.nodes[1:]).tolist()) == list(range(1, STAR_LEAVES + 1))


def test_direction_in_vs_out(tmp_path_factory):
    # 0 -> 1 -> 2: in-neighbors of 1 are {0}, out-neighbors {2}; edge_index keeps true direction.
    case = _partition(tmp_path_factory, "chain", np.array([[0, 1], [1, 2]]), 3, 1)
    sub_in = case.sample([1], SamplingSpec((-1,)))
    assert case.orig(sub_in.nodes).tolist() == [1, 0]
    assert sub_in.edge_index.tolist() == [[1], [0]]      # source 0 (local 1) -> seed 1 (local 0)
    assert sub_in.eids.tolist() == [0]
    sub_out = case.sample([1], SamplingSpec((-1,), direction="out"))
    assert case.orig(sub_out.nodes).tolist() == [1, 2]
    assert sub_out.edge_index.tolist() == [[0], [1]]     # seed 1 (local 0) -> 2 (local 1)
    assert sub_out.eids.tolist() == [1]


def test_determinism_and_seed_sensitivity(rand_case):
    seeds = torch.arange(0, 200, 3)
    for spec in (SamplingSpec((5, 3)), SamplingSpec((5, 3), replace=True)):
        a, b = rand_case.sample(seeds, spec, seed=11), rand_case.sample(seeds, spec, seed=11)
        for f in ("nodes", "row", "col", "eids"):
            assert torch.equal(getattr(a, f), getattr(b, f))
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        c = rand_case.sample(seeds, spec, seed=12)
        assert a.eids.tolist() != c.eids.tolist(), "a different batch seed must give a different sample"


def test_seed_order_does_not_change_neighborhoods(rand_case):
    # Counter-based RNG: a node's sample depends on (seed, hop, gid), not on its frontier position.
    seeds = torch.arange(0, 120)
    spec = SamplingSpec((6,))
    a = rand_case.sample(seeds, spec, seed=3)
    b = rand_case.sample(seeds.flip(0), spec, seed=3)

    def per_seed(sub, seeds_):
        return {int(s): sorted(sub.eids[sub.col == i].tolist()) for i, s in enumerate(seeds_.tolist())}

    assert per_seed(a, seeds) == per_seed(b, seeds.flip(0))


# ---------------------------------------------------------------- split / stitch exactness

def _concatenated_topology(parts, kind: str) -> Topology:
    indptrs, offset = [], 0
    for p in parts:
        t = p.topology(kind)
        indptrs.append(t.indptr[:-1] + offset)
        offset += int(t.indptr[-1])
    indptr = torch.cat(indptrs + [torch.tensor([offset])])
    return Topology(indptr, torch.cat([p.topology(kind).indices for p in parts]),
                    torch.cat([p.topology(kind).eid for p in parts]))


@pytest.mark.parametrize("spec", [SamplingSpec((5, 3, 2)), SamplingSpec((4, -1), replace=True),
                                  SamplingSpec((3, 3), direction="out")], ids=str)
def test_multi_part_equals_single_concatenated_topology(rand_case, spec):
    topo = _concatenated_topology(rand_case.graph.parts, spec.topology)

    def single(gids, fanout, hop):
        return dispatch.one_hop(topo, gids, gids, fanout, spec.replace, 99, hop)

    for batch in (1, 40, 290):
        seeds = torch.randperm(rand_case.num_nodes, generator=torch.Generator().manual_seed(batch))[:batch]
        a = rand_case.graph.sample(seeds, spec, 99)
        b = sample_subgraph(seeds, spec, single)
        for f in ("nodes", "row", "col", "eids"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


def test_multi_part_gather_puts_every_row_in_place(rand_case):
    """Rows of ids from every part, repeated and shuffled, land at their positions (x = [2o, 2o+1], y = o % 3)."""
    g = torch.Generator().manual_seed(5)
    gids = torch.randint(0, rand_case.num_nodes, (700,), generator=g)
    rows = rand_case.graph.gather(gids)
    x, y, orig = rows.x, rows.y, rows.n_id
    assert torch.equal(rand_case.gid_of_orig[orig], gids)
    assert torch.equal(x, torch.stack([2 * orig, 2 * orig + 1], dim=1).to(x.dtype))
    assert torch.equal(y, orig % 3)


@pytest.mark.parametrize("num_parts", [1, 2, 3, 6])
def test_book_split_gives_each_owner_its_positions_in_order(num_parts):
    bounds = [0] + sorted(torch.randint(0, 100, (num_parts - 1,), generator=torch.Generator().manual_seed(1)).tolist())
    book = RangePartitionBook(bounds + [100])
    gids = torch.randint(0, 100, (500,), generator=torch.Generator().manual_seed(2))
    split = book.split(gids)
    owner = book.owner(gids)
    assert [p for p, _ in split] == sorted(set(owner.tolist()))
    for part, pos in split:
        assert torch.equal(pos, torch.nonzero(owner == part).view(-1))


# ----------------------------------------------------------- the selection rule, spelled out

def _draw_int(key: int, i: int) -> int:
    return mix64_int(key + (i + 1) * 0x9E3779B97F4A7C15) >> 1


def _positions_by_spec(deg: int, key: int, k: int, replace: bool) -> list[int]:
    """The selection rule of reference.py's docstring, one node, in plain Python ints."""
    if k < 0 or (not replace and deg <= k):
        return list(range(deg))
    if replace:
        return [_draw_int(key, i) % deg for i in range(k)] if deg else []
    chosen: list[int] = []
    for i in range(k):
        j = deg - k + i
        t = _draw_int(key, i) % (j + 1)
        chosen.append(j if t in chosen else t)
    return sorted(chosen)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("k", [-1, 1, 3, 10])
def test_vectorized_positions_match_the_rule(k, replace):
    deg = torch.tensor([0, 1, 2, 3, 4, 9, 10, 11, 30, 1000, 7, 3])
    gids = torch.tensor([5, 0, 1, 2**40, 77, 3, 4, 6, 8, 9, 123456789, 2**62 + 5])
    base = rng.hop_base(seed=2024, hop=1)
    keys = rng.node_keys(base, gids)
    counts, pos = reference.sample_positions(deg, keys, k, replace)
    got = torch.split(pos, counts.tolist())
    for d, key, g in zip(deg.tolist(), keys.tolist(), got):
        assert g.tolist() == _positions_by_spec(d, key & MASK64, k, replace)


def test_node_keys_match_the_integer_spec():
    gids = torch.tensor([0, 1, 2**33 + 7, 2**63 - 1])
    for seed, hop in [(0, 0), (123, 2), (2**62, 5)]:
        base = rng.hop_base(seed, hop)
        assert base & MASK64 == mix64_int(seed + 0x9E3779B97F4A7C15 * (hop + 1))
        keys = rng.node_keys(base, gids)
        for g, kk in zip(gids.tolist(), keys.tolist()):
            assert kk & MASK64 == mix64_int((g ^ base) & MASK64)


def test_mix64_tensor_matches_int_bit_for_bit():
    r = np.random.default_rng(5)
    vals = r.integers(-2**63, 2**63 - 1, size=4000, dtype=np.int64, endpoint=True)
    edge = np.array([0, 1, -1, 2**63 - 1, -2**63, 2**62, -2**62, 0x9E3779B97F4A7C15 - 2**64], dtype=np.int64)
    z = torch.from_numpy(np.concatenate([vals, edge]))
    out = rng.mix64(z).tolist()
    for v, o in zip(z.tolist(), out):
        assert o & MASK64 == mix64_int(v & MASK64)
    d = rng.draws(z[:100], 3)
    assert bool((d >= 0).all())
    assert [v & MASK64 for v in d.tolist()] == [_draw_int(v & MASK64, 3) for v in z[:100].tolist()]


# ---------------------------------------------------------------------------- uniformity

def _chi2_critical(df: int, z: float = 4.265) -> float:
    """Upper critical value of chi-square(df) (Wilson-Hilferty); z = 4.265 is a 1e-5 tail."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _pearson(observed, expected) -> float:
    return float(sum((o - e) ** 2 / e for o, e in zip(observed, expected)))


def _leaf_counts(case: Case, spec: SamplingSpec, trials: int) -> tuple[Counter, list[tuple[int, ...]]]:
    counts: Counter = Counter()
    subsets = []
    for seed in range(trials):
        sub = case.sample([0], spec, seed=seed)
        leaves = tuple(case.orig(sub.nodes[sub.row]).tolist())
        counts.update(leaves)
        subsets.append(tuple(sorted(leaves)))
    return counts, subsets


@pytest.mark.parametrize("replace", [False, True])
def test_uniform_over_star_leaves(star_case, replace):
    k, trials, leaves = 5, 2000, STAR_LEAVES
    counts, _ = _leaf_counts(star_case, SamplingSpec((k,), replace=replace), trials)
    assert set(counts) <= set(range(1, leaves + 1))
    assert sum(counts.values()) == k * trials
    p = k / leaves
    observed = [counts[leaf] for leaf in range(1, leaves + 1)]
    stat = _pearson(observed, [trials * k / leaves] * leaves)
    if not replace:
        # k distinct of L per trial: Pearson's statistic has mean L(1-p); rescale to chi2(L-1).
        stat /= leaves * (1 - p) / (leaves - 1)
    assert stat < _chi2_critical(leaves - 1), f"leaf frequencies not uniform: chi2={stat:.1f}"
    # Sanity of the test itself: a visibly biased sampler is rejected.
    biased = observed[:]
    biased[0] += trials // 10
    biased[1] -= trials // 10
    assert _pearson(biased, [trials * k / leaves] * leaves) > _chi2_critical(leaves - 1)


def test_uniform_over_subsets_without_replacement(tmp_path_factory):
    # Floyd must make every 2-subset of 6 leaves equally likely (15 categories).
    case = _partition(tmp_path_factory, "star6", _star(6), 7, 1)
    trials = 3000
    _, subsets = _leaf_counts(case, SamplingSpec((2,)), trials)
    freq = Counter(subsets)
    cats = list(itertools.combinations(range(1, 7), 2))
    assert set(freq) == set(cats)
    stat = _pearson([freq[c] for c in cats], [trials / len(cats)] * len(cats))
    assert stat < _chi2_critical(len(cats) - 1), f"2-subsets not uniform: chi2={stat:.1f}"


def test_uniform_draw_order_with_replacement(tmp_path_factory):
    # With replacement, the ordered pair (first draw, second draw) is uniform over 5 x 5.
    case = _partition(tmp_path_factory, "star5", _star(5), 6, 1)
    trials = 2500
    pairs = Counter()
    for seed in range(trials):
        sub = case.sample([0], SamplingSpec((2,), replace=True), seed=seed)
        pairs[tuple(case.orig(sub.nodes[sub.row]).tolist())] += 1
    cats = list(itertools.product(range(1, 6), repeat=2))
    assert set(pairs) == set(cats)
    stat = _pearson([pairs[c] for c in cats], [trials / 25] * 25)
    assert stat < _chi2_critical(24), f"with-replacement draws not uniform: chi2={stat:.1f}"


def test_synthetic_tiny_sample_is_valid(tmp_path_factory):
    ei, x, y, splits = synth.generate(2000, 8, 4, 3, seed=3)
    root = tmp_path_factory.mktemp("synth") / "parts"
    partition_graph(GraphInput(ei, x, y, splits), 2, root, method="metis")
    case = Case(root, ei, 2000)
    spec = SamplingSpec((15, 10, 5))
    seeds = torch.from_numpy(splits["train"][:128])
    check_subgraph(case, seeds, spec, case.sample(seeds, spec, seed=1))


# ------------------------------------------------------------------------------ relabelling

@pytest.mark.parametrize("trial", range(6))
def test_relabel_dense_and_sorted_paths_agree(trial):
    g = torch.Generator().manual_seed(trial)
    span = [50, 1000, 10**6][trial % 3]
    known = torch.unique(torch.randint(0, span, (trial * 7,), generator=g))
    known_local = torch.randperm(known.numel(), generator=g)
    cands = torch.randint(0, span, (trial * 40 + 1,), generator=g)
    if trial % 2 and known.numel():
        cands = torch.cat([cands, known[:3]])
    num_known = known.numel()
    a = dispatch._relabel_dense(known, known_local, cands, num_known, span)
    b = dispatch._relabel_sorted(known, known_local, cands, num_known)
    c = dispatch.relabel(known, known_local, cands, num_known)
    for x in (b, c):
        assert torch.equal(a[0], x[0]) and torch.equal(a[1], x[1])
    # Spec: known ids map to their local id; new ids are numbered by first appearance.
    local, new = a
    lookup = dict(zip(known.tolist(), known_local.tolist()))
    firsts = list(dict.fromkeys(v for v in cands.tolist() if v not in lookup))
    assert new.tolist() == firsts
    lookup.update({v: num_known + i for i, v in enumerate(firsts)})
    assert local.tolist() == [lookup[v] for v in cands.tolist()]


def test_relabel_empty_inputs():
    e = torch.empty(0, dtype=torch.int64)
    local, new = dispatch.relabel(e, e, e, 0)
    assert local.numel() == 0 and new.numel() == 0
    local, new = dispatch.relabel(e, e, torch.tensor([4, 4, 2]), 3)
    assert local.tolist() == [3, 3, 4] and new.tolist() == [4, 2]
