"""The fused native typed sampler (``torch.ops.graphfeed.sample_typed_subgraph`` via
``dispatch.fused_sample_typed``) against the typed driver over the pure-torch reference.

"Reference" here is ``neighbor.sample_typed`` with ``reference.one_hop`` and the reference
relabel (the native library switched off for that call), so every comparison is native fused
vs pure torch, tensor for tensor.  Graphs: the five-edge-type graph of ``test_sampler_hetero``
(self relations, parallel edges, isolated nodes), a graph with a node type without in-edges
and one without out-edges whose node types start at non-zero global ids, a high-degree graph
(fanouts above the bitmap threshold), and a real one-part ``mag-tiny`` partition.
Skipped as a whole when the native library is not built (except the no-library error test).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_sampler_hetero import (
    CITES,
    FANOUTS,
    KNOWS,
    NUM_NODES,
    REV_WRITES,
    TOPIC,
    WRITES,
    TypedGraph,
    _random_edges,
    assert_same,
    check_typed,
    per_type,
    reference_one_hop,
)

from graphfeed import cuda_ext
from graphfeed.server.partition.format.store import Topology
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.neighbor import sample_typed
from graphfeed.server.sampling.types import TypedSubgraph

needs_fused = pytest.mark.skipif(not dispatch.has_fused_typed_sampler(),
                                 reason=f"native op library not loaded: {cuda_ext.load_error()}")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_ext.has_cuda_kernels()),
                                reason="needs a GPU and a CUDA build of the op library")


# ---------------------------------------------------------------------------------- graphs and samplers

@pytest.fixture(scope="module")
def graph() -> TypedGraph:
    """test_sampler_hetero's graph: three node types, five edge types (a self relation, a reverse
    relation), parallel edges, and the last two nodes of every type isolated."""
    r = np.random.default_rng(9)
    writes = _random_edges(NUM_NODES["author"], NUM_NODES["paper"], 150, r)
    return TypedGraph(NUM_NODES, {WRITES: writes, REV_WRITES: writes[::-1].copy(),
                                  CITES: _random_edges(NUM_NODES["paper"], NUM_NODES["paper"], 300, r),
                                  TOPIC: _random_edges(NUM_NODES["paper"], NUM_NODES["field"], 80, r),
                                  KNOWS: _random_edges(NUM_NODES["author"], NUM_NODES["author"], 50, r)})


class OffsetGraph:
    """A typed graph whose node type ``t`` holds global ids ``offsets[t] .. offsets[t] + n_t - 1``
    (a part's id ranges): topologies keyed by ``gid - offset``, neighbors stored as global ids."""

    def __init__(self, base: TypedGraph, offsets: dict[str, int]):
        self.base, self.offsets = base, offsets
        self.csc = {e: self._shift(t, e[0]) for e, t in base.csc.items()}
        self.csr = {e: self._shift(t, e[2]) for e, t in base.csr.items()}

    def _shift(self, topo: Topology, other: str) -> Topology:
        return Topology(topo.indptr, topo.indices + self.offsets[other], topo.eid)

    def topos(self, direction: str) -> dict:
        return self.csc if direction == "in" else self.csr


def reference_sample(topos: dict, offsets: dict, seeds, fanouts, direction: str, replace: bool, seed: int,
                     input_type: str | None = None) -> TypedSubgraph:
    """``sample_typed`` over the pure-torch one hop and relabel (native library switched off)."""
    def hop(etype, gids, fanout, rng_hop):
        center = etype[2] if direction == "in" else etype[0]
        return reference_one_hop(topos[etype], gids - offsets[center], gids, fanout, replace, seed, rng_hop)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "_NATIVE", None)
        return sample_typed(seeds, fanouts, direction, hop, input_type=input_type)


def both(topos: dict, offsets: dict, seeds, fanouts, direction: str, replace: bool, seed: int,
         input_type: str | None = None, **kw) -> tuple[TypedSubgraph, TypedSubgraph]:
    """(fused native, reference driver) samples of the same call."""
    fused = dispatch.fused_sample_typed(topos, offsets, seeds, fanouts, direction, replace, seed, input_type, **kw)
    return fused, reference_sample(topos, offsets, seeds, fanouts, direction, replace, seed, input_type)


ZERO = {t: 0 for t in NUM_NODES}


def _perm(n: int, k: int, gen_seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(gen_seed))[:k]


# ---------------------------------------------------------------------------------- exact equality

