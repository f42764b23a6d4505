"""Native op library (graphfeed.cuda_ext): exact outputs, parity with the pure-torch
reference, thread-count independence, statistics, fallback.

Tests that need the compiled library skip when it did not build; the references and
the fallback path are tested either way.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from graphfeed import cuda_ext
from graphfeed.core.seeding import GOLDEN, MASK64, mix64_int
from graphfeed.core.spec import SamplingSpec
from graphfeed.server.sampling import dispatch, reference, reference_ext
from graphfeed.server.sampling.graph import sample_topology
from graphfeed.server.sampling.neighbor import sample_subgraph

OPS = cuda_ext.load_ops()
needs_native = pytest.mark.skipif(OPS is None, reason=f"native ops unavailable: {cuda_ext.load_error()}")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_ext.has_cuda_kernels()),
                                reason="needs a GPU and a CUDA build of the op library")
IMPLS = ["reference", pytest.param("native", marks=needs_native)]


# ----------------------------------------------------------------------------- helpers
def compress(num_nodes: int, edges: list[tuple[int, int]], direction: str = "in"):
    """(indptr, indices, eid) holding each node's in- (CSC) or out-neighbors (CSR), edge id = list index."""
    e = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2)
    row, other = (e[:, 1], e[:, 0]) if direction == "in" else (e[:, 0], e[:, 1])
    order = torch.sort(row, stable=True).indices
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    return indptr, other[order].contiguous(), order.contiguous()


def random_graph(num_nodes: int, num_edges: int, seed: int, hubs: int = 3, hub_degree: int = 400):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    hub_dst = torch.arange(hubs).repeat_interleave(hub_degree)              # nodes 0..hubs-1: big rows
    hub_src = torch.randint(0, num_nodes, (hubs * hub_degree,), generator=g)
    return list(zip(torch.cat([src, hub_src]).tolist(), torch.cat([dst, hub_dst]).tolist()))


def key_of(seed: int, hop: int, gid: int) -> int:
    base = mix64_int(seed + GOLDEN * (hop + 1))
    return mix64_int((gid & MASK64) ^ base)


def draw(key: int, i: int) -> int:
    return mix64_int(key + GOLDEN * (i + 1)) >> 1


def py_positions(deg: int, fanout: int, replace: bool, key: int) -> list[int]:
    """The uniform rule transcribed with Python ints (independent of both implementations)."""
    if fanout < 0 or (not replace and deg <= fanout):
        return list(range(deg))
    if replace:
        return [draw(key, i) % deg for i in range(fanout)] if deg else []
    chosen: list[int] = []
    for i in range(fanout):
        j = deg - fanout + i
        t = draw(key, i) % (j + 1)
        chosen.append(j if t in chosen else t)
    return sorted(chosen)


def one_hop(impl: str, topo, nodes, fanout, replace, seed=7, hop=0, gids=None):
    gids = nodes if gids is None else gids
    nodes, gids = torch.as_tensor(nodes), torch.as_tensor(gids)
    if impl == "native":
        return tuple(OPS.one_hop(*topo, nodes, gids, fanout, replace, seed, hop))
    r = reference.one_hop(*topo, nodes, gids, fanout, replace, seed, hop)
    return r.counts, r.neighbors, r.eids


def weighted(impl: str, topo, weight, nodes, fanout, replace, seed=7, hop=0):
    nodes = torch.as_tensor(nodes)
    weight = torch.as_tensor(weight, dtype=torch.float64)
    if impl == "native":
        return tuple(OPS.weighted_one_hop(*topo, weight, nodes, nodes, fanout, replace, seed, hop))
    r = reference_ext.weighted_one_hop(*topo, weight, nodes, nodes, fanout, replace, seed, hop)
    return r.counts, r.neighbors, r.eids


def temporal(impl: str, topo, edge_time, nodes, seed_time, fanout, replace, seed=7, hop=0):
    nodes, edge_time, seed_time = (torch.as_tensor(t) for t in (nodes, edge_time, seed_time))
    if impl == "native":
        return tuple(OPS.temporal_one_hop(*topo, edge_time, nodes, nodes, seed_time, fanout, replace, seed, hop))
    r = reference_ext.temporal_one_hop(*topo, edge_time, nodes, nodes, seed_time, fanout, replace, seed, hop)
    return r.counts, r.neighbors, r.eids


def as_lists(res):
    return [t.tolist() for t in res]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, y)


CYCLE = compress(4, [(0, 1), (1, 2), (2, 3), (3, 0)])                       # in-neighbor of v is v-1
STAR = compress(6, [(leaf, 0) for leaf in range(1, 6)])                     # leaves 1..5 -> center 0
MULTI = compress(5, [(1, 0), (1, 0), (2, 0), (4, 4)])                       # multi-edge, isolated 1..3, self loop


