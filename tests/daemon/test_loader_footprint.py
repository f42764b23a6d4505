"""Budgets that mean "servable" (issue 35, item 7): a loader's whole footprint in its session worker
(producers' working sets + buffered batches) is checked at OpenSession against what one loader may
use -- here a configured small ``loader_memory`` -- and refused naming the estimate, the limit, where it
came from and the settings to change; a smaller loader on the same server is served, and the server
and the worker stay up.  A real daemon and session worker on loopback."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from helpers.graphs import partition_arrays

import graphfeed.client as gf
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

LOADER_MEMORY = 16 << 20


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return partition_arrays(synth.generate(1000, 8, 8, 4), tmp_path_factory.mktemp("footprint") / "parts",
                            classes=4, parts=1, name="footprint-1000")


def test_a_loader_whose_footprint_exceeds_the_limit_is_refused_and_a_smaller_one_served(parts_dir, tmp_path):
    env = {"GRAPHFEED_LOADER_MEMORY": str(LOADER_MEMORY)}
    with running_cluster(parts_dir, env=env, log_dir=tmp_path / "logs") as servers, \
            gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=0) as client:
        worker = psutil.Process(int(client.servers[0].extra["worker_pid"]))
        # 128 disjoint 3-hop samples: ~10 MB batches, x (2 producers x 2 + 8 buffered) > 16 MiB
        with pytest.raises(gf.ServerError, match=r"RESOURCE_EXHAUSTED.*may hold up to [\d,]+ bytes in its session "
                                                 r"worker \([\d,]+ bytes per batch \(batch estimate.*2 producers.*"
                                                 r"8 buffered\)\), more than the 16,777,216 bytes a loader may use on "
                                                 r"this server \(loader_memory in the server config\).*batch_size.*"
                                                 r"num_producers, buffer_bytes or buffer_batches.*loader_memory"):
            client.neighbor_loader("train", [10, 10, 10], batch_size=128, disjoint=True)
        assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
        loader = client.neighbor_loader("train", [4, 2], batch_size=16)
        batches = list(loader)
        assert len(batches) == len(loader) > 0 and all(b.batch_size <= 16 for b in batches)
        assert servers[0].proc.poll() is None and worker.is_running()
