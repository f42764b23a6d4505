"""Pauses are not deaths: a daemon that stops answering for a while (SIGSTOP, a frozen VM, an overloaded host)
keeps its groups and extends their leases by the pause (``Registry.forgive_stall``), so its trainers wait for it
-- up to ``reconnect_timeout`` -- while the loaders keep pulling from its session worker; only a daemon that is
gone (its port refuses, it no longer knows the group, or it answers with a new incarnation: it restarted) is
recovered from by re-forming the group.

The first tests judge the client's liveness rules on stand-in stubs (the fast tier); the others pause and
restart real daemons.  The pause tests use the suite's defaults on purpose: ``reconnect_timeout`` 180 s (so a
120 s pause is survivable), the daemons' 15 s lease and the client's 30 s control timeout (so the 60 and 120 s
pauses make the client send StartEpoch again)."""
from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import torch
from helpers.graphs import partition_arrays

import graphfeed.client as gf
from graphfeed.client.cluster import ServerConn
from graphfeed.client.errors import ServerError
from graphfeed.client.group import REPLICA_PATIENCE_MIN, DataGroup
from graphfeed.client.settings import ConnectSettings
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster, start_server

FANOUTS = [4, 2]
LEASE = 0.4            # stand-in servers: a heartbeat every 0.2 s


# ---- the rules, on stand-in servers --------------------------------------------------------------------------

class _Error(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode):
        super().__init__(code.name)
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"stand-in {self._code.name}"


class _Stub:
    """Answers Heartbeat with ``incarnation`` unless ``error`` is set (then raises that status)."""

    def __init__(self):
        self.error: grpc.StatusCode | None = None
        self.incarnation = "a" * 32
        self.calls: list[str] = []

    def Heartbeat(self, req, timeout, metadata=None):   # noqa: N802 -- named as the gRPC method it stands in for
        self.calls.append("Heartbeat")
        if self.error is not None:
            raise _Error(self.error)
        return pb.HeartbeatReply(lease_seconds=LEASE, incarnation=self.incarnation)

    def StartEpoch(self, req, timeout, metadata=None):   # noqa: N802 -- named as the gRPC method it stands in for
        self.calls.append("StartEpoch")
        if self.calls.count("StartEpoch") <= 2:
            raise _Error(grpc.StatusCode.DEADLINE_EXCEEDED)
        return pb.StartEpochReply(num_batches=7)


class _Conn(ServerConn):
    def draining(self, timeout: float) -> bool:
        return False


def _group(reconnect_timeout: float) -> tuple[DataGroup, _Stub, list]:
    stub = _Stub()
    server = _Conn(address="127.0.0.1:5000", channel=None, stub=stub, info=pb.ClusterInfo(part_id=0),
                   group_lease=LEASE, incarnation=stub.incarnation)
    settings = ConnectSettings(advertise_host="127.0.0.1", timeout=10, rpc_timeout=10, lease_seconds=LEASE,
                               reconnect_timeout=reconnect_timeout)
    group = DataGroup([server], transport="torch-rpc", settings=settings)
    failed: list = []
    group.on_failure = lambda name, reason: failed.append(reason)
    return group, stub, failed


def _wait_until(what: str, cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)


def _heartbeating(group: DataGroup):
    group._start_heartbeat(group.servers[0])
    return group


def _stop(group: DataGroup) -> None:
    group._stop.set()
    for t in group._threads:
        t.join(5)
    assert not any(t.is_alive() for t in group._threads)


def test_a_heartbeat_that_times_out_is_waited_for_and_forgotten_once_it_answers():
    group, stub, failed = _group(reconnect_timeout=60)
    stub.error = grpc.StatusCode.DEADLINE_EXCEEDED
    try:
        _heartbeating(group)
        _wait_until("silent server", lambda: stub.calls.count("Heartbeat") >= 6)   # 3x the old two-miss rule
        assert failed == [] and not group.failures and group.servers[0].name in group.silent
        assert group.probe() == {}, "a server that only does not answer is not gone"
        stub.error = None
        _wait_until("answer", lambda: not group.silent)
        assert failed == [] and group.probe() == {}
    finally:
        _stop(group)


def test_a_server_silent_past_reconnect_timeout_counts_as_gone():
    group, stub, failed = _group(reconnect_timeout=1.0)
    stub.error = grpc.StatusCode.DEADLINE_EXCEEDED
    try:
        _heartbeating(group)
        _wait_until("failure", lambda: failed)
        assert "has not answered for" in failed[0] and "reconnect_timeout=1" in failed[0]
        assert group.servers[0].name in group.given_up
    finally:
        _stop(group)


