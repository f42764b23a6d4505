"""PyG's defaults after the loader swap (issue 40): ``edge_label_index=None`` is every edge, ``len(loader)`` is
PyG's for the same arguments, and the in-process loader has every public attribute of the remote one.

PyG's own ``NeighborLoader``/``LinkNeighborLoader`` give the expected lengths; the session's shared cluster
(2 real daemons, 3000 nodes, CSC + CSR) and the local loader over the same parts give graphfeed's.
"""
from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from helpers.graphs import assert_same_batch, partition_arrays
from helpers.shared import serving
from torch_geometric.data import Data

from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.layout import DEFAULT_EDGE_TYPE, PartitionPaths, read_meta
from graphfeed.server.partition.format.store import Partition

FANOUTS = [4, 2]


def _mask(graph) -> torch.Tensor:
    mask = torch.zeros(graph[1].shape[0], dtype=torch.bool)
    mask[torch.as_tensor(graph[3]["train"])] = True
    return mask


def _pyg_len(graph, link: bool = False, **kwargs) -> int:
    """``len()`` of PyG's own loader over the same graph and arguments."""
    from torch_geometric.loader import LinkNeighborLoader, NeighborLoader

    ei, x, *_ = graph
    data = Data(x=torch.as_tensor(x), edge_index=torch.as_tensor(ei))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "NeighborSampler without pyg-lib is deprecated"
        loader = (LinkNeighborLoader if link else NeighborLoader)(data, num_neighbors=FANOUTS, **kwargs)
    return len(loader)


# ---- edge_label_index=None ----------------------------------------------------------------------------

def test_edge_label_index_none_is_every_edge_local_equals_remote_equals_explicit(shared_graph, shared_parts,
                                                                                 shared_cluster, connect):
    ei = torch.as_tensor(shared_graph[0])
    args = dict(batch_size=256, shuffle=True, seed=4, neg_sampling="binary")
    every = list(LocalLinkNeighborLoader(shared_parts, FANOUTS, **args))
    explicit = list(LocalLinkNeighborLoader(shared_parts, FANOUTS, edge_label_index=ei, **args))
    with connect([s.address for s in shared_cluster], timeout=60) as client:
        remote = client.link_neighbor_loader(FANOUTS, **args)
        assert len(remote.dataset) == ei.size(1)
        remote = list(remote)
    assert len(every) == len(explicit) == len(remote) == _pyg_len(shared_graph, link=True, batch_size=256)
    for a, b, c in zip(every, explicit, remote, strict=True):
        assert_same_batch(a, b)
        assert_same_batch(a, c)


def test_every_edge_of_a_partition_of_in_edges_only_is_read_from_every_part_s_in_edges(shared_graph, tmp_path,
                                                                                          connect):
    """``graphfeed partition``'s default topology (CSC) holds no part's out-edges: each part lists the edges
    whose source it owns from every part's in-edges in its folder; batches equal the explicit form's, local and
    remote.  A folder without another part's in-edges refuses in one line naming the three fixes."""
    parts = partition_arrays(shared_graph, tmp_path / "csc", classes=4, parts=2, name="csc-only", method="metis")
    assert read_meta(parts).topologies == ["csc"]
    ei = torch.as_tensor(shared_graph[0])
    args = dict(batch_size=512, shuffle=True, seed=5, neg_sampling="binary")
    every = list(LocalLinkNeighborLoader(parts, FANOUTS, **args))
    explicit = list(LocalLinkNeighborLoader(parts, FANOUTS, edge_label_index=ei, **args))
    with serving(parts, log_dir=tmp_path / "logs") as servers:
        with connect([s.address for s in servers], timeout=60) as client:
            remote = list(client.link_neighbor_loader(FANOUTS, **args))
    assert sum(b.input_id.numel() for b in every) == ei.size(1)
    assert len(every) == len(explicit) == len(remote)
    for a, b, c in zip(every, explicit, remote, strict=True):
        assert_same_batch(a, b)
        assert_same_batch(a, c)
    lacking = shutil.copytree(parts, tmp_path / "lacking")
    PartitionPaths(lacking).edge_file(1, "csc", "eid").unlink()
    with pytest.raises(ValueError, match=r"every edge of the type\) lists each part's out-edges, which this partition "
                                         r"lacks .*part_1.* is not in this server's folder: give each server the "
                                         r"whole partition folder, re-partition with `graphfeed partition --topology "
                                         r"both`, or pass"):
        Partition(lacking, 0, read_meta(lacking)).every_edge(DEFAULT_EDGE_TYPE)


