"""Link loaders: seed-edge epochs, negatives (binary/triplet, strict), errors, local == remote (2 servers)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch
from helpers.shared import serving

from graphfeed.client.errors import InvalidRequest
from graphfeed.core.spec import LinkInput, LoaderSpec, NegativeSampling
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling.link import ROUNDS, StrictNegativeError
from graphfeed.testing.cluster import SERVING, health_status

N = 800
FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def graph():
    ei, x, y, splits = synth.generate(N, 6, 8, 3, seed=3)
    return ei, x, y, splits


def _edge_attr(ei) -> np.ndarray:
    """Edge features that name their edge: row e is (e, -2e, 1 + e mod 5) (the last a valid weight)."""
    e = np.arange(ei.shape[1], dtype=np.float32)
    return np.stack([e, -2 * e, 1 + e % 5], axis=1)


def _partition(graph, out, topologies):
    ei, x, y, splits = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=3, fingerprint=f"link-{N}",
                           edge_attr=_edge_attr(ei))
    builder.partition_graph(g, 2, out, method="metis", topologies=topologies)
    return out


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory):
    """CSC only: strict checks ask the part that owns the negative's destination (often the other one)."""
    return _partition(graph, tmp_path_factory.mktemp("link") / "parts", ("csc",))


@pytest.fixture(scope="module")
def parts_csr_dir(graph, tmp_path_factory):
    return _partition(graph, tmp_path_factory.mktemp("link_csr") / "parts", ("csc", "csr"))


@pytest.fixture(scope="module")
def edge_set(graph):
    ei = graph[0]
    return set((ei[0] * N + ei[1]).tolist())


@pytest.fixture(scope="module")
def seed_edges(graph):
    """Every 7th edge of the graph (distinct pairs) as the seed edges."""
    ei = torch.from_numpy(graph[0])
    return ei[:, ::7].contiguous()


def _pairs(b, index):
    """Original-id pairs of local-id edges ``index`` [2, K] of batch ``b``."""
    return list(zip(b.n_id[index[0]].tolist(), b.n_id[index[1]].tolist()))


# ---- records ----------------------------------------------------------------------------------------

def test_negative_sampling_accepts_pyg_forms_and_refuses_unknown_modes():
    assert NegativeSampling.of("binary") == NegativeSampling("binary", 1.0, True)
    assert NegativeSampling.of({"mode": "triplet", "amount": 3}) == NegativeSampling("triplet", 3.0)
    assert NegativeSampling.of(None, 2.0) == NegativeSampling("binary", 2.0)
    assert NegativeSampling.of(None, None) is None and NegativeSampling.of(None, 0) is None
    assert NegativeSampling("binary", 0.5).count(5) == 3 and NegativeSampling("triplet", 2).count(5) == 10
    with pytest.raises(ValueError, match="neg_sampling mode 'ternary' does not exist: use 'binary' or 'triplet'"):
        NegativeSampling.of("ternary")
    with pytest.raises(ValueError, match="whole number in triplet mode"):
        NegativeSampling.of({"mode": "triplet", "amount": 1.5})
    with pytest.raises(ValueError, match="not both"):
        NegativeSampling.of("binary", 1.0)


def test_link_input_validates_index_and_labels_and_round_trips_through_protobuf():
    with pytest.raises(ValueError, match=r"edge_label_index must have shape \[2, E\]"):
        LinkInput.of(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="edge_label has 1 entries, edge_label_index has 2 edges"):
        LinkInput.of(torch.tensor([[0, 1], [1, 2]]), edge_label=torch.tensor([1.0]))
    link = LinkInput.of(torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 2]), neg_sampling={"mode": "binary",
                                                                                            "amount": 2,
                                                                                            "strict": False})
    assert link.labels(torch.tensor([0, 1])).tolist() == [1, 3], "binary shifts 0-based labels (0 = negative)"
    spec = LoaderSpec.of(link, [3, 2], batch_size=2, shuffle=True, seed=5, weight_attr="edge_attr:1")
    assert spec.is_link and spec.kind == "link"
    assert loader_spec_from_proto(open_session_request(spec, "g")) == spec


# ---- the local loader -------------------------------------------------------------------------------

