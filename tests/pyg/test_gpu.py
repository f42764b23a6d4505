"""PyG's loaders over GPU-sampling daemons (``device: cuda``): the sampler's batches equal graphfeed's loader's.
Skipped where GPU sampling is unavailable (``scripts/gpu_check.sh`` runs it on a GPU machine)."""
from __future__ import annotations

import pytest
import torch
from helpers.graphs import assert_same_batch
from torch_geometric.loader import LinkLoader, NodeLoader

from graphfeed.core.constants import DEFAULT_EDGE_TYPE
from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore, GraphfeedSampler
from graphfeed.server.partition.build.builder import GraphInput, partition_graph
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling.gpu import cuda_unavailable_reason
from graphfeed.testing.cluster import start_server, stop_processes

NO_GPU = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(NO_GPU is not None, reason=f"GPU sampling unavailable: {NO_GPU}")


@pytest.fixture(scope="module")
def tiny_random(tmp_path_factory):
    """``tiny`` in 2 random parts (METIS may be missing on a GPU machine)."""
    ei, x, y, splits = synth.generate_preset("tiny")
    root = tmp_path_factory.mktemp("pyg-gpu") / "tiny2"
    partition_graph(GraphInput(ei, x, y, splits, name="tiny"), 2, root, method="random")
    return root, ei


def _same(a, b) -> None:
    a, b = a.clone(), b.clone()
    for key in ("epoch", "seq", "batch_index", "num_nodes", "batch_size"):
        for batch in (a, b):
            if key in batch:
                del batch[key]
    assert_same_batch(a, b)


@pytest.mark.parametrize("devices", [("cuda", "cuda"), ("cuda", "cpu")], ids=["gpu-daemons", "mixed"])
def test_pyg_loaders_over_gpu_daemons_equal_graphfeed_loaders(tiny_random, tmp_path, devices):
    import graphfeed.client as gf

    root, ei = tiny_random
    servers = [start_server(root, p, log_dir=tmp_path, env={"GRAPHFEED_DEVICE": d}) for p, d in enumerate(devices)]
    try:
        with gf.connect([s.address for s in servers], timeout=120) as client:
            fs, gs = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
            ids = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))[:2048]
            sampler = GraphfeedSampler(client, [10, 5], feature_store=fs, seed=4)
            got = list(NodeLoader((fs, gs), node_sampler=sampler, input_nodes=ids, batch_size=512))
            want = list(client.neighbor_loader(input_nodes=ids, num_neighbors=[10, 5], batch_size=512, seed=4))
            assert len(got) == len(want) == 4
            for a, b in zip(got, want):
                _same(a, b)
            seeds = torch.from_numpy(ei[:, ::97].copy()).to(torch.int64)
            ours = list(client.link_neighbor_loader([5, 3], edge_label_index=seeds, neg_sampling="binary",
                                                    batch_size=256, seed=4))
            order = torch.cat([b.input_id for b in ours])
            bounds = torch.tensor([0] + [b.input_id.numel() for b in ours]).cumsum(0).tolist()
            batches = [list(range(s, e)) for s, e in zip(bounds, bounds[1:])]
            link = LinkLoader((fs, gs), link_sampler=GraphfeedSampler(client, [5, 3], feature_store=fs, seed=4),
                              edge_label_index=(DEFAULT_EDGE_TYPE, seeds[:, order]), input_id=order,
                              neg_sampling="binary", batch_sampler=batches)
            for a, b in zip(list(link), ours, strict=True):
                _same(a, b)
        assert "samples part 0 on cuda:0" in servers[0].logs()
    finally:
        assert stop_processes([s.proc for s in servers]) == [0, 0], [s.log_tail() for s in servers]
