"""``graphfeed drain ADDRESS``: the Drain call starts the daemon's own drain (as SIGTERM does), from afar.

Real daemons (2 parts, 1200 nodes): an idle one drained with ``--wait`` exits 0; a trainer on a drained one is
served through the grace and then told the server is shutting down; a signal after a Drain joins its drain; on
a daemon with an admin token only that token drains.  The ``--wait`` bound and an older server are checked
against stand-in control servers.
"""
from __future__ import annotations

import itertools
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from helpers import TESTS
from helpers.cluster import hermetic_env
from helpers.graphs import synthetic_parts

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.daemon.exitcodes import ExitCode
from graphfeed.testing.cluster import (
    CONTROL_SERVICE,
    NOT_SERVING,
    SERVING,
    health_status,
    running_cluster,
    wait_for_health,
)

DRAIN = (sys.executable, "-m", "graphfeed.cli", "drain")
FAKE_SERVE = (sys.executable, str(TESTS / "helpers" / "fake_worker.py"))   # graphfeed serve, stand-in workers
RUN_TIMEOUT = 90.0     # seconds: one CLI run (its --wait included)
EXIT_WAIT = 30.0       # seconds: a drained daemon's exit, past its grace
GRACE = 3              # seconds: --drain-grace-seconds of the daemons a trainer holds
FANOUTS = [4, 2]


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("drain") / "parts", nodes=1200, avg_degree=6, features=8,
                           classes=4, parts=2, name="drain-1200")


def _drain_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DRAIN, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=hermetic_env({"GRAPHFEED_TOKEN": "", **(env or {})}))


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _events(log: str, event: str) -> list[str]:
    return [line for line in log.splitlines() if f"event={event} " in line or line.endswith(f"event={event}")]


def test_drain_wait_stops_an_idle_daemon_which_exits_0(parts_dir, tmp_path):
    with running_cluster(parts_dir, parts=[0], log_dir=tmp_path) as (server,):
        started = time.monotonic()
        done = _drain_cli(server.address, "--wait", "60", "--reason", "upgrade to 1.2")
        assert done.returncode == 0, done.stdout + done.stderr + server.log_tail()
        assert done.stderr == "", done.stderr
        assert done.stdout.splitlines() == [
            f"{server.address} draining: its open groups are served up to 20 s (drain_grace_seconds), then it exits",
            f"{server.address} gone"]
        assert server.wait(EXIT_WAIT) == 0, server.log_tail()
        assert time.monotonic() - started < 60, "an idle daemon has no group to wait for"
        log = server.logs()
        [requested] = _events(log, "drain_requested")
        assert 'reason="upgrade to 1.2"' in requested and "peer=ipv4:127.0.0.1:" in requested, requested
        assert "started=true" in requested and "grace_seconds=20.0" in requested, requested
        assert len(_events(log, "drain_start")) == 1 and "exitcode=0" in _events(log, "shutdown")[0], log


def _endless(loader):
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def _served_in_grace(stub: pb_grpc.ControlStub, batches, drained: float) -> bool:
    """Pull (both servers' batches, in the loader's order) until the drained server has served one more batch,
    as its GetStats says; False if the grace is nearly over first (half a second left)."""
    at_drain = stub.GetStats(pb.StatsRequest(), timeout=10).batches_served_total
    while time.monotonic() - drained < GRACE - 0.5:
        next(batches)
        stats = stub.GetStats(pb.StatsRequest(), timeout=10)
        assert stats.state == "draining", stats
        if stats.batches_served_total > at_drain:
            return True
    return False


