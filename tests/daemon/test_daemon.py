"""``graphfeed serve``: config, lifecycle (startup/drain/shutdown, exit codes), Control validation, leases.

Real daemon processes on port 0; readiness and drain are observed through gRPC health.
Group/session tests use ``tests/fake_worker.py`` (the daemon with a stand-in session
worker: a real ``sleep`` child process); tests with the real worker are skipped until
``graphfeed.server.worker.handle`` exists.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from helpers import TESTS
from helpers.capabilities import holding_capabilities
from helpers.cluster import hermetic_env
from helpers.graphs import synthetic_parts

from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.daemon.config import ConfigError, load_config
from graphfeed.server.daemon.exitcodes import ExitCode
from graphfeed.server.partition.format.layout import read_meta
from graphfeed.server.partition.format.store import Partition
from graphfeed.testing.cluster import (
    CONTROL_SERVICE,
    NOT_SERVING,
    SERVING,
    health_status,
    running_cluster,
    start_server,
    wait_for_health,
)

KEY = b"k" * 32   # a trainer group's data-path key (OpenGroupRequest.group_key)
FAKE_SERVE = (sys.executable, str(TESTS / "helpers" / "fake_worker.py"))
SERVE = (sys.executable, "-m", "graphfeed.cli", "serve")
RPC_TIMEOUT = 10.0
CLI_TIMEOUT = 90.0


# ---- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def partition_dir(tmp_path_factory) -> Path:
    """A 2-part partition of a 2,000-node synthetic graph (built once for this module's tests)."""
    return synthetic_parts(tmp_path_factory.mktemp("daemon") / "graph-2p", nodes=2000, avg_degree=8, features=16,
                           classes=4, parts=2, name="daemon-test")


@pytest.fixture(scope="module")
def fake_config(tmp_path_factory, partition_dir) -> Path:
    path = tmp_path_factory.mktemp("fakecfg") / "server.yaml"
    # torch RPC by name: the OpenGroup checks below include the rendezvous a torch RPC worker would dial
    path.write_text(f"partition: {partition_dir}\npart: 1\nmax_groups: 3\nmax_sessions_per_group: 2\n"
                    f"call_timeout: 2\nlog_format: json\ndata_path: torch-rpc\n")
    return path


@pytest.fixture(scope="module")
def fake_server(partition_dir, fake_config, tmp_path_factory):
    """A daemon for part 1 with fake session workers (max_groups 3, max_sessions_per_group 2)."""
    logs = tmp_path_factory.mktemp("fakelogs")
    with running_cluster(partition_dir, parts=[1], args=("--config", str(fake_config)), log_dir=logs,
                         command=FAKE_SERVE) as servers:
        yield servers[0]


@pytest.fixture
def stub(fake_server):
    """A trainer's control stub: its calls carry the capabilities of the groups it opened."""
    with grpc.insecure_channel(fake_server.address) as channel:
        yield pb_grpc.ControlStub(holding_capabilities(channel))


def _status(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=RPC_TIMEOUT, **kwargs)
    return info.value.code(), info.value.details()


_group_counter = iter(range(1_000_000))


def open_group(stub, lease: float = 0.0, group_id: str | None = None, part: int = 1, num_parts: int = 2):
    gid = group_id or f"g{next(_group_counter)}-{os.getpid()}"
    reply = stub.OpenGroup(pb.OpenGroupRequest(group_key=KEY,
                                               group_id=gid, rendezvous="127.0.0.1:29500", world_size=num_parts + 1,
                                               rank=1 + part, lease_seconds=lease), timeout=RPC_TIMEOUT)
    return gid, reply


def session_request(gid: str, **overrides) -> pb.OpenSessionRequest:
    fields = dict(group_id=gid, spec=pb.SamplingSpec(num_neighbors=[5, 5]), split="train", batch_size=32,
                  kind="train")
    fields.update(overrides)
    if "node_ids" in overrides or fields["split"] is None:  # the input is a oneof: node_ids, split or nothing
        del fields["split"]
    return pb.OpenSessionRequest(**fields)


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie still answers kill(0); the daemon waits for its children, so "gone" = not present or zombie
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # it vanished while we looked
        return True


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Bounded wait on a condition that has no event to watch (e.g. the reaper's scan)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def run_cli(args, env=None, command=SERVE, timeout=CLI_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *args], capture_output=True, text=True, env=hermetic_env(env),
                          timeout=timeout)


# ---- config (in-process) --------------------------------------------------------------------------

def test_config_defaults_and_precedence(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("partition: /p\npart: 1\nport: 1111\nlease_seconds: 5\nbuffer_bytes: 64MiB\n")
    env = {"GRAPHFEED_PORT": "2222", "GRAPHFEED_LOG_FORMAT": "json", "GRAPHFEED_SAMPLER": "reference"}
    cfg = load_config(path, environ=env, flags={"port": 3333, "host": None})
    assert (cfg.port, cfg.log_format, cfg.lease_seconds, cfg.buffer_bytes) == (3333, "json", 5.0, 64 << 20)
    assert load_config(path, environ=env).port == 2222       # env beats the file
    assert load_config(path, environ={}).port == 1111         # the file beats the default
    assert load_config(path, environ={}).host == "127.0.0.1"  # defaults fill the rest
    assert load_config(path, environ={}).effective_data_address == "127.0.0.1"
    cfg = load_config(None, environ={"GRAPHFEED_CONFIG": str(path), "GRAPHFEED_METRICS_PORT": "9100"})
    assert (cfg.partition, cfg.part, cfg.metrics_port) == ("/p", 1, 9100)
    with pytest.raises(AttributeError):
        cfg.port = 1  # frozen


@pytest.mark.parametrize("text, env, key, expect", [
    ("partition: /p\npart: 0\nprot: 1\n", {}, "prot", "unknown key"),
    ("partition: /p\npart: 0\nport: abc\n", {}, "port", "integer 0..65535"),
    ("partition: /p\npart: 0\nport: 70000\n", {}, "port", "integer 0..65535"),
    ("partition: /p\npart: 0\nport: true\n", {}, "port", "integer"),
    ("partition: /p\npart: -1\n", {}, "part", "integer >= 0"),
    ("partition: /p\npart: 0\nlease_seconds: 0\n", {}, "lease_seconds", "> 0"),
    ("partition: /p\npart: 0\nlog_format: xml\n", {}, "log_format", "logfmt, json"),
    ("partition: /p\npart: 0\nbuffer_bytes: lots\n", {}, "buffer_bytes", "256MiB"),
    ("partition: /p\npart: 0\n", {"GRAPHFEED_MAX_GROUPS": "0"}, "GRAPHFEED_MAX_GROUPS", "integer 1..4096"),
    ("part: 0\n", {}, "partition", "missing required"),
    ("- a\n- b\n", {}, "mapping", "mapping"),
])
def test_config_errors_name_the_key(tmp_path, text, env, key, expect):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=env)
    assert key in str(info.value) and expect in str(info.value), str(info.value)


def test_config_file_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "nope.yaml", environ={})


