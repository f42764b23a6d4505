"""A PyG script ported by swapping the loader: what it passes is taken as PyG takes it (issue 27).

Real ``graphfeed serve`` daemons on loopback (2 parts, 3000 nodes); the exit cases run a real
trainer script in a subprocess.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
import torch
from helpers.graphs import assert_same_batch, partition_arrays
from torch_geometric.data import Data
from torch_geometric.transforms import NormalizeFeatures

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

FANOUTS = [5, 3]
EXIT_BOUND = 120.0   # seconds for a trainer script to connect, pull and exit on a loaded host


@pytest.fixture(scope="module")
def graph():
    ei, x, y, splits = synth.generate(3000, 8, 16, 4)
    return ei, (x > 0).astype("float32"), y, splits    # bag-of-words rows like Cora's (min 0 in every batch)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    return partition_arrays(graph, tmp_path_factory.mktemp("dropin") / "parts", classes=4, parts=2, name="dropin-3000",
                            method="metis")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


@pytest.fixture(scope="module")
def addresses(cluster):
    return [s.address for s in cluster]


def _groups_open(address: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.ControlStub(ch).GetStats(pb.StatsRequest(), timeout=10).groups_open


# ---- transform= ------------------------------------------------------------------------------------

def test_transform_normalize_features_equals_normalising_locally(addresses, graph, parts_dir):
    _, x, *_ = graph
    full = NormalizeFeatures()(Data(x=torch.as_tensor(x))).x   # the dataset transform, on the trainer's copy
    with gf.connect(addresses, timeout=60) as client:
        plain = list(client.neighbor_loader("train", FANOUTS, batch_size=64))
        normed = list(client.neighbor_loader("train", FANOUTS, batch_size=64, transform=NormalizeFeatures()))
        assert len(plain) == len(normed) > 1
        for a, b in zip(plain, normed):
            assert torch.equal(a.n_id, b.n_id)
            assert torch.allclose(b.x, full[b.n_id])
            assert not torch.allclose(a.x, full[a.n_id])   # without transform= the servers' raw rows
        seen = []
        raw = client.neighbor_loader("train", FANOUTS, batch_size=64,
                                     transform_sampler_output=lambda out: seen.append(sorted(out)) or out)
        assert len(list(raw)) == len(plain) and any(k.startswith("n_id") for k in seen[0])
        with pytest.raises(TypeError, match="transform must be a callable"):
            client.neighbor_loader("train", FANOUTS, transform="normalize")
    local = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=64, transform=NormalizeFeatures())
    for a, b in zip(local, normed):   # the local loader applies it the same way
        assert torch.equal(a.x, b.x)


# ---- PyG's keyword arguments ----------------------------------------------------------------------

def test_pyg_keyword_arguments_dataset_batch_size_and_a_positional_data(addresses, graph, caplog):
    *_, splits = graph
    with gf.connect(addresses, timeout=60) as client:
        with caplog.at_level(logging.INFO, logger="graphfeed"):
            loader = client.neighbor_loader("train", FANOUTS, batch_size=64, num_workers=4, persistent_workers=True,
                                            prefetch_factor=2)
            client.neighbor_loader("train", FANOUTS, batch_size=64, num_workers=4, persistent_workers=True,
                                   prefetch_factor=2)
        noted = [r.getMessage() for r in caplog.records if "num_workers=4" in r.getMessage()]
        assert len(noted) == 1 and "session workers" in noted[0], noted   # one line, once
        assert loader.batch_size == 64
        assert len(loader.dataset) == len(splits["train"])
        data = Data(x=torch.zeros(3, 1), edge_index=torch.zeros(2, 0, dtype=torch.long))
        with pytest.raises(TypeError, match=r"takes no graph .* client.neighbor_loader\(input_nodes=X"):
            client.neighbor_loader(data, FANOUTS, batch_size=64)
        with pytest.raises(TypeError, match="link_neighbor_loader's first argument"):
            client.link_neighbor_loader(data, edge_label_index="train")


# ---- drop_last as PyG --------------------------------------------------------------------------------

def _pyg_kept_per_rank(total: int, batch_size: int, world: int) -> int:
    """Seeds a rank trains on per epoch in PyG: ``DistributedSampler`` then ``DataLoader(drop_last=True)``."""
    from torch.utils.data import DataLoader, DistributedSampler

    data = list(range(total))
    sampler = DistributedSampler(data, num_replicas=world, rank=0, shuffle=False)
    return sum(len(b) for b in DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True))


@pytest.mark.parametrize("batch_size", [32, 64])
def test_drop_last_on_two_ranks_keeps_what_pyg_keeps_remote_equals_local(addresses, graph, parts_dir, batch_size):
    *_, splits = graph
    train = splits["train"]
    common = dict(batch_size=batch_size, shuffle=True, drop_last=True, seed=7, world_size=2)
    with gf.connect(addresses, timeout=60) as client:
        remote = [list(client.neighbor_loader("train", FANOUTS, rank=r, **common)) for r in range(2)]
        link = [list(client.link_neighbor_loader(FANOUTS, edge_label_index=_seed_edges(graph), rank=r,
                                                 neg_sampling="binary", **common)) for r in range(2)]
    local = [list(LocalNeighborLoader(parts_dir, FANOUTS, rank=r, **common)) for r in range(2)]
    assert len(remote[0]) == len(remote[1]) == len(local[0]) > 0
    for r in range(2):
        for a, b in zip(remote[r], local[r], strict=True):
            assert_same_batch(a, b)
    seeds = torch.cat([b.n_id[:b.batch_size] for rank in remote for b in rank])
    assert all(b.batch_size == batch_size for rank in remote for b in rank)
    assert seeds.numel() == 2 * _pyg_kept_per_rank(len(train), batch_size, 2)   # PyG's count, not fewer
    assert len(train) - seeds.numel() <= 2 * (batch_size - 1)
    assert seeds.unique().numel() == seeds.numel() and set(seeds.tolist()) <= set(train.tolist())
    part0 = open_parts(parts_dir)[1][0]
    owners = [part0.to_global(b.n_id[:b.batch_size])[0] for rank in remote for b in rank]
    assert any(0 < int(o.sum()) < batch_size for o in owners), "a packed batch takes seeds of both parts"
    # a link loader packs its seed edges too, and its remote batches equal the local loader's
    local_link = [list(LocalLinkNeighborLoader(parts_dir, FANOUTS, edge_label_index=_seed_edges(graph), rank=r,
                                               neg_sampling="binary", **common)) for r in range(2)]
    edges = _seed_edges(graph).size(1)
    assert len(link[0]) == len(link[1]) == 2 * _pyg_kept_per_rank(edges, batch_size, 2) // (2 * batch_size)
    for r in range(2):
        for a, b in zip(link[r], local_link[r], strict=True):
            assert_same_batch(a, b)


def _seed_edges(graph) -> torch.Tensor:
    ei = torch.as_tensor(graph[0])
    return ei[:, torch.arange(0, ei.size(1), 37)]    # a few hundred seed edges, both parts' sources


# ---- connect() twice, exit without close() ---------------------------------------------------------

def test_connect_to_the_same_servers_returns_the_open_client(addresses):
    first = gf.connect(addresses, timeout=60)
    try:
        again = gf.connect(list(reversed(addresses)), timeout=60)   # a re-imported script connects again
        assert again is first
        again.close()                                 # the inner connect's close keeps the outer's client
        assert len(list(first.neighbor_loader("val", FANOUTS, batch_size=256))) >= 1
        with pytest.raises(RuntimeError, match="already has an open graphfeed client.*imported twice"):
            gf.connect([addresses[0]], timeout=60)
    finally:
        first.close()
    with pytest.raises(RuntimeError, match="closed"):
        first.neighbor_loader("val", FANOUTS)


BREAKS_WITHOUT_CLOSE = textwrap.dedent("""
    import sys, graphfeed.client as gf
    client = gf.connect(sys.argv[1].split(","), timeout=60)
    loader = client.neighbor_loader("test", [5, 3], batch_size=16, shuffle=True, prefetch=4)
    for i, batch in enumerate(loader):
        if i == 2:
            break                     # an unfinished epoch, pulls in flight
    peek = next(iter(client.neighbor_loader("val", [5, 3], batch_size=32)))   # a next(iter(...)) peek
    print("done", int(batch.batch_size), int(peek.batch_size), flush=True)
    # no client.close(): the interpreter exits with the client open