def test_binary_epoch_covers_every_seed_edge_once_across_ranks_with_strict_non_edges(parts_dir, seed_edges,
                                                                                     edge_set, graph):
    attr = _edge_attr(graph[0])
    positions, num_neg, edges_checked = [], 0, 0
    lens = set()
    for rank in range(2):
        loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=seed_edges, neg_sampling_ratio=2.0,
                                         batch_size=40, shuffle=True, seed=1, rank=rank, world_size=2)
        batches = list(loader)
        lens.add(len(batches))
        for b in batches:
            k = b.input_id.numel()
            positions += b.input_id.tolist()
            assert b.edge_label_index.size(1) == k + int(np.ceil(2.0 * k)), "pos/neg ratio as asked"
            assert b.edge_label[:k].eq(1).all() and b.edge_label[k:].eq(0).all()
            pos = _pairs(b, b.edge_label_index[:, :k])
            assert pos == list(zip(*seed_edges[:, b.input_id].tolist())), "positives are the input's edges"
            negs = _pairs(b, b.edge_label_index[:, k:])
            assert all(s * N + d not in edge_set for s, d in negs), "strict negatives are non-edges"
            num_neg += len(negs)
            src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
            assert set((src * N + dst).tolist()) <= edge_set
            assert torch.equal(b.edge_attr, torch.from_numpy(attr)[b.e_id]), "edge_attr rows are e_id's rows"
            edges_checked += src.numel()
    assert len(lens) == 1, "every rank gets the same number of batches"
    assert sorted(positions) == list(range(seed_edges.size(1))), "every seed edge exactly once across ranks"
    assert num_neg >= 2 * seed_edges.size(1) and edges_checked > 0


def test_non_strict_negatives_do_hit_edges_so_the_strict_check_is_real(parts_dir, graph):
    # A dense corner: seed edges from node 0's neighbourhood on a graph where we count hits of non-strict draws
    ei = torch.from_numpy(graph[0])
    loose = LocalLinkNeighborLoader(parts_dir, [2], edge_label_index=ei, batch_size=512,
                                    neg_sampling={"mode": "binary", "amount": 1, "strict": False})
    edges = set((ei[0] * N + ei[1]).tolist())
    hits = 0
    for b in loose:
        k = b.input_id.numel()
        hits += sum(s * N + d in edges for s, d in _pairs(b, b.edge_label_index[:, k:]))
    assert hits > 0, "with ~1% density some of ~4800 uniform draws are edges"


def test_triplet_mode_gives_src_pos_neg_indices(parts_csr_dir, seed_edges, edge_set):
    loader = LocalLinkNeighborLoader(parts_csr_dir, FANOUTS, edge_label_index=seed_edges,
                                     neg_sampling={"mode": "triplet", "amount": 3}, batch_size=50, seed=2)
    b = next(iter(loader))
    k = b.input_id.numel()
    assert b.src_index.shape == (k,) and b.dst_pos_index.shape == (k,) and b.dst_neg_index.shape == (k, 3)
    assert "edge_label_index" not in b.keys()
    assert _pairs(b, torch.stack([b.src_index, b.dst_pos_index])) == list(zip(*seed_edges[:, b.input_id].tolist()))
    src = b.n_id[b.src_index]
    for j in range(3):
        negs = zip(src.tolist(), b.n_id[b.dst_neg_index[:, j]].tolist())
        assert all(s * N + d not in edge_set for s, d in negs)
    assert b.n_id[:b.batch_size].unique().numel() == b.batch_size


def test_labels_without_negatives_and_determinism(parts_dir, seed_edges):
    labels = torch.arange(seed_edges.size(1), dtype=torch.float32)
    kw = dict(edge_label_index=seed_edges, edge_label=labels, batch_size=64, shuffle=True, seed=9)
    a, b = LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw), LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw)
    for x, y in zip(list(a), list(b), strict=True):
        assert_same_batch(x, y)
        assert torch.equal(x.edge_label, labels[x.input_id])


def test_link_loader_has_the_node_loaders_resilience(parts_dir, seed_edges):
    """One live iterator, state_dict / load_state_dict mid-epoch (the tail equals the whole epoch's) and a
    refused state of another loader: shared with LocalNeighborLoader, not copied."""
    kw = dict(edge_label_index=seed_edges, neg_sampling="binary", batch_size=64, shuffle=True, seed=5)
    ref = list(LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw))
    loader = LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    with pytest.raises(RuntimeError, match="already has a live iterator"):
        next(iter(loader))
    state = loader.state_dict()
    assert (state["epoch"], state["cursor"]) == (0, 2)
    fresh = LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw)
    fresh.load_state_dict(state)
    tail = list(fresh)
    assert len(head) + len(tail) == len(ref) > 2
    for a, b in zip(head + tail, ref, strict=True):
        assert_same_batch(a, b)
    seen = torch.cat([b.input_id for b in head + tail])
    assert sorted(seen.tolist()) == list(range(seed_edges.size(1)))
    with pytest.raises(ValueError, match="inputs_fingerprint"):
        LocalLinkNeighborLoader(parts_dir, FANOUTS, **{**kw, "edge_label_index": seed_edges[:, 1:]}).load_state_dict(
            state)


