"""Every caller of the workers survives a ``kill -9`` of a server through the one recovery path
(``Client.call_with_recovery`` on the data path's ``PeerLost``): the README's training loop with a server-held
table and SparseAdam (the kill lands mid-step, between the batch and the push), ``client.sample`` and the PyG
backend's feature store.  Each kills part 1's daemon (and its session workers) and restarts it on the same port
about a second later; no caller sees a transport's raw error.  Run also with GRAPHFEED_TEST_DATA_PATH=secure."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.graphs import partition_arrays

import graphfeed.client as gf
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster, start_server

FANOUTS = [4, 2]
DIM = 8
RESTART_DELAY = 1.5   # seconds between the kill and the restart on the same port


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    graph = synth.generate(1200, 8, 8, 4)
    return partition_arrays(graph, tmp_path_factory.mktemp("peer_lost") / "parts", classes=4, parts=2,
                            name="peer-lost-1200")


class Restarter:
    """Kill -9 ``servers[1]`` (its process group: the daemon and its session workers) and start part 1 again on
    its port ``RESTART_DELAY`` s later, from a thread; :meth:`done` puts the new server in ``servers``."""

    def __init__(self, parts, servers: list, log_dir: Path, env: dict | None = None):
        self.parts, self.servers, self.log_dir, self.env = parts, servers, log_dir, env or {}
        self.thread: threading.Thread | None = None
        self.killed = threading.Event()
        self.new: list = []

    def kill(self) -> None:
        victim = self.servers[1]
        victim.expect_exit = -signal.SIGKILL
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(30)
        victim.checked = True
        self.killed.set()

        def restart():
            time.sleep(RESTART_DELAY)
            self.new.append(start_server(self.parts, 1, log_dir=self.log_dir, env=self.env,
                                         args=("--port", str(victim.port))))

        self.thread = threading.Thread(target=restart, daemon=True)
        self.thread.start()

    def done(self) -> None:
        assert self.thread is not None
        self.thread.join(90)
        assert self.new, "the restarted server did not come up within 90 s"
        self.servers[1] = self.new.pop()   # the cluster's teardown stops the new one
        self.killed.clear()


def test_embedding_training_survives_a_kill_9_mid_step(parts_dir, tmp_path):
    """The README's loop: a model over the table's rows, SparseAdam stepping the table.  A thread kills the
    server while the trainer is inside a step: in epoch 0 with the batch in hand and the push to come, in epoch 1
    just after the push was sent (the owner applying it).  The loop runs on, the pushes wait for the owner and
    are delivered to the re-formed group, and both epochs deliver every batch.  A kill between steps (the pull
    sees it) is the loaders' older case."""
    env = {"GRAPHFEED_EMBEDDING_DIR": str(tmp_path / "tables")}
    with running_cluster(parts_dir, log_dir=tmp_path / "logs", env=env) as servers:
        restarter = Restarter(parts_dir, servers, tmp_path / "restart", env)
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            table = client.embedding(dim=DIM, seed=1, field="emb")
            loader = client.neighbor_loader("test", FANOUTS, batch_size=64, shuffle=True, seed=3, prefetch=2,
                                            embeddings=[table])
            model = torch.nn.Linear(DIM, 4)
            dense = torch.optim.Adam(model.parameters(), lr=0.01)
            sparse = gf.SparseAdam([table], lr=0.05)
            every = torch.arange(table.num_rows)
            start = table.rows(every)
            for epoch in range(2):
                steps = 0
                for i, batch in enumerate(loader):
                    loss = torch.nn.functional.cross_entropy(model(batch.emb)[:batch.batch_size],
                                                             batch.y[:batch.batch_size])
                    loss.backward()
                    if epoch == 0 and i == 3:   # mid-step: the batch is in hand, the push not yet sent
                        _kill_from_a_thread(restarter)
                    dense.step()
                    sparse.step()
                    if epoch == 1 and i == 2:   # mid-step: the push is in flight
                        _kill_from_a_thread(restarter)
                    dense.zero_grad()
                    steps += 1
                assert steps == len(loader), f"epoch {epoch}: {steps} of {len(loader)} batches"
                restarter.done()
            assert client.reconnects >= 2
            after = table.rows(every)
            assert torch.isfinite(after).all() and not torch.equal(after, start)   # the steps reached the owners
            table.save("end")   # every owner answers on the new group
            saved = tmp_path / "tables" / "default" / table.spec.name / "end"   # the job's namespace
            assert sorted(p.name for p in saved.glob("*.pt")) == ["part_0.pt", "part_1.pt"]
            # each owner starts its update log next to the checkpoint it saved
            assert sorted(p.name for p in saved.glob("*.log")) == [f"part_{k}.{table.replica}.log" for k in (0, 1)]


def _kill_from_a_thread(restarter: Restarter) -> None:
    killer = threading.Thread(target=restarter.kill, daemon=True)
    killer.start()
    assert restarter.killed.wait(60), "the kill did not land"


def test_sample_across_a_kill_returns_the_batch_of_an_uninterrupted_call(parts_dir, tmp_path):
    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers:
        restarter = Restarter(parts_dir, servers, tmp_path / "restart")
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            ids = torch.tensor([5, 700, 11, 1100, 640])   # seeds on both parts
            before = [client.sample(ids, FANOUTS, seed=9) for _ in range(2)]   # one call per server (round robin)
            restarter.kill()
            after = [client.sample(ids, FANOUTS, seed=9) for _ in range(2)]
            restarter.done()
            assert client.reconnects == 1
            for a, b in zip(before, after):
                for key in ("n_id", "x", "edge_index"):
                    assert torch.equal(a[key], b[key]), key


def test_pyg_feature_and_graph_store_calls_across_a_kill(parts_dir, tmp_path):
    from graphfeed.pyg import GraphfeedFeatureStore, GraphfeedGraphStore

    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers:
        restarter = Restarter(parts_dir, servers, tmp_path / "restart")
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            features, graph = GraphfeedFeatureStore(client), GraphfeedGraphStore(client)
            ids = torch.tensor([1, 600, 1199, 3])
            rows = features.get_tensor(group_name=None, attr_name="x", index=ids)
            (attr,) = graph.get_all_edge_attrs()
            edges = graph.get_edge_index(attr)
            restarter.kill()
            assert torch.equal(features.get_tensor(group_name=None, attr_name="x", index=ids), rows)
            assert all(torch.equal(a, b) for a, b in zip(graph.get_edge_index(attr), edges))
            restarter.done()
            assert client.reconnects == 1