def test_a_trainer_is_served_through_the_grace_then_told_the_server_is_shutting_down(parts_dir, tmp_path):
    """The drain keeps the trainer's pulls served for the grace, then its sessions end and it gets the
    "is shutting down" ServerError at once (not after reconnect_timeout); a second Drain answers the same
    and does not restart the grace."""
    args = ("--drain-grace-seconds", str(GRACE), "--lease-seconds", "4")   # heartbeats every 1 s
    with running_cluster(parts_dir, log_dir=tmp_path, args=args) as servers:
        victim = servers[1]
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=30) as client, \
                grpc.insecure_channel(victim.address) as channel:
            stub = pb_grpc.ControlStub(channel)
            batches = _endless(client.neighbor_loader("test", FANOUTS, batch_size=48, prefetch=1))
            next(batches)
            drained = time.monotonic()
            done = _drain_cli(victim.address, "--reason", "rolling upgrade")
            assert done.returncode == 0, done.stdout + done.stderr
            assert _one_line(done.stdout) == (f"{victim.address} draining: its open groups are served up to {GRACE} s "
                                              f"(drain_grace_seconds), then it exits")
            again = stub.Drain(pb.DrainRequest(reason="again"), timeout=10)   # idempotent: the same answer
            assert (again.state, again.grace_seconds) == ("draining", GRACE)
            assert _served_in_grace(stub, batches, drained), \
                f"the drained server served no batch within its grace ({time.monotonic() - drained:.1f} s after it)"
            with pytest.raises(gf.ServerError, match="is shutting down") as err:
                for _ in itertools.islice(batches, 1000):   # read slowly: the grace ends meanwhile
                    time.sleep(0.2)
            ended = time.monotonic() - drained
            assert f"{victim.address} part 1" in str(err.value) and client.reconnects == 0
            assert ended < GRACE + 20, f"the trainer ended {ended:.1f} s after the drain, not after reconnect_timeout"
        assert victim.wait(EXIT_WAIT) == 0, victim.log_tail()
        log = victim.logs()
        assert [("started=true" in line, "started=false" in line) for line in _events(log, "drain_requested")] == \
            [(True, False), (False, True)], log
        assert len(_events(log, "drain_start")) == 1, "the second Drain started no second drain"
        assert _events(log, "drain_timeout"), "the trainer's group was stopped at the end of the grace"


def test_a_signal_after_a_drain_call_joins_its_drain_and_a_second_signal_forces_exit(parts_dir, tmp_path):
    """A Drain call counts as no signal: systemd's SIGTERM after `graphfeed drain` waits for the same drain;
    only a second signal forces exit (130).  Stand-in session workers: the group only holds the drain."""
    args = ("--drain-grace-seconds", "600")
    with running_cluster(parts_dir, parts=[0], log_dir=tmp_path, args=args, command=FAKE_SERVE) as (server,):
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.ControlStub(channel)
            stub.OpenGroup(pb.OpenGroupRequest(group_id="held", group_key=secrets.token_bytes(32), world_size=3,
                                               rank=1, lease_seconds=600), timeout=30)
            assert stub.Drain(pb.DrainRequest(), timeout=10).grace_seconds == 600
        wait_for_health(server.address, NOT_SERVING, CONTROL_SERVICE, timeout=20)
        server.signal(signal.SIGTERM)
        _wait_for_log(server, 'event=signal signal=SIGTERM action="drain (already draining)"')
        assert server.proc.poll() is None, "the first signal after a Drain call must not force exit"
        server.expect_exit = ExitCode.FORCED
        server.signal(signal.SIGTERM)
        assert server.wait(EXIT_WAIT) == ExitCode.FORCED, server.log_tail()
        assert len(_events(server.logs(), "drain_start")) == 1


