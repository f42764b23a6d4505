"""TLS on the secure data path, in one process: :class:`TlsStream` (memory BIOs, large socket reads) against
Python's own :class:`ssl.SSLSocket`, frames of every size, records split across reads, a peer that stops."""
from __future__ import annotations

import random
import socket
import ssl
import threading
import time

import pytest
import torch
from helpers.pki import make_pki

from graphfeed.transport import secure, tls
from graphfeed.transport.secure import Function, SecureCalls, SecureServer, TlsServer, client_tls, new_group_key
from graphfeed.transport.tls import TlsStream


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_pair(pki, *, server_stream: bool = False, relay_pieces: int = 0, flip_at: int = -1):
    """A connected (client TlsStream, server end) pair: the server end an SSLSocket as a worker's, or a TlsStream.
    ``relay_pieces``: the two ends talk through a relay that hands bytes on in pieces of 1..relay_pieces bytes."""
    if relay_pieces:
        client_raw, server_raw = _relayed(relay_pieces, flip_at)
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        client_raw = socket.create_connection(listener.getsockname()[:2])
        server_raw, _ = listener.accept()
        listener.close()
    ctx = TlsServer(str(pki.server_cert), str(pki.server_key)).context()
    server: list = []

    def accept():
        if server_stream:
            server.append(TlsStream(server_raw, ctx, server_side=True, timeout=10))
        else:
            server.append(ctx.wrap_socket(server_raw, server_side=True))

    t = threading.Thread(target=accept)
    t.start()
    client = TlsStream(client_raw, client_tls(str(pki.ca)), server_side=False, timeout=10)
    t.join(10)
    return client, server[0]


_RELAYS: list = []


@pytest.fixture(autouse=True)
def _close_relays():
    yield
    while _RELAYS:
        pumps, socks = _RELAYS.pop()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in pumps:
            t.join(10)
        for s in socks:
            s.close()


def _relayed(most: int, flip_at: int = -1) -> tuple[socket.socket, socket.socket]:
    """Two sockets joined by pumps that forward in random pieces of 1..most bytes (records split across reads);
    ``flip_at``: the server -> client pump flips one bit of the byte at that offset (a tampered record)."""
    client, a = socket.socketpair()
    server, b = socket.socketpair()

    def pump(src, dst, seed):
        rng = random.Random(seed)
        passed = 0
        try:
            while data := src.recv(1 << 16):
                if src is b and passed <= flip_at < passed + len(data):
                    data = bytearray(data)
                    data[flip_at - passed] ^= 0x10
                passed += len(data)
                view = memoryview(data)
                while view:
                    k = rng.randint(1, most)
                    dst.sendall(view[:k])
                    view = view[k:]
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    pumps = [threading.Thread(target=pump, args=(a, b, 1), daemon=True),
             threading.Thread(target=pump, args=(b, a, 2), daemon=True)]
    for t in pumps:
        t.start()
    _RELAYS.append((pumps, (a, b)))
    return client, server