def test_edge_label_index_none_on_several_edge_types_names_them(shared_mag):
    parts, mag_graph = shared_mag
    with pytest.raises(ValueError, match=r"edge_label_index=None means every edge of the graph's one edge type .*"
                                         r"this graph has 5 .*'writes'"):
        LocalLinkNeighborLoader(parts, FANOUTS)


# ---- len(loader) --------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1024, 100, 64])
def test_len_is_pyg_s_for_hierarchical_sampling_s_arguments(shared_graph, shared_parts, shared_cluster, connect,
                                                           batch_size):
    """hierarchical_sampling.py: ``input_nodes=data.train_mask, shuffle=True`` (there 1 batch, not 1 per part)."""
    mask = _mask(shared_graph)
    want = _pyg_len(shared_graph, input_nodes=mask, batch_size=batch_size, shuffle=True)
    args = dict(batch_size=batch_size, shuffle=True, seed=1)
    local = LocalNeighborLoader(shared_parts, FANOUTS, input_nodes=mask, **args)
    with connect([s.address for s in shared_cluster], timeout=60) as client:
        remote = client.neighbor_loader(mask, FANOUTS, **args)
        assert len(remote) == len(local) == want
        got = list(remote)
        assert len(got) == want
        for a, b in zip(got, local, strict=True):
            assert_same_batch(a, b)
        split = client.neighbor_loader("train", FANOUTS, **args)   # a split name too
        assert len(split) == want
    seeds = torch.cat([b.n_id[:b.batch_size] for b in got])
    assert sorted(seeds.tolist()) == mask.nonzero().view(-1).tolist()   # every seed once
    assert all(b.batch_size == batch_size for b in got[:-1]) or len(got) == 1


def test_len_per_rank_is_pyg_s_and_ordered_false_by_name_keeps_batches_on_one_part(shared_graph, shared_parts):
    from torch.utils.data import DataLoader, DistributedSampler

    mask = _mask(shared_graph)
    total = int(mask.sum())
    for world, batch_size in ((2, 64), (3, 100), (4, 1024)):
        sampler = DistributedSampler(range(total), num_replicas=world, rank=0, shuffle=False)
        want = len(DataLoader(range(total), batch_size=batch_size, sampler=sampler))   # PyG's DDP recipe
        ranks = [LocalNeighborLoader(shared_parts, FANOUTS, input_nodes=mask, batch_size=batch_size, shuffle=True,
                                     rank=r, world_size=world) for r in range(world)]
        assert [len(r) for r in ranks] == [want] * world
        seeds = torch.cat([b.n_id[:b.batch_size] for r in ranks for b in r])
        assert sorted(seeds.tolist()) == mask.nonzero().view(-1).tolist()
    by_part = LocalNeighborLoader(shared_parts, FANOUTS, input_nodes="train", batch_size=1024, ordered=False)
    assert len(by_part) == by_part.graph.num_parts   # each part's seeds in a batch of their own, by name


# ---- the same public attributes -----------------------------------------------------------------------

def _public(obj) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_local_loaders_have_every_public_attribute_of_the_remote_ones(shared_graph, shared_parts, shared_cluster,
                                                                      connect):
    ei = torch.as_tensor(shared_graph[0])[:, :500]
    local = LocalNeighborLoader(shared_parts, FANOUTS, batch_size=64)
    local_link = LocalLinkNeighborLoader(shared_parts, FANOUTS, edge_label_index=ei, batch_size=64)
    with connect([s.address for s in shared_cluster], timeout=60) as client:
        remote = client.neighbor_loader("train", FANOUTS, batch_size=64)
        remote_link = client.link_neighbor_loader(FANOUTS, edge_label_index=ei, batch_size=64)
        assert _public(remote) - _public(local) == set()
        assert _public(remote_link) - _public(local_link) == set()
        for mine, theirs in ((local, remote), (local_link, remote_link)):
            assert mine.dataset == theirs.dataset and mine.batch_size == theirs.batch_size == 64
            assert len(mine) == len(theirs)
            list(mine)
            list(theirs)
            assert set(mine.stats()) == set(theirs.stats())
            assert mine.stats()["batches"] == theirs.stats()["batches"] == len(mine)
            assert sum(mine.stats()["batches_by_server"]) == len(mine)
        assert local.sessions == [] and local.client is None and local.feature_cache is None
    with local:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        iter(local)