# ----------------------------------------------------------------------------- uniform one hop, exact
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fanout,replace", [(1, False), (-1, False), (3, True)])
def test_one_hop_cycle(impl, fanout, replace):
    counts, nbr, eid = as_lists(one_hop(impl, CYCLE, [0, 1, 2, 3], fanout, replace))
    k = 3 if replace else 1
    assert counts == [k] * 4
    assert nbr == [p for v in range(4) for p in [(v - 1) % 4] * k]
    assert eid == [p for v in range(4) for p in [(v - 1) % 4] * k]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fanout,replace", [(-1, False), (5, False), (9, False), (2, False), (4, False),
                                            (3, True), (1, True)])
def test_one_hop_star(impl, fanout, replace):
    nodes = [0, 1, 5]
    seed, hop = 123, 2
    counts, nbr, eid = as_lists(one_hop(impl, STAR, nodes, fanout, replace, seed, hop))
    pos = py_positions(5, fanout, replace, key_of(seed, hop, 0))
    assert counts == [len(pos), 0, 0]                      # leaves have no in-neighbors
    assert nbr == [p + 1 for p in pos]
    assert eid == pos
    if not replace:
        assert len(set(nbr)) == len(nbr)


@pytest.mark.parametrize("impl", IMPLS)
def test_one_hop_multi_edges_isolated_and_self_loop(impl):
    counts, nbr, eid = as_lists(one_hop(impl, MULTI, [0, 3, 4, 0], -1, False))
    assert counts == [3, 0, 1, 3]
    assert nbr == [1, 1, 2, 4, 1, 1, 2]                    # a multi-edge is sampled once per edge
    assert eid == [0, 1, 2, 3, 0, 1, 2]
    counts, nbr, eid = as_lists(one_hop(impl, MULTI, [3], 5, True))
    assert counts == [0] and nbr == [] and eid == []       # no neighbors: nothing, even with replacement


@pytest.mark.parametrize("impl", IMPLS)
def test_one_hop_uses_gids_for_randomness(impl):
    big = compress(2, [(i % 2, 0) for i in range(50)])
    a = one_hop(impl, big, [0], 3, False, gids=[0])
    b = one_hop(impl, big, [0], 3, False, gids=[1000])
    key = key_of(7, 0, 1000)
    assert b[2].tolist() == py_positions(50, 3, False, key)
    assert a[2].tolist() == py_positions(50, 3, False, key_of(7, 0, 0))


# ----------------------------------------------------------------------------- weighted, exact
W_STAR = [0.0, 1.0, 0.0, 2.0, 0.5]          # leaves 1..5 -> positions 0..4


def py_weighted(weights, fanout, replace, key):
    pos = [j for j, w in enumerate(weights) if w > 0]
    if fanout < 0 or (not replace and len(pos) <= fanout):
        return pos
    if replace:
        cum, acc = [], 0.0
        for w in weights:
            acc += w
            cum.append(acc)
        out = []
        for q in range(fanout):
            t = (draw(key, q) >> 10) / 2.0 ** 53 * acc
            p = next((j for j, c in enumerate(cum) if c > t), len(weights))
            out.append(p if p < len(weights) else pos[-1])
        return out
    race = sorted((-math.log(((draw(key, j) >> 10) + 1) / 2.0 ** 53) / weights[j], j) for j in pos)
    return sorted(j for _, j in race[:fanout])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fanout,replace", [(-1, False), (3, False), (2, False), (1, False), (4, True), (1, True)])
def test_weighted_star(impl, fanout, replace):
    counts, nbr, eid = as_lists(weighted(impl, STAR, W_STAR, [0, 2], fanout, replace, seed=5, hop=1))
    pos = py_weighted(W_STAR, fanout, replace, key_of(5, 1, 0))
    assert counts == [len(pos), 0]
    assert eid == pos and nbr == [p + 1 for p in pos]
    assert all(W_STAR[p] > 0 for p in pos)


