"""Fuzzing every control RPC of a real daemon: it answers each request with a status and stays SERVING.

Requests are generated from the proto descriptors (every field of every request message,
random values of its type, including extreme integers, NaN and non-ASCII text), plus raw
bytes that are not a valid message at all.  A typed request must get OK or a status that
names the caller's fault or the server's state -- never INTERNAL/UNKNOWN (an unhandled
error) and never a hang.  Bounded: a few dozen examples per RPC, each call with a deadline.
"""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphfeed.client as gf
from graphfeed.proto import control_pb2 as pb
from graphfeed.server.daemon.security import CAPABILITY_HEADER
from graphfeed.server.partition.build import builder
from graphfeed.server.partition.inputs import synth
from graphfeed.testing.cluster import SERVING, health_status, running_cluster

SERVICE = pb.DESCRIPTOR.services_by_name["Control"]
# Drain ends the daemon on purpose (a valid request drains it: test_drain.py); every other RPC is fuzzed
METHODS = {m.name: getattr(pb, m.input_type.name) for m in SERVICE.methods if m.name != "Drain"}
CALL_DEADLINE = 20.0   # seconds; a call that takes longer counts as a hang
EXAMPLES = 25          # per RPC
ACCEPTED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.ALREADY_EXISTS}
FD = pb.OpenSessionRequest.DESCRIPTOR.fields[0].__class__   # FieldDescriptor: its type constants

_SCALARS = {
    FD.TYPE_INT32: st.one_of(st.sampled_from([0, -1, 1, 2, 2**31 - 1, -2**31]), st.integers(-2**31, 2**31 - 1)),
    FD.TYPE_INT64: st.one_of(st.sampled_from([0, -1, 1, 2**40, 2**63 - 1, -2**63]), st.integers(-2**63, 2**63 - 1)),
    FD.TYPE_UINT64: st.one_of(st.sampled_from([0, 1, 2**64 - 1]), st.integers(0, 2**64 - 1)),
    FD.TYPE_DOUBLE: st.floats(allow_nan=True, allow_infinity=True),
    FD.TYPE_BOOL: st.booleans(),
    FD.TYPE_STRING: st.one_of(st.sampled_from(["", "train", "127.0.0.1:1", "_N", "x" * 300]), st.text(max_size=24)),
    FD.TYPE_BYTES: st.binary(max_size=48),
}


@st.composite
def messages(draw, cls, strings=(), ints=(), depth: int = 0):
    """A ``cls`` message with a random subset of its fields set to random values of their types;
    ``strings``/``ints`` are values worth trying too (ids and counts of a live session)."""
    scalars = dict(_SCALARS)
    if strings:
        scalars[FD.TYPE_STRING] = st.one_of(st.sampled_from(list(strings)), _SCALARS[FD.TYPE_STRING])
    if ints:
        for t in (FD.TYPE_INT32, FD.TYPE_INT64):
            scalars[t] = st.one_of(st.sampled_from(list(ints)), _SCALARS[t])
    msg = cls()
    for f in cls.DESCRIPTOR.fields:
        if depth > 2 or not draw(st.booleans()):
            continue
        if f.type == FD.TYPE_MESSAGE:
            sub = getattr(pb, f.message_type.name)
            if f.is_repeated:
                for value in draw(st.lists(messages(sub, strings, ints, depth + 1), max_size=3)):
                    getattr(msg, f.name).add().CopyFrom(value)
            else:
                getattr(msg, f.name).CopyFrom(draw(messages(sub, strings, ints, depth + 1)))
        elif f.is_repeated:
            getattr(msg, f.name).extend(draw(st.lists(scalars[f.type], max_size=6)))
        else:
            setattr(msg, f.name, draw(scalars[f.type]))
    return msg


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ei, x, y, splits = synth.generate(600, 8, 8, 4)
    g = builder.GraphInput(edge_index=ei, x=x, y=y, splits=splits, num_classes=4, fingerprint="fuzz-600")
    out: Path = tmp_path_factory.mktemp("fuzz") / "parts"
    builder.partition_graph(g, 1, out, method="random")
    with running_cluster(out, log_dir=tmp_path_factory.mktemp("logs")) as servers:
        yield servers[0]


@pytest.fixture(scope="module")
def live(server):
    """A real trainer group and session on the server, so fuzzed requests also reach its workers."""
    with gf.connect([server.address], timeout=60, reconnect_timeout=0) as client:
        loader = client.neighbor_loader("train", [3, 2], batch_size=16)
        yield dict(strings=(client.group.group_id, loader.sessions[0]), ints=tuple(loader.counts) + (1, 2),
                   capability=client.servers[0].capability)
        assert len(list(loader)) == len(loader)   # the fuzzing left the session usable


# Live ids are offered only to calls that cannot end the live group or session.
USES_LIVE_IDS = {"Heartbeat", "OpenSession", "StartEpoch"}


def _code(channel: grpc.Channel, method: str, request, capability: bytes = b"") -> grpc.StatusCode:
    call = channel.unary_unary(f"/{SERVICE.full_name}/{method}", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    try:   # as the live trainer: its group's capability, so fuzzed calls on its ids reach its worker
        call(request, timeout=CALL_DEADLINE, metadata=[(CAPABILITY_HEADER, capability)] if capability else None)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_fuzzed_requests_get_a_status_and_server_stays_serving(server, live, method):
    cls = METHODS[method]
    hints = {k: v for k, v in live.items() if k != "capability"} if method in USES_LIVE_IDS else {}
    seen: list[tuple[grpc.StatusCode, str]] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(request=messages(cls, **hints))
    def one(request):
        with grpc.insecure_channel(server.address) as ch:
            code = _code(ch, method, request, live["capability"])
        seen.append((code, str(request)[:200]))
        assert code in ACCEPTED, f"{method}({request}) answered {code.name}"

    one()
    assert seen, "hypothesis ran no example"
    assert health_status(server.address, "graphfeed.control.v1.Control") == SERVING


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(sorted(METHODS)), payload=st.binary(max_size=64))
def test_raw_bytes_get_a_status_and_server_stays_serving(server, method, payload):
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary(f"/{SERVICE.full_name}/{method}", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
        try:
            call(payload, timeout=CALL_DEADLINE)
        except grpc.RpcError as exc:
            assert exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} hung on {payload!r}"
    assert health_status(server.address, "graphfeed.control.v1.Control") == SERVING