def test_strict_negatives_that_cannot_exist_fail_naming_the_fix(tmp_path):
    # node 0 is linked to every node (itself included): no strict negative exists for source 0
    n = 20
    src = np.concatenate([np.zeros(n, dtype=np.int64), np.arange(1, n)])
    dst = np.concatenate([np.arange(n), np.zeros(n - 1, dtype=np.int64)])
    g = builder.GraphInput(edge_index=np.stack([src, dst]), x=np.ones((n, 2), np.float32),
                           y=np.zeros(n, np.int64), splits={"train": np.arange(n)}, num_classes=1)
    builder.partition_graph(g, 2, tmp_path / "star", method="random", topologies=("csc",))
    loader = LocalLinkNeighborLoader(tmp_path / "star", [2], edge_label_index=torch.tensor([[0], [3]]),
                                     neg_sampling="binary")
    with pytest.raises(StrictNegativeError, match=f"drew {ROUNDS} destinations for seed edge 0 .*strict=False"):
        next(iter(loader))
    loose = LocalLinkNeighborLoader(tmp_path / "star", [2], edge_label_index=torch.tensor([[0], [3]]),
                                    neg_sampling={"mode": "binary", "strict": False})
    assert next(iter(loose)).edge_label.tolist() == [1.0, 0.0]


def test_local_errors_name_the_argument(parts_dir):
    with pytest.raises(ValueError, match=f"edge_label_index has node id {N}, outside the graph"):
        LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=torch.tensor([[0, N], [1, 2]]))
    with pytest.raises(ValueError, match="neg_sampling mode 'negative' does not exist"):
        LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=torch.tensor([[0], [1]]),
                                neg_sampling="negative")


def test_node_batches_carry_edge_attr_of_e_id_in_both_directions(parts_csr_dir, graph):
    from graphfeed.server.loader.local import LocalNeighborLoader

    attr = torch.from_numpy(_edge_attr(graph[0]))
    for direction in ("in", "out"):
        loader = LocalNeighborLoader(parts_csr_dir, FANOUTS, batch_size=64, direction=direction)
        for b in loader:
            assert b.edge_attr.shape == (b.e_id.numel(), 3) and torch.equal(b.edge_attr, attr[b.e_id])


# ---- through 2 servers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with serving(parts_dir, log_dir=tmp_path_factory.mktemp("link_logs")) as servers:
        yield servers


@pytest.mark.parametrize("neg, weight_attr", [({"mode": "binary", "amount": 1.5}, None),
                                              ({"mode": "triplet", "amount": 2}, "edge_attr:2")])
def test_remote_link_batches_equal_local_on_every_key(cluster, parts_dir, seed_edges, edge_set, neg, weight_attr,
                                                      connect):
    kw = dict(edge_label_index=seed_edges, neg_sampling=neg, batch_size=48, shuffle=True, seed=4,
              weight_attr=weight_attr)
    local = LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw)
    owner_parts = set()
    with connect([s.address for s in cluster], timeout=60) as client:
        remote = client.link_neighbor_loader(FANOUTS, prefetch=2, **kw)
        assert len(remote) == len(local)
        got = list(remote)
        for a, b in zip(got, list(local), strict=True):
            assert_same_batch(a, b)
        positions = sorted(p for b in got for p in b.input_id.tolist())
        assert positions == list(range(seed_edges.size(1)))
        book = local.graph.book
        for b in got:   # every negative a non-edge, including those checked by the other server's worker
            if "edge_label_index" in b.keys():
                negs = _pairs(b, b.edge_label_index[:, b.input_id.numel():])
            else:
                negs = _pairs(b, torch.stack([b.src_index.repeat_interleave(2), b.dst_neg_index.reshape(-1)]))
            assert all(s * N + d not in edge_set for s, d in negs)
            gsrc, gdst = (local.graph.to_global(torch.tensor(ids)) for ids in zip(*negs))
            owner_parts |= set((book.owner(gdst) != book.owner(gsrc)).tolist())
    assert True in owner_parts, "some strict checks ran on the other server's worker (CSC: the destination's part)"


def test_remote_bad_link_input_is_invalid_argument_and_server_stays_up(cluster, seed_edges, connect):
    with connect([s.address for s in cluster], timeout=60) as client:
        with pytest.raises(ValueError, match=f"edge_label_index has node id {N}, outside the graph"):
            client.link_neighbor_loader(FANOUTS, edge_label_index=torch.tensor([[0, N], [1, 1]]))
        with pytest.raises(ValueError, match="neg_sampling mode 'x' does not exist"):
            client.link_neighbor_loader(FANOUTS, edge_label_index=seed_edges, neg_sampling="x")
        # past the client's checks: the server refuses it itself
        spec = LoaderSpec.of(LinkInput.of(torch.tensor([[0, N + 5], [1, 1]])), FANOUTS)
        with pytest.raises(InvalidRequest, match=f"edge_label_index has node id {N + 5}, outside the graph"):
            client.open_loader(spec)
        with pytest.raises(InvalidRequest, match="weight_attr='edge_attr:1': edge weights must be finite and >= 0"):
            client.link_neighbor_loader(FANOUTS, edge_label_index=seed_edges, weight_attr="edge_attr:1")
        ok = client.link_neighbor_loader(FANOUTS, edge_label_index=seed_edges[:, :10], batch_size=5)
        assert sum(b.input_id.numel() for b in ok) == 10, "the same client's next loader works"
    for s in cluster:
        assert health_status(s.address) == SERVING
        assert s.proc.poll() is None