# ---- startup failures and --check-config (subprocess, no server) ----------------------------------

def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_bad_config_exits_3_naming_the_key(tmp_path, partition_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"partition: {partition_dir}\npart: 0\nlease_secs: 3\n")
    proc = run_cli(["--config", str(bad)])
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "lease_secs" in _one_line_error(proc)
    bad.write_text(f"partition: {partition_dir}\npart: 0\ndrain_grace_seconds: soon\n")
    proc = run_cli(["--config", str(bad)])
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "drain_grace_seconds" in _one_line_error(proc)


def test_part_not_in_partition_exits_3(partition_dir):
    proc = run_cli(["--partition", str(partition_dir), "--part", "7", "--check-config"])
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "parts 0..1" in _one_line_error(proc)


def test_missing_partition_exits_4(tmp_path):
    proc = run_cli(["--partition", str(tmp_path / "absent"), "--part", "0", "--port", "0"])
    assert proc.returncode == ExitCode.PARTITION, proc.stderr
    assert "META.json" in _one_line_error(proc)


def test_unbindable_host_exits_5(partition_dir):
    proc = run_cli(["--partition", str(partition_dir), "--part", "0", "--port", "0", "--host", "192.0.2.1"])
    assert proc.returncode == ExitCode.BIND, proc.stderr
    assert "192.0.2.1" in _one_line_error(proc)