SEED_SETS = {
    "papers": lambda s: {"paper": _perm(NUM_NODES["paper"], 12, s)},
    "one-author": lambda s: {"author": _perm(NUM_NODES["author"], 1, s)},
    "isolated": lambda s: {"paper": torch.tensor([NUM_NODES["paper"] - 1, NUM_NODES["paper"] - 2])},
    "two-types": lambda s: {"paper": _perm(NUM_NODES["paper"], 5, s), "field": _perm(NUM_NODES["field"], 3, s)},
}


@needs_fused
@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
@pytest.mark.parametrize("direction", ["in", "out"])
@pytest.mark.parametrize("name", list(FANOUTS))
def test_fused_equals_reference_driver(graph, name, direction, replace):
    fanouts = per_type(FANOUTS[name], graph)
    topos = graph.csc if direction == "in" else graph.csr
    for k, (set_name, make) in enumerate(SEED_SETS.items()):
        seeds = make(k)
        input_type = "paper" if set_name == "two-types" else None
        fused, ref = both(topos, ZERO, seeds, fanouts, direction, replace, seed=100 + k, input_type=input_type)
        assert_same(fused, ref)
        check_typed(graph, seeds, fanouts, direction, replace, fused)
    # isolated seeds: nothing is sampled and every later frontier is empty
    isolated = dispatch.fused_sample_typed(topos, ZERO, SEED_SETS["isolated"](0), fanouts, direction, replace, 1)
    if direction == "in":
        assert all(n.numel() == 0 for n in isolated.row.values())
        assert isolated.num_sampled_nodes["paper"] == [2] + [0] * len(next(iter(fanouts.values())))


def _citation_graph() -> TypedGraph:
    """author -writes-> paper -cites-> paper -has_topic-> field: ``author`` has no in-edges and
    ``field`` no out-edges, so each is never a frontier in one direction; the last two nodes of
    every type are isolated."""
    r = np.random.default_rng(3)
    n = {"author": 30, "field": 6, "paper": 50}
    edges = {("author", "writes", "paper"): _random_edges(n["author"], n["paper"], 90, r),
             ("paper", "cites", "paper"): _random_edges(n["paper"], n["paper"], 160, r),
             ("paper", "has_topic", "field"): _random_edges(n["paper"], n["field"], 40, r)}
    return TypedGraph(n, edges)


OFFSETS = {"author": 1000, "field": 3, "paper": 77}


@needs_fused
@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_offsets_and_types_without_in_or_out_edges(direction, replace):
    base = _citation_graph()
    g = OffsetGraph(base, OFFSETS)
    fanouts = {("author", "writes", "paper"): [2, -1, 1], ("paper", "cites", "paper"): [3, 0, 2],
               ("paper", "has_topic", "field"): [-1, 1, 0]}
    seeds = {"paper": _perm(50, 9, 5) + OFFSETS["paper"]}
    fused, ref = both(g.topos(direction), OFFSETS, seeds, fanouts, direction, replace, seed=7)
    assert_same(fused, ref)
    assert fused.nodes["author"].numel() > 0 if direction == "in" else fused.nodes["field"].numel() > 0
    # Without a bound the type no topology is keyed by is hashed; with one, mapped densely: same sample.
    never_center = "author" if direction == "in" else "field"
    bound = {never_center: OFFSETS[never_center] + base.num_nodes[never_center]}
    dense = dispatch.fused_sample_typed(g.topos(direction), OFFSETS, seeds, fanouts, direction, replace, 7,
                                        node_bounds=bound)
    assert_same(dense, fused)
    # The same sample in the graph's own ids: every edge exists in its relation, fanout bounds hold.
    shifted = _unshift(fused, OFFSETS)
    check_typed(base, {"paper": seeds["paper"] - OFFSETS["paper"]}, fanouts, direction, replace, shifted)


def _unshift(sub: TypedSubgraph, offsets: dict) -> TypedSubgraph:
    return TypedSubgraph({t: n - offsets[t] for t, n in sub.nodes.items()}, sub.row, sub.col, sub.eids,
                         sub.num_sampled_nodes, sub.num_sampled_edges, sub.batch_size, sub.input_type)


