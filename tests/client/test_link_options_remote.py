"""Link-prediction options through 2 servers: seed-edge exclusion, stored hard negatives and int8 features
give the local loader's batches on every key (homogeneous: a cluster of its own; typed: the shared mag-tiny
cluster), and a bad option is INVALID_ARGUMENT with the server staying up."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch, partition_with_hard_negatives
from helpers.shared import serving

from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status

N = 800
FANOUTS = [4, 3]
WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")


@pytest.fixture(scope="module")
def graph():
    ei, x, y, splits = synth.generate(N, 6, 8, 3, seed=3)
    return ei, x, y, splits, synth.hard_negatives(ei, y, 3, seed=1)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory):
    return partition_with_hard_negatives(graph, tmp_path_factory.mktemp("linkopts_remote") / "parts", "linkopts-remote")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with serving(parts_dir, log_dir=tmp_path_factory.mktemp("linkopts_logs")) as servers:
        yield servers


@pytest.mark.parametrize("neg, hard", [(dict(mode="binary", amount=2), 2), (dict(mode="triplet", amount=2), 1)])
def test_remote_exclusion_hard_negatives_and_int8_equal_local(cluster, parts_dir, graph, neg, hard, connect):
    seeds = torch.from_numpy(graph[0][:, ::6].copy())
    kw = dict(edge_label_index=seeds, neg_sampling=neg, num_hard_negatives=hard, batch_size=48, shuffle=True,
              seed=7, exclude_seed_edges=True, feature_dtype="int8")
    local = list(LocalLinkNeighborLoader(parts_dir, FANOUTS, **kw))
    with connect([s.address for s in cluster], timeout=60) as client:
        remote = list(client.link_neighbor_loader(FANOUTS, prefetch=2, **kw))
    assert len(remote) == len(local) > 1
    hard_count = 0
    for a, b in zip(remote, local):
        assert_same_batch(a, b)
        if "edge_label_index" in a.keys():
            k = a.input_id.numel()
            seed_pairs = a.n_id[a.edge_label_index[:, :k]].t().tolist()
        else:
            seed_pairs = torch.stack([a.n_id[a.src_index], a.n_id[a.dst_pos_index]], 1).tolist()
        sampled = set(zip(a.n_id[a.edge_index[0]].tolist(), a.n_id[a.edge_index[1]].tolist()))
        assert not any((u, v) in sampled or (v, u) in sampled for u, v in seed_pairs)
        assert a.x.dtype == torch.float32
        hard_count += int(a.neg_is_hard.sum())
    assert hard_count > 0


def test_remote_typed_exclusion_equals_local(shared_mag, shared_mag_cluster, connect):
    parts, graph = shared_mag
    ei = torch.from_numpy(np.asarray(graph.edges[WRITES].edge_index)[:, ::13].copy())
    fanouts = {WRITES: [4, 2], WRITTEN_BY: [4, 2], ("paper", "cites", "paper"): [3, 2]}
    kw = dict(edge_label_index=(WRITES, ei), batch_size=96, seed=1, neg_sampling="binary",
              exclude_seed_edges=True, reverse_edge_types={WRITES: WRITTEN_BY})
    local = list(LocalLinkNeighborLoader(parts, fanouts, **kw))
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        remote = list(client.link_neighbor_loader(fanouts, prefetch=2, **kw))
    assert len(remote) == len(local) > 1
    for a, b in zip(remote, local):
        assert_same_batch(a, b)
        k = a[WRITES].input_id.numel()
        seeds = zip(a["author"].n_id[a[WRITES].edge_label_index[0, :k]].tolist(),
                    a["paper"].n_id[a[WRITES].edge_label_index[1, :k]].tolist())
        writes = set(zip(a["author"].n_id[a[WRITES].edge_index[0]].tolist(),
                         a["paper"].n_id[a[WRITES].edge_index[1]].tolist()))
        written = set(zip(a["paper"].n_id[a[WRITTEN_BY].edge_index[0]].tolist(),
                          a["author"].n_id[a[WRITTEN_BY].edge_index[1]].tolist()))
        assert not any((u, v) in writes or (v, u) in written for u, v in seeds)


def test_remote_bad_options_are_refused_and_the_server_stays_up(shared_mag_cluster, connect):
    ei = torch.tensor([[0, 1], [0, 1]])
    with connect([s.address for s in shared_mag_cluster], timeout=60) as client:
        with pytest.raises(ValueError, match="reverse_edge_types names edge type .*'nope'.*which the graph does not"):
            client.link_neighbor_loader([2], edge_label_index=(WRITES, ei), exclude_seed_edges=True,
                                        reverse_edge_types={("paper", "nope", "author"): WRITES})
        with pytest.raises(ValueError, match="num_hard_negatives=1 needs hard negatives stored with the partition"):
            client.link_neighbor_loader([2], edge_label_index=(WRITES, ei), neg_sampling="binary",
                                        num_hard_negatives=1)
        ok = client.link_neighbor_loader([2], edge_label_index=(WRITES, ei), batch_size=2, exclude_seed_edges=True)
        assert sum(b[WRITES].input_id.numel() for b in ok) == 2
    for s in shared_mag_cluster:
        assert health_status(s.address) == SERVING and s.proc.poll() is None
