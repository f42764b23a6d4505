"""Hardening (issue 26): work budgets, worker death, refused requests, session leaks, leases, rendezvous.

Real ``graphfeed serve`` daemons on loopback (port 0) with real session workers, a 1,000-node
graph in 2 parts; each test bounds its waits and checks the error text.
"""
from __future__ import annotations

import gc
import os
import signal
import socket
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