@needs_fused
@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
def test_large_fanouts_and_thread_count_independence(replace):
    """Degrees ~100 with fanouts 70 and 90 (Floyd with a bitmap above 64 picks) and 1 vs 2 threads."""
    r = np.random.default_rng(11)
    n = {"a": 40, "b": 30}
    edges = {("a", "to", "b"): np.stack([r.integers(0, 40, 3000), r.integers(0, 30, 3000)]),
             ("b", "to", "a"): np.stack([r.integers(0, 30, 4000), r.integers(0, 40, 4000)])}
    g = TypedGraph(n, edges)
    fanouts = {("a", "to", "b"): [70, 5], ("b", "to", "a"): [90, 3]}
    seeds = {"b": _perm(30, 8, 1), "a": _perm(40, 4, 2)}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)    # the session runs with one thread (tests/conftest.py)
        fused, ref = both(g.csc, {"a": 0, "b": 0}, seeds, fanouts, "in", replace, seed=-5, input_type="b")
        torch.set_num_threads(1)
        one = dispatch.fused_sample_typed(g.csc, {"a": 0, "b": 0}, seeds, fanouts, "in", replace, -5, "b")
    finally:
        torch.set_num_threads(threads)
    assert_same(fused, ref)
    check_typed(g, seeds, fanouts, "in", replace, fused)
    assert_same(one, fused)


@needs_fused
@pytest.mark.parametrize("direction", ["in", "out"])
def test_one_type_case_equals_the_homogeneous_fused_op(direction):
    """A one-type graph through the typed op is the homogeneous fused op's sample."""
    from graphfeed.core.spec import SamplingSpec
    from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE

    r = np.random.default_rng(4)
    g = TypedGraph({DEFAULT_NODE_TYPE: 200}, {DEFAULT_EDGE_TYPE: _random_edges(200, 200, 1500, r)})
    topos = g.csc if direction == "in" else g.csr
    seeds = _perm(200, 16, 9)
    spec = SamplingSpec((5, 3, -1), replace=False, direction=direction)
    typed = dispatch.fused_sample_typed(topos, {DEFAULT_NODE_TYPE: 0}, {DEFAULT_NODE_TYPE: seeds},
                                        {DEFAULT_EDGE_TYPE: [5, 3, -1]}, direction, False, 42).homogeneous()
    homo = dispatch.fused_sample_subgraph(topos[DEFAULT_EDGE_TYPE], 0, seeds, spec, 42)
    for field in ("nodes", "row", "col", "eids"):
        assert torch.equal(getattr(typed, field), getattr(homo, field)), field
    assert (typed.num_sampled_nodes, typed.num_sampled_edges) == (homo.num_sampled_nodes, homo.num_sampled_edges)


@pytest.fixture(scope="module")
def mag_tiny_parts(tmp_path_factory):
    """``mag-tiny`` partitioned into one part (CSC and CSR) and into two parts."""
    from graphfeed.cli.generate import write_graph
    from graphfeed.server.partition.build.builder import partition_graph
    from graphfeed.server.partition.inputs.reader import read_graph

    root = tmp_path_factory.mktemp("mag")
    write_graph(root / "g", "mag-tiny", seed=0)
    graph_input = read_graph(root / "g")
    partition_graph(graph_input, 1, root / "p1", method="random", topologies=("csc", "csr"))
    partition_graph(graph_input, 2, root / "p2", method="random")
    return root / "p1", root / "p2"


@needs_fused
def test_one_part_mag_tiny_partition(mag_tiny_parts):
    """A real one-part typed partition (every node type, every edge type, CSC and CSR)."""
    from graphfeed.server.partition.format.store import open_parts

    _, (part,) = open_parts(mag_tiny_parts[0])
    offsets = {t: part.nodes(t).start for t in part.node_types}
    seeds = {"paper": _perm(part.nodes("paper").num_nodes, 64, 3)}
    for direction, kind in (("in", "csc"), ("out", "csr")):
        topos = {e: part.edges(e).topology(kind) for e in part.edge_types}
        fanouts = {e: [4, 2] for e in part.edge_types}
        fused, ref = both(topos, offsets, seeds, fanouts, direction, False, seed=3)
        assert_same(fused, ref)
        assert sum(n.numel() for n in fused.row.values()) > 0