def test_port_in_use_exits_5(partition_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = run_cli(["--partition", str(partition_dir), "--part", "0", "--port", str(port)])
    assert proc.returncode == ExitCode.BIND, proc.stderr
    line = _one_line_error(proc)
    assert str(port) in line and "in use" in line, line


def test_check_config_ok_and_env_flag_precedence(tmp_path, partition_dir):
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(f"partition: {partition_dir}\npart: 1\nport: 1111\nlease_seconds: 7\n")
    proc = run_cli(["--config", str(cfg), "--check-config", "--port", "3333"], env={"GRAPHFEED_PORT": "2222",
                                                                                    "GRAPHFEED_LEASE_SECONDS": "9"})
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stdout.startswith("config ok:"), proc.stdout
    assert "port=3333" in proc.stdout and "lease_seconds=9" in proc.stdout and "part=1" in proc.stdout
    proc = run_cli(["--check-config"], env={"GRAPHFEED_CONFIG": str(cfg), "GRAPHFEED_PORT": "2222"})
    assert proc.returncode == ExitCode.OK and "port=2222" in proc.stdout and "lease_seconds=7" in proc.stdout


# ---- a real daemon per part -----------------------------------------------------------------------

def test_cluster_serving_and_info_equals_meta(partition_dir, tmp_path):
    meta = read_meta(partition_dir)
    with running_cluster(partition_dir, log_dir=tmp_path) as servers:
        for server in servers:
            assert health_status(server.address) == SERVING
            assert health_status(server.address, CONTROL_SERVICE) == SERVING
            with grpc.insecure_channel(server.address) as channel:
                info = pb_grpc.ControlStub(channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=RPC_TIMEOUT)
            part = Partition(partition_dir, server.part, meta)
            assert info.part_id == server.part and info.num_parts == meta.num_parts == 2
            assert list(info.node_ranges) == meta.node_ranges["_N"]
            assert info.num_edges == sum(meta.num_edges.values())
            assert (info.graph_name, info.fingerprint) == ("daemon-test", meta.source_fingerprint)
            assert info.format_version == meta.format_version and info.num_classes == 4
            assert dict(info.split_sizes) == meta.split_sizes
            assert dict(info.local_split_sizes) == {s: int(part.split(s).numel()) for s in meta.split_sizes}
            assert sum(dict(info.local_split_sizes).values()) == part.num_nodes  # the splits cover every node
            assert {f.name: (list(f.shape), f.dtype) for f in info.features} == \
                {"x": ([16], "float32"), "y": ([], "int64")}
            assert list(info.topologies) == meta.topologies and info.data_address == "127.0.0.1"
            assert (list(info.node_types), info.label_type) == (["_N"], "_N")   # the one-type graph's schema
            assert [(e.src, e.rel, e.dst) for e in info.edge_types] == [("_N", "to", "_N")]
            assert "event=serving" in server.logs()
            with grpc.insecure_channel(server.address) as channel:  # server reflection lists the services
                services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
            assert {CONTROL_SERVICE, "grpc.health.v1.Health"} <= services, services
        totals = {}
        for server in servers:
            with grpc.insecure_channel(server.address) as channel:
                info = pb_grpc.ControlStub(channel).GetClusterInfo(pb.ClusterInfoRequest(), timeout=RPC_TIMEOUT)
            for k, v in info.local_split_sizes.items():
                totals[k] = totals.get(k, 0) + v
        assert totals == meta.split_sizes


def test_port_file_and_sigterm_drain_with_open_group(partition_dir, tmp_path):
    """SIGTERM: health NOT_SERVING first, new groups/sessions refused, the open group keeps working until it
    closes, then exit 0 well within the grace."""
    port_file = tmp_path / "port"
    server = start_server(partition_dir, 0, args=("--port-file", str(port_file), "--drain-grace-seconds", "30"),
                          log_dir=tmp_path, command=FAKE_SERVE)
    try:
        assert int(port_file.read_text()) == server.port
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ControlStub(holding_capabilities(channel))
            gid, reply = open_group(stub, part=0)
            sid = stub.OpenSession(session_request(gid), timeout=RPC_TIMEOUT).session_id
            server.signal(signal.SIGTERM)
            wait_for_health(server.address, NOT_SERVING, timeout=20)
            wait_for_health(server.address, NOT_SERVING, CONTROL_SERVICE, timeout=20)
            code, details = _status(stub.OpenGroup, pb.OpenGroupRequest(group_key=KEY,
                                                                        group_id="late", rendezvous="h:1",
                                                                        world_size=3, rank=1))
            assert code == grpc.StatusCode.UNAVAILABLE and "draining" in details
            code, details = _status(stub.OpenSession, session_request(gid))
            assert code == grpc.StatusCode.UNAVAILABLE and "draining" in details
            stub.Heartbeat(pb.HeartbeatRequest(group_id=gid), timeout=RPC_TIMEOUT)
            assert stub.StartEpoch(pb.StartEpochRequest(session_id=sid, epoch=0), timeout=RPC_TIMEOUT).num_batches
            assert stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).state == "draining"
            started = time.monotonic()
            stub.CloseGroup(pb.CloseGroupRequest(group_id=gid), timeout=RPC_TIMEOUT)
        assert server.wait(timeout=25) == ExitCode.OK, server.log_tail()
        assert time.monotonic() - started < 15, "the daemon should exit as soon as its last group closed"
        assert pid_gone(reply.worker_pid)
        log = server.logs()
        assert log.index("event=drain_start") < log.index("event=group_close") < log.index("event=shutdown")
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.wait(10)


