"""Typed (heterogeneous) batches through 2 real ``graphfeed serve`` daemons (``mag-tiny``, METIS, 2 parts).

Remote batches equal the local loader's on every key of every store (typed hops and typed
feature reads cross the partition between the session workers); bad typed input is
INVALID_ARGUMENT naming the type (the client raises a one-line ValueError) and the servers
stay up; 2 DDP ranks get equal batch counts and the train papers exactly once between them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import grpc
import numpy as np
import pytest
import torch
from helpers.graphs import assert_same_batch, check_typed_batch

from graphfeed.bench.remote import RemoteBenchConfig, bench_remote
from graphfeed.bench.sample import SampleBenchConfig, bench_sample
from graphfeed.core.spec import LoaderSpec
from graphfeed.proto.convert import open_session_request
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.testing.cluster import SERVING, health_status

WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")


@pytest.fixture(scope="module")
def mag(shared_mag):
    return shared_mag


@pytest.fixture(scope="module")
def cluster(shared_mag_cluster):
    return shared_mag_cluster


def test_typed_remote_batches_equal_local_on_every_key(cluster, mag, connect):
    parts, graph = mag
    args = dict(batch_size=96, input_nodes=("paper", "train"), shuffle=True, seed=7)
    local = LocalNeighborLoader(parts, [4, 3], **args)
    with connect([s.address for s in cluster], timeout=60) as client:
        assert client.node_types == ["author", "field", "paper"] and client.label_type == "paper"
        remote = client.neighbor_loader(num_neighbors=[4, 3], prefetch=2, **args)
        assert len(remote) == len(local)
        for _ in range(2):   # two epochs: the second is shuffled differently, still equal
            got, want = list(remote), list(local)
            assert len(got) == len(want) == len(local)
            for a, b in zip(got, want):
                assert_same_batch(a, b)
        for batch in got:
            check_typed_batch(batch, graph, {e: [4, 3] for e in graph.edge_types})


def test_typed_remote_ids_of_another_type_out_edges_dict_fanouts(cluster, mag, connect):
    parts, graph = mag
    ids = torch.from_numpy(np.random.default_rng(4).permutation(graph.nodes["author"].num_nodes)[:250])
    fanouts = {("author", "writes", "paper"): [5, 0], ("paper", "has_topic", "field"): [0, 2]}
    args = dict(batch_size=64, input_nodes=("author", ids), direction="out", seed=1)
    local = list(LocalNeighborLoader(parts, fanouts, **args))
    with connect([s.address for s in cluster], timeout=60) as client:
        remote = list(client.neighbor_loader(num_neighbors=fanouts, **args))
        every_field = client.neighbor_loader(("field", None), [2], batch_size=200)
        fields = torch.cat([b["field"].n_id[:b["field"].batch_size] for b in every_field])
    assert len(remote) == len(local) > 1
    for a, b in zip(remote, local):
        assert_same_batch(a, b)
        assert torch.equal(ids[a["author"].input_id], a["author"].n_id[:a["author"].batch_size])
        check_typed_batch(a, graph, {e: fanouts.get(e, [0, 0]) for e in graph.edge_types}, direction="out")
    assert sorted(fields.tolist()) == list(range(graph.nodes["field"].num_nodes)), "(type, None): every node once"


def test_bad_typed_input_is_invalid_argument_and_the_servers_stay_up(cluster, connect):
    addresses = [s.address for s in cluster]
    with connect(addresses, timeout=60) as client:
        bad = LoaderSpec.of(("venue", "train"), [3], batch_size=8)
        with pytest.raises(grpc.RpcError) as info:
            client.servers[0].stub.OpenSession(open_session_request(bad, client.group.group_id), timeout=30,
                                               metadata=client.servers[0].metadata)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'venue'" in info.value.details() and "node types are" in info.value.details()
        cases = [(("venue", "train"), [3], "node type 'venue'"),
                 (("venue", None), [3], "node type 'venue'"),
                 (("author", "train"), [3], "node type 'author' has no splits"),
                 (("paper", "train"), {("paper", "likes", "paper"): [3]}, r"\('paper', 'likes', 'paper'\)"),
                 (("author", torch.tensor([0, 10 ** 6])), [3], "original 'author' node ids are")]
        for input_nodes, fanouts, match in cases:
            with pytest.raises(ValueError, match=match) as err:
                client.neighbor_loader(input_nodes, fanouts, batch_size=8)
            assert "\n" not in str(err.value)
        val = client.neighbor_loader(("paper", "val"), [2], batch_size=400)
        assert len(list(val)) == len(val) > 0   # still serving
    assert all(health_status(a, "graphfeed.control.v1.Control") == SERVING for a in addresses)


def test_bench_sample_and_remote_on_the_typed_graph_count_the_same_batches(cluster, mag):
    parts, graph = mag
    common = dict(num_neighbors=(4, 2), batch_size=128, epochs=1)
    sampled = bench_sample(SampleBenchConfig(str(parts), features=False, **common))
    produced = bench_sample(SampleBenchConfig(str(parts), features=True, **common))
    remote = bench_remote(RemoteBenchConfig(tuple(s.address for s in cluster), prefetch=2, **common))
    n_train = len(graph.splits["train"])
    assert sampled["input_type"] == produced["input_type"] == "paper"
    assert sampled["seeds_per_epoch"] == produced["seeds_per_epoch"] == remote["seeds_per_epoch"] == n_train
    assert sampled["batches_per_epoch"] == produced["batches_per_epoch"] == remote["batches_per_epoch"]
    # the same batches in-process and through the servers: the same edges over every edge type
    assert sampled["sampled_edges_per_epoch"] == produced["sampled_edges_per_epoch"] \
        == remote["sampled_edges_per_epoch"] > n_train
    assert remote["seeds_per_s"] > 0 and sampled["seeds_per_s"] > 0


DDP_RANK = textwrap.dedent("""
    import json, sys, torch.distributed as dist
    import graphfeed.client as gf
    rank, world, store, out, servers = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    with gf.connect(servers, timeout=60) as client:
        loader = client.neighbor_loader(("paper", "train"), {("author", "writes", "paper"): [3, 2]},
                                        batch_size=70, shuffle=True, seed=1)
        seeds = [b["paper"].n_id[:b["paper"].batch_size].tolist() for b in loader]
    dist.barrier()
    dist.destroy_process_group()
    json.dump({"len": len(loader), "seeds": seeds}, open(out, "w"))
""")


@pytest.mark.slow
def test_two_ddp_ranks_get_the_train_papers_exactly_once(cluster, mag, tmp_path):
    _, graph = mag
    servers = ",".join(s.address for s in cluster)
    procs = [subprocess.Popen([sys.executable, "-c", DDP_RANK, str(r), str(tmp_path / "store"),
                               str(tmp_path / f"rank{r}.json"), servers]) for r in range(2)]
    try:
        codes = [p.wait(240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["len"] == results[1]["len"] == len(results[0]["seeds"]) == len(results[1]["seeds"])
    seeds = [sum(r["seeds"], []) for r in results]
    assert not set(seeds[0]) & set(seeds[1]), "ranks must get disjoint seeds"
    assert sorted(seeds[0] + seeds[1]) == sorted(graph.splits["train"].tolist())