""")


def test_a_script_that_breaks_and_never_closes_exits_0_and_frees_its_group(addresses):
    for _ in range(2):   # the abort came in 3 of 4 runs before
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-c", BREAKS_WITHOUT_CLOSE, ",".join(addresses)], capture_output=True,
                             text=True, timeout=EXIT_BOUND)
        assert res.returncode == 0, f"exit code {res.returncode}:\n{res.stdout}\n{res.stderr[-3000:]}"
        assert "done 16" in res.stdout
        assert "terminate called" not in res.stderr and "failed" not in res.stderr, res.stderr[-3000:]
        assert time.monotonic() - t0 < EXIT_BOUND
        assert [_groups_open(a) for a in addresses] == [0, 0], "the servers free the group when the script exits"


# ---- order with shuffle=False -----------------------------------------------------------------------

def test_layer_wise_inference_with_shuffle_false_equals_full_batch(addresses, graph):
    """reddit.py's ``inference``: every node, all neighbours, ``shuffle=False``, outputs ``torch.cat``ed."""
    from torch_geometric.nn import SAGEConv

    ei, x, *_ = graph
    torch.manual_seed(0)
    conv = SAGEConv(x.shape[1], 8).eval()
    with torch.no_grad():
        full = conv(torch.as_tensor(x), torch.as_tensor(ei))
        with gf.connect(addresses, timeout=60) as client:
            def layer(loader):
                return torch.cat([conv(b.x, b.edge_index)[:b.batch_size] for b in loader])

            subgraph_loader = client.neighbor_loader(None, [-1], batch_size=256, shuffle=False)
            assert subgraph_loader.spec.ordered   # the default for ids / every node without shuffle
            assert torch.allclose(layer(subgraph_loader), full, atol=1e-5)
            by_part = client.neighbor_loader(None, [-1], batch_size=256, ordered=False)   # by name: part by part
            assert not torch.allclose(layer(by_part), full, atol=1e-5)
            assert not client.neighbor_loader("train", FANOUTS, batch_size=64).spec.ordered   # a split name