def test_drain_grace_expires_then_workers_stop(partition_dir, tmp_path):
    server = start_server(partition_dir, 0, args=("--drain-grace-seconds", "1"), log_dir=tmp_path,
                          command=FAKE_SERVE)
    with grpc.insecure_channel(server.address) as channel:
        gid, reply = open_group(pb_grpc.ControlStub(channel), part=0)
    started = time.monotonic()
    server.stop(expect=ExitCode.OK, timeout=20)
    assert time.monotonic() - started >= 1.0, "the open group should get the whole grace"
    assert pid_gone(reply.worker_pid), "the worker of the group left open must be stopped"
    assert "event=drain_timeout" in server.logs()


def test_second_signal_forces_exit_130(partition_dir, tmp_path):
    server = start_server(partition_dir, 0, args=("--drain-grace-seconds", "60"), log_dir=tmp_path,
                          command=FAKE_SERVE)
    with grpc.insecure_channel(server.address) as channel:
        gid, reply = open_group(pb_grpc.ControlStub(channel), part=0)
    server.signal(signal.SIGINT)
    wait_for_health(server.address, NOT_SERVING, timeout=20)
    server.signal(signal.SIGINT)
    assert server.wait(timeout=20) == ExitCode.FORCED, server.log_tail()
    wait_until(lambda: pid_gone(reply.worker_pid), 10, f"worker pid {reply.worker_pid} killed on forced exit")


# ---- Control: validation and errors (fake workers) ------------------------------------------------

@pytest.mark.parametrize("overrides, expect", [
    (dict(group_id=""), "group_id"),
    (dict(rendezvous="nohost"), "rendezvous"),
    (dict(rendezvous="h:0"), "rendezvous"),
    (dict(world_size=2), "world_size must be 3"),
    (dict(rank=1), "rank is 2"),
    (dict(lease_seconds=-1), "lease_seconds"),
])
def test_open_group_invalid(stub, fake_server, overrides, expect):
    fields = dict(group_id="bad-group", rendezvous="127.0.0.1:29500", world_size=3, rank=2, group_key=KEY)
    fields.update(overrides)
    code, details = _status(stub.OpenGroup, pb.OpenGroupRequest(**fields))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and expect in details, details
    assert health_status(fake_server.address) == SERVING


