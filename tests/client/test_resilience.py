"""Usage errors that leave the client usable, DDP agreement, checkpoints (issue 12).

Remote cases run real ``graphfeed serve`` daemons on loopback (2 parts, 1200 nodes); the
DDP cases run two gloo ranks in subprocesses.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.cluster import kill_server
from helpers.graphs import assert_same_batch, partition_arrays

import graphfeed.client as gf
from graphfeed.core.agreement import inputs_fingerprint, settings_fingerprint
from graphfeed.core.spec import LoaderSpec
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.chaos import run_chaos
from graphfeed.testing.cluster import SERVING, health_status, running_cluster, start_server

FANOUTS = [4, 2]
CHAOS_KILLS = 2        # kill -9s per chaos epoch in CI (python -m graphfeed.testing.chaos for more)
REFUSED_BOUND = 3.0    # seconds: "connection refused" must come about this fast (1 s probe + slack)


@pytest.fixture(scope="module")
def graph():
    return synth.generate(1200, 8, 8, 4)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    return partition_arrays(graph, tmp_path_factory.mktemp("resilience") / "parts", classes=4, parts=2,
                            name="resilience-1200")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


@pytest.fixture(scope="module")
def edge_set(graph):
    ei, x, *_ = graph
    return set((ei[0] * x.shape[0] + ei[1]).tolist())


def _seeds(batch) -> list[int]:
    return batch.n_id[:batch.batch_size].tolist()


def _check_edges(batch, edge_set, num_nodes: int) -> None:
    """Every sampled edge exists in the graph; fanouts bound the edges per hop."""
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    assert set((src * num_nodes + dst).tolist()) <= edge_set
    assert batch.num_sampled_edges[0] <= batch.batch_size * FANOUTS[0]


# ---- addresses ------------------------------------------------------------------------------------

@pytest.mark.parametrize("address", ["grpc://127.0.0.1:50051", "http://localhost:1234/"])
def test_address_with_scheme_is_refused_up_front(address):
    with pytest.raises(gf.ClusterError, match="has a scheme: pass host:port"):
        gf.connect([address], timeout=30)
    with pytest.raises(gf.ClusterError, match="has a scheme"):
        gf.connect(address, timeout=30)


def test_unreachable_port_says_connection_refused_quickly():
    with socket.socket() as s:   # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(gf.ClusterError, match="connection refused") as err:
            gf.connect([f"127.0.0.1:{port}"], timeout=30)
        elapsed = time.monotonic() - t0
    assert elapsed < REFUSED_BOUND, f"took {elapsed:.1f} s"
    assert f"127.0.0.1:{port}" in str(err.value)


# ---- one live iterator ----------------------------------------------------------------------------

def test_second_live_iterator_is_a_clear_error_and_client_stays_usable(cluster, graph, edge_set):
    _, x, _, splits = graph
    with gf.connect([s.address for s in cluster], timeout=60) as client:
        loader = client.neighbor_loader("train", FANOUTS, batch_size=32, shuffle=True)
        other = client.neighbor_loader("val", FANOUTS, batch_size=64)
        it = iter(loader)
        first = next(it)
        with pytest.raises(RuntimeError, match="already has a live iterator") as err:
            next(iter(loader))    # a peek inside the epoch
        assert "epoch 0" in str(err.value) and "1 of" in str(err.value)
        rest = list(it)           # the running epoch is unaffected
        seeds = sum((_seeds(b) for b in [first, *rest]), [])
        assert sorted(seeds) == sorted(splits["train"].tolist())
        for b in rest[:3]:
            _check_edges(b, edge_set, x.shape[0])
        assert [b.epoch for b in rest] == [0] * len(rest)
        val = list(other)         # other loaders of the client work
        assert sorted(sum((_seeds(b) for b in val), [])) == sorted(splits["val"].tolist())
        for _ in iter(loader):    # break out: the dropped iterator is no longer live
            break
        assert len(list(loader)) == len(loader)   # epoch 2 runs whole
    assert all(health_status(s.address, "graphfeed.control.v1.Control") == SERVING for s in cluster)


# ---- checkpoints ----------------------------------------------------------------------------------

def test_local_state_dict_round_trip_mid_epoch(parts_dir, graph):
    _, _, _, splits = graph
    kwargs = dict(batch_size=24, input_nodes="train", shuffle=True, seed=7)
    ref = list(LocalNeighborLoader(parts_dir, FANOUTS, **kwargs))
    loader = LocalNeighborLoader(parts_dir, FANOUTS, **kwargs)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert (state["epoch"], state["cursor"]) == (0, 3)
    fresh = LocalNeighborLoader(parts_dir, FANOUTS, **kwargs)
    fresh.load_state_dict(state)
    tail = list(fresh)
    assert len(head) + len(tail) == len(ref)
    for a, b in zip(head + tail, ref):
        assert_same_batch(a, b)
    assert sorted(sum((_seeds(b) for b in head + tail), [])) == sorted(splits["train"].tolist())
    assert fresh.state_dict()["epoch"] == 1 and fresh.state_dict()["cursor"] == 0
    with pytest.raises(ValueError, match="different loader .*seed"):
        LocalNeighborLoader(parts_dir, FANOUTS, **{**kwargs, "seed": 8}).load_state_dict(state)
    with pytest.raises(ValueError, match="inputs_fingerprint"):
        LocalNeighborLoader(parts_dir, FANOUTS, **{**kwargs, "input_nodes": "val"}).load_state_dict(state)
    with pytest.raises(ValueError, match="not a graphfeed loader state"):
        fresh.load_state_dict({"epoch": 0})


SAVE_THEN_RESUME = textwrap.dedent("""
    import json, sys, torch, graphfeed.client as gf
    mode, servers, state_path, out_path = sys.argv[1:5]
    with gf.connect(servers.split(","), timeout=60) as client:
        loader = client.neighbor_loader("train", [4, 2], batch_size=16, shuffle=True, seed=5)
        got = []
        if mode == "save":
            it = iter(loader)
            for _ in range(4):
                got.append(next(it))
            torch.save(loader.state_dict(), state_path)
        else:
            loader.load_state_dict(torch.load(state_path))
            got = list(loader)
    json.dump([{"n_id": b.n_id.tolist(), "edge_index": b.edge_index.tolist(), "batch_size": b.batch_size,
                "seq": int(b.seq)} for b in got], open(out_path, "w"))
