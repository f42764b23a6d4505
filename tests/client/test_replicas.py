"""Replicated parts (issue 37): several daemons serve one part; a trainer uses one of them and, when it is
lost -- killed, draining for an upgrade -- moves the part to another replica at once instead of waiting for
the lost one, and the running epoch continues: batches equal to an uninterrupted run, every seed once.

Real ``graphfeed serve`` daemons on loopback: part 0 once, part 1 twice (same partition files)."""
from __future__ import annotations

import logging
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.cluster import kill_server
from helpers.graphs import assert_same_batch, partition_arrays
from prometheus_client.parser import text_string_to_metric_families

import graphfeed.client as gf
from graphfeed.client import replicas
from graphfeed.client.metrics import start_metrics_server
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster, start_server

FANOUTS = [4, 2]
KWARGS = dict(batch_size=48, shuffle=True, seed=3)   # the 1,080 "test" nodes: 23 batches, far past the prefetch
PULLS_TO_MOVE = 4   # batches pulled after a drained replica exited, at most, until its part moved (prefetched ones)
NEVER_BACK = 60.0   # reconnect_timeout: a killed replica never comes back, so waiting for it would fail the epoch


@pytest.fixture(scope="module")
def graph():
    return synth.generate(1200, 8, 8, 4)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    return partition_arrays(graph, tmp_path_factory.mktemp("replicas") / "parts", classes=4, parts=2,
                            name="replicas-1200")


@pytest.fixture(scope="module")
def reference(parts_dir):
    return list(LocalNeighborLoader(parts_dir, FANOUTS, input_nodes="test", **KWARGS))


@pytest.fixture(scope="module")
def edge_set(graph):
    ei, x, *_ = graph
    return set((ei[0] * x.shape[0] + ei[1]).tolist())


def _seeds(batches) -> list[int]:
    return sum((b.n_id[:b.batch_size].tolist() for b in batches), [])


def _check(batch, edge_set, num_nodes: int) -> None:
    """Every sampled edge of ``batch`` exists in the graph; the fanout bounds its first hop."""
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    assert set((src * num_nodes + dst).tolist()) <= edge_set
    assert batch.num_sampled_edges[0] <= batch.batch_size * FANOUTS[0]


def _check_epoch(got, reference, graph, edge_set) -> None:
    """Batch for batch equal to the uninterrupted in-process run, every test seed once, edges of the graph."""
    _, x, _, splits = graph
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        assert_same_batch(a, b)
    assert sorted(_seeds(got)) == sorted(splits["test"].tolist())
    for b in got[::4]:
        _check(b, edge_set, x.shape[0])


def _scraped_failovers(part: int) -> float:
    """graphfeed_client_failovers_total of ``part`` on this process's trainer metrics endpoint."""
    server = start_metrics_server(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        server.close()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "graphfeed_client_failovers_total" and s.labels == {"part": str(part)})


def _in_use(servers, client, part: int):
    """The server process of ``part`` the client uses now."""
    return next(s for s in servers if s.address == client.servers[part].address)


@pytest.mark.slow
def test_a_killed_replica_hands_its_part_to_the_other(parts_dir, graph, edge_set, reference, tmp_path):
    """With a warm worker on every daemon (replicas' set-up: the group re-formed on the surviving servers takes
    them instead of starting processes).  Each batch is checked as it comes and dropped, as a training loop does
    (a kept batch holds its shared-memory slot), so the longest wait printed is the failover's."""
    _, x, _, splits = graph
    with running_cluster(parts_dir, [0, 1, 1], log_dir=tmp_path, env={"GRAPHFEED_WARM_WORKERS": "1"}) as servers:
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=NEVER_BACK) as client:
            assert client.replicas.counts() == {0: 1, 1: 2}
            moved_before = replicas.FAILOVERS[1]   # this process's, for the trainer's metrics
            loader = client.neighbor_loader("test", FANOUTS, prefetch=2, **KWARGS)
            seeds, waits, last = [], [], time.monotonic()
            for i, batch in enumerate(loader):
                waits.append(time.monotonic() - last)
                assert_same_batch(batch, reference[i])   # equal to the uninterrupted in-process run
                seeds += batch.n_id[:batch.batch_size].tolist()
                if i % 4 == 0:
                    _check(batch, edge_set, x.shape[0])
                if i == 2:
                    victim = _in_use(servers, client, 1)
                    kill_server(victim)   # never comes back: the epoch continues on the other replica
                del batch
                last = time.monotonic()
            assert i + 1 == len(reference) and sorted(seeds) == sorted(splits["test"].tolist())   # every seed once
            assert client.servers[1].address != victim.address
            assert client.replicas.failovers == 1 and client.reconnects == 1 and loader.stats()["resumes"] == 1
            again = list(loader)   # the next epoch runs on the new group, from the surviving replica
            assert sorted(_seeds(again)) == sorted(splits["test"].tolist())
            assert _scraped_failovers(part=1) == moved_before + 1
            print(f"failover: the longest batch wait {max(waits[3:]):.2f} s (before the kill {max(waits[1:3]):.2f} s)")


