"""The remote loader through real ``graphfeed serve`` daemons on loopback (2 parts, 3000 nodes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest
import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.testing.cluster import SERVING, health_status, running_cluster, start_server

FANOUTS = [5, 3]
KILL_BOUND = 30.0    # seconds: a dead server must surface in the trainer within this


@pytest.fixture(scope="module")
def graph(shared_graph):
    return shared_graph


@pytest.fixture(scope="module")
def parts_dir(shared_parts):
    return shared_parts


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    return shared_cluster


@pytest.fixture(scope="module")
def edge_set(graph):
    ei, x, *_ = graph
    return set((ei[0] * x.shape[0] + ei[1]).tolist())


def _stats(address: str) -> pb.ServerStats:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.ControlStub(ch).GetStats(pb.StatsRequest(), timeout=10)


# ---- batches ----------------------------------------------------------------------------------------

def test_epochs_equal_local_loader_cover_train_once_and_edges_exist(cluster, parts_dir, graph, edge_set, connect):
    _, x, _, splits = graph
    local = LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True, seed=7)
    with connect([s.address for s in cluster], timeout=60) as client:
        assert (client.num_parts, client.num_nodes) == (2, 3000)
        loader = client.neighbor_loader("train", FANOUTS, batch_size=32, shuffle=True, seed=7, prefetch=2)
        assert len(loader) == len(local) == 8
        for epoch in range(2):
            got, want = list(loader), list(local)
            assert len(got) == len(want) == 8
            for a, b in zip(got, want):
                assert_same_batch(a, b)
                assert a.epoch == epoch
            seeds = torch.cat([b.n_id[:b.batch_size] for b in got])
            assert sorted(seeds.tolist()) == sorted(splits["train"].tolist()), "every training node once"
            for b in got:
                src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
                assert set((src * x.shape[0] + dst).tolist()) <= edge_set
        loader.set_epoch(0)
        assert_same_batch(next(iter(loader)), want_first := next(iter(
            LocalNeighborLoader(parts_dir, FANOUTS, batch_size=32, shuffle=True, seed=7))))
        assert want_first.epoch == 0


def test_node_id_input_out_direction_and_two_loaders(cluster, parts_dir, connect):
    ids = torch.tensor([5, 2999, 17, 1200, 64, 3, 1500, 42, 8, 1000])
    kw = dict(batch_size=4, direction="out", replace=True)
    with connect([s.address for s in cluster], timeout=60) as client:
        out = client.neighbor_loader(ids, [4, 4], **kw)
        val = client.neighbor_loader("val", [-1], batch_size=16)
        rows = {r.kind: r for r in _stats(cluster[0].address).sessions}
        assert {"nodes", "val"} <= set(rows), "both loaders are sessions of the one group"
        for a, b in zip(list(out), list(LocalNeighborLoader(parts_dir, [4, 4], input_nodes=ids, **kw)), strict=True):
            assert_same_batch(a, b)
        for a, b in zip(list(val), list(LocalNeighborLoader(parts_dir, [-1], input_nodes="val", batch_size=16)),
                        strict=True):
            assert_same_batch(a, b)


DDP_RANK = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    import graphfeed.client as gf
    rank, world, store, out, servers = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    with gf.connect(servers, timeout=60) as client:
        loader = client.neighbor_loader("train", [5, 3], batch_size=50, shuffle=True, seed=1)
        seeds = [b.n_id[:b.batch_size].tolist() for b in loader]
    dist.barrier()
    dist.destroy_process_group()
    json.dump({"len": len(loader), "seeds": seeds}, open(out, "w"))
""")


@pytest.mark.slow
def test_two_ddp_ranks_get_equal_counts_disjoint_seeds_covering_train(cluster, graph, tmp_path):
    _, _, _, splits = graph
    servers = ",".join(s.address for s in cluster)
    procs = [subprocess.Popen([sys.executable, "-c", DDP_RANK, str(r), str(tmp_path / "store"),
                               str(tmp_path / f"rank{r}.json"), servers]) for r in range(2)]
    codes = [p.wait(240) for p in procs]
    assert codes == [0, 0]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["len"] == results[1]["len"] == len(results[0]["seeds"]) == len(results[1]["seeds"])
    seeds = [sum(r["seeds"], []) for r in results]
    assert not set(seeds[0]) & set(seeds[1]), "ranks must get disjoint seeds"
    assert sorted(seeds[0] + seeds[1]) == sorted(splits["train"].tolist())


# ---- errors -----------------------------------------------------------------------------------------