""")


@pytest.mark.slow
def test_remote_state_dict_round_trip_in_a_fresh_trainer_process(cluster, parts_dir, graph, tmp_path):
    _, _, _, splits = graph
    servers = ",".join(s.address for s in cluster)
    state = tmp_path / "state.pt"
    runs = []
    for mode in ("save", "resume"):   # two trainer processes, one after the other
        out = tmp_path / f"{mode}.json"
        proc = subprocess.run([sys.executable, "-c", SAVE_THEN_RESUME, mode, servers, str(state), str(out)],
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(out.read_text()))
    saved, resumed = runs
    assert torch.load(state)["cursor"] == 4
    ref = list(LocalNeighborLoader(parts_dir, FANOUTS, batch_size=16, input_nodes="train", shuffle=True, seed=5))
    got = saved + resumed
    assert [b["seq"] for b in got] == list(range(len(ref)))
    for g, r in zip(got, ref):
        assert g["n_id"] == r.n_id.tolist() and g["edge_index"] == r.edge_index.tolist()
    seeds = sum((g["n_id"][:g["batch_size"]] for g in got), [])
    assert sorted(seeds) == sorted(splits["train"].tolist())


def test_remote_refuses_a_state_of_another_loader(cluster):
    with gf.connect([s.address for s in cluster], timeout=60) as client:
        a = client.neighbor_loader("train", FANOUTS, batch_size=32, seed=1)
        b = client.neighbor_loader("train", FANOUTS, batch_size=16, seed=1)
        with pytest.raises(ValueError, match="settings_fingerprint"):
            b.load_state_dict(a.state_dict())
        state = dict(a.state_dict(), cursor=10_000)
        a.load_state_dict(state)
        with pytest.raises(ValueError, match="resumes epoch 0 at batch 10000"):
            iter(a)


# ---- DDP agreement --------------------------------------------------------------------------------

def test_fingerprints_ignore_rank_and_see_inputs_and_settings():
    def spec(inputs="train", rank=0, **kw):
        return LoaderSpec.of(inputs, [4, 2], batch_size=kw.pop("batch_size", 8), rank=rank, world_size=2, **kw)

    a, b = spec(rank=0), spec(rank=1, kind="other label")
    assert settings_fingerprint(a) == settings_fingerprint(b)
    assert inputs_fingerprint(a, [5, 6]) == inputs_fingerprint(b, [5, 6])
    assert inputs_fingerprint(a, [5, 6]) != inputs_fingerprint(a, [6, 5])
    ids = torch.arange(10)
    assert inputs_fingerprint(spec(ids), [10]) != inputs_fingerprint(spec(ids[:5]), [5, 5])
    assert inputs_fingerprint(spec(ids), [10]) != inputs_fingerprint(spec(ids.flip(0)), [10])
    assert inputs_fingerprint(spec(ids), [10]) == inputs_fingerprint(spec(ids.clone()), [10])
    assert settings_fingerprint(a) != settings_fingerprint(spec(batch_size=9))
    assert settings_fingerprint(a) != settings_fingerprint(spec(seed=1))
    assert settings_fingerprint(a) != settings_fingerprint(spec(shuffle=True))


DDP_RANK = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from graphfeed.server.loader.local import LocalNeighborLoader
    rank, store, parts, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    train = torch.load(parts + "/../train.pt")
    inputs = train.chunk(2)[rank] if mode == "hand-split" else train
    try:
        loader = LocalNeighborLoader(parts, [4, 2], batch_size=16, input_nodes=inputs)
        n = sum(1 for _ in loader)
        print(f"OK {n}")
    except ValueError as exc:
        print(f"ValueError {exc}")
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["same", "hand-split"])
def test_ddp_ranks_compare_loader_fingerprints(parts_dir, graph, tmp_path, mode):
    _, _, _, splits = graph
    torch.save(torch.as_tensor(splits["train"]), parts_dir.parent / "train.pt")
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", DDP_RANK, str(r), str(store), str(parts_dir), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    lines = [o[0].strip().splitlines()[-1] for o in outs]
    if mode == "same":
        assert lines[0] == lines[1] and lines[0].startswith("OK "), lines
    else:
        for line in lines:   # every rank raises, with the fix in the message
            assert line.startswith("ValueError") and "same input_nodes on every rank" in line, lines


# ---- transparent resume after a server restart ------------------------------------------------------

def _restart_later(parts, part: int, port: int, log_dir, delay: float, out: list) -> threading.Thread:
    """Start part ``part`` of ``parts`` on ``port`` after ``delay`` s, from a thread (the trainer keeps waiting)."""
    def run():
        time.sleep(delay)
        out.append(start_server(parts, part, log_dir=log_dir, args=("--port", str(port))))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_server_killed_mid_epoch_resumes_after_restart_on_the_same_port(parts_dir, graph, edge_set, tmp_path):
    """The epoch (the 1,080 "test" nodes, 23 batches) is far longer than the prefetch window, so the
    kill after 3 batches always lands mid-epoch (with the 96 "train" nodes, 4 batches, the last
    ones could already be in flight and the epoch ended without a reconnect)."""
    _, x, _, splits = graph
    kwargs = dict(batch_size=48, shuffle=True, seed=3)
    ref = list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes="test", **kwargs))
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            loader = client.neighbor_loader("test", FANOUTS, prefetch=2, **kwargs)
            val = client.neighbor_loader("val", FANOUTS, batch_size=64)
            it = iter(loader)
            got = [next(it) for _ in range(3)]
            kill_server(victim)
            restarted: list = []
            thread = _restart_later(parts_dir, 1, victim.port, tmp_path / "restart", 1.0, restarted)
            got += list(it)             # the same trainer process finishes the epoch
            thread.join(60)
            servers[1] = restarted[0]   # the cluster's teardown stops the new one
            assert client.reconnects == 1 and loader.stats()["resumes"] == 1
            assert len(got) == len(ref)
            for a, b in zip(got, ref):  # equal to an uninterrupted run, batch for batch
                assert_same_batch(a, b)
            seeds = sum((_seeds(b) for b in got), [])
            assert sorted(seeds) == sorted(splits["test"].tolist())    # every seed exactly once
            for b in got[::5]:
                _check_edges(b, edge_set, x.shape[0])
            assert len(list(loader)) == len(ref)   # the next epoch runs on the new group
            assert sorted(sum((_seeds(b) for b in val), [])) == sorted(splits["val"].tolist())


@pytest.mark.slow
def test_a_draining_server_ends_the_trainer_at_once_instead_of_waiting_to_reconnect(parts_dir, tmp_path):
    """SIGTERM = a drain: health NOT_SERVING, the trainer keeps pulling for the grace (2 s), then its
    workers stop; a client that would wait 120 s for a crashed server ends at once, saying why."""
    drain = ("--drain-grace-seconds", "2", "--lease-seconds", "4")   # heartbeats (and health checks) every 1 s
    with running_cluster(parts_dir, log_dir=tmp_path, args=drain) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            loader = client.neighbor_loader("test", FANOUTS, batch_size=48, prefetch=1)
            it = iter(loader)
            next(it)
            victim.signal(signal.SIGTERM)
            t0 = time.monotonic()
            with pytest.raises(gf.ServerError, match="is shutting down .*announced a drain") as err:
                for _ in range(1000):   # epochs of 23 batches, read slowly: the drain's grace ends meanwhile
                    for _ in it:
                        time.sleep(0.2)
                    it = iter(loader)
            assert time.monotonic() - t0 < 2 + 20, "ended after the grace, not after reconnect_timeout"
            assert f"{victim.address} part 1" in str(err.value) and client.reconnects == 0
        assert victim.wait(30) == 0    # the drained server exits cleanly
        victim.checked = True


@pytest.mark.slow
def test_resume_refuses_another_partition_and_bounds_the_wait(parts_dir, graph, tmp_path):
    other = partition_arrays(graph, tmp_path / "other", classes=4, parts=2, name="another-graph")
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=60) as client:
            it = iter(client.neighbor_loader("train", FANOUTS, batch_size=24, prefetch=1))
            next(it)
            kill_server(victim)
            impostor = start_server(other, 1, log_dir=tmp_path / "impostor", args=("--port", str(victim.port)))
            try:
                with pytest.raises(gf.ServerError, match="came back with a different partition") as err:
                    list(it)
                assert f"{victim.address} part 1" in str(err.value)
            finally:
                impostor.stop()
        servers[1] = start_server(parts_dir, 1, log_dir=tmp_path / "again", args=("--port", str(victim.port)))
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=2) as client:
            it = iter(client.neighbor_loader("train", FANOUTS, batch_size=24, prefetch=1))
            next(it)
            kill_server(servers[1])
            t0 = time.monotonic()
            with pytest.raises(gf.ServerError, match=r"did not come back within reconnect_timeout=2 s") as err:
                list(it)
            assert time.monotonic() - t0 < 2 + 20, "the wait must end near reconnect_timeout"
            assert f"{victim.address} part 1" in str(err.value)
        assert health_status(servers[0].address, "graphfeed.control.v1.Control") == SERVING


@pytest.mark.slow
def test_chaos_kills_at_random_points_the_epoch_completes_exactly_once(parts_dir, tmp_path):
    """12 batches (96 seeds of 8), kills before the last five: each lands with batches still to ask for."""
    report = run_chaos(parts_dir, kills=CHAOS_KILLS, seed=11, batch_size=8, log_dir=tmp_path)
    assert len(report.kills) == CHAOS_KILLS
    assert 1 <= report.reconnects <= CHAOS_KILLS and 1 <= report.resumes <= report.reconnects, str(report)


def test_pygs_loader_over_graphfeeds_stores_resumes_after_a_server_kill(parts_dir, graph, tmp_path):
    """PyG's own NeighborLoader over graphfeed's stores (its batches started ahead on the servers): a server
    killed mid-epoch and restarted on its port, the same epoch finishes equal to graphfeed's own loader."""
    from torch_geometric.loader import NeighborLoader

    from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore

    ids = torch.as_tensor(graph[3]["test"])
    with running_cluster(parts_dir, log_dir=tmp_path) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            want = list(client.neighbor_loader(input_nodes=ids, num_neighbors=FANOUTS, batch_size=48, shuffle=False))
            loader = NeighborLoader((GraphfeedFeatureStore(client), GraphfeedGraphStore(client)),
                                    num_neighbors=FANOUTS, input_nodes=ids, batch_size=48, shuffle=False)
            it = iter(loader)
            got = [next(it) for _ in range(3)]
            kill_server(victim)
            restarted: list = []
            thread = _restart_later(parts_dir, 1, victim.port, tmp_path / "restart", 1.0, restarted)
            got += list(it)
            thread.join(60)
            servers[1] = restarted[0]
            assert client.reconnects == 1
            assert len(got) == len(want)
            for a, b in zip(got, want):   # the batches of an uninterrupted run, seeds first
                for key in ("x", "y", "edge_index"):
                    assert torch.equal(a[key], b[key]), key
            loader.node_sampler.close()