@pytest.mark.parametrize("overrides, expect", [
    (dict(spec=pb.SamplingSpec(num_neighbors=[])), "num_neighbors is empty"),
    (dict(spec=pb.SamplingSpec(num_neighbors=[5, -2])), "invalid fanout"),
    (dict(spec=pb.SamplingSpec(num_neighbors=[0])), "invalid fanout"),
    (dict(spec=pb.SamplingSpec(num_neighbors=[(1 << 20) + 1])), "invalid fanout"),
    (dict(spec=pb.SamplingSpec(num_neighbors=[5], direction="sideways")), "direction"),
    (dict(spec=pb.SamplingSpec(num_neighbors=[5], direction="out")), "CSR topology"),
    (dict(batch_size=0), "batch_size = 0"),
    (dict(batch_size=-5), "batch_size = -5"),
    (dict(batch_size=(1 << 22) + 1), "batch_size"),
    (dict(split="training"), "unknown split 'training'"),
    (dict(node_ids=pb.NodeIds(ids=[1, 2, 2000])), "id 2000"),
    (dict(node_ids=pb.NodeIds(ids=[-1, 3])), "id -1"),
    (dict(node_ids=pb.NodeIds(ids=[])), "node_ids is empty"),
    (dict(ordered=True, shuffle=True), "ordered = True: ordered=True delivers the seeds in input order: use it "
                                       "with shuffle=False"),
    (dict(ordered=True), "ordered=True needs input_nodes as ids"),
    (dict(rank=2, world_size=2), "rank = 2"),
    (dict(rank=-1, world_size=2), "rank = -1"),
    (dict(kind="invalid"), "the worker refused"),   # the worker raised BadRequest
    (dict(node_type="paper"), "node type 'paper', which the graph does not have; its node types are '_N'"),
    (dict(spec=pb.SamplingSpec(edge_type_fanouts=[pb.EdgeTypeFanouts(edge_type=pb.EdgeType(src="_N", rel="cites",
                                                                                            dst="_N"), fanouts=[5])])),
     "edge type ('_N', 'cites', '_N'), which the graph does not have; its edge types are ('_N', 'to', '_N')"),
])
def test_open_session_invalid(stub, fake_server, overrides, expect):
    gid, _ = open_group(stub)
    try:
        code, details = _status(stub.OpenSession, session_request(gid, **overrides))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert expect in details, details
        assert health_status(fake_server.address) == SERVING
        stats = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
        assert all(s.group_id != gid for s in stats.sessions), "a refused session must not exist"
    finally:
        stub.CloseGroup(pb.CloseGroupRequest(group_id=gid), timeout=RPC_TIMEOUT)


def test_worker_internal_error_is_internal_not_invalid(stub, fake_server):
    """A plain ValueError inside a worker command (not a BadRequest) is the server's failure: INTERNAL, logged."""
    gid, _ = open_group(stub)
    try:
        code, details = _status(stub.OpenSession, session_request(gid, kind="crash"))
        assert code == grpc.StatusCode.INTERNAL, (code, details)
        assert "OpenSession failed inside the worker: ValueError: a tensor had the wrong shape" in details, details
        wait_until(lambda: '"event": "worker_error"' in fake_server.logs(), 5, "the worker_error log line")
        assert stub.OpenSession(session_request(gid), timeout=RPC_TIMEOUT).local_input_nodes > 0, \
            "an internal error must not take the group down"
        assert health_status(fake_server.address) == SERVING
    finally:
        stub.CloseGroup(pb.CloseGroupRequest(group_id=gid), timeout=RPC_TIMEOUT)


def test_worker_error_codes():
    from graphfeed.server.daemon.control import worker_error_code
    from graphfeed.server.worker.commands import BadRequest, NotFound, NotReady, WorkerError

    assert worker_error_code(BadRequest("x")) == grpc.StatusCode.INVALID_ARGUMENT
    assert worker_error_code(NotFound("x")) == grpc.StatusCode.NOT_FOUND
    assert worker_error_code(NotReady("x")) == grpc.StatusCode.FAILED_PRECONDITION
    assert worker_error_code(WorkerError("x")) == grpc.StatusCode.INTERNAL


