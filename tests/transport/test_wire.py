"""The secure data path's pieces in one process: the codec, the handshake, frame MACs, the refusal log."""
from __future__ import annotations

import socket
import threading

import pytest
import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.transport import secure, wire
from graphfeed.transport.pending import Pending
from graphfeed.transport.secure import Function, RefusalLog, SecureCalls, SecureServer, new_group_key
from graphfeed.transport.secure.buffers import POOLED_BODY, _with_headroom


def _roundtrip(value):
    header, buffers = wire.encode(value)
    offsets, body_len = wire.layout(buffers)
    body = torch.zeros(body_len, dtype=torch.uint8)
    for o, b in zip(offsets, buffers):
        body[o:o + b.numel()] = b
    header = wire.loads_header(wire.dumps_header(header))
    return wire.decode(header, body, [[o, int(b.numel())] for o, b in zip(offsets, buffers)])


def test_values_tensors_and_records_round_trip():
    value = {"x@_N": torch.randn(5, 3), ("a", "to", "b"): [1, 2.5, None, True, b"\x00k"],
             "bf": torch.ones(2, 2, dtype=torch.bfloat16), "e": torch.empty(0, 4, dtype=torch.int64),
             "flag": torch.tensor([True, False]), "spec": SamplingSpec((5, 3)), "t": (1, "two")}
    got = _roundtrip(value)
    assert got.keys() == value.keys()
    for k, v in value.items():
        assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k
    assert isinstance(got["t"], tuple) and got["spec"] == SamplingSpec((5, 3))


def test_views_of_any_stride_travel_as_their_values():
    # a one-element slice counts as contiguous whatever its stride: its bytes are copied, not viewed
    base = torch.arange(40, dtype=torch.int64).reshape(4, 10)
    value = {"one": base[::2, 3][:1], "col": base[:, 1], "t": base.t()[2:3, 1:2], "row": base[1:2, ::3]}
    assert value["one"].stride() == (20,)
    got = _roundtrip(value)
    for k, v in value.items():
        assert got[k].shape == v.shape and torch.equal(got[k], v), k


def test_what_is_not_allowed_does_not_travel_or_decode():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(wire.WireError, match="cannot travel"):
        wire.encode(Evil())
    with pytest.raises(wire.WireError, match="dtype"):
        wire.encode(torch.zeros(2, dtype=torch.complex64))
    body = torch.zeros(16, dtype=torch.uint8)
    bad = [
        ({"$R": "Popen", "f": {}}, "may not travel"),                          # not a registered record
        ({"$R": "SamplingSpec", "f": {"num_neighbors": {"$t": [5]}, "evil": 1}}, "no field"),
        ({"$T": 0, "d": "object", "s": [2]}, "not allowed"),                   # dtype outside the allow-list
        ({"$T": 0, "d": "float32", "s": [5]}, "needs 20 bytes"),               # shape vs buffer length
        ({"$T": 3, "d": "float32", "s": [1]}, "out of range"),
        ({"__reduce__": 1}, "unknown header object"),
        ({"$R": "SamplingSpec", "f": {"num_neighbors": {"$t": [-7]}}}, "does not validate"),
    ]
    for header, match in bad:
        with pytest.raises(wire.WireError, match=match):
            wire.decode(header, body, [[0, 16]])


def _server(key, **functions):
    refused: list[tuple[str, str]] = []
    table = {"echo": Function(lambda *a: a), "later": Function(lambda: Pending(), True), **functions}
    srv = SecureServer("127.0.0.1", key, table, name="t", on_refused=lambda p, r: refused.append((p, r))).start()
    return srv, refused


def test_calls_answer_holders_of_the_key_and_refuse_the_rest():
    key = new_group_key()
    srv, refused = _server(key, boom=Function(lambda: (_ for _ in ()).throw(ValueError("bad ids 7"))))
    calls = SecureCalls(key, {0: srv.address})
    try:
        big = torch.randn(300_000)
        assert torch.equal(calls.call_sync(0, "echo", (big,), 10)[0], big)
        with pytest.raises(ValueError, match="On part0: ValueError: bad ids 7"):
            calls.call_sync(0, "boom", (), 10)
        with pytest.raises(PermissionError, match="'nope' is not callable"):
            calls.call_sync(0, "nope", (), 10)
        with pytest.raises(TimeoutError, match="timed out"):
            calls.call_sync(0, "later", (), 0.3)
        outsider = SecureCalls(new_group_key(), {0: srv.address})
        with pytest.raises(ConnectionError, match="failed the group proof"):
            outsider.call_sync(0, "echo", (1,), 10)
        outsider.close()
        with socket.create_connection((srv.host, srv.port)) as s:   # a pickle instead of a hello
            s.sendall(b"\x80\x04\x95" + bytes(64))
            try:
                assert s.recv(100) == b""    # dropped unanswered ...
            except ConnectionResetError:
                pass                         # ... or reset (the server closed with bytes unread)
        assert calls.call_sync(0, "echo", (1,), 10) == (1,)          # the group is undisturbed
        for _ in range(50):
            if len(refused) == 2:
                break
            threading.Event().wait(0.1)
        assert len(refused) == 2 and any("not a graphfeed data-path hello" in why for _, why in refused)
    finally:
        calls.close()
        srv.close()


