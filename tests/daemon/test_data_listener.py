"""A worker's secure data listener, saturated, through real daemons: gRPC health's ``graphfeed.data_path`` service
turns NOT_SERVING while the set-up slots are all taken (the daemon's own health stays SERVING), the excess is
closed at once, and both come back once the slots are free -- the trainer's group works throughout."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from helpers.graphs import synthetic_parts

import graphfeed.client as gf
from graphfeed.server.daemon.app import DATA_PATH_SERVICE
from graphfeed.testing.cluster import NOT_SERVING, SERVING, health_status, running_cluster

SLOTS = 2
HEALTH_BOUND = 15.0   # seconds for health to follow (the daemon looks every 5 s)


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return synthetic_parts(tmp_path_factory.mktemp("listener") / "parts", nodes=1000, avg_degree=5, features=8,
                           classes=4, parts=2, name="listener-1000")


def _wait_health(address: str, want: int, what: str) -> None:
    deadline = time.monotonic() + HEALTH_BOUND
    while (got := health_status(address, DATA_PATH_SERVICE)) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"health of {DATA_PATH_SERVICE} at {address} is {got}, not {what}, after "
                                 f"{HEALTH_BOUND:g} s")
        time.sleep(0.2)


def _closed_at_once(host: str, port: int) -> bool:
    """Whether a new connection to ``host:port`` is closed without a byte: reset (which, on a busy host, can
    reach the connect itself before it returns) or ended."""
    try:
        with socket.create_connection((host, port), timeout=5) as extra:
            extra.settimeout(2.0)
            return extra.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.slow
def test_a_saturated_listener_turns_data_path_health_not_serving_until_a_slot_is_free(parts_dir, tmp_path):
    env = {"GRAPHFEED_DATA_HANDSHAKES": str(SLOTS), "GRAPHFEED_DATA_HANDSHAKES_PER_SOURCE": str(SLOTS),
           "GRAPHFEED_DATA_HANDSHAKE_TIMEOUT": "120"}
    with running_cluster(parts_dir, env=env, log_dir=tmp_path) as servers:
        with gf.connect([s.address for s in servers], timeout=60) as client:
            assert client.group.data_path == "secure"
            host, port = client.group.endpoints[0].rsplit(":", 1)
            assert health_status(servers[0].address, DATA_PATH_SERVICE) == SERVING
            idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(SLOTS)]
            try:
                _wait_health(servers[0].address, NOT_SERVING, "NOT_SERVING while both set-up slots are held")
                assert health_status(servers[0].address) == SERVING            # the daemon itself serves
                assert health_status(servers[1].address, DATA_PATH_SERVICE) == SERVING
                assert _closed_at_once(host, int(port))
            finally:
                for s in idle:
                    s.close()
            _wait_health(servers[0].address, SERVING, "SERVING once the slots are free")
            loader = client.neighbor_loader("train", [3, 2], batch_size=32, shuffle=True, seed=1)
            assert sum(1 for _ in loader) == len(loader)