@pytest.mark.parametrize("impl", IMPLS)
def test_weighted_all_zero_and_multi_edges(impl):
    counts, nbr, eid = as_lists(weighted(impl, MULTI, [0.0, 0.0, 0.0, 1.0], [0, 3, 4], 2, True))
    assert counts == [0, 0, 2] and nbr == [4, 4] and eid == [3, 3]
    counts, nbr, eid = as_lists(weighted(impl, MULTI, [1.0, 1.0, 0.0, 1.0], [0], -1, False))
    assert counts == [2] and nbr == [1, 1] and eid == [0, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_weighted_rejects_negative_weight(impl):
    with pytest.raises((RuntimeError, ValueError), match="weights must be >= 0"):
        weighted(impl, STAR, [1.0, -1.0, 1.0, 1.0, 1.0], [0], 2, False)


# ----------------------------------------------------------------------------- temporal, exact
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fanout,replace", [(-1, False), (2, False), (3, False), (4, True)])
def test_temporal_star(impl, fanout, replace):
    edge_time = [5, 1, 4, 2, 3]                       # leaves 1..5
    counts, nbr, eid = as_lists(temporal(impl, STAR, edge_time, [0, 0, 3], [3, 0, 9], fanout, replace, 9, 0))
    eligible = [p for p in range(5) if edge_time[p] <= 3]          # positions 1, 3, 4
    pos = [eligible[q] for q in py_positions(3, fanout, replace, key_of(9, 0, 0))]
    assert counts == [len(pos), 0, 0]                # seed time 0: nothing is old enough
    assert eid == pos and nbr == [p + 1 for p in pos]
    assert all(edge_time[p] <= 3 for p in pos)


# ----------------------------------------------------------------------------- relabel
def py_relabel(known: dict, candidates: list[int], num_known: int):
    table, local, new = dict(known), [], []
    for c in candidates:
        if c not in table:
            table[c] = num_known + len(new)
            new.append(c)
        local.append(table[c])
    return local, new


@needs_native
def test_relabel_exact():
    local, new = OPS.relabel(torch.tensor([10, 20]), torch.tensor([0, 1]), torch.tensor([20, 30, 10, 30, 40]), 2)
    assert local.tolist() == [1, 2, 0, 2, 3] and new.tolist() == [30, 40]
    local, new = OPS.relabel(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long),
                             torch.tensor([], dtype=torch.long), 0)
    assert local.numel() == 0 and new.numel() == 0


@needs_native
@pytest.mark.parametrize("span", [50, 10_000, 1 << 40])
def test_relabel_parity_random(span):
    g = torch.Generator().manual_seed(span % 1000)
    known = torch.unique(torch.randint(0, span, (300,), generator=g))
    known_local = torch.randperm(known.numel(), generator=g)
    cand = torch.randint(0, span, (20_000,), generator=g)
    local, new = OPS.relabel(known, known_local, cand, known.numel())
    exp_local, exp_new = py_relabel(dict(zip(known.tolist(), known_local.tolist())), cand.tolist(), known.numel())
    assert local.tolist() == exp_local and new.tolist() == exp_new


@needs_native
def test_relabel_rejects_negative_ids():
    with pytest.raises(RuntimeError, match="must be >= 0"):
        OPS.relabel(torch.tensor([1]), torch.tensor([0]), torch.tensor([3, -2]), 1)


@needs_native
@pytest.mark.parametrize("span", [50, 10_000])
def test_relabel_map_keeps_one_map_across_calls(span):
    """Three rounds against one id map equal three fresh relabels against every node seen before."""
    g = torch.Generator().manual_seed(span)
    seeds = torch.randperm(span, generator=g)[:20]
    id_map = dispatch.new_id_map(span, torch.device("cpu"))
    id_map.index_copy_(0, seeds, torch.arange(seeds.numel(), dtype=torch.int32))
    known = dict(zip(seeds.tolist(), range(seeds.numel())))
    for size in (100, 3000, 20_000):
        cand = torch.randint(0, span, (size,), generator=g)
        local, new = OPS.relabel_map(id_map, cand, len(known))
        exp_local, exp_new = py_relabel(known, cand.tolist(), len(known))
        assert local.tolist() == exp_local and new.tolist() == exp_new
        known.update(zip(exp_new, range(len(known), len(known) + len(exp_new))))
    assert int((id_map >= 0).sum()) == len(known)


@needs_native
def test_relabel_map_errors():
    id_map = dispatch.new_id_map(10, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="outside the id map"):
        OPS.relabel_map(id_map, torch.tensor([3, 10]), 0)
    with pytest.raises(RuntimeError, match="outside the id map"):
        OPS.relabel_map(id_map, torch.tensor([-1]), 0)
    with pytest.raises(RuntimeError, match="int32"):
        OPS.relabel_map(torch.zeros(10, dtype=torch.int64), torch.tensor([3]), 0)
    assert dispatch.new_id_map(1 << 27, torch.device("cpu")) is None        # too large: the hashing relabel runs


# ----------------------------------------------------------------------------- parity on random graphs
GRAPH = random_graph(3000, 40_000, seed=1)
TOPO = {d: compress(3000, GRAPH, d) for d in ("in", "out")}


