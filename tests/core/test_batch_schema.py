"""The batch schema (graphfeed.core.batch): one wire format for homogeneous and typed batches,
and its one conversion to PyG (``Data`` for the one-type graph, ``HeteroData`` otherwise)."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data, HeteroData

from graphfeed.core import batch
from graphfeed.core.constants import DEFAULT_EDGE_TYPE, DEFAULT_NODE_TYPE

VERSION_MESSAGE = "client and server run different graphfeed versions"


# ---- a tiny typed graph and an exhaustive sampler (fanout -1 on every edge type, in-edges) ----------

AUTHOR, FIELD, PAPER = "author", "field", "paper"
WRITES, CITES = (AUTHOR, "writes", PAPER), (PAPER, "cites", PAPER)
HAS, ABOUT = (FIELD, "has", PAPER), (PAPER, "about", FIELD)
NUM_NODES = {AUTHOR: 4, FIELD: 2, PAPER: 5}
EDGES = {   # [2, E]: row = source, col = destination, in original ids of each type
    WRITES: torch.tensor([[0, 1, 1, 2, 3], [0, 0, 2, 3, 4]]),
    CITES: torch.tensor([[1, 2, 3, 4, 0], [0, 0, 2, 2, 4]]),
    HAS: torch.tensor([[0, 1], [1, 3]]),
    ABOUT: torch.tensor([[1, 3, 4], [0, 1, 1]]),
}
FEATURES = {AUTHOR: torch.arange(4 * 3, dtype=torch.float32).view(4, 3),
            PAPER: torch.arange(100, 100 + 5 * 6, dtype=torch.float32).view(5, 6)}   # field: no features
LABELS = {PAPER: torch.tensor([3, 1, 0, 2, 1])}


def sample_all(seeds: list[int], hops: int, input_type: str = PAPER) -> tuple[dict, dict]:
    """Every in-neighbor of the frontier for ``hops`` hops, as ``(nodes, edges)`` for :func:`batch.encode_typed`."""
    node_ids = {t: [] for t in NUM_NODES}
    local = {t: {} for t in NUM_NODES}
    parts = {e: ([], [], []) for e in EDGES}     # row, col, e_id
    node_counts = {t: [0] for t in NUM_NODES}
    edge_counts = {e: [] for e in EDGES}
    for s in seeds:
        local[input_type][s] = len(node_ids[input_type])
        node_ids[input_type].append(s)
    node_counts[input_type][0] = len(seeds)
    frontier = {input_type: list(seeds)}
    for _ in range(hops):
        new = {t: [] for t in NUM_NODES}
        for etype in sorted(EDGES):
            src, _, dst = etype
            before = len(parts[etype][0])
            for v in frontier.get(dst, []):
                for eid in (EDGES[etype][1] == v).nonzero().view(-1).tolist():
                    u = int(EDGES[etype][0, eid])
                    if u not in local[src]:
                        local[src][u] = len(node_ids[src])
                        node_ids[src].append(u)
                        new[src].append(u)
                    for column, value in zip(parts[etype], (local[src][u], local[dst][v], eid)):
                        column.append(value)
            edge_counts[etype].append(len(parts[etype][0]) - before)
        for t in NUM_NODES:
            node_counts[t].append(len(new[t]))
        frontier = new
    nodes = {}
    for t, ids in node_ids.items():
        n_id = torch.tensor(ids, dtype=torch.int64)
        nodes[t] = {"n_id": n_id, "num_sampled_nodes": node_counts[t],
                    "x": FEATURES[t][n_id] if t in FEATURES else None, "y": LABELS[t][n_id] if t in LABELS else None}
    edges = {e: {"edge_index": torch.tensor([row, col], dtype=torch.int64).view(2, -1),
                 "e_id": torch.tensor(eid, dtype=torch.int64), "num_sampled_edges": edge_counts[e]}
             for e, (row, col, eid) in parts.items()}
    return nodes, edges


@pytest.fixture
def typed_wire():
    nodes, edges = sample_all([0, 2], hops=2)
    return batch.encode_typed(nodes=nodes, edges=edges, input_type=PAPER, batch_size=2, epoch=7, seq=3, index=11,
                              input_id=torch.tensor([5, 1]))


# ---- the one-type graph: today's Data ----------------------------------------------------------

def homogeneous_inputs():
    # graph 0->1, 2->1, 3->2, 1->0 ; seeds [1], one hop of in-edges: 0->1, 2->1
    return dict(x=torch.randn(3, 4), y=torch.tensor([1, 0, 1]), edge_index=torch.tensor([[1, 2], [0, 0]]),
                n_id=torch.tensor([1, 0, 2]), e_id=torch.tensor([0, 1]), num_sampled_nodes=[1, 2],
                num_sampled_edges=[2])


def test_one_type_batch_keys_are_the_default_types():
    wire = batch.encode(**homogeneous_inputs(), batch_size=1, epoch=0, seq=0, index=0, input_id=[0])
    assert set(wire) == {"x@_N", "y@_N", "n_id@_N", "num_sampled_nodes@_N", "edge_index@_N__to___N",
                         "e_id@_N__to___N", "num_sampled_edges@_N__to___N", "input_id", "meta"}
    assert wire["meta"].tolist() == [1, 0, 0, 0, 0]
    lay = batch.layout(wire)
    assert lay == batch.BatchLayout((DEFAULT_NODE_TYPE,), (DEFAULT_EDGE_TYPE,), DEFAULT_NODE_TYPE)
    assert lay.is_homogeneous


def test_one_type_to_pyg_is_todays_data():
    given = homogeneous_inputs()
    wire = batch.encode(**given, batch_size=1, epoch=4, seq=2, index=9, input_id=[3])
    got = batch.to_pyg(wire)
    expected = Data(x=given["x"], y=given["y"], edge_index=given["edge_index"], n_id=given["n_id"],
                    e_id=given["e_id"], batch_size=1, input_id=torch.tensor([3]), num_sampled_nodes=[1, 2],
                    num_sampled_edges=[2],
                    epoch=4, seq=2, batch_index=9)
    assert type(got) is Data
    # the same attributes (PyG's Data.keys() is a set made into a list: its order follows str hashing)
    assert sorted(got.keys()) == sorted(expected.keys())
    for key in expected.keys():
        want, have = expected[key], got[key]
        if isinstance(want, torch.Tensor):
            assert have.dtype == want.dtype and torch.equal(have, want), key
            if key != "input_id":   # made by encode from the given list
                assert have.data_ptr() == want.data_ptr(), f"{key} was copied"   # bit-identical: the same storage
        else:
            assert type(have) is type(want) and have == want, key
    assert got.num_nodes == 3 and got.num_edges == 2


def test_one_type_to_pyg_without_features():
    given = homogeneous_inputs()
    given["x"] = given["y"] = None
    data = batch.to_pyg(batch.encode(**given, batch_size=1, epoch=0, seq=0, index=0, input_id=[0]))
    assert "x" not in data and "y" not in data and torch.equal(data.n_id, given["n_id"])


# ---- the typed graph: HeteroData ---------------------------------------------------------------

def test_typed_wire_keys_cover_the_whole_schema(typed_wire):
    node_keys = {f"{f}@{t}" for t in NUM_NODES for f in ("n_id", "num_sampled_nodes")}
    feature_keys = {"x@author", "x@paper", "y@paper"}
    edge_keys = {f"{f}@{'__'.join(e)}" for e in EDGES for f in ("edge_index", "e_id", "num_sampled_edges")}
    assert set(typed_wire) == node_keys | feature_keys | edge_keys | {"input_id", "meta"}
    # paper is at position 2 among the sorted node types author, field, paper
    assert typed_wire["meta"].tolist() == [2, 7, 3, 11, 2]
    lay = batch.layout(typed_wire)
    assert lay.node_types == (AUTHOR, FIELD, PAPER) and lay.input_type == PAPER and not lay.is_homogeneous
    assert lay.edge_types == tuple(sorted(EDGES))


def test_typed_to_pyg_is_heterodata_with_pygs_attributes(typed_wire):
    data = batch.to_pyg(typed_wire)
    assert isinstance(data, HeteroData)
    assert sorted(data.node_types) == [AUTHOR, FIELD, PAPER] and sorted(data.edge_types) == sorted(EDGES)
    assert set(data[PAPER].keys()) == {"x", "y", "n_id", "num_sampled_nodes", "batch_size", "input_id"}
    assert data[PAPER].input_id.tolist() == [5, 1]
    assert set(data[AUTHOR].keys()) == {"x", "n_id", "num_sampled_nodes"}
    assert set(data[FIELD].keys()) == {"n_id", "num_sampled_nodes", "num_nodes"}   # featureless: size stated
    for etype in EDGES:
        assert set(data[etype].keys()) == {"edge_index", "e_id", "num_sampled_edges"}, etype
    assert (data.epoch, data.seq, data.batch_index) == (7, 3, 11)
    assert data[PAPER].batch_size == 2 and data[PAPER].n_id[:2].tolist() == [0, 2]   # seeds first


def test_typed_nodes_carry_their_own_rows(typed_wire):
    data = batch.to_pyg(typed_wire)
    for ntype, total in NUM_NODES.items():
        store = data[ntype]
        n_id = store.n_id
        assert n_id.dtype == torch.int64 and n_id.unique().numel() == n_id.numel()
        assert bool((n_id >= 0).all()) and bool((n_id < total).all())
        assert isinstance(store.num_sampled_nodes, list) and len(store.num_sampled_nodes) == 3   # hops + 1
        assert sum(store.num_sampled_nodes) == n_id.numel() == data[ntype].num_nodes
        if ntype in FEATURES:
            assert torch.equal(store.x, FEATURES[ntype][n_id])
    assert torch.equal(data[PAPER].y, LABELS[PAPER][data[PAPER].n_id])
    assert data[PAPER].num_sampled_nodes[0] == 2 and data[AUTHOR].num_sampled_nodes[0] == 0
    # the sample reached every author through writes and both fields through has
    assert sorted(data[AUTHOR].n_id.tolist()) == [0, 1, 2, 3] and sorted(data[FIELD].n_id.tolist()) == [0, 1]


def test_typed_edges_are_real_edges_of_their_relation(typed_wire):
    data = batch.to_pyg(typed_wire)
    total = 0
    for etype, graph_edges in EDGES.items():
        src, _, dst = etype
        store = data[etype]
        row, col = store.edge_index
        assert store.edge_index.dtype == torch.int64 and store.edge_index.size(0) == 2
        # local ids index the source / destination type's n_id; e_id names the same edge of the input
        assert torch.equal(data[src].n_id[row], graph_edges[0, store.e_id])
        assert torch.equal(data[dst].n_id[col], graph_edges[1, store.e_id])
        assert isinstance(store.num_sampled_edges, list) and len(store.num_sampled_edges) == 2
        assert sum(store.num_sampled_edges) == store.e_id.numel()
        total += store.e_id.numel()
    assert data[ABOUT].edge_index.shape == (2, 0)       # nothing sampled, still present
    assert batch.num_edges(typed_wire) == total == 12
    assert batch.batch_size(typed_wire) == 2


def test_a_graph_with_one_named_type_is_heterodata():
    nodes = {"user": {"n_id": torch.tensor([4, 1]), "num_sampled_nodes": [1, 1], "x": torch.ones(2, 2)}}
    edges = {("user", "follows", "user"): {"edge_index": torch.tensor([[1], [0]]), "e_id": torch.tensor([8]),
                                           "num_sampled_edges": [1]}}
    data = batch.to_pyg(batch.encode_typed(nodes=nodes, edges=edges, input_type="user", batch_size=1,
                                           epoch=0, seq=0, index=0, input_id=[0]))
    assert isinstance(data, HeteroData) and data["user"].batch_size == 1
    assert data["user", "follows", "user"].e_id.tolist() == [8]


# ---- check(): the key set's shape, with the version message -------------------------------------

def test_check_accepts_what_encode_builds(typed_wire):
    batch.check(typed_wire)
    batch.check(batch.encode(**homogeneous_inputs(), batch_size=1, epoch=0, seq=0, index=0, input_id=[0]))


@pytest.mark.parametrize("mutate, problem", [
    (lambda w: w.pop("n_id@author"), "node type 'author' lacks n_id"),
    (lambda w: w.pop("num_sampled_nodes@field"), "node type 'field' lacks num_sampled_nodes"),
    (lambda w: w.pop("e_id@paper__cites__paper"), r"edge type \('paper', 'cites', 'paper'\) lacks e_id"),
    (lambda w: w.pop("meta"), "no meta"),
    (lambda w: w.pop("input_id"), "no input_id"),
    (lambda w: w.update({"edge_weight@paper__cites__paper": torch.zeros(1)}), "unknown key 'edge_weight@"),
    (lambda w: w.update({"x": torch.zeros(1)}), "unknown key 'x'"),
    (lambda w: w.update({"x@": torch.zeros(1)}), "unknown key 'x@'"),
    (lambda w: w.update({"edge_index@paper_cites": torch.zeros(2, 0)}), "unknown key 'edge_index@paper_cites'"),
    (lambda w: w.update({"meta@paper": torch.zeros(1)}), "unknown key 'meta@paper'"),
    (lambda w: w.update({"x@venue": torch.zeros(1, 2)}), "node type 'venue' lacks n_id"),
    (lambda w: w.update({"meta": torch.tensor([2, 7, 3, 11])}), r"meta has shape \[4\]"),
    (lambda w: w.update({"meta": torch.tensor([2, 7, 3, 11, 3])}), "valid input type"),
], ids=["node-field", "node-count", "edge-field", "meta", "input-id", "unknown-field", "bare-key", "no-type",
        "bad-edge-type", "scoped-meta", "unknown-type", "short-meta", "input-type"])
def test_check_rejects_a_mismatched_batch(typed_wire, mutate, problem):
    mutate(typed_wire)
    with pytest.raises(batch.BatchSchemaError, match=problem) as err:
        batch.check(typed_wire)
    assert VERSION_MESSAGE in str(err.value)
    with pytest.raises(batch.BatchSchemaError, match=VERSION_MESSAGE):
        batch.to_pyg(typed_wire)


def test_check_rejects_an_edge_type_without_its_node_types(typed_wire):
    for key in [k for k in typed_wire if k.endswith("@field")]:
        del typed_wire[key]
    with pytest.raises(batch.BatchSchemaError, match=r"edge type \('field', 'has', 'paper'\) joins a node type"):
        batch.check(typed_wire)


def test_check_rejects_the_previous_wire_format():
    old = {"x": torch.zeros(1, 2), "y": torch.zeros(1), "edge_index": torch.zeros(2, 0, dtype=torch.int64),
           "n_id": torch.zeros(1, dtype=torch.int64), "e_id": torch.zeros(0, dtype=torch.int64),
           "num_sampled_nodes": torch.tensor([1]), "num_sampled_edges": torch.tensor([0]),
           "meta": torch.tensor([1, 0, 0, 0])}
    with pytest.raises(batch.BatchSchemaError, match=f"unknown key.*{VERSION_MESSAGE}"):
        batch.check(old)


# ---- encode_typed() refuses what it cannot write -------------------------------------------------

def test_encode_typed_refuses_bad_input():
    nodes, edges = sample_all([1], hops=1)
    common = dict(batch_size=1, epoch=0, seq=0, index=0, input_id=[0])
    with pytest.raises(ValueError, match="input type 'venue' is not one of the batch's node types"):
        batch.encode_typed(nodes=nodes, edges=edges, input_type="venue", **common)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['features'\]"):
        batch.encode_typed(nodes={**nodes, PAPER: {**nodes[PAPER], "features": torch.zeros(1)}}, edges=edges,
                           input_type=PAPER, **common)
    with pytest.raises(ValueError, match="node type 'author' lacks n_id"):
        batch.encode_typed(nodes={**nodes, AUTHOR: {"num_sampled_nodes": [0, 0]}}, edges=edges, input_type=PAPER,
                           **common)
    with pytest.raises(ValueError, match=r"joins node type\(s\) \['field'\] that the batch lacks"):
        batch.encode_typed(nodes={t: v for t, v in nodes.items() if t != FIELD}, edges=edges, input_type=PAPER,
                           **common)
    with pytest.raises(ValueError, match="input_id has 2 entries for a batch of 1 seeds"):
        batch.encode_typed(nodes=nodes, edges=edges, input_type=PAPER, **{**common, "input_id": [0, 1]})
    bad = {("paper_", "x", "paper"): edges[CITES]}
    with pytest.raises(ValueError, match="cannot be written as src__rel__dst"):
        batch.encode_typed(nodes={"paper_": nodes[PAPER], PAPER: nodes[PAPER]}, edges=bad, input_type=PAPER,
                           **common)


def test_edge_type_names_read_back():
    for etype in [DEFAULT_EDGE_TYPE, WRITES, ("_a", "_b", "c_")]:
        assert batch.parse_edge_type(batch.edge_type_name(etype)) == etype
    assert batch.edge_type_name(DEFAULT_EDGE_TYPE) == "_N__to___N"
    for etype in [("a__b", "r", "c"), ("a", "r_", "c"), ("a", "", "c")]:
        with pytest.raises(ValueError, match="cannot be written"):
            batch.edge_type_name(etype)


def test_nbytes_counts_every_tensor(typed_wire):
    assert batch.nbytes(typed_wire) == sum(t.numel() * t.element_size() for t in typed_wire.values())
    assert batch.nbytes({"x": torch.zeros(10, dtype=torch.uint8)}) == 10
