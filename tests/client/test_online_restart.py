"""Online sampling (``Client.sample``) across a server restart: the call re-forms the group as a loader does.

Its own module: a process holds one client at a time, and ``test_online.py`` keeps one open.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import torch
from helpers.graphs import assert_same_batch

import graphfeed.client as gf
from graphfeed.server.loader.local import sample_nodes
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.format.store import open_parts
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster, start_server

FANOUTS = [4, 3]


def test_sample_after_a_server_restart_reforms_the_group(tmp_path):
    ei, x, y, splits = synth.generate(1000, 6, 8, 4)
    parts_dir = tmp_path / "parts"
    builder.partition_graph(builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4,
                                               fingerprint="online-restart-1000"), 2, parts_dir, method="metis")
    _, parts = open_parts(parts_dir)
    ids = torch.cat([parts[0].orig_id[:5], parts[1].orig_id[:5]])
    want = sample_nodes(parts_dir, ids, FANOUTS, seed=2)
    with running_cluster(parts_dir, log_dir=tmp_path / "logs") as servers:
        with gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=120) as client:
            assert_same_batch(client.sample(ids, FANOUTS, seed=2), want)
            victim = servers[1]
            victim.expect_exit = -signal.SIGKILL
            os.killpg(victim.pid, signal.SIGKILL)        # the daemon and its session workers
            victim.wait(30)
            victim.checked = True
            restarted: list = []

            def restart() -> None:
                time.sleep(1.0)
                restarted.append(start_server(parts_dir, 1, log_dir=tmp_path / "again",
                                              args=("--port", str(victim.port))))

            thread = threading.Thread(target=restart, daemon=True)
            thread.start()
            got = [client.sample(ids, FANOUTS, seed=2) for _ in range(2)]   # one of them finds the dead server
            thread.join(60)
            servers[1] = restarted[0]                    # the cluster's teardown stops the new one
            assert client.reconnects == 1
            for batch in got:
                assert_same_batch(batch, want)