def test_bad_requests_raise_clear_errors_and_server_stays_up(cluster):
    addresses = [s.address for s in cluster]
    with pytest.raises(gf.ClusterError, match="no server for part"):
        gf.connect(addresses[:1], timeout=30)
    with pytest.raises(gf.ClusterError, match="twice"):
        gf.connect([addresses[0], addresses[0]], timeout=30)
    with gf.connect(addresses, timeout=60) as client:
        again = gf.connect(addresses, timeout=30)   # the same servers: the open client (see test_dropin.py)
        assert again is client
        again.close()
        with pytest.raises(ValueError, match="unknown split"):
            client.neighbor_loader("bogus", FANOUTS)
        with pytest.raises(ValueError, match="fanout"):
            client.neighbor_loader("train", [5, -2])
        with pytest.raises(ValueError, match="outside the graph"):
            client.neighbor_loader(torch.tensor([1, 3000]), FANOUTS)
        with pytest.raises(ValueError, match="repeated id"):
            client.neighbor_loader(torch.tensor([1, 2, 2]), FANOUTS)
        with pytest.raises(ValueError, match="batch_size"):
            client.neighbor_loader("train", FANOUTS, batch_size=0)
        assert len(list(client.neighbor_loader("val", FANOUTS, batch_size=64))) == 1  # 60 seeds, as PyG: still serving
    assert all(health_status(a, "graphfeed.control.v1.Control") == SERVING for a in addresses)


def test_server_killed_mid_epoch_names_it_within_bound(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=0) as client:
            loader = client.neighbor_loader("train", FANOUTS, batch_size=8, prefetch=1)
            it = iter(loader)
            next(it)
            victim.expect_exit = -signal.SIGKILL
            os.killpg(victim.pid, signal.SIGKILL)  # the daemon and its session worker
            t0 = time.monotonic()
            with pytest.raises(gf.ServerError) as err:
                for _ in it:
                    pass
            assert time.monotonic() - t0 < KILL_BOUND
            assert f"{victim.address} part 1" in str(err.value), str(err.value)
            with pytest.raises(gf.ServerError, match="unusable"):
                iter(loader)
        assert health_status(servers[0].address, "graphfeed.control.v1.Control") == SERVING
        _wait(lambda: _stats(servers[0].address).groups_open == 0, 30, "server 0 to close the broken group")
        victim.wait(10)
        victim.checked = True
        servers[1] = start_server(parts_dir, 1, log_dir=tmp_path)  # restarted: a new client works again
        with gf.connect([s.address for s in servers], timeout=60) as client:
            assert len(list(client.neighbor_loader("val", FANOUTS, batch_size=64))) == 1   # 60 seeds, as PyG


TRAINER = textwrap.dedent("""
    import sys, time, graphfeed.client as gf
    client = gf.connect(sys.argv[1].split(","), timeout=60, lease_seconds=2)
    print(",".join(str(s.extra["worker_pid"]) for s in client.servers), flush=True)
    time.sleep(600)
""")


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a daemon and every process below it."""
    import psutil

    root = psutil.Process(pid)
    procs = [root] + root.children(recursive=True)
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def test_trainer_killed_its_workers_are_reaped(cluster):
    servers = ",".join(s.address for s in cluster)
    before = [_tree_rss_mb(s.pid) for s in cluster]
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, servers], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in trainer.stdout.readline().split(",")]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        assert all(_stats(s.address).groups_open == 1 for s in cluster)
    finally:
        trainer.kill()
        assert trainer.wait(30) == -signal.SIGKILL
        trainer.stdout.close()
    _wait(lambda: not any(_alive(p) for p in pids), 30, "the dead trainer's workers to exit")
    assert all(_stats(s.address).groups_open == 0 for s in cluster)
    # The session's memory lived in its worker processes: with them gone, each server's
    # process tree is back near its level before the session (allowing allocator noise).
    after = [_tree_rss_mb(s.pid) for s in cluster]
    assert all(a <= b + 64 for a, b in zip(after, before)), f"server RSS before {before} MB, after {after} MB"
    assert all(health_status(s.address, "graphfeed.control.v1.Control") == SERVING for s in cluster)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def test_cluster_yaml_file(cluster, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("servers:\n" + "".join(f"  - {s.address}\n" for s in cluster))
    with gf.connect(str(path), timeout=60) as client:
        assert [s.part for s in client.servers] == [0, 1]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\n")
    with pytest.raises(gf.ClusterError, match="servers:"):
        gf.connect(str(bad))


def test_client_never_imports_the_server():
    code = ("import sys, graphfeed.client; "
            "bad = sorted(m for m in sys.modules if m.startswith('graphfeed.server')); "
            "assert not bad, bad")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