def test_a_silent_server_whose_part_has_a_replica_counts_as_gone_once_its_heartbeats_lapse():
    """Not after reconnect_timeout (60 s here): its part can move to the replica, so the trainer does not stall."""
    group, stub, failed = _group(reconnect_timeout=60)
    name = group.servers[0].name
    group.has_replica = lambda server: server == name
    assert group.patience(server=name) == REPLICA_PATIENCE_MIN   # heartbeats every 0.2 s: the floor
    assert group.patience(server="another:1 part 1") == 60
    stub.error = grpc.StatusCode.DEADLINE_EXCEEDED
    t0 = time.monotonic()
    try:
        _heartbeating(group)
        _wait_until("failure", lambda: failed, timeout=REPLICA_PATIENCE_MIN + 5)
        assert time.monotonic() - t0 >= REPLICA_PATIENCE_MIN
        assert "its part has another replica" in failed[0] and name in group.given_up
    finally:
        _stop(group)


def test_a_refused_heartbeat_and_a_new_incarnation_are_gone():
    group, stub, failed = _group(reconnect_timeout=60)
    stub.error = grpc.StatusCode.UNAVAILABLE   # the port closed: connection refused
    assert "does not answer (" in group.probe()[group.servers[0].name]
    try:
        _heartbeating(group)
        _wait_until("failure", lambda: failed)
        assert "UNAVAILABLE" in failed[0]
        stub.error, stub.incarnation = None, "b" * 32   # answers again, but it is another daemon
        assert "restarted (incarnation aaaaaaaa -> bbbbbbbb)" in group.probe()[group.servers[0].name]
        _wait_until("restart", lambda: any("restarted" in r for r in failed))
        stub.incarnation = "a" * 32
        _wait_until("answer", lambda: not group.failures)   # the same daemon again: nothing is gone
    finally:
        _stop(group)


def test_a_silent_server_that_answers_it_lost_the_group_is_gone_and_no_longer_silent():
    """A link down past the lease: the server reaped the group meanwhile, so its first answer is NOT_FOUND."""
    group, stub, _ = _group(reconnect_timeout=60)
    name = group.servers[0].name
    stub.error = grpc.StatusCode.DEADLINE_EXCEEDED
    assert group.probe() == {} and name in group.silent
    stub.error = grpc.StatusCode.NOT_FOUND
    assert "no longer knows this trainer's group" in group.probe()[name]
    assert name not in group.silent


def test_a_start_epoch_nobody_answers_is_sent_again_within_the_patience_and_raises_past_it():
    stub = _Stub()
    server = _Conn(address="127.0.0.1:5000", channel=None, stub=stub, info=pb.ClusterInfo(part_id=0), patience=30)
    assert server.call("StartEpoch", pb.StartEpochRequest(), timeout=0.1).num_batches == 7
    assert stub.calls == ["StartEpoch"] * 3
    impatient = _Conn(address="127.0.0.1:5001", channel=None, stub=_Stub(), info=pb.ClusterInfo(part_id=1))
    with pytest.raises(ServerError) as err:
        impatient.call("StartEpoch", pb.StartEpochRequest(), timeout=0.1)
    assert err.value.code == "DEADLINE_EXCEEDED"
    stub.calls.clear()
    stub.error = grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(ServerError):   # only calls a second delivery cannot harm are sent again
        server.call("Heartbeat", pb.HeartbeatRequest(), timeout=0.1)
    assert stub.calls == ["Heartbeat"]


# ---- real daemons ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    graph = synth.generate(1600, 8, 8, 4)
    return partition_arrays(graph, tmp_path_factory.mktemp("pauses") / "parts", classes=4, parts=2,
                            name="pauses-1600")


def _key(batch) -> tuple:
    return tuple(batch.n_id.tolist()), tuple(batch.edge_index.flatten().tolist())


def _seeds(batches) -> list[int]:
    return sorted(int(s) for b in batches for s in b.n_id[:b.batch_size])


def _paused_run(parts_dir, tmp_path, pause: float) -> None:
    """Two epochs of a loader while part 0's daemon (only the daemon: its session worker runs on) is stopped
    for ``pause`` s from batch 3 of epoch 0; both epochs equal an uninterrupted loader's, seed by seed and batch
    by batch, on the same group (nothing re-formed)."""
    with running_cluster(parts_dir, log_dir=tmp_path) as servers, \
            gf.connect([s.address for s in servers]) as client:
        args = dict(batch_size=8, shuffle=True, seed=5, prefetch=2)
        reference = client.neighbor_loader("train", FANOUTS, **args)
        expected = [[_key(b) for b in reference] for _ in range(2)]
        reference.close()
        loader, group = client.neighbor_loader("train", FANOUTS, **args), client.group.group_id
        resumed = threading.Event()
        got, started = [], time.monotonic()
        for epoch in range(2):
            batches = []
            for i, batch in enumerate(loader):
                batches.append(batch)
                if epoch == 0 and i == 3:
                    servers[0].signal(signal.SIGSTOP)
                    started = time.monotonic()
                    threading.Timer(pause, lambda: (servers[0].signal(signal.SIGCONT), resumed.set())).start()
            got.append(batches)
        took = time.monotonic() - started
        assert resumed.wait(pause + 30), "the daemon was not continued"
        assert [[_key(b) for b in batches] for batches in got] == expected
        assert _seeds(got[0]) == _seeds(got[1]) == sorted(set(_seeds(got[0])))   # every seed once per epoch
        assert client.reconnects == 0 and client.group.group_id == group
        print(f"paused {pause:g} s: two epochs done {took:.1f} s after the pause began")
    log = servers[0].logs()
    assert "daemon_stalled" in log and not any("group_reap" in line for line in log.splitlines())


