"""Typed seed edges (``edge_label_index=((src, rel, dst), index)``) on ``mag-tiny``: local and 2 servers.

The link batch is the node batch's producer with link fields, so a typed link batch is a
``HeteroData`` whose endpoints are seeds of their own node types; ``edge_label_index``,
``edge_label`` and ``input_id`` sit on the edge type, ``src_index`` on its source type and
``dst_pos_index``/``dst_neg_index`` on its destination type (PyG's layout).  Negatives draw
destinations of the destination type and, strict, are non-edges of that edge type.
"""
from __future__ import annotations

import grpc
import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.core.spec import LinkInput, LoaderSpec
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status

WRITES = ("author", "writes", "paper")
FANOUTS = [3, 2]


@pytest.fixture(scope="module")
def mag(shared_mag):
    return shared_mag


@pytest.fixture(scope="module")
def seeds(mag):
    """Every 4th author-writes-paper edge (original ids: row 0 authors, row 1 papers)."""
    return torch.as_tensor(mag[1].edges[WRITES].edge_index)[:, ::4].contiguous()


@pytest.fixture(scope="module")
def writes_set(mag):
    ei = torch.as_tensor(mag[1].edges[WRITES].edge_index)
    return set(zip(ei[0].tolist(), ei[1].tolist()))


def _check_typed_link_epoch(batches, seeds, writes_set, num_papers: int) -> None:
    """Every seed edge once, its endpoints the right nodes of their types, every negative a non-edge."""
    seen = []
    for b in batches:
        store = b[WRITES]
        k = store.input_id.numel()
        seen += store.input_id.tolist()
        authors, papers = b["author"].n_id, b["paper"].n_id
        if "edge_label_index" in store:
            index = store.edge_label_index
            pairs = list(zip(authors[index[0]].tolist(), papers[index[1]].tolist()))
            assert pairs[:k] == list(zip(*seeds[:, store.input_id].tolist()))
            assert store.edge_label.tolist() == [1.0] * k + [0.0] * (len(pairs) - k)
            negs = pairs[k:]
        else:
            src, pos = b["author"].src_index, b["paper"].dst_pos_index
            want = list(zip(*seeds[:, store.input_id].tolist()))
            assert list(zip(authors[src].tolist(), papers[pos].tolist())) == want
            neg = b["paper"].dst_neg_index.reshape(k, -1)
            negs = [(a, int(p)) for a, row in zip(authors[src].tolist(), papers[neg]) for p in row]
        assert negs and all(0 <= p < num_papers for _, p in negs)
        assert not set(negs) & writes_set, "strict negatives are non-edges of the seed edge type"
    assert sorted(seen) == list(range(seeds.size(1)))


@pytest.mark.parametrize("neg", ["binary", {"mode": "triplet", "amount": 2}])
def test_local_typed_link_epoch_places_fields_as_pyg_with_strict_negatives(mag, seeds, writes_set, neg):
    loader = LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(WRITES, seeds), neg_sampling=neg,
                                     batch_size=64, shuffle=True, seed=2)
    batches = list(loader)
    assert len(batches) == len(loader) > 1
    _check_typed_link_epoch(batches, seeds, writes_set, mag[1].nodes["paper"].num_nodes)
    for b in batches:   # the sampled edges exist: the seeds' neighbourhoods are sampled as node batches'
        ei = b[WRITES].edge_index
        orig = set(zip(b["author"].n_id[ei[0]].tolist(), b["paper"].n_id[ei[1]].tolist()))
        assert orig <= writes_set


def test_disjoint_typed_batches_keep_every_edge_inside_one_subgraph(mag, seeds, writes_set):
    from graphfeed.server.loader.local import LocalNeighborLoader

    node = LocalNeighborLoader(mag[0], FANOUTS, batch_size=16, input_nodes=("paper", "train"), disjoint=True)
    link = LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(WRITES, seeds), neg_sampling="binary",
                                   batch_size=16, disjoint=True)
    for b in [next(iter(node)), next(iter(link))]:
        for ntype in b.node_types:   # a node is in its subgraph once
            pairs = set(zip(b[ntype].batch.tolist(), b[ntype].n_id.tolist()))
            assert len(pairs) == b[ntype].n_id.numel()
        for etype in b.edge_types:
            row, col = b[etype].edge_index
            assert torch.equal(b[etype[0]].batch[row], b[etype[2]].batch[col]), etype
        assert sum(b[e].edge_index.size(1) for e in b.edge_types) > 0
    index = b[WRITES].edge_label_index   # each labelled pair (seed edge or binary negative) is its own subgraph
    assert torch.equal(b["author"].batch[index[0]], torch.arange(index.size(1)))
    assert torch.equal(b["paper"].batch[index[1]], torch.arange(index.size(1)))
    row, col = b[WRITES].edge_index
    orig = set(zip(b["author"].n_id[row].tolist(), b["paper"].n_id[col].tolist()))
    assert orig <= writes_set


def test_typed_link_input_round_trips_and_errors_name_the_edge_type(mag, seeds):
    spec = LoaderSpec.of(LinkInput.of((WRITES, seeds), neg_sampling="binary"), FANOUTS, batch_size=8)
    assert spec.input.edge_type == WRITES and loader_spec_from_proto(open_session_request(spec, "g")) == spec
    with pytest.raises(ValueError, match=r"on a typed graph needs its edge type: pass \(\(src, rel, dst\), index\)"):
        LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=seeds)
    with pytest.raises(ValueError, match=r"names edge type \('author', 'likes', 'paper'\), which the graph"):
        LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(("author", "likes", "paper"), seeds))
    far = seeds.clone()
    far[1, 0] = 10 ** 6
    with pytest.raises(ValueError, match=r"original 'paper' node \(destination of .*\) ids are 0\.\."):
        LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(WRITES, far))