def _read_exactly(stream, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.recv_into(view[got:], n - got)
        assert k > 0, f"end of stream after {got} of {n} bytes"
        got += k
    return bytes(buf)


@pytest.mark.parametrize("server_stream", [False, True])
def test_bytes_cross_intact_both_ways_in_every_piece_size(pki, server_stream):
    client, server = _tls_pair(pki, server_stream=server_stream)
    rng = random.Random(1)
    pieces = [rng.randbytes(n) for n in (1, 5, 0, 12, 16 << 10, (16 << 10) + 1, 70_000, 3, 1 << 20, 200_001, 7)]
    want = b"".join(pieces)
    t = threading.Thread(target=client.sendall_pieces, args=(pieces,))
    t.start()
    assert _read_exactly(server, len(want)) == want
    t.join(10)
    back = rng.randbytes(5 << 20)          # server -> client: a large body, read in one recv_into call chain
    t = threading.Thread(target=server.sendall, args=(back,))
    t.start()
    assert _read_exactly(client, len(back)) == back
    t.join(10)
    client.close()
    server.close()


def test_records_split_across_socket_reads_reassemble(pki):
    """A relay hands the TLS bytes on in pieces of 1..300 bytes: every record arrives in parts."""
    client, server = _tls_pair(pki, relay_pieces=300)
    data = random.Random(2).randbytes(300_000)
    t = threading.Thread(target=server.sendall, args=(data,))
    t.start()
    assert _read_exactly(client, len(data)) == data
    t.join(10)
    client.sendall(b"ping")
    assert _read_exactly(server, 4) == b"ping"
    client.close()
    server.close()


def test_a_tampered_record_ends_the_stream_with_an_error(pki):
    """One bit flipped on the wire, deep in the data: TLS refuses the record; nothing of it reaches the reader."""
    client, server = _tls_pair(pki, relay_pieces=5000, flip_at=200_000)
    data = random.Random(4).randbytes(400_000)
    t = threading.Thread(target=lambda: _quietly(server.sendall, data))
    t.start()
    buf = bytearray(len(data))
    view, got = memoryview(buf), 0
    with pytest.raises(ssl.SSLError):
        while got < len(data):
            k = client.recv_into(view[got:])
            assert k > 0
            got += k
    assert got < 200_000 and buf[:got] == data[:got]   # what arrived before the tampered record, all of it true
    client.close()
    server.close()
    t.join(10)


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def test_a_tiny_read_buffer_still_reads_records_larger_than_it(pki, monkeypatch):
    monkeypatch.setattr(tls, "READ_CHUNK", 1000)   # far below one 16 KiB record
    client, server = _tls_pair(pki)
    data = random.Random(3).randbytes(100_000)
    t = threading.Thread(target=server.sendall, args=(data,))
    t.start()
    assert _read_exactly(client, len(data)) == data
    t.join(10)
    client.close()
    server.close()


@pytest.mark.parametrize("server_stream", [False, True])
def test_end_of_stream_reads_as_zero_bytes(pki, server_stream):
    client, server = _tls_pair(pki, server_stream=server_stream)
    server.sendall(b"last")
    server.close()
    assert _read_exactly(client, 4) == b"last"
    buf = bytearray(10)
    assert client.recv_into(buf) == 0 and client.recv_into(buf) == 0
    client.close()


def test_a_peer_that_closes_mid_frame_is_a_clear_error_not_a_hang(pki):
    client_sock, server_sock = _tls_pair(pki)
    receiver = secure.Connection(client_sock, b"1" * 32, b"2" * 32, False, "part0")
    sender_keys = (b"2" * 32, b"1" * 32)
    sender = secure.Connection(server_sock, *sender_keys, False, "trainer")
    sender.send({"k": "ok", "id": 1}, torch.arange(10))
    meta, value = receiver.recv()
    assert meta["id"] == 1 and torch.equal(value, torch.arange(10))
    # the next frame: its prefix says 4 MB of body, half of it comes, then the worker goes away
    header = b'{"k":"ok","id":2,"v":null,"b":[]}'
    server_sock.sendall(secure.PREFIX.pack(len(header), 4 << 20) + header + bytes(2 << 20))
    server_sock.close()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match="closed in the middle of a frame"):
        receiver.recv()
    assert time.monotonic() - t0 < 10
    receiver.close()


def test_the_handshake_is_bounded_and_refuses_what_is_not_tls(pki):
    listener = socket.create_server(("127.0.0.1", 0))
    silent = socket.create_connection(listener.getsockname()[:2])
    t0 = time.monotonic()
    with pytest.raises(socket.timeout):   # a listener that never answers the ClientHello
        TlsStream(silent, client_tls(str(pki.ca)), server_side=False, timeout=0.5)
    assert time.monotonic() - t0 < 5
    silent.close()
    listener.accept()[0].close()                    # the silent one
    talker = socket.create_connection(listener.getsockname()[:2])
    peer, _ = listener.accept()
    peer.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 2000)     # not TLS records
    with pytest.raises(ssl.SSLError):
        TlsStream(talker, client_tls(str(pki.ca)), server_side=False, timeout=5)
    for s in (talker, peer, listener):
        s.close()


def test_the_secure_path_over_tls_answers_frames_of_every_size_concurrently(pki):
    key = new_group_key()
    srv = SecureServer("127.0.0.1", key, {"echo": Function(lambda *a: a)}, name="t",
                       tls=TlsServer(str(pki.server_cert), str(pki.server_key))).start()
    calls = SecureCalls(key, {0: srv.address}, tls=client_tls(str(pki.ca)))
    try:
        assert isinstance(calls._client(0)._connection().sock, TlsStream)
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
    secure._send_pieces(trickle, pieces)
    assert bytes(trickle.out) == b"".join(bytes(p) for p in pieces)
    whole = _Trickle(most=1 << 30)
    secure._send_pieces(whole, pieces)
    assert whole.calls == 1 and bytes(whole.out) == bytes(trickle.out)