@pytest.mark.slow
def test_a_rolling_restart_of_a_parts_replicas_under_a_running_epoch(parts_dir, graph, edge_set, reference,
                                                                      tmp_path):
    """SIGTERM (a drain) of the replica in use, its restart on the same port, then SIGTERM of the other: the
    epoch runs through both upgrades (a drain without a replica ends the trainer: test_resilience.py)."""
    with running_cluster(parts_dir, [0, 1, 1], log_dir=tmp_path, args=("--drain-grace-seconds", "1")) as servers:
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=NEVER_BACK) as client:
            it = iter(client.neighbor_loader("test", FANOUTS, prefetch=1, **KWARGS))
            got = [next(it)]
            for round_ in range(2):
                victim = _in_use(servers, client, 1)
                victim.signal(signal.SIGTERM)
                got.append(next(it))   # a draining replica still answers pulls (within its grace)
                assert victim.wait(30) == 0
                victim.checked = True
                for _ in range(PULLS_TO_MOVE):   # a pull reaches the exited replica: the part moves
                    got.append(next(it))
                    if client.replicas.failovers == round_ + 1:
                        break
                assert client.replicas.failovers == round_ + 1, f"no failover within {PULLS_TO_MOVE} pulls"
                assert client.servers[1].address != victim.address
                back = start_server(parts_dir, 1, log_dir=tmp_path / f"back{round_}",
                                    args=("--port", str(victim.port), "--drain-grace-seconds", "1"))
                servers[servers.index(victim)] = back   # the cluster's teardown stops it
            got += list(it)
            assert client.replicas.failovers == 2
            _check_epoch(got, reference, graph, edge_set)


@pytest.mark.slow
def test_a_replica_down_at_connect_is_taken_once_it_answers(parts_dir, graph, edge_set, reference, tmp_path, caplog):
    with running_cluster(parts_dir, [0, 1, 1], log_dir=tmp_path) as servers:
        down = servers[2]
        kill_server(down)
        addresses = [s.address for s in servers]
        with caplog.at_level(logging.WARNING, logger="graphfeed.client"):
            client = gf.connect(addresses, timeout=60, reconnect_timeout=NEVER_BACK)
        with client:
            assert any(down.address in r.getMessage() and "kept as a replica" in r.getMessage()
                       for r in caplog.records)
            assert client.servers[1].address == servers[1].address
            it = iter(client.neighbor_loader("test", FANOUTS, prefetch=2, **KWARGS))
            got = [next(it) for _ in range(3)]
            servers[2] = start_server(parts_dir, 1, log_dir=tmp_path / "back", args=("--port", str(down.port)))
            kill_server(servers[1])
            got += list(it)
            assert client.servers[1].address == down.address and client.replicas.counts() == {0: 1, 1: 2}
            _check_epoch(got, reference, graph, edge_set)


def test_a_cluster_of_replicas_is_still_checked_at_connect(parts_dir, graph, tmp_path):
    """A replica holding other partition files is refused in one line naming it; a part with no reachable
    server is refused with the unreachable server's error; a cluster missing a part names it."""
    other = partition_arrays(graph, tmp_path / "other", classes=4, parts=2, name="another-graph")
    with running_cluster(parts_dir, [0, 1], log_dir=tmp_path) as servers:
        impostor = start_server(other, 1, log_dir=tmp_path / "impostor")
        try:
            with pytest.raises(gf.ClusterError, match="serves a different graph") as err:
                gf.connect([s.address for s in servers] + [impostor.address], timeout=30)
            assert impostor.address in str(err.value) and "\n" not in str(err.value)
        finally:
            impostor.stop()
        refused = impostor.address   # stopped: nothing listens there now
        with pytest.raises(gf.ClusterError, match="connection refused") as err:
            gf.connect([servers[0].address, refused], timeout=30)
        assert refused in str(err.value)
        with pytest.raises(gf.ClusterError, match=r"no server for part\(s\) \[1\]"):
            gf.connect([servers[0].address], timeout=30)


@pytest.mark.slow
def test_a_frozen_replica_hands_its_part_over_once_its_heartbeats_lapse(parts_dir, graph, edge_set, reference,
                                                                         tmp_path):
    """SIGSTOP of the replica in use -- daemon and session worker: a frozen host -- for the rest of the epoch.  With
    reconnect_timeout at 60 s the trainer would wait that long for a paused server without a replica; with one, the
    part moves once the frozen one's heartbeats lapse: its first heartbeat unanswered (3.75 s apart, 3.75 s each:
    a quarter of the 15 s lease), then 2 of them (7.5 s), then the group re-formed -- 17 s here."""
    with running_cluster(parts_dir, [0, 1, 1], log_dir=tmp_path) as servers:
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=NEVER_BACK) as client:
            loader = client.neighbor_loader("test", FANOUTS, prefetch=2, **KWARGS)
            got, waits, last, frozen = [], [], time.monotonic(), None
            try:
                for i, batch in enumerate(loader):
                    waits.append(time.monotonic() - last)
                    got.append(batch)
                    if i == 2:
                        frozen = _in_use(servers, client, 1)
                        os.killpg(frozen.pid, signal.SIGSTOP)
                    last = time.monotonic()
                assert client.servers[1].address != frozen.address and client.replicas.failovers == 1
            finally:
                if frozen is not None:
                    os.killpg(frozen.pid, signal.SIGCONT)   # thawed for the cluster's teardown
            _check_epoch(got, reference, graph, edge_set)
            longest = max(waits[3:])
            assert longest < NEVER_BACK / 2, f"the trainer waited {longest:.1f} s: as for a server without a replica"
            print(f"frozen replica: the longest batch wait {longest:.2f} s")