def _wait_for_log(server, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.logs():
        assert time.monotonic() < deadline, f"no {text!r} in the log within {timeout:g} s:\n{server.log_tail()}"
        time.sleep(0.05)


def _token_file(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def test_with_an_admin_token_only_the_admin_token_drains(parts_dir, tmp_path):
    trainers, admin, team = (secrets.token_hex(32) for _ in range(3))
    trainers_file = _token_file(tmp_path / "token", trainers)
    admin_file = _token_file(tmp_path / "admin-token", admin)
    env = {"GRAPHFEED_ADMIN_TOKEN_FILE": str(admin_file), "GRAPHFEED_TOKENS": f"vision: {team}"}
    with running_cluster(parts_dir, parts=[0], log_dir=tmp_path, args=("--token-file", str(trainers_file)),
                         env=env) as (server,):
        denied = [_drain_cli(server.address, "--token-file", str(trainers_file)),
                  _drain_cli(server.address, env={"GRAPHFEED_TOKEN": team})]
        for done in denied:
            assert done.returncode == 1, done.stdout + done.stderr
            line = _one_line(done.stderr)
            assert line.startswith(f"graphfeed drain: error: {server.address}: PERMISSION_DENIED: Drain needs the "
                                   f"operators' admin token"), line
            assert "--token-file ADMIN_TOKEN_FILE" in line and trainers not in line and team not in line, line
        nothing = _drain_cli(server.address)
        assert nothing.returncode == 1, nothing.stdout + nothing.stderr
        assert "no authorization metadata" in _one_line(nothing.stderr) and "give --token-file" in nothing.stderr
        with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControlStub(channel).Drain(pb.DrainRequest(reason="x" * 201), timeout=10,
                                               metadata=[("authorization", f"Bearer {admin}")])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
        assert "the drain reason has 201 characters: give at most 200" in refused.value.details()
        assert health_status(server.address, CONTROL_SERVICE) == SERVING
        assert _stats_state(server.address, admin) == "serving"
        assert len(_events(server.logs(), "request_refused")) == 3 and not _events(server.logs(), "drain_requested")

        done = _drain_cli(server.address, "--token-file", str(admin_file), "--wait", "60")
        assert done.returncode == 0, done.stdout + done.stderr + server.log_tail()
        assert done.stdout.splitlines()[-1] == f"{server.address} gone"
        assert server.wait(EXIT_WAIT) == 0, server.log_tail()
        assert len(_events(server.logs(), "drain_requested")) == 1


def _stats_state(address: str, token: str) -> str:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ControlStub(channel).GetStats(
            pb.StatsRequest(), timeout=10, metadata=[("authorization", f"Bearer {token}")]).state


# ---- the CLI's bounds and wording, against stand-in control servers ----------------------------------------

class DrainsButStays(pb_grpc.ControlServicer):
    """Answers Drain as a daemon does and never goes away: a server whose open groups hold it up."""

    def Drain(self, request, context):
        return pb.DrainReply(state="draining", grace_seconds=30)


@contextmanager
def _stand_in(servicer: pb_grpc.ControlServicer):
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_ControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_wait_gives_up_at_its_bound_naming_the_server_still_up():
    with _stand_in(DrainsButStays()) as address:
        started = time.monotonic()
        done = _drain_cli(address, "--wait", "1.5")
        took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith(f"{address} draining: its open groups are served up to 30 s"), done.stdout
    assert _one_line(done.stderr) == (f"graphfeed drain: error: {address} is still up after --wait 1.5 s (its port "
                                      f"accepts connections; its grace is 30 s): wait longer, or read its log")
    assert took < 1.5 + 20, f"the wait took {took:.1f} s"


def test_a_server_without_drain_says_to_use_sigterm():
    with _stand_in(pb_grpc.ControlServicer()) as address:
        done = _drain_cli(address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _one_line(done.stderr) == (f"graphfeed drain: error: {address}: this server has no Drain call (an older "
                                      f"graphfeed): stop it with SIGTERM on its host")


def test_bad_arguments_are_usage_errors_and_nobody_listening_is_one_line():
    nobody = "127.0.0.1:1"
    for args, says in [(("not-an-address",), "server address 'not-an-address' is not host:port"),
                       (("cluster.yaml",), "cluster.yaml is a cluster file: drain takes one server's HOST:PORT"),
                       ((nobody, "--wait", "-1"), "--wait must be 0 or more seconds"),
                       ((nobody, "--wait", "nan"), "--wait must be 0 or more seconds (a finite number), got nan"),
                       ((nobody, "--timeout", "0"), "--timeout must be a positive number of seconds"),
                       ((nobody, "--reason", "x" * 201), "the drain reason has 201 characters: give at most 200"),
                       ((nobody, "--reason", "two\nlines"), "the drain reason holds control characters")]:
        done = _drain_cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert _one_line(done.stderr).startswith(f"graphfeed drain: error: {says}"), done.stderr
    with _stand_in(pb_grpc.ControlServicer()) as address:
        pass   # a port nobody listens on any more
    done = _drain_cli(address, "--timeout", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _one_line(done.stderr).startswith(f"graphfeed drain: error: {address}: unreachable: "), done.stderr
