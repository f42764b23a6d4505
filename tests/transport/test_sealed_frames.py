"""The secure data path with TLS, in one process: the set-up inside TLS, then sealed frames (AES-256-GCM) of every
size, split across reads, tampered, replayed, cut off mid-frame; and the plain frames' gathered sends."""
from __future__ import annotations

import random
import socket
import threading
import time

import pytest
import torch
from helpers.pki import make_pki

from graphfeed.transport import secure
from graphfeed.transport.secure import Function, SecureCalls, SecureServer, TlsServer, client_tls, frames, new_group_key

K1, K2 = b"1" * 32, b"2" * 32


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _sealed_pair(a: socket.socket, b: socket.socket) -> tuple[secure.Connection, secure.Connection]:
    return (secure.Connection(a, K2, K1, mac=False, seal=True, where="a"),
            secure.Connection(b, K1, K2, mac=False, seal=True, where="b"))


def _read_all(sock: socket.socket, sender: threading.Thread) -> bytearray:
    """What ``sender`` writes to the other end of ``sock`` until it is done and nothing more arrives."""
    raw = bytearray()
    sock.settimeout(0.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            raw += sock.recv(1 << 20)
        except socket.timeout:
            if not sender.is_alive():
                return raw
    raise AssertionError("the sender did not finish within 30 s")


def test_the_secure_path_over_tls_seals_frames_of_every_size_concurrently(pki):
    key = new_group_key()
    srv = SecureServer("127.0.0.1", key, {"echo": Function(lambda *a: a)}, name="t",
                       tls=TlsServer(str(pki.server_cert), str(pki.server_key))).start()
    calls = SecureCalls(key, {0: srv.address}, tls=client_tls(str(pki.ca)))
    try:
        conn = calls._client(0)._connection()
        assert conn.seal and not conn.mac and type(conn.sock) is socket.socket   # TLS was left after the set-up
        assert conn.tls_suite is not None and conn.tls_suite[1] in ("TLSv1.2", "TLSv1.3")
        sizes = [0, 1, 3, 4096, 70_000, 3_000_000, 5, 11_000_000]
        values = [torch.randn(n) for n in sizes]
        pending = [calls.call(0, "echo", (v, {"n": len(v)}), 30) for v in values]   # all in flight at once
        for v, p in zip(values, pending):
            got = p.result(60)
            assert torch.equal(got[0], v) and got[1] == {"n": len(v)}
        outsider = SecureCalls(new_group_key(), {0: srv.address}, tls=client_tls(str(pki.ca)))
        with pytest.raises(ConnectionError, match="failed the group proof"):
            outsider.call_sync(0, "echo", (1,), 10)
        outsider.close()
        assert calls.call_sync(0, "echo", (2,), 10) == (2,)
    finally:
        calls.close()
        srv.close()


def test_sealed_frames_show_nothing_in_clear_and_cross_split_reads():
    a, wire_in = socket.socketpair()
    wire_out, b = socket.socketpair()
    sender, receiver = _sealed_pair(a, b)
    secret = b"session-secret-0123456789abcdef"
    rows = torch.arange(300_000, dtype=torch.int32) * 7
    send = threading.Thread(target=sender.send, args=({"k": "ok", "id": 1}, [secret, rows]))
    send.start()   # the frame is larger than a socket pair's buffer
    raw = _read_all(wire_in, send)
    assert secret not in raw and rows[1000:1004].numpy().tobytes() not in raw
    rng = random.Random(5)

    def trickle():   # hand the frame on in pieces of 1..3000 bytes: tags and chunks split across reads
        view = memoryview(raw)
        while view:
            k = rng.randint(1, 3000)
            wire_out.sendall(view[:k])
            view = view[k:]

    t = threading.Thread(target=trickle)
    t.start()
    meta, value = receiver.recv()
    t.join(10)
    assert meta["id"] == 1 and value[0] == secret and torch.equal(value[1], rows)
    for s in (a, b, wire_in, wire_out):
        s.close()


def _sealed_bytes(value) -> bytearray:
    """The bytes of one sealed frame (id 1) carrying ``value``, sent from a thread (a frame may be larger than a
    socket pair's buffer)."""
    a, b = socket.socketpair()
    sender, _ = _sealed_pair(a, b)
    send = threading.Thread(target=sender.send, args=({"k": "ok", "id": 1}, value))
    send.start()
    try:
        return _read_all(b, send)
    finally:
        a.close()
        b.close()


def _sealed_receiver() -> tuple[socket.socket, secure.Connection]:
    """``(writer, receiver)``: what is written to ``writer`` arrives at a sealed connection with the receiving
    end's keys (the caller closes both sockets)."""
    writer, reader = socket.socketpair()
    return writer, secure.Connection(reader, K1, K2, mac=False, seal=True, where="d")


@pytest.mark.parametrize("where, match", [("header", "header failed its tag"), ("body", "body failed its tag")])
def test_a_tampered_sealed_frame_ends_the_connection_before_it_is_decoded(where, match):
    raw = _sealed_bytes(torch.arange(4000))
    raw[frames.PREFIX.size + 3 if where == "header" else len(raw) - 100] ^= 1
    writer, tampered = _sealed_receiver()
    writer.sendall(bytes(raw))
    with pytest.raises(secure.FrameError, match=match):
        tampered.recv()
    writer.close()
    tampered.sock.close()


def test_a_replayed_sealed_frame_fails_its_header_tag():
    raw = bytes(_sealed_bytes(torch.arange(10)))
    writer, replay = _sealed_receiver()
    writer.sendall(raw + raw)                 # the same frame twice: the second has the wrong counter
    assert replay.recv()[0]["id"] == 1
    with pytest.raises(secure.FrameError, match="header failed its tag"):
        replay.recv()
    writer.close()
    replay.sock.close()


def test_a_peer_that_closes_mid_frame_is_a_clear_error_not_a_hang():
    raw = _sealed_bytes(torch.zeros(1 << 20))
    writer, cut = _sealed_receiver()

    def worker():   # three quarters of the body, then the worker goes away
        writer.sendall(bytes(raw[:3 << 20]))
        writer.close()

    t = threading.Thread(target=worker)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="closed in the middle of a frame"):
        cut.recv()
    assert time.monotonic() - t0 < 10
    t.join(10)
    cut.sock.close()


def test_macs_and_seals_are_not_mixed():
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match="not both"):
        secure.Connection(a, K1, K2, mac=True, seal=True, where="a")
    a.close()
    b.close()


class _Trickle:
    """A socket whose sendmsg takes at most ``most`` bytes per call (a full send buffer), recording them."""

    def __init__(self, most: int):
        self.most, self.out, self.calls = most, bytearray(), 0

    def sendmsg(self, buffers):
        self.calls += 1
        left = self.most
        for b in buffers:
            take = bytes(b[:left])
            self.out += take
            left -= len(take)
            if not left:
                break
        return self.most - left


def test_plain_frames_gather_their_pieces_and_survive_partial_sends():
    pieces = [b"prefix", b"", b"header-json", memoryview(bytes(range(256)) * 40), b"mac" * 11, b"\x00" * 5]
    trickle = _Trickle(most=97)
    frames._send_pieces(trickle, pieces)
    assert bytes(trickle.out) == b"".join(bytes(p) for p in pieces)
    whole = _Trickle(most=1 << 30)
    frames._send_pieces(whole, pieces)
    assert whole.calls == 1 and bytes(whole.out) == bytes(trickle.out)