def test_unknown_ids_are_not_found(stub, fake_server):
    for call, request in [(stub.OpenSession, session_request("no-such-group")),
                          (stub.Heartbeat, pb.HeartbeatRequest(group_id="no-such-group")),
                          (stub.CloseGroup, pb.CloseGroupRequest(group_id="no-such-group")),
                          (stub.StartEpoch, pb.StartEpochRequest(session_id="no-such-session", epoch=0)),
                          (stub.CloseSession, pb.CloseSessionRequest(session_id="no-such-session"))]:
        code, details = _status(call, request)
        assert code == grpc.StatusCode.NOT_FOUND and "no-such" in details, (call, code, details)
    assert health_status(fake_server.address) == SERVING


def test_session_lifecycle_stats_and_logs(stub, fake_server, partition_dir):
    part = Partition(partition_dir, 1)
    before = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
    gid, reply = open_group(stub, lease=30)
    assert (reply.worker_name, reply.lease_seconds) == ("part1", 30.0) and reply.worker_pid > 0
    code, details = _status(stub.OpenGroup, pb.OpenGroupRequest(group_key=KEY,
                                                                group_id=gid, rendezvous="h:1", world_size=3, rank=2))
    assert code == grpc.StatusCode.ALREADY_EXISTS and gid in details
    s1 = stub.OpenSession(session_request(gid), timeout=RPC_TIMEOUT)
    assert s1.local_input_nodes == part.split("train").numel()
    ids = np.arange(0, 2000, 7)
    s2 = stub.OpenSession(session_request(gid, node_ids=pb.NodeIds(ids=ids.tolist()), kind="val"),
                          timeout=RPC_TIMEOUT)
    assert s2.local_input_nodes == int(part.to_global(torch.from_numpy(ids))[0].sum())
    code, details = _status(stub.OpenSession, session_request(gid))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_sessions_per_group=2" in details
    code, details = _status(stub.StartEpoch, pb.StartEpochRequest(session_id=s1.session_id, epoch=-1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "epoch = -1" in details
    started = stub.StartEpoch(pb.StartEpochRequest(session_id=s1.session_id, epoch=4), timeout=RPC_TIMEOUT)
    assert started.num_batches == 3
    stats = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
    mine = {s.session_id: s for s in stats.sessions if s.group_id == gid}
    assert set(mine) == {s1.session_id, s2.session_id} and mine[s1.session_id].epoch == 4
    assert stats.sessions_opened_total == before.sessions_opened_total + 2
    assert stats.groups_open == before.groups_open + 1 and stats.state == "serving" and stats.part_id == 1
    stub.CloseSession(pb.CloseSessionRequest(session_id=s1.session_id), timeout=RPC_TIMEOUT)
    code, _ = _status(stub.StartEpoch, pb.StartEpochRequest(session_id=s1.session_id, epoch=5))
    assert code == grpc.StatusCode.NOT_FOUND
    stub.CloseGroup(pb.CloseGroupRequest(group_id=gid), timeout=RPC_TIMEOUT)
    code, _ = _status(stub.StartEpoch, pb.StartEpochRequest(session_id=s2.session_id, epoch=0))
    assert code == grpc.StatusCode.NOT_FOUND
    wait_until(lambda: pid_gone(reply.worker_pid), 10, "the closed group's worker to exit")
    log = fake_server.logs()
    for event in ("group_open", "session_open", "session_close", "group_close"):
        assert f'"event": "{event}"' in log and gid in log, event  # JSON logs (log_format: json)
    assert '"peer": "ipv' in log


def test_max_groups(stub, fake_server):
    already = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).groups_open
    opened = []
    try:
        while True:
            try:
                opened.append(open_group(stub)[0])
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_groups=3" in exc.details()
                break
            assert len(opened) <= 3, "max_groups=3 was not enforced"
        assert len(opened) == 3 - already
    finally:
        for gid in opened:
            stub.CloseGroup(pb.CloseGroupRequest(group_id=gid), timeout=RPC_TIMEOUT)


def test_lease_expiry_reaps_group(stub, fake_server):
    before = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).sessions_reaped_total
    gid, reply = open_group(stub, lease=0.5)
    stub.OpenSession(session_request(gid), timeout=RPC_TIMEOUT)
    for _ in range(3):  # heartbeats keep it alive past its lease
        stub.Heartbeat(pb.HeartbeatRequest(group_id=gid), timeout=RPC_TIMEOUT)
        time.sleep(0.3)
    stats = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
    assert any(s.group_id == gid for s in stats.sessions), "renewed group was reaped"
    def reaped():  # GetStats does not renew the lease (Heartbeat would)
        stats = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
        return all(s.group_id != gid for s in stats.sessions)
    wait_until(reaped, 10, f"group {gid} to be reaped after its 0.5 s lease")
    assert _status_code(stub.Heartbeat, pb.HeartbeatRequest(group_id=gid)) == grpc.StatusCode.NOT_FOUND
    stats = stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT)
    assert stats.sessions_reaped_total == before + 1
    wait_until(lambda: pid_gone(reply.worker_pid), 10, "the reaped group's worker to exit")
    assert "lease expired" in fake_server.logs() and health_status(fake_server.address) == SERVING