TO_HETERO_SCRIPT = textwrap.dedent("""
    import sys
    import graphfeed.client as gf
    from torch_geometric.nn import SAGEConv, Sequential, to_hetero

    client = gf.connect(sys.argv[1].split(","), timeout=60)   # at module level, as the ported scripts do
    model = Sequential("x, edge_index", [(SAGEConv((-1, -1), 16), "x, edge_index -> x"),
                                         (SAGEConv((-1, -1), 4), "x, edge_index -> x")])
    metadata = (["paper", "author"], [("author", "writes", "paper"), ("paper", "written_by", "author")])
    hetero = to_hetero(model, metadata)
    print("built", type(hetero).__name__, flush=True)
    client.close()
""")


def test_to_hetero_of_a_pyg_sequential_builds_in_a_script_that_connects(addresses, tmp_path):
    """PyG's Sequential template imports the calling script again, which connects again: that must work."""
    script = tmp_path / "hetero_script.py"
    script.write_text(TO_HETERO_SCRIPT)
    res = subprocess.run([sys.executable, str(script), ",".join(addresses)], capture_output=True, text=True,
                         timeout=EXIT_BOUND, cwd=tmp_path)
    assert res.returncode == 0, f"exit code {res.returncode}:\n{res.stdout}\n{res.stderr[-3000:]}"
    # the template's `from hetero_script import *` ran the script a second time: two connect()s, two models
    assert res.stdout.count("built GraphModule") == 2, res.stdout
