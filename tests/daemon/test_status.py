"""``graphfeed status`` against real daemons: both up (exit 0), then one killed (a DOWN row, exit 1)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cluster import hermetic_env
from helpers.graphs import synthetic_parts

import graphfeed.client as gf
from graphfeed.cli import status
from graphfeed.testing.cluster import running_cluster

STATUS = (sys.executable, "-m", "graphfeed.cli", "status")
RUN_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("status") / "parts", nodes=1200, avg_degree=6, features=8,
                           classes=4, parts=2, name="status-1200")


def _status_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*STATUS, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=hermetic_env({"GRAPHFEED_TOKEN": ""}))


def _status_json(addresses, capsys) -> tuple[int, list[dict]]:
    parser = argparse.ArgumentParser()
    status.add_arguments(parser)
    code = status.run(parser.parse_args([*addresses, "--json", "--timeout", "10"]))
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_status_rows_for_live_servers_then_a_down_row(parts_dir, tmp_path, capsys):
    with running_cluster(parts_dir, args=("--metrics-port", "0"), log_dir=tmp_path) as servers:
        addresses = [s.address for s in servers]
        with gf.connect(addresses, timeout=60) as client:
            with client.neighbor_loader("train", [3, 2], batch_size=32, seed=2) as loader:
                assert sum(1 for _ in loader) == len(loader)
                per_server = loader.stats()["batches_by_server"]
                code, rows = _status_json(addresses, capsys)
        assert code == 0
        assert [r["server"] for r in rows] == addresses
        for k, (row, server) in enumerate(zip(rows, servers)):
            assert (row["up"], row["health"], row["part"], row["state"]) == (True, "SERVING", f"{k}/2", "serving")
            assert (row["groups"], row["sessions"]) == (1, 1)
            assert row["batches"] == per_server[k] and row["bytes"] > 0
            assert row["buf_batches"] == 0 and row["uptime"] > 0
            assert row["metrics_port"] == server.metrics_port

        done = _status_cli(*addresses)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split()[:3] == ["server", "health", "part"]
        for k, address in enumerate(addresses):
            row = next(line for line in lines if line.startswith(address))
            assert row.split()[1:3] == ["SERVING", f"{k}/2"], row
        assert "2 server(s), 0 down" in done.stdout

        victim = servers[1]
        victim.expect_exit = -signal.SIGKILL
        os.killpg(victim.pid, signal.SIGKILL)  # the daemon and its session workers
        victim.wait(30)
        done = _status_cli(*addresses)
        assert done.returncode == 1, done.stdout + done.stderr
        up = next(line for line in done.stdout.splitlines() if line.startswith(addresses[0]))
        down = next(line for line in done.stdout.splitlines() if line.startswith(addresses[1]))
        assert up.split()[1] == "SERVING"
        assert down.split()[1] == "DOWN" and "unreachable" in down, down
        assert "2 server(s), 1 down" in done.stdout


def test_status_bad_address_is_a_usage_error():
    done = _status_cli("not-an-address")
    assert done.returncode == 2
    assert "not host:port" in done.stderr and "Traceback" not in done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_wait_answers_once_a_server_just_started_serves(parts_dir, tmp_path):
    """``serve`` then at once ``status --wait``: no sleep in between, exit 0 once the daemon serves."""
    port = _free_port()
    with open(tmp_path / "serve.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "graphfeed.cli", "serve", "--partition", str(parts_dir),
                                   "--part", "0", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                  env=hermetic_env({"GRAPHFEED_TOKEN": ""}), start_new_session=True)
    try:
        done = _status_cli("--wait", "50", f"127.0.0.1:{port}")
        assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "serve.log").read_text()[-2000:]
        row = next(line for line in done.stdout.splitlines() if line.startswith(f"127.0.0.1:{port}"))
        assert row.split()[1:3] == ["SERVING", "0/2"], row
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        code = server.wait(60)
    assert code == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_status_wait_gives_up_at_its_bound_naming_the_server(capsys):
    parser = argparse.ArgumentParser()
    status.add_arguments(parser)
    address = f"127.0.0.1:{_free_port()}"    # nobody listens there
    start = time.monotonic()
    code = status.run(parser.parse_args(["--wait", "1.5", "--timeout", "1", address]))
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 1 and 1.5 <= took < 10, took
    assert err.startswith("graphfeed status: error: not SERVING after --wait 1.5 s") and address in err
    assert "unreachable" in err and "graphfeed serve" in err and len(err.strip().splitlines()) == 1, err
    assert "DOWN" in out and "1 server(s), 1 down" in out
    with pytest.raises(ValueError, match="--wait must be 0 or more"):
        status.run(parser.parse_args(["--wait", "-1", address]))


def test_status_counts_a_parts_serving_replicas_and_warns_at_the_last():
    def row(address: str, part: str, health: str) -> status.ServerRow:
        return status.ServerRow(server=address, up=True, health=health, part=part, graph="g")

    rows = [row("a:1", "0/2", "SERVING"), row("b:1", "1/2", "SERVING"), row("c:1", "1/2", "NOT_SERVING"),
            status.ServerRow(server="d:1", up=False, health="DOWN", error="unreachable")]
    table = status.format_table(rows)
    assert "replicas: g part 0 1/1 serving, g part 1 1/2 serving" in table
    assert "warning: g part 1 has one serving replica left" in table
    assert "part 0 has one" not in table   # one server of a part that has no replica is no warning
    rows[2].health = "SERVING"
    assert "warning" not in status.format_table(rows)
    assert "replicas:" not in status.format_table(rows[:2])   # no part served twice: no replica lines
