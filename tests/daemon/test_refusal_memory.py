"""Refusals keep nothing (issue 35, item 4): requests of 7.8 M repeated ids, each refused, leave the daemon
and its session worker at the memory they had.

A real ``graphfeed serve`` daemon (the default 64 MiB ``max_message_bytes``, so the requests are read and
decoded) and a real session worker; each kind of refusal is made once to warm up, then 10 times, and the
daemon's and the worker's RSS (psutil) must come back within ``SLACK`` of before, each wait bounded.
Before the fix the daemon kept about 130 MB per refused request (the request held in a reference cycle
by gRPC's abort) and the worker about 50 MB per refused online sample (the ids held by a cycle through
the pending result's traceback).
"""
from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import torch
from helpers.graphs import partition_arrays

import graphfeed.client as gf
from graphfeed.client.online import online_spec
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto.convert import open_session_request
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import running_cluster

NUM_IDS = 7_800_000          # the requests: ~13-22 MB on the wire, ~60 MB as int64, more while decoded
REPEATS = 10
SLACK = 30 << 20             # bytes an RSS may end above where it was
SETTLE = 20.0                # seconds to wait for the freed pages to go back (the daemon trims every second)
FANOUTS = [2, 2]


@pytest.fixture(scope="module")
def parts_dir(tmp_path_factory) -> Path:
    return partition_arrays(synth.generate(1000, 8, 8, 4), tmp_path_factory.mktemp("refusals") / "parts",
                            classes=4, parts=1, name="refusal-memory-1000")


@pytest.fixture(scope="module")
def cluster(parts_dir, tmp_path_factory):
    with running_cluster(parts_dir, log_dir=tmp_path_factory.mktemp("logs")) as servers, \
            gf.connect([s.address for s in servers], timeout=60, reconnect_timeout=0) as client:
        yield servers[0], client


@pytest.fixture(scope="module")
def repeated_ids() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 1000, NUM_IDS)


def _open_session_call(server, client, request: pb.OpenSessionRequest):
    """One raw OpenSession of ``request`` (serialized once) with the client's group capability on
    ``server``: its status code and details."""
    metadata = next(s.metadata for s in client.servers if s.address == server.address)
    data = request.SerializeToString()
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1)])
    call = channel.unary_unary("/graphfeed.control.v1.Control/OpenSession",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)

    def once() -> str:
        try:
            call(data, timeout=120, metadata=metadata)
        except grpc.RpcError as err:
            return f"{err.code().name}: {err.details()}"
        return "accepted"
    return once


def _base_request(client) -> pb.OpenSessionRequest:
    return open_session_request(online_spec(FANOUTS, replace=False, direction="in", weight_attr=None,
                                            feature_dtype=None), client.group.group_id)


def _refusals(server, client, ids: np.ndarray) -> dict:
    """Each kind of refused request: a call making one, returning what the caller saw."""
    repeated = pb.OpenSessionRequest()
    repeated.CopyFrom(_base_request(client))
    repeated.node_ids.ClearField("ids")
    repeated.node_ids.ids.extend(ids.tolist())
    times = pb.OpenSessionRequest()
    times.CopyFrom(_base_request(client))
    times.node_ids.ClearField("ids")
    times.node_ids.ids.extend(range(1000))
    times.input_time.extend(ids.tolist())
    cached = pb.OpenSessionRequest()   # decoded in full before it is refused (unsorted ids, no type to count)
    cached.CopyFrom(_base_request(client))
    cached.feature_cache.node_ids.extend(ids.tolist())
    tensor = torch.from_numpy(ids)

    def sample() -> str:   # past the client's own check, as a foreign client would send it
        spec = online_spec(FANOUTS, replace=False, direction="in", weight_attr=None, feature_dtype=None)
        sessions = client._online._sessions_for(spec)
        try:
            client.group.channel.sample(0, sessions.ids[0], sessions.secrets[0], tensor, 0).result(timeout=120)
        except Exception as exc:  # noqa: BLE001 -- the worker's refusal, checked by the caller
            return f"{type(exc).__name__}: {exc}"
        return "accepted"
    return {"OpenSession node_ids": (_open_session_call(server, client, repeated), "INVALID_ARGUMENT: node_ids has"),
            "OpenSession input_time": (_open_session_call(server, client, times), "INVALID_ARGUMENT: input_time has"),
            "OpenSession feature_cache": (_open_session_call(server, client, cached), "sorted and distinct"),
            "online sample": (sample, "repeats id")}


def _settled(procs: dict[str, psutil.Process], before: dict[str, int]) -> dict[str, int]:
    """Each process's RSS growth once it is within SLACK (or SETTLE seconds passed)."""
    deadline = time.monotonic() + SETTLE
    while True:
        grown = {name: p.memory_info().rss - before[name] for name, p in procs.items()}
        if all(g <= SLACK for g in grown.values()) or time.monotonic() > deadline:
            return grown
        time.sleep(0.5)


def test_ten_refusals_of_each_kind_leave_the_daemon_and_the_worker_memory_as_it_was(cluster, repeated_ids):
    server, client = cluster
    procs = {"daemon": psutil.Process(server.pid),
             "worker": psutil.Process(int(client.servers[0].extra["worker_pid"]))}
    kinds = _refusals(server, client, repeated_ids)
    for name, (refuse, expected) in kinds.items():   # warm-up: gRPC's and torch's own buffers and threads
        seen = refuse()
        assert expected in seen, f"{name}: expected a refusal with {expected!r}, got {seen[:300]!r}"
    for name, (refuse, expected) in kinds.items():
        before = {p: proc.memory_info().rss for p, proc in procs.items()}
        for _ in range(REPEATS):
            seen = refuse()
            assert expected in seen, f"{name}: {seen[:300]!r}"
        grown = _settled(procs, before)
        assert all(g <= SLACK for g in grown.values()), \
            f"{REPEATS} refused {name} requests of {NUM_IDS:,} ids left " + \
            ", ".join(f"the {p} {g / 2**20:+.0f} MiB" for p, g in grown.items()) + f" (allowed {SLACK >> 20} MiB)"
    assert client.sample(torch.arange(10), FANOUTS).batch_size == 10   # still serving
