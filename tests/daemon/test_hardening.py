"""Hardening (issue 26): work budgets, worker death, refused requests, session leaks, leases, rendezvous.

Real ``graphfeed serve`` daemons on loopback (port 0) with real session workers, a 1,000-node
graph in 2 parts; each test bounds its waits and checks the error text.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import socket
import time
from pathlib import Path

import grpc
import pytest
import torch
from helpers.graphs import partition_arrays

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.partition.inputs import synth
from graphfeed.server.sampling.budget import BudgetExceeded, WorkBudget, estimate
from graphfeed.testing.cluster import running_cluster

KEY = b"k" * 32   # a trainer group's data-path key (OpenGroupRequest.group_key)
FANOUTS = [4, 2]
WAIT = 30.0   # seconds: bound of every poll below


@pytest.fixture(scope="module")
def graph():
    return synth.generate(1000, 8, 8, 4)


@pytest.fixture(scope="module")
def parts_dir(graph, tmp_path_factory) -> Path:
    return partition_arrays(graph, tmp_path_factory.mktemp("hardening") / "parts", classes=4, parts=2,
                            name="hardening-1000")


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


# ---- one cluster for the other cases (a small message limit) ----------------------------------------

IDLE_SECONDS = 3.0
MESSAGE_LIMIT = 1 << 20


@pytest.fixture(scope="module")
def servers(parts_dir, tmp_path_factory):
    env = {"GRAPHFEED_MAX_MESSAGE_BYTES": str(MESSAGE_LIMIT)}
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

def test_a_foreign_rendezvous_address_is_refused(parts_dir, tmp_path):
    """torch RPC (a daemon's data_path names it): a worker would dial the rendezvous, so only the caller's."""
    with running_cluster(parts_dir, parts=[0], env={"GRAPHFEED_DATA_PATH": "torch-rpc"}, log_dir=tmp_path) as \
            servers, grpc.insecure_channel(servers[0].address) as channel:
        stub = pb_grpc.ControlStub(channel)
        req = pb.OpenGroupRequest(group_key=KEY, group_id="foreign", rendezvous="192.0.2.77:29500", world_size=3,
                                  rank=1, data_path="torch-rpc")
        with pytest.raises(grpc.RpcError) as err:
            stub.OpenGroup(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "rendezvous = '192.0.2.77:29500' is not the address this OpenGroup came from (127.0.0.1)" in \
            err.value.details() and "advertise_host" in err.value.details()
        assert stub.GetStats(pb.StatsRequest(), timeout=30).groups_open == 0, "no worker may have been started"


def test_peer_endpoints_a_worker_may_dial_are_the_callers_its_own_and_the_peer_networks():
    from graphfeed.server.daemon.control import check_peer_endpoints
    from graphfeed.server.daemon.registry import RequestError

    nets = ("10.9.0.0/16",)
    check_peer_endpoints(["10.9.0.1:7001", "10.9.3.4:7002", "10.1.2.3:7003", "[10.9.0.1]:7004"], 0,
                         "ipv4:10.1.2.3:5555", "10.9.0.1:7001", nets)
    # the worker's own entry is never dialled, so it is not checked
    check_peer_endpoints(["192.0.2.1:22", "10.9.3.4:7002"], 0, "ipv4:10.1.2.3:5555", "10.9.0.1:7001", nets)
    with pytest.raises(RequestError) as err:
        check_peer_endpoints(["10.9.0.1:7001", "192.0.2.1:22"], 0, "ipv4:10.1.2.3:5555", "10.9.0.1:7001", nets)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.message.startswith("endpoint '192.0.2.1:22' of part 1 is not an address this server's worker "
                                        "may dial (the caller 10.1.2.3, this server's data address 10.9.0.1:7001, "
                                        "peer networks: 10.9.0.0/16)") and "set peer_networks" in err.value.message
    with pytest.raises(RequestError, match="no-such-host.invalid"):   # a name that does not resolve
        check_peer_endpoints(["10.9.0.1:7001", "no-such-host.invalid:80"], 0, "ipv4:10.1.2.3:1", "10.9.0.1:1", nets)
    # a trainer on loopback may name loopback peers (every server on its host)
    check_peer_endpoints(["127.0.0.1:1", "127.0.0.1:2"], 1, "ipv4:127.0.0.1:5", "127.0.0.1:1")
    with pytest.raises(RequestError, match="of part 0"):   # but not another host's address
        check_peer_endpoints(["203.0.113.9:2", "127.0.0.1:1"], 1, "ipv4:127.0.0.1:5", "127.0.0.1:1")


def test_peer_networks_is_a_daemon_setting(parts_dir):
    from graphfeed.server.daemon.config import ConfigError, load_config

    flags = {"partition": str(parts_dir), "part": 0}
    cfg = load_config(environ={"GRAPHFEED_PEER_NETWORKS": "10.0.0.0/8, fd00::/64"}, flags=flags)
    assert cfg.peer_networks == ("10.0.0.0/8", "fd00::/64")
    assert load_config(environ={}, flags=flags).peer_networks == ()
    with pytest.raises(ConfigError, match="'10.0.0.300/8' is not a network in CIDR form"):
        load_config(environ={"GRAPHFEED_PEER_NETWORKS": "10.0.0.300/8"}, flags=flags)


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


def test_the_session_limit_error_says_how_many_are_open_and_by_whom(servers):
    with gf.connect([s.address for s in servers], timeout=60) as client:
        kept = [client.neighbor_loader("val", FANOUTS, batch_size=16) for _ in range(16)]
        with pytest.raises(gf.ServerError, match=r"of ipv4:127.0.0.1:\d+ already has 16 of max_sessions_per_group=16 "
                                                 r"sessions open \(loaders by kind: val x16\); close\(\) loaders"):
            client.neighbor_loader("train", FANOUTS, batch_size=16)
        del kept


def test_idle_sessions_expire(parts_dir, tmp_path):
    env = {"GRAPHFEED_SESSION_IDLE_SECONDS": str(IDLE_SECONDS)}
    with running_cluster(parts_dir, env=env, log_dir=tmp_path) as servers, \
            gf.connect([s.address for s in servers], timeout=60) as client:
        kept = [client.neighbor_loader("val", FANOUTS, batch_size=16) for _ in range(2)]
        with grpc.insecure_channel(servers[0].address) as channel:
            stub = pb_grpc.ControlStub(channel)
            _wait_for(lambda: stub.GetStats(pb.StatsRequest(), timeout=30).sessions_open == 0,
                      "idle sessions to expire", timeout=IDLE_SECONDS + WAIT)
        assert "session_expired" in servers[0].logs() and "idle_seconds=" in servers[0].logs()
        # the trainer's loader was only idle, not gone: it opens its sessions again and runs its epoch
        batches = list(kept[0])
        assert batches
        assert sorted(int(s) for b in batches for s in b.n_id[:b.batch_size]) == \
            sorted(int(s) for b in list(kept[1]) for s in b.n_id[:b.batch_size])
        first = client.sample(torch.tensor([1, 2, 3]), FANOUTS)
        _wait_for(lambda: stub_sessions(servers[0]) == 0, "the online session to expire",
                  timeout=IDLE_SECONDS + WAIT)
        again = client.sample(torch.tensor([1, 2, 3]), FANOUTS)   # re-opened transparently
        assert torch.equal(first.n_id, again.n_id) and torch.equal(first.edge_index, again.edge_index)
        assert client.reconnects == 0
        del kept


def stub_sessions(server) -> int:
    with grpc.insecure_channel(server.address) as channel:
        return pb_grpc.ControlStub(channel).GetStats(pb.StatsRequest(), timeout=30).sessions_open


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
        time.sleep(3.0)   # the daemon trims freed heap pages every second
        grown = _rss(server.pid) - before
    assert grown < 16 << 20, f"the daemon kept {grown >> 20} MiB after 10 refused 16 MiB requests"


# ---- 2. a worker that dies while its daemon lives ---------------------------------------------------

def _listening_ports(pid: int) -> list[int]:
    """TCP ports process ``pid`` listens on (its socket inodes matched against /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in list(fh)[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:   # LISTEN
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def _send(port: int, data: bytes) -> None:
    """``data`` to ``port`` (nothing when the port is gone: the worker may already have died of the last one)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(data)
            s.settimeout(2)
            s.recv(1024)
    except OSError:
        pass


def test_garbage_on_a_worker_port_and_a_killed_worker_resume_the_epoch_exactly_once(servers, graph, caplog):
    caplog.set_level(logging.WARNING, logger="graphfeed.client")
    num_nodes = graph[1].shape[0]
    with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=60) as client:
        loader = client.neighbor_loader(None, FANOUTS, batch_size=64, prefetch=1, shuffle=True, seed=5)
        it = iter(loader)
        got = [next(it) for _ in range(3)]
        victim = _worker_pids(client)[1]
        ports = _listening_ports(victim)
        assert ports, "the worker listens on its data path"
        for port in ports:   # what the issue found aborts a worker with std::bad_alloc
            _send(port, b"GET / HTTP/1.0\r\n\r\n")
            _send(port, os.urandom(64 << 10))
        got += [next(it) for _ in range(2)]
        garbage_killed = not _alive(victim)
        os.kill(_worker_pids(client)[1], signal.SIGKILL)   # the OOM killer's way: the daemon lives on
        got += list(it)
        seeds = sorted(int(s) for b in got for s in b.n_id[:b.batch_size])
        assert seeds == list(range(num_nodes)), "every seed exactly once"
        assert client.reconnects == 1 + garbage_killed and loader.stats()["resumes"] == 1 + garbage_killed
    log = servers[1].logs()
    assert "was killed by SIGKILL (the server itself is alive)" in log
    assert "was killed by SIGKILL" in caplog.text, "the trainer is told how its worker died"
    assert servers[1].proc.poll() is None


def test_a_truncated_part_file_turns_health_not_serving_with_a_clear_error(parts_dir, tmp_path):
    import shutil

    from graphfeed.testing.cluster import CONTROL_SERVICE, NOT_SERVING, SERVING, wait_for_health

    copy = tmp_path / "parts"
    shutil.copytree(parts_dir, copy)
    victim = copy / "part_0" / "nodes" / "_N" / "x.npy"
    intact = victim.read_bytes()
    with running_cluster(copy, parts=[0], log_dir=tmp_path / "logs") as [server]:
        with open(victim, "r+b") as fh:
            fh.truncate(len(intact) // 2)
        wait_for_health(server.address, NOT_SERVING, CONTROL_SERVICE, timeout=WAIT)
        assert "partition_unreadable" in server.logs() and "truncated or replaced" in server.logs()
        with grpc.insecure_channel(server.address) as channel:
            req = pb.OpenGroupRequest(group_key=KEY,
                                      group_id="after", rendezvous="127.0.0.1:29500", world_size=3, rank=1)
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.ControlStub(channel).OpenGroup(req, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"this server's part cannot be read ({victim} is" in err.value.details()
        assert "restore the partition files" in err.value.details()
        victim.write_bytes(intact)   # restored: serving again
        wait_for_health(server.address, SERVING, CONTROL_SERVICE, timeout=WAIT)


# ---- 7. tokens and exposure -------------------------------------------------------------------------

@pytest.mark.parametrize("token", ["aaaaaaaaaaaaaaaa", "password12345678", "abcdefghabcdefgh", "0123456789abcdef",
                                   "qwertyuiopqwertyuiop", "Secret_2024_____", "abcdeabcdeabcdea", "1234567890123456",
                                   "1212343412123434", "0000111122223333"])
def test_weak_tokens_are_refused_saying_the_rule(token):
    from graphfeed.server.daemon.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"token = <redacted> is invalid: expected a random secret: a token needs "
                                          r"at least 5 distinct characters and 50 bits of estimated entropy .*"
                                          r"openssl rand -hex 32") as err:
        load_config(environ={"GRAPHFEED_TOKEN": token}, flags={"partition": "p", "part": 0})
    assert token not in str(err.value)


def test_random_tokens_pass():
    from graphfeed.server.daemon.config import load_config

    tokens = [os.urandom(16).hex(), os.urandom(32).hex(), "gf-test-token-0123456789abcdef", "Zt8#qL2v!xW9mP4c"]
    for token in tokens:
        assert load_config(environ={"GRAPHFEED_TOKEN": token}, flags={"partition": "p", "part": 0}).token == token


def test_short_random_hex_tokens_pass_the_estimate():
    from graphfeed.server.daemon.config import _token

    # `openssl rand -hex 8`: 16 hex characters, 64 random bits, the shortest token the rules allow.  A random draw
    # has fewer than 5 distinct characters about twice in a million, so 20,000 draws all pass (the old estimate,
    # length x log2(distinct characters) >= 50 with 8 distinct, refused about 7% of them).  The draws are seeded:
    # 20,000 fresh random ones would hit a 4-distinct draw in about 4% of runs (a flaky test), while a rule that
    # refuses more than that one-in-500,000 still fails here.
    draws = random.Random(20_000)
    refused = []
    for _ in range(20_000):
        token = draws.randbytes(8).hex()
        try:
            _token(token)
        except ValueError:
            refused.append(token)
    assert not refused, refused[:5]


def test_a_token_file_others_can_read_is_warned_about(parts_dir, tmp_path):
    import subprocess
    import sys

    from graphfeed.server.daemon.config import token_file_exposure

    path = tmp_path / "token"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o644)
    assert "has mode 0644: its group or other users can read the token; run `chmod 600" in \
        token_file_exposure(str(path))
    run = subprocess.run([sys.executable, "-m", "graphfeed.cli", "serve", "--partition", str(parts_dir), "--part",
                          "0", "--token-file", str(path), "--check-config"], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("GRAPHFEED_")})
    assert run.returncode == 0 and "warning: token_file" in run.stderr and "mode 0644" in run.stderr, run.stderr
    path.chmod(0o600)
    assert token_file_exposure(str(path)) is None


def test_session_workers_get_no_credentials(monkeypatch):
    from graphfeed.server.worker.handle import worker_environment

    for name in ("GRAPHFEED_TOKEN", "GRAPHFEED_TLS_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("GRAPHFEED_CACHE_DIR", "/tmp/cache")
    env = worker_environment()
    assert not {"GRAPHFEED_TOKEN", "GRAPHFEED_TLS_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DB_PASSWORD"} & set(env)
    assert env["GRAPHFEED_CACHE_DIR"] == "/tmp/cache" and "PATH" in env