def test_a_tampered_frame_ends_the_connection():
    a, b = socket.socketpair()
    k1, k2 = b"1" * 32, b"2" * 32
    sender, receiver = secure.Connection(a, k2, k1, True, "a"), secure.Connection(b, k1, k2, True, "b")
    sender.send({"k": "ok", "id": 1}, torch.arange(4))
    meta, value = receiver.recv()
    assert meta["id"] == 1 and torch.equal(value, torch.arange(4))
    sender.send({"k": "ok", "id": 2}, torch.arange(4))
    raw = b.recv(1 << 16)          # take the frame off the wire, flip one body byte, put it back
    c, d = socket.socketpair()
    flipped = bytearray(raw)
    flipped[-40] ^= 1
    c.sendall(bytes(flipped))
    replay = secure.Connection(d, k1, k2, True, "d")
    replay._recv_seq = 1
    with pytest.raises(secure.FrameError, match="body failed its MAC"):
        replay.recv()
    e, f = socket.socketpair()
    e.sendall(raw)                  # the same frame again (counter 1 expected 0): a replay
    with pytest.raises(secure.FrameError, match="header failed its MAC"):
        secure.Connection(f, k1, k2, True, "f").recv()
    for s in (a, b, c, d, e, f):
        s.close()


def test_refusals_are_counted_every_time_and_logged_once_per_interval():
    now, lines, counted = [0.0], [], []
    log = RefusalLog(lines.append, lambda: counted.append(1), interval=60.0, clock=lambda: now[0])
    for _ in range(5):
        log("10.0.0.9:1234", "wrong group proof")
    now[0] = 61.0
    log("10.0.0.9:1235", "wrong group proof")
    assert len(counted) == 6 and log.total == 6
    assert len(lines) == 2 and "(1 refused since" in lines[0] and "(5 refused since" in lines[1]


@pytest.mark.parametrize("mac", [True, False])
def test_large_bodies_reuse_receive_buffers_only_once_nothing_views_them(mac):
    a, b = socket.socketpair()
    k1, k2 = b"1" * 32, b"2" * 32
    sender, receiver = secure.Connection(a, k2, k1, mac, "a"), secure.Connection(b, k1, k2, mac, "b")
    n = POOLED_BODY // 4 + 1000        # float32 elements: a body above the pooling size
    values = [torch.full((n,), float(i)) for i in range(4)]
    t = threading.Thread(target=lambda: [sender.send({"k": "ok", "id": i}, v) for i, v in enumerate(values)])
    t.start()
    first = receiver.recv()[1]
    rows = first[:10]                         # a view keeps the first frame's buffer in use
    del first
    second = receiver.recv()[1]
    assert torch.equal(rows, values[0][:10]) and receiver.buffers.reused == 0
    del rows, second                          # both frames' buffers free: the next two reuse them
    third, fourth = receiver.recv()[1], receiver.recv()[1]
    t.join(10)
    assert torch.equal(third, values[2]) and torch.equal(fourth, values[3])
    assert receiver.buffers.reused == 2
    for s in (a, b):
        s.close()


def test_receive_buffers_replace_a_free_buffer_of_another_size():
    buffers = secure.ReceiveBuffers(keep=2)
    small, mid = buffers.take(2 << 20), buffers.take(3 << 20)
    del small
    big = buffers.take(9 << 20)                 # the pool is full: the free 2 MiB buffer makes room
    assert sorted(b.nbytes for b in buffers._owned) == [_with_headroom(3 << 20), _with_headroom(9 << 20)]
    held = buffers.take(9 << 20)                # the 9 MiB one is in use: fresh memory, not pooled
    assert held.data_ptr() != big.data_ptr() and buffers.reused == 0
    del big, mid
    assert buffers.take(9 << 20).numel() == 9 << 20 and buffers.reused == 1
    assert buffers.take(100).numel() == 100 and buffers.reused == 1   # small bodies are never pooled


def test_a_pooled_buffer_has_room_for_a_slightly_larger_next_body():
    buffers = secure.ReceiveBuffers(keep=2)
    n = 120_000_000                             # a medium batch's body; the next ones vary by about 1%
    first = buffers.take(n)
    assert first.numel() == n and buffers._owned[0].nbytes == _with_headroom(n) >= int(n * 1.06)
    ptr = first.data_ptr()
    del first
    larger = buffers.take(n + n // 50)           # 2% larger: fits the free buffer, no fresh pages
    assert larger.numel() == n + n // 50 and larger.data_ptr() == ptr and buffers.reused == 1
    assert _with_headroom(5) == 1 << 20 and _with_headroom(1 << 20) == 2 << 20   # whole MiB