def test_every_edge_label_index_form_pyg_accepts_equals_the_explicit_form(mag, seeds):
    kw = dict(neg_sampling="binary", batch_size=64, shuffle=True, seed=3)
    explicit = list(LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(WRITES, seeds), **kw))
    for form in ((("author", "paper"), seeds), [list(WRITES), seeds]):   # PyG's (src, dst) shorthand; lists
        got = list(LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=form, **kw))
        assert len(got) == len(explicit)
        for a, b in zip(got, explicit, strict=True):
            assert_same_batch(a, b)
    every_edge, kw = torch.as_tensor(mag[1].edges[WRITES].edge_index), dict(kw, batch_size=4096)   # 23591 edges
    explicit = list(LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(WRITES, every_edge), **kw))
    assert sum(b["author", "writes", "paper"].input_id.numel() for b in explicit) == every_edge.size(1)
    for every in (WRITES, (WRITES, None), ("author", "paper"), (("author", "paper"), None)):   # every edge of the type
        got = list(LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=every, **kw))
        assert len(got) == len(explicit)
        for a, b in zip(got, explicit, strict=True):
            assert_same_batch(a, b)
    with pytest.raises(ValueError, match=r"every edge of the type\) takes no edge_label"):
        LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=WRITES, edge_label=torch.ones(3), **kw)
    with pytest.raises(ValueError, match=r"names no edge type\(s\) from 'field' to 'author'.*full \(src, rel, dst\)"):
        LocalLinkNeighborLoader(mag[0], FANOUTS, edge_label_index=(("field", "author"), seeds), **kw)


def test_every_edge_of_a_type_from_in_edges_only_equals_the_explicit_form(tmp_path):
    """A typed partition of in-edges only (the CLI's default): every 'writes' edge, listed from both parts'
    in-edges, gives the batches of the explicit form."""
    graph = synth.generate_mag_preset("mag-tiny", seed=0)
    builder.partition_graph(graph, 2, tmp_path / "csc", method="metis", topologies=("csc",), seed=0)
    ei = torch.as_tensor(graph.edges[WRITES].edge_index)
    kw = dict(neg_sampling="binary", batch_size=4096, shuffle=True, seed=3)
    explicit = list(LocalLinkNeighborLoader(tmp_path / "csc", FANOUTS, edge_label_index=(WRITES, ei), **kw))
    every = list(LocalLinkNeighborLoader(tmp_path / "csc", FANOUTS, edge_label_index=WRITES, **kw))
    assert sum(b[WRITES].input_id.numel() for b in every) == ei.size(1)
    assert len(every) == len(explicit)
    for a, b in zip(every, explicit, strict=True):
        assert_same_batch(a, b)


@pytest.fixture(scope="module")
def cluster(shared_mag_cluster):
    return shared_mag_cluster


def test_remote_typed_link_batches_equal_local_and_bad_input_is_invalid_argument(cluster, mag, seeds, writes_set):
    kw = dict(edge_label_index=(WRITES, seeds), neg_sampling="binary", batch_size=64, shuffle=True, seed=3)
    local = list(LocalLinkNeighborLoader(mag[0], FANOUTS, **kw))
    addresses = [s.address for s in cluster]
    with gf.connect(addresses, timeout=60) as client:
        remote = client.link_neighbor_loader(FANOUTS, prefetch=2, **kw)
        got = list(remote)
        assert len(got) == len(local)
        for a, b in zip(got, local, strict=True):
            assert_same_batch(a, b)
        _check_typed_link_epoch(got, seeds, writes_set, mag[1].nodes["paper"].num_nodes)
        with pytest.raises(ValueError, match="needs its edge type"):
            client.link_neighbor_loader(FANOUTS, edge_label_index=seeds)
        shorthand = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **dict(kw, edge_label_index=(
            ("author", "paper"), seeds))))   # PyG's (src, dst) form: was "too many dimensions 'str'"
        for a, b in zip(shorthand, local, strict=True):
            assert_same_batch(a, b)
        big = dict(kw, batch_size=4096)   # 23591 seed edges: 6 batches
        local_every = list(LocalLinkNeighborLoader(mag[0], FANOUTS, **dict(big, edge_label_index=(
            WRITES, torch.as_tensor(mag[1].edges[WRITES].edge_index)))))
        for form in (WRITES, ("author", "paper")):   # every edge of the type, listed by the servers
            got = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **dict(big, edge_label_index=form)))
            assert len(got) == len(local_every)
            for a, b in zip(got, local_every, strict=True):
                assert_same_batch(a, b)
        bad = LoaderSpec.of(LinkInput.of((("author", "likes", "paper"), seeds)), FANOUTS)
        with pytest.raises(grpc.RpcError) as info:
            client.servers[0].stub.OpenSession(open_session_request(bad, client.group.group_id), timeout=30,
                                               metadata=client.servers[0].metadata)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "likes" in info.value.details()
    assert all(health_status(a) == SERVING for a in addresses)
    assert all(s.proc.poll() is None for s in cluster)