@needs_native
def test_block_pool_allocator_reuses_freed_large_blocks():
    """``dispatch.use_block_pool`` (what session workers install): a freed block of 8 MiB or more serves the
    next large tensor (no fresh pages), a large tensor allocated while the block is held gets another one, and
    tensors keep their values.
    In a child process: the allocator stays installed for the process's life."""
    code = textwrap.dedent("""
        import torch
        from graphfeed.server.sampling import dispatch
        assert dispatch.use_block_pool() and dispatch.use_block_pool()      # a second call is harmless
        a = torch.arange(2 << 20)                                            # 16 MiB of int64: from the pool
        where = a.data_ptr()
        assert where % (2 << 20) == 0, "pooled blocks are huge-page aligned"
        total = int(a.sum())
        del a
        b = torch.ones(3 << 20, dtype=torch.float32)                         # 12 MiB: the same block again
        assert b.data_ptr() == where and float(b.sum()) == 3 << 20
        c = torch.ones(1000)                                                  # small: torch's allocator
        assert float(c.sum()) == 1000
        d = torch.randn(3000, 1000)                                          # 12 MiB, while b holds the block
        assert d.data_ptr() != where and torch.equal(d.clone(), d)
        print("ok", total == (2 << 20) * ((2 << 20) - 1) // 2)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ok", "True"]


@needs_native
def test_driver_reuses_a_cleared_id_map_per_thread():
    """Batches after the first take the thread's id map back (cleared at the entries the last batch used):
    each equals a sample that relabels without a map, and the map is all empty between batches.  A batch
    that fails mid-relabel does not hand its map back."""
    from graphfeed.server.sampling.neighbor import sample_typed

    indptr, indices, eid = TOPO["in"]
    topo = type("Topo", (), {"indptr": indptr, "indices": indices, "eid": eid})
    etype = ("_N", "to", "_N")

    def hop(et, gids, fanout, rng_hop):
        return dispatch.one_hop(topo, gids, gids, fanout, False, 7, rng_hop)

    def run(seeds, num_nodes):
        sub = sample_typed({"_N": seeds}, {etype: [10, 5]}, "in", hop, num_nodes=num_nodes)
        return sub.nodes["_N"], sub.row[etype], sub.col[etype]

    g = torch.Generator().manual_seed(3)
    maps = []
    for _ in range(3):
        seeds = torch.randperm(3000, generator=g)[:64]
        got, want = run(seeds, {"_N": 3000}), run(seeds, None)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        spare = dispatch.take_id_map(3000, torch.device("cpu"))
        assert bool((spare == dispatch.ID_MAP_EMPTY).all())
        maps.append(spare.data_ptr())
        dispatch.give_id_map(spare, [])
    assert len(set(maps)) == 1                      # one map served every batch of this thread

    def bad_hop(et, gids, fanout, rng_hop):
        res = hop(et, gids, fanout, rng_hop)
        return type(res)(res.counts, res.neighbors + 5000, res.eids)   # ids beyond the map
    with pytest.raises(RuntimeError, match="outside the id map"):
        sample_typed({"_N": torch.arange(8)}, {etype: [3]}, "in", bad_hop, num_nodes={"_N": 3000})
    fresh = dispatch.take_id_map(3000, torch.device("cpu"))
    assert bool((fresh == dispatch.ID_MAP_EMPTY).all())
FANOUTS = [(-1, False), (1, False), (5, False), (15, False), (100, False), (1, True), (7, True), (100, True)]


@needs_native
@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("fanout,replace", FANOUTS)
def test_one_hop_parity_random(direction, fanout, replace):
    g = torch.Generator().manual_seed(fanout + 100 * replace)
    nodes = torch.cat([torch.arange(3), torch.randint(0, 3000, (2000,), generator=g)])   # hubs + repeats
    gids = nodes * 7 + 11
    for seed, hop in [(0, 0), (2 ** 62 + 3, 4)]:
        assert_same(one_hop("native", TOPO[direction], nodes, fanout, replace, seed, hop, gids),
                    one_hop("reference", TOPO[direction], nodes, fanout, replace, seed, hop, gids))


@needs_native
def test_dispatch_one_hop_with_64_bit_seed():
    topo = type("T", (), {"indptr": TOPO["in"][0], "indices": TOPO["in"][1], "eid": TOPO["in"][2]})
    nodes = torch.arange(500)
    seed = (1 << 64) - 12345                                 # batch seeds are Python ints up to 2**64
    got = dispatch.one_hop(topo, nodes, nodes, 10, False, seed, 1)
    exp = reference.one_hop(*TOPO["in"], nodes, nodes, 10, False, seed, 1)
    assert_same((got.counts, got.neighbors, got.eids), (exp.counts, exp.neighbors, exp.eids))


@needs_native
@pytest.mark.parametrize("fanout,replace", FANOUTS)
def test_weighted_parity_random(fanout, replace):
    g = torch.Generator().manual_seed(3)
    weight = torch.rand(len(GRAPH) + 0, generator=g, dtype=torch.float64)
    weight[torch.rand(weight.numel(), generator=g) < 0.2] = 0.0
    weight = weight[TOPO["in"][2]]                           # aligned with the CSC's edges
    nodes = torch.cat([torch.arange(3), torch.randint(0, 3000, (1500,), generator=g)])
    assert_same(weighted("native", TOPO["in"], weight, nodes, fanout, replace, 11, 2),
                weighted("reference", TOPO["in"], weight, nodes, fanout, replace, 11, 2))


@needs_native
@pytest.mark.parametrize("fanout,replace", FANOUTS)
def test_temporal_parity_and_no_future_neighbors(fanout, replace):
    g = torch.Generator().manual_seed(4)
    edge_time = torch.randint(0, 1000, (len(GRAPH),), generator=g)
    nodes = torch.cat([torch.arange(3), torch.randint(0, 3000, (1500,), generator=g)])
    seed_time = torch.randint(0, 1000, (nodes.numel(),), generator=g)
    got = temporal("native", TOPO["in"], edge_time, nodes, seed_time, fanout, replace, 13, 1)
    assert_same(got, temporal("reference", TOPO["in"], edge_time, nodes, seed_time, fanout, replace, 13, 1))
    counts, _, eids = got
    owner_time = torch.repeat_interleave(seed_time, counts)
    # edge ids index the original edge list, the CSC's eid maps positions to them
    time_by_eid = torch.empty_like(edge_time)
    time_by_eid[TOPO["in"][2]] = edge_time
    assert bool((time_by_eid[eids] <= owner_time).all())
    if fanout > 0:
        assert int(counts.max()) <= fanout


def reference_subgraph(topo, seeds, spec, seed, monkeypatch):
    monkeypatch.setattr(dispatch, "_NATIVE", None)           # relabel on the reference path too

    def hop_fn(gids, fanout, hop):
        return reference.one_hop(*topo, gids, gids, fanout, spec.replace, seed, hop)

    return sample_subgraph(seeds, spec, hop_fn)


def native_subgraph(topo, seeds, spec, seed, offset=0):
    return OPS.sample_subgraph(*topo, seeds, offset, list(spec.num_neighbors), spec.replace, seed,
                               spec.direction == "in")


@needs_native
@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("fanouts,replace", [([15, 10, 5], False), ([5, 5], True), ([-1, 3], False),
                                              ([100], False), ([2, 2, 2, 2], True)])
def test_sample_subgraph_parity_random(direction, fanouts, replace, monkeypatch):
    spec = SamplingSpec(fanouts, replace=replace, direction=direction)
    seeds = torch.randperm(3000, generator=torch.Generator().manual_seed(len(fanouts)))[:300]
    nodes, row, col, eids, nn, ne = native_subgraph(TOPO[direction], seeds, spec, 99)
    exp = reference_subgraph(TOPO[direction], seeds, spec, 99, monkeypatch)
    assert_same((nodes, row, col, eids), (exp.nodes, exp.row, exp.col, exp.eids))
    assert nn.tolist() == exp.num_sampled_nodes and ne.tolist() == exp.num_sampled_edges
    assert torch.equal(nodes[:300], seeds)                                   # seeds first
    assert nodes.unique().numel() == nodes.numel()                          # every node once


@needs_native
def test_sample_subgraph_exact_cycle():
    spec_in = SamplingSpec([1, 1], direction="in")
    nodes, row, col, eids, nn, ne = native_subgraph(CYCLE, torch.tensor([0]), spec_in, 3)
    assert nodes.tolist() == [0, 3, 2] and row.tolist() == [1, 2] and col.tolist() == [0, 1]
    assert eids.tolist() == [3, 2] and nn.tolist() == [1, 1, 1] and ne.tolist() == [1, 1]
    out = compress(4, [(0, 1), (1, 2), (2, 3), (3, 0)], "out")
    nodes, row, col, eids, nn, ne = native_subgraph(out, torch.tensor([0]), SamplingSpec([1, 1], direction="out"), 3)
    assert nodes.tolist() == [0, 1, 2] and row.tolist() == [0, 1] and col.tolist() == [1, 2]
    assert eids.tolist() == [0, 1]
    # a frontier that dies out: star leaves have no in-neighbors
    nodes, row, col, eids, nn, ne = native_subgraph(STAR, torch.tensor([0]), SamplingSpec([-1, 2, 2]), 3)
    assert nodes.tolist() == [0, 1, 2, 3, 4, 5] and nn.tolist() == [1, 5, 0, 0] and ne.tolist() == [5, 0, 0]


@needs_native
def test_sample_subgraph_node_offset_and_errors():
    shifted = native_subgraph(CYCLE, torch.tensor([100]), SamplingSpec([1]), 3, offset=100)
    assert shifted[0].tolist() == [100, 3]       # rows are shifted, indices hold global ids
    with pytest.raises(RuntimeError, match="not a row of this topology|outside the graph.s ids"):
        native_subgraph(CYCLE, torch.tensor([4]), SamplingSpec([1]), 3)
    with pytest.raises(RuntimeError, match="appears more than once"):
        native_subgraph(CYCLE, torch.tensor([1, 1]), SamplingSpec([1]), 3)


@needs_native
def test_sample_topology_matches_reference(monkeypatch):
    topo = type("T", (), {"indptr": TOPO["in"][0], "indices": TOPO["in"][1], "eid": TOPO["in"][2]})
    spec = SamplingSpec([10, 5])
    seeds = torch.arange(0, 3000, 7)
    got = sample_topology(topo, 0, seeds, spec, 2 ** 63 + 1)
    exp = reference_subgraph(TOPO["in"], seeds, spec, 2 ** 63 + 1, monkeypatch)
    assert_same((got.nodes, got.row, got.col, got.eids), (exp.nodes, exp.row, exp.col, exp.eids))
    assert got.num_sampled_nodes == exp.num_sampled_nodes and got.batch_size == exp.batch_size


# ----------------------------------------------------------------------------- threads
@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@needs_native
def test_results_do_not_depend_on_thread_count(restore_threads):
    big = compress(20_000, random_graph(20_000, 200_000, seed=7), "in")
    seeds = torch.randperm(20_000, generator=torch.Generator().manual_seed(1))[:2000]
    weight = torch.rand(big[1].numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    edge_time = torch.randint(0, 100, (big[1].numel(),), generator=torch.Generator().manual_seed(3))
    runs = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        nodes = torch.arange(20_000)
        runs.append([
            *OPS.sample_subgraph(*big, seeds, 0, [15, 10, 5], False, 5, True),
            *OPS.one_hop(*big, nodes, nodes, 10, False, 5, 0),
            *OPS.one_hop(*big, nodes, nodes, 10, True, 5, 0),
            *OPS.weighted_one_hop(*big, weight, nodes, nodes, 10, False, 5, 0),
            *OPS.temporal_one_hop(*big, edge_time, nodes, nodes, torch.full((20_000,), 50), 10, False, 5, 0),
            *OPS.relabel(torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), big[1], 0),
        ])
    for other in runs[1:]:
        assert_same(runs[0], other)


# ----------------------------------------------------------------------------- statistics
CHI2_DF3_P001 = 16.27     # chi-square critical values at p = 0.001
CHI2_DF4_P001 = 18.47


def chi2(observed: torch.Tensor, expected: torch.Tensor) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def many_stars(m: int, leaves: int):
    edges = [(m + c * leaves + leaf, c) for c in range(m) for leaf in range(leaves)]
    return compress(m + m * leaves, edges)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("replace", [False, True])
def test_weighted_frequencies_follow_weights(impl, replace):
    m, weights = 4000, [1.0, 2.0, 3.0, 4.0, 0.0]
    topo = many_stars(m, 5)
    w = torch.tensor(weights * m, dtype=torch.float64)
    counts, nbr, eid = weighted(impl, topo, w, torch.arange(m), 1 if not replace else 3, replace, seed=21)
    pos = eid % 5
    observed = torch.bincount(pos, minlength=5).double()
    assert observed[4] == 0                                   # zero weight: never
    p = torch.tensor(weights[:4], dtype=torch.float64) / 10.0
    assert chi2(observed[:4], p * pos.numel()) < CHI2_DF3_P001


@pytest.mark.parametrize("impl", IMPLS)
def test_uniform_without_replacement_is_uniform(impl):
    m = 4000
    topo = many_stars(m, 5)
    counts, nbr, eid = one_hop(impl, topo, torch.arange(m), 2, False, seed=17)
    assert counts.tolist() == [2] * m
    observed = torch.bincount(eid % 5, minlength=5).double()
    assert chi2(observed, torch.full((5,), 2 * m / 5, dtype=torch.float64)) < CHI2_DF4_P001
    pairs = (eid % 5).reshape(m, 2)
    assert bool((pairs[:, 0] < pairs[:, 1]).all())            # distinct and ascending


# ----------------------------------------------------------------------------- gather
@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16, torch.uint8])
def test_gather_rows_exact(dtype):
    src = (torch.arange(40 * 3) % 251).to(dtype).reshape(40, 3)
    index = torch.tensor([5, 0, 39, 5])
    assert torch.equal(OPS.gather_rows(src, index), src[index])
    out = torch.full((4, 3), 7).to(dtype)
    OPS.gather_rows_into(src, index, out)
    assert torch.equal(out, src[index])
    assert torch.equal(OPS.gather_rows(src[:, 0].contiguous(), index), src[index, 0])
    assert OPS.gather_rows(src, torch.tensor([], dtype=torch.long)).shape == (0, 3)


@needs_native
def test_gather_rows_large_matches_index_select():
    src = torch.randn(50_000, 100)
    index = torch.randint(0, 50_000, (30_000,))
    assert torch.equal(dispatch.gather_rows(src, index), src.index_select(0, index))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_gather_rows_to_exact(dtype):
    src = (torch.arange(40 * 3) % 251).to(dtype).reshape(40, 3)
    index, out_index = torch.tensor([5, 0, 39, 5]), torch.tensor([6, 1, 0, 3])
    exp = torch.full((7, 3), 9).to(dtype)
    exp[out_index] = src[index]
    out = torch.full((7, 3), 9).to(dtype)
    OPS.gather_rows_to(src, index, out, out_index)
    assert torch.equal(out, exp)
    out = torch.full((7, 3), 9).to(dtype)
    OPS.gather_rows_to(src[:4].contiguous(), None, out, out_index)          # no index: src's rows in order
    exp = torch.full((7, 3), 9).to(dtype)
    exp[out_index] = src[:4]
    assert torch.equal(out, exp)
    big = OPS.empty_rows(torch.zeros(1, 100), 50_000)                       # 20 MB: on huge pages
    assert big.shape == (50_000, 100) and big.dtype == torch.float32
    dispatch.gather_rows_to(torch.ones(50_000, 100), None, big, torch.arange(50_000))
    assert bool((big == 1).all())


@needs_native
def test_reused_row_blocks_never_touch_live_rows():
    """Freed multi-MB row blocks are reused for later gathers: a live result keeps its rows."""
    src = torch.arange(60_000 * 64, dtype=torch.float32).reshape(60_000, 64)      # 15 MB per gather
    index = torch.randperm(60_000, generator=torch.Generator().manual_seed(0))
    live = OPS.gather_rows(src, index)
    for k in range(4):
        rows = OPS.gather_rows(src, index.roll(k + 1))                              # a freed block again
        assert torch.equal(rows, src[index.roll(k + 1)])
        del rows
    assert torch.equal(live, src[index])


@needs_native
def test_gather_rows_to_errors():
    src, out = torch.zeros(4, 2), torch.zeros(3, 2)
    with pytest.raises(RuntimeError, match="out of range for src"):
        OPS.gather_rows_to(src, torch.tensor([4]), out, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="out of range for out"):
        OPS.gather_rows_to(src, torch.tensor([1]), out, torch.tensor([3]))
    with pytest.raises(RuntimeError, match="one destination row per source row"):
        OPS.gather_rows_to(src, torch.tensor([1, 2]), out, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="rows of shape"):
        OPS.gather_rows_to(src, torch.tensor([1]), torch.zeros(3, 5), torch.tensor([0]))


@needs_native
def test_gather_rows_errors():
    src = torch.zeros(4, 2)
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.gather_rows(src, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.gather_rows(src, torch.tensor([-1]))
    with pytest.raises(RuntimeError, match="dtype"):
        OPS.gather_rows_into(src, torch.tensor([1]), torch.zeros(1, 2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="shape"):
        OPS.gather_rows_into(src, torch.tensor([1]), torch.zeros(2, 2))
    with pytest.raises(RuntimeError, match="contiguous"):
        OPS.gather_rows(torch.zeros(4, 2).t(), torch.tensor([1]))


# ----------------------------------------------------------------------------- argument checks
@needs_native
def test_one_hop_argument_errors():
    indptr, indices, eid = CYCLE
    n = torch.tensor([0])
    with pytest.raises(RuntimeError, match="fanout must be -1"):
        OPS.one_hop(indptr, indices, eid, n, n, 0, False, 1, 0)
    with pytest.raises(RuntimeError, match="int64"):
        OPS.one_hop(indptr, indices.int(), eid, n, n, 1, False, 1, 0)
    with pytest.raises(RuntimeError, match="outside the topology"):
        OPS.one_hop(indptr, indices, eid, torch.tensor([4]), torch.tensor([4]), 1, False, 1, 0)
    with pytest.raises(RuntimeError, match="one global id per frontier row"):
        OPS.one_hop(indptr, indices, eid, n, torch.tensor([0, 1]), 1, False, 1, 0)
    with pytest.raises(RuntimeError, match="one entry per edge"):
        OPS.one_hop(indptr, indices, eid[:2], n, n, 1, False, 1, 0)
    with pytest.raises(RuntimeError, match="indptr is corrupt"):
        OPS.one_hop(torch.tensor([0, 9]), indices, eid, n, n, 1, False, 1, 0)
    with pytest.raises(RuntimeError, match="hop must be >= 0"):
        OPS.one_hop(indptr, indices, eid, n, n, 1, False, 1, -1)


# ----------------------------------------------------------------------------- fallback
def run_python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_forced_reference_path_samples_like_the_reference():
    proc = run_python("""
        import torch, warnings
        warnings.simplefilter("error")
        from graphfeed.server.sampling import dispatch, reference
        from graphfeed.server.sampling.graph import sample_topology
        from graphfeed.core.spec import SamplingSpec
        assert dispatch.IMPLEMENTATION == "reference", dispatch.IMPLEMENTATION
        indptr = torch.tensor([0, 1, 2, 3, 4]); indices = torch.tensor([3, 0, 1, 2]); eid = torch.arange(4)
        topo = type("T", (), {"indptr": indptr, "indices": indices, "eid": eid})
        sub = sample_topology(topo, 0, torch.tensor([0]), SamplingSpec([1, 1]), 3)
        print(sub.nodes.tolist(), sub.row.tolist(), sub.col.tolist())
        """, GRAPHFEED_SAMPLER="reference")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 3, 2] [1, 2] [0, 1]"


def test_missing_library_warns_once_and_falls_back():
    proc = run_python("""
        import warnings
        from graphfeed import cuda_ext
        cuda_ext.load_ops = lambda: None
        cuda_ext.load_error = lambda: "simulated: library missing"
        cuda_ext.build_was_expected = lambda: True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from graphfeed.server.sampling import dispatch
            import graphfeed.server.sampling.graph
        print(dispatch.IMPLEMENTATION, len(caught), caught[0].category.__name__, "simulated" in str(caught[0].message))
        """, GRAPHFEED_SAMPLER="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["reference", "1", "RuntimeWarning", "True"]


def test_forcing_native_without_library_is_an_error():
    proc = run_python("""
        from graphfeed import cuda_ext
        cuda_ext.load_ops = lambda: None
        cuda_ext.load_error = lambda: "simulated"
        try:
            from graphfeed.server.sampling import dispatch
        except ImportError as exc:
            print("ImportError", "GRAPHFEED_SAMPLER=native" in str(exc))
        """, GRAPHFEED_SAMPLER="native")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ImportError", "True"]


@needs_native
def test_default_path_is_native():
    proc = run_python("from graphfeed.server.sampling import dispatch; print(dispatch.IMPLEMENTATION)",
                      GRAPHFEED_SAMPLER="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "native"


# ----------------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("fanout,replace", FANOUTS)
def test_cuda_one_hop_matches_cpu(fanout, replace):
    nodes = torch.cat([torch.arange(3), torch.randint(0, 3000, (2000,))])
    cpu = OPS.one_hop(*TOPO["in"], nodes, nodes, fanout, replace, 5, 1)
    gpu = OPS.one_hop(*(t.cuda() for t in TOPO["in"]), nodes.cuda(), nodes.cuda(), fanout, replace, 5, 1)
    assert_same(cpu, tuple(t.cpu() for t in gpu))


@needs_cuda
def test_cuda_relabel_and_gather_match_cpu():
    known = torch.unique(torch.randint(0, 10_000, (500,)))
    local = torch.randperm(known.numel())
    cand = torch.randint(0, 10_000, (50_000,))
    cpu = OPS.relabel(known, local, cand, known.numel())
    gpu = OPS.relabel(known.cuda(), local.cuda(), cand.cuda(), known.numel())
    assert_same(cpu, tuple(t.cpu() for t in gpu))
    src = torch.randn(1000, 33)
    index = torch.randint(0, 1000, (5000,))
    assert torch.equal(OPS.gather_rows(src.cuda(), index.cuda()).cpu(), src[index])


@needs_cuda
def test_cuda_feature_cache_matches_rows():
    from graphfeed.cuda_ext.feature_cache import GpuFeatureCache

    x = torch.randn(5000, 16)
    hot = torch.randperm(5000)[:700]
    cache = GpuFeatureCache(x, hot, device="cuda")
    index = torch.randint(0, 5000, (20_000,))
    assert torch.equal(cache.gather(index.cuda()).cpu(), x[index])