@needs_fused
def test_bench_script_times_the_three_implementations(mag_tiny_parts, capsys):
    from graphfeed.bench import typed_native

    one, two = mag_tiny_parts
    assert typed_native.main(["--graph", str(one), "--epochs", "1", "--batch-size", "200", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(typed_native.IMPLEMENTATIONS)
    assert all(float(line.split("seeds/s=")[1].split()[0]) > 0 for line in lines)
    assert typed_native.main(["--graph", str(two), "--epochs", "1"]) == 2
    assert "has 2 parts; the fused typed sampler needs a one-part partition" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- errors and devices

@needs_fused
def test_bad_calls_raise_one_line_errors_naming_the_fix(graph):
    fanouts = per_type([2, 2], graph)
    seeds = {"paper": torch.tensor([1, 2])}
    call = dispatch.fused_sample_typed
    with pytest.raises(ValueError, match=r"no topology for edge type \('author', 'writes', 'paper'\)"):
        call({e: t for e, t in graph.csc.items() if e != WRITES}, ZERO, seeds, fanouts, "in", False, 0)
    with pytest.raises(ValueError, match="no node offset for node type 'field'"):
        call(graph.csc, {"author": 0, "paper": 0}, seeds, fanouts, "in", False, 0)
    with pytest.raises(ValueError, match="invalid fanout"):
        call(graph.csc, ZERO, seeds, {**fanouts, WRITES: [2, -2]}, "in", False, 0)
    with pytest.raises(ValueError, match="seeds of node type 'venue'"):
        call(graph.csc, ZERO, {"venue": torch.tensor([0])}, fanouts, "in", False, 0)
    with pytest.raises(RuntimeError, match="seed node 2 appears more than once"):
        call(graph.csc, ZERO, {"paper": torch.tensor([2, 5, 2])}, fanouts, "in", False, 0)
    with pytest.raises(RuntimeError, match="node id 60 is outside the graph's ids 0..59"):
        call(graph.csc, ZERO, {"paper": torch.tensor([60])}, fanouts, "in", False, 0)
    # offsets that do not match the topologies: a frontier node that is no row of its topology
    with pytest.raises(RuntimeError, match="not a row of this topology"):
        call(graph.csc, {**ZERO, "paper": 5}, {"paper": torch.tensor([1])}, fanouts, "in", False, 0)
    # the op itself checks its lists (a caller other than dispatch)
    topo = graph.csc[WRITES]
    with pytest.raises(RuntimeError, match="one entry per edge type"):
        dispatch._NATIVE.sample_typed_subgraph([topo.indptr], [topo.indices], [], [0], [1], [torch.tensor([0]),
                                               torch.tensor([0])], [0, 0], [-1, -1], [2], False, 0, True)
    # the map of a failed call is left usable: the next call gives the reference's answer
    fused, ref = both(graph.csc, ZERO, seeds, fanouts, "in", False, 3)
    assert_same(fused, ref)


def test_without_the_library_the_fused_typed_sampler_is_off(graph, monkeypatch):
    monkeypatch.setattr(dispatch, "_NATIVE", None)
    assert not dispatch.has_fused_typed_sampler()
    with pytest.raises(RuntimeError, match="needs the native op library"):
        dispatch.fused_sample_typed(graph.csc, ZERO, {"paper": torch.tensor([1])}, per_type([2], graph), "in",
                                    False, 0)


@needs_fused
def test_device_topologies_go_through_the_driver(graph):
    """The typed op is CPU only: topologies on another device report no fused sampler (the
    driver then runs each hop with dispatch.one_hop, i.e. the CUDA kernel for CUDA tensors)."""
    assert dispatch.has_fused_typed_sampler(graph.csc)
    on_meta = {e: Topology(*(x.to("meta") for x in (t.indptr, t.indices, t.eid))) for e, t in graph.csc.items()}
    assert not dispatch.has_fused_typed_sampler(on_meta)


@needs_cuda
@pytest.mark.parametrize("replace", [False, True], ids=["norep", "rep"])
def test_cuda_topologies_through_the_driver_equal_the_cpu_fused_op(graph, replace):
    fanouts = per_type(FANOUTS["dict-zeros-all"], graph)
    seeds = {"paper": _perm(NUM_NODES["paper"], 12, 0)}
    cuda = {e: Topology(*(x.cuda() for x in (t.indptr, t.indices, t.eid))) for e, t in graph.csc.items()}

    def hop(etype, gids, fanout, rng_hop):
        return dispatch.one_hop(cuda[etype], gids, gids, fanout, replace, 9, rng_hop)

    on_gpu = sample_typed({"paper": seeds["paper"].cuda()}, fanouts, "in", hop)
    assert all(n.is_cuda for n in on_gpu.nodes.values())
    cpu = dispatch.fused_sample_typed(graph.csc, ZERO, seeds, fanouts, "in", replace, 9)
    on_gpu = TypedSubgraph({t: n.cpu() for t, n in on_gpu.nodes.items()}, {e: r.cpu() for e, r in on_gpu.row.items()},
                           {e: c.cpu() for e, c in on_gpu.col.items()}, {e: x.cpu() for e, x in on_gpu.eids.items()},
                           on_gpu.num_sampled_nodes, on_gpu.num_sampled_edges, on_gpu.batch_size, on_gpu.input_type)
    assert_same(on_gpu, cpu)
