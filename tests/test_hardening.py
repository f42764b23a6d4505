"""Hardening (issue 26): work budgets, worker death, refused requests, session leaks, leases, rendezvous.

Real ``graphfeed serve`` daemons on loopback (port 0) with real session workers, a 1,000-node
graph in 2 parts; each test bounds its waits and checks the error text.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.partition import builder, synth
from graphfeed.server.sampling.budget import BudgetExceeded, WorkBudget, estimate
from graphfeed.testing.cluster import running_cluster

FANOUTS = [4, 2]
WAIT = 30.0   # seconds: bound of every poll below


@pytest.fixture(scope="module")
def graph():
    return synth.generate(1000, 8, 8, 4)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    ei, x, y, splits = graph
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, fingerprint="hardening-1000")
    out = tmp_path_factory.mktemp("hardening") / "parts"
    builder.partition_graph(g, 2, out, method="random")
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _worker_pids(client) -> list[int]:
    return [int(s.extra["worker_pid"]) for s in client.servers]


# ---- 1. work budget -------------------------------------------------------------------------------

def test_estimate_bounds_disjoint_and_plain_batches():
    # the loader: disjoint, 8 hops of fanout 10, batch 64 -- 64 x (10 + ... + 10^8) edges
    est = estimate(64, [10] * 8, disjoint=True, num_nodes=10**9, num_edges=10**9, row_bytes=400)
    assert est.edges == 64 * sum(10**h for h in range(1, 9))
    # not disjoint: never more than the graph holds
    est = estimate(64, [10] * 8, disjoint=False, num_nodes=1000, num_edges=8000, row_bytes=400)
    assert (est.nodes, est.edges) == (1000, 8000)
    assert estimate(64, [-1, 5], disjoint=True, num_nodes=1000, num_edges=8000, row_bytes=4).edges is None
    budget = WorkBudget(max_hops=4, max_nodes=100, max_edges=100, max_bytes=1000)
    with pytest.raises(BudgetExceeded, match=r"8 hops, more than this server's max_hops=4.*raise max_hops"):
        budget.check_hops(8)
    with pytest.raises(BudgetExceeded, match=r"reached 101 sampled edges at hop 2.*max_batch_edges=100"):
        budget.check_sample(50, 101, 1)
    with pytest.raises(BudgetExceeded, match=r"max_batch_bytes=1,000"):
        budget.check_bytes(1001)


def test_oversized_loaders_are_refused_naming_the_cap_and_the_worker_lives(parts_dir):
    env = {"GRAPHFEED_MAX_HOPS": "12", "GRAPHFEED_MAX_BATCH_EDGES": "20000", "GRAPHFEED_MAX_BATCH_NODES": "20000"}
    with running_cluster(parts_dir, env=env) as servers, \
            gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=0) as client:
        pids = _worker_pids(client)
        # the case: refused when the loader is made, before any sampling
        for hops in (8, 12):
            with pytest.raises(gf.ServerError, match=r"RESOURCE_EXHAUSTED.*may sample up to [\d,]+ (nodes|edges).*"
                                                     r"max_batch_(nodes|edges)=20,000.*raise max_batch_"):
                client.neighbor_loader("train", [10] * hops, batch_size=64, disjoint=True)
        with pytest.raises(ValueError, match=r"50 hops, more than this server's max_hops=12"):
            client.neighbor_loader("train", [10] * 50, batch_size=64, disjoint=True)
        assert all(_alive(p) for p in pids)
        # what no estimate bounds (every neighbour): stopped while sampling, within one hop of the cap
        loader = client.neighbor_loader("train", [-1, -1, -1], batch_size=64, disjoint=True)
        with pytest.raises(gf.ServerError, match=r"sampled (nodes|edges) at hop \d, more than this server's "
                                                 r"max_batch_(nodes|edges)=20,000"):
            list(loader)
        assert all(_alive(p) for p in pids), "a refused batch must not take its worker down"
    # the same servers' caps leave ordinary loaders alone
    with running_cluster(parts_dir, env=env) as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        batches = list(client.neighbor_loader("train", FANOUTS, batch_size=16, disjoint=True))
        assert batches and all(b.num_sampled_edges[0] <= b.batch_size * FANOUTS[0] for b in batches)


# ---- one cluster for the control-plane cases (short idle expiry, small message limit) ------------------

IDLE_SECONDS = 3.0
MESSAGE_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def servers(parts_dir, tmp_path_factory):
    env = {"GRAPHFEED_SESSION_IDLE_SECONDS": str(IDLE_SECONDS), "GRAPHFEED_MAX_MESSAGE_BYTES": str(MESSAGE_LIMIT)}
    with running_cluster(parts_dir, env=env, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers


def _wait_for(predicate, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


# ---- 6. the daemon decides where it connects ---------------------------------------------------------

def test_a_foreign_rendezvous_address_is_refused(servers):
    with grpc.insecure_channel(servers[0].address) as channel:
        stub = pb_grpc.ControlStub(channel)
        req = pb.OpenGroupRequest(group_id="foreign", rendezvous="192.0.2.77:29500", world_size=3, rank=1)
        with pytest.raises(grpc.RpcError) as err:
            stub.OpenGroup(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "rendezvous = '192.0.2.77:29500' is not the address this OpenGroup came from (127.0.0.1)" in \
            err.value.details() and "advertise_host" in err.value.details()
        assert stub.GetStats(pb.StatsRequest(), timeout=30).groups_open == 0, "no worker may have been started"


# ---- 4. sessions cannot leak ------------------------------------------------------------------------

def test_dropped_loaders_do_not_exhaust_the_session_limit(servers):
    before = servers[0].logs().count("session_close")
    with gf.connect([s.address for s in servers], timeout=60) as client:
        for i in range(100):
            loader = client.neighbor_loader("train", FANOUTS, batch_size=16)
            if i % 2:   # an abandoned iterator: the loader and its generator form a cycle only gc frees
                it = iter(loader)
                next(it)
                del it
            del loader
        assert len(list(client.neighbor_loader("train", FANOUTS, batch_size=16))) > 0
        with grpc.insecure_channel(servers[0].address) as channel:
            stats = pb_grpc.ControlStub(channel).GetStats(pb.StatsRequest(), timeout=30)
        assert stats.sessions_open <= 16
        # the client closed them (refcount: at once; in a cycle: when the limit was hit), not the idle expiry
        assert servers[0].logs().count("session_close") - before >= 50


def test_idle_sessions_expire_and_the_limit_error_says_who_holds_them(servers):
    with gf.connect([s.address for s in servers], timeout=60) as client:
        kept = [client.neighbor_loader("val", FANOUTS, batch_size=16) for _ in range(16)]
        with pytest.raises(gf.ServerError, match=r"already has 16 of max_sessions_per_group=16 sessions open "
                                                 r"\(loaders by kind: val x16\); close\(\) loaders"):
            client.neighbor_loader("train", FANOUTS, batch_size=16)
        with grpc.insecure_channel(servers[0].address) as channel:
            stub = pb_grpc.ControlStub(channel)
            _wait_for(lambda: stub.GetStats(pb.StatsRequest(), timeout=30).sessions_open == 0,
                      "idle sessions to expire", timeout=IDLE_SECONDS + WAIT)
        assert "session_expired" in servers[0].logs() and "idle_seconds" in servers[0].logs()
        del kept


# ---- 5. leases judged by the trainer's heartbeats ---------------------------------------------------

def test_a_paused_daemon_keeps_the_group_whose_trainer_kept_heartbeating(servers):
    lease = 2.0
    with gf.connect([s.address for s in servers], timeout=60, lease_seconds=lease, reconnect_timeout=60) as client:
        group_id = client.group.group_id
        servers[0].signal(signal.SIGSTOP)
        try:
            time.sleep(3 * lease)   # the trainer's heartbeats go unanswered meanwhile
        finally:
            servers[0].signal(signal.SIGCONT)
        time.sleep(lease)           # a reaper that judged by its own clock would have reaped by now
        batches = list(client.neighbor_loader("train", FANOUTS, batch_size=16))
        assert batches and client.reconnects == 0 and client.group.group_id == group_id
    log = servers[0].logs()
    assert "daemon_stalled" in log
    assert not any("group_reap" in line and group_id in line for line in log.splitlines())


# ---- 3. refused requests cost nothing ---------------------------------------------------------------

def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) << 10 for line in fh if line.startswith("VmRSS:"))


def test_refused_large_requests_leave_the_daemon_memory_as_it_was(servers):
    server, payload = servers[0], os.urandom(16 << 20)   # 16x the 1 MiB limit
    with grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1)]) as channel:
        open_session = channel.unary_unary("/graphfeed.control.v1.Control/OpenSession",
                                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError):   # warm-up: gRPC's own buffers and threads
            open_session(payload, timeout=60)
        before = _rss(server.pid)
        for _ in range(10):
            with pytest.raises(grpc.RpcError) as err:
                open_session(payload, timeout=60)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        time.sleep(3.0)   # the daemon trims freed heap pages every 2 s
        grown = _rss(server.pid) - before
    assert grown < 16 << 20, f"the daemon kept {grown >> 20} MiB after 10 refused 16 MiB requests"