def test_dead_worker_is_reaped(stub, fake_server):
    gid, reply = open_group(stub, lease=60)
    os.kill(reply.worker_pid, signal.SIGKILL)
    wait_until(lambda: _status_code(stub.Heartbeat, pb.HeartbeatRequest(group_id=gid)) == grpc.StatusCode.NOT_FOUND,
               10, f"group {gid} to be reaped after its worker died")
    assert f"session worker pid {reply.worker_pid} was killed by SIGKILL (the server itself is alive)" in \
        fake_server.logs()
    code, details = _status(stub.Heartbeat, pb.HeartbeatRequest(group_id=gid))   # the trainer is told why
    assert code == grpc.StatusCode.NOT_FOUND and "reaped: session worker" in details and "SIGKILL" in details
    other, _ = open_group(stub)  # other groups unaffected; new ones open
    stub.CloseGroup(pb.CloseGroupRequest(group_id=other), timeout=RPC_TIMEOUT)


def test_hung_worker_call_reaps_only_its_group(stub, fake_server):
    gid, reply = open_group(stub, lease=60)
    other, _ = open_group(stub, lease=60)
    try:
        code, details = _status(stub.OpenSession, session_request(gid, kind="hang"))  # worker never answers
        assert code == grpc.StatusCode.UNAVAILABLE and gid in details and "gone" in details, details
        assert _status_code(stub.Heartbeat, pb.HeartbeatRequest(group_id=gid)) == grpc.StatusCode.NOT_FOUND
        wait_until(lambda: pid_gone(reply.worker_pid), 10, "the hung worker to be stopped")
        assert stub.OpenSession(session_request(other), timeout=RPC_TIMEOUT).local_input_nodes > 0
        assert health_status(fake_server.address) == SERVING
    finally:
        stub.CloseGroup(pb.CloseGroupRequest(group_id=other), timeout=RPC_TIMEOUT)


def _status_code(call, request):
    try:
        call(request, timeout=RPC_TIMEOUT)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# ---- the real session worker ----------------------------------------------------------------------

def test_real_worker_group_is_reaped_when_trainer_never_joins(partition_dir, tmp_path):
    """OpenGroup starts a real worker; no trainer ever joins or heartbeats: the lease reaps it."""
    with running_cluster(partition_dir, parts=[0], log_dir=tmp_path) as (server,):
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ControlStub(holding_capabilities(channel))
            with socket.socket() as s:  # a port nobody serves: the worker cannot join
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            reply = stub.OpenGroup(pb.OpenGroupRequest(group_key=KEY, group_id="real", rendezvous=f"127.0.0.1:{port}",
                                                       world_size=3, rank=1, lease_seconds=1.0), timeout=RPC_TIMEOUT)
            assert reply.worker_pid > 0 and reply.worker_name == "part0"
            assert stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).groups_open == 1
            wait_until(lambda: stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).groups_open == 0, 15,
                       "the real worker's group to be reaped (GetStats does not renew the lease)")
            wait_until(lambda: pid_gone(reply.worker_pid), 15, "the real worker process to exit")
            assert stub.GetStats(pb.StatsRequest(), timeout=RPC_TIMEOUT).groups_open == 0