def test_a_5_s_pause_of_a_daemon_is_waited_through(parts_dir, tmp_path):
    _paused_run(parts_dir, tmp_path, 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("pause", [30.0, 60.0, 120.0])
def test_long_pauses_of_a_daemon_are_waited_through(parts_dir, tmp_path, pause):
    _paused_run(parts_dir, tmp_path, pause)


def _sessions_opened(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(pb_grpc.ControlStub(channel).GetStats(pb.StatsRequest(), timeout=10).sessions_opened_total)


def test_a_loader_opened_while_its_daemon_is_paused_opens_once_it_runs_again(parts_dir, tmp_path):
    """An OpenSession its daemon does not answer within the client's 3 s is sent again with the same open_key
    until the daemon runs again (8 s later): the loader opens with one session on that daemon (a repeat of
    an open the daemon got is answered with the first's session), and its batches equal a loader opened
    before the pause."""
    with running_cluster(parts_dir, log_dir=tmp_path) as servers, \
            gf.connect([s.address for s in servers], timeout=3, reconnect_timeout=60) as client:
        args = dict(batch_size=8, shuffle=True, seed=5)
        reference = client.neighbor_loader("train", FANOUTS, **args)
        expected = [_key(b) for b in reference]
        reference.close()
        before = _sessions_opened(servers[0].address)
        servers[0].signal(signal.SIGSTOP)
        resume = threading.Timer(8.0, servers[0].signal, (signal.SIGCONT,))
        resume.start()
        started = time.monotonic()
        try:
            loader = client.neighbor_loader("train", FANOUTS, **args)
        finally:
            resume.join()
        assert time.monotonic() - started >= 7.5, "the loader opened while its daemon was stopped"
        assert _sessions_opened(servers[0].address) - before == 1
        assert [_key(b) for b in loader] == expected
        assert client.reconnects == 0
    assert "group_reap" not in servers[0].logs()


def test_an_open_delivered_again_with_its_key_gets_the_first_s_session(parts_dir, tmp_path):
    """The daemon's side of the retry: deliveries of one OpenSession with the same open_key, at once (the
    repeat waits for the first) or later, open one session and all answer its id; another key opens another."""
    with running_cluster(parts_dir, log_dir=tmp_path) as servers, \
            gf.connect([s.address for s in servers], timeout=30) as client:
        loader = client.neighbor_loader("train", FANOUTS, batch_size=8, shuffle=True, seed=5)
        server, before = client.servers[0], _sessions_opened(servers[0].address)
        request = loader._session_request()
        request.open_key = "k" * 32
        with ThreadPoolExecutor(3) as pool:
            at_once = list(pool.map(lambda _: server.call("OpenSession", request, timeout=30), range(3)))
        later = server.call("OpenSession", request, timeout=30)
        assert len({r.session_id for r in at_once + [later]}) == 1
        assert len({r.local_input_nodes for r in at_once + [later]}) == 1
        assert _sessions_opened(servers[0].address) - before == 1
        request.open_key = "m" * 32
        assert server.call("OpenSession", request, timeout=30).session_id != later.session_id
        assert _sessions_opened(servers[0].address) - before == 2
    assert "session_open_repeat" in servers[0].logs()


def test_a_restarted_daemon_is_gone_and_recovered(parts_dir, tmp_path):
    """kill -9 of part 1's daemon and a new one on its port: a new incarnation, which holds none of the old
    group; the client re-forms the group and the epoch completes with every seed once."""
    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers, \
            gf.connect([s.address for s in servers], reconnect_timeout=120) as client:
        loader = client.neighbor_loader("train", FANOUTS, batch_size=8, shuffle=True, seed=2, prefetch=2)
        before = client.servers[1].incarnation
        assert before
        seen = []
        for i, batch in enumerate(loader):
            seen.append(batch)
            if i == 3:
                victim = servers[1]
                victim.expect_exit = -signal.SIGKILL
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait(30)
                victim.checked = True
                servers[1] = start_server(parts_dir, 1, log_dir=tmp_path / "restart",
                                          args=("--port", str(victim.port)))
        assert client.reconnects == 1
        assert client.servers[1].incarnation not in ("", before)
        assert len(seen) == len(loader) and _seeds(seen) == sorted(set(_seeds(seen)))
        assert torch.equal(torch.tensor(_seeds(seen)), torch.tensor(_seeds(list(loader))))
