"""One authenticated socket of the secure data path: frames out (:meth:`Connection.send`) and in
(:meth:`Connection.recv`)."""
from __future__ import annotations

import hmac
import queue
import select
import socket
import threading
from typing import Any, Callable

import torch
from cryptography.exceptions import InvalidTag

from graphfeed.transport import wire
from graphfeed.transport.secure.buffers import ReceiveBuffers
from graphfeed.transport.secure.frames import (
    BODY_TAG,
    MAX_BODY,
    MAX_HEADER,
    PREFIX,
    SEAL_CHUNK,
    SEAL_SLACK,
    SEAL_TAG,
    FrameError,
    _body_key,
    _body_mac,
    _body_tag,
    _decoded,
    _gcm,
    _seal_key,
    _SealedOut,
    _send_pieces,
)
from graphfeed.transport.secure.handshake import MAC, recv_exact
from graphfeed.transport.secure.keys import REKEY_BYTES, REKEY_FRAMES, TRAINER, ratchet

CHUNK = 16 << 20              # bytes per recv_into
RECV_LOWAT = 4 << 20          # bytes a frame's reader waits for per wake-up (SO_RCVLOWAT; capped at tcp_rmem[2] / 2)


class Connection:
    """One authenticated socket: :meth:`send` (thread-safe) and :meth:`recv` (one reader thread).

    ``party``: the other end's party (:mod:`.keys`), proven at the set-up.  Each direction's key is replaced by
    :func:`~.keys.ratchet` of it after :attr:`rekey_frames` frames or :attr:`rekey_bytes` bytes (header and body
    lengths, which both ends read from the prefixes): the sender after the frame that reaches the limit, the
    receiver after reading that frame -- the same frame, no message about it.

    ``pooled``: large bodies received into reused buffers (:class:`.buffers.ReceiveBuffers`) -- a client's
    connection, which receives batch after batch; a server's receives requests, mostly small, and a large one
    (an online sample of millions of ids) is freed once answered or refused rather than kept for the next."""

    rekey_frames = REKEY_FRAMES
    rekey_bytes = REKEY_BYTES

    def __init__(self, sock, recv_key: bytes, send_key: bytes, mac: bool, where: str, seal: bool = False,
                 party: int = TRAINER, max_header: int = MAX_HEADER, max_body: int = MAX_BODY,
                 pooled: bool = True):
        if mac and seal:
            raise ValueError("a connection's frames are MACed or sealed, not both")
        self.sock, self.where, self.mac, self.seal, self.party = sock, where, mac, seal, party
        self.max_header, self.max_body = max_header, max_body   # checked from a frame's prefix, before any read
        self._sent = [0, 0]       # frames, bytes under the current send key
        self._received = [0, 0]   # frames, bytes under the current receive key
        self.rekeys = [0, 0]      # keys replaced: sending, receiving
        self.tls_suite: tuple | None = None   # (name, protocol, bits) of the TLS set-up, on a client's connection
        self._recv_key, self._send_key = recv_key, send_key
        self._recv_body_key, self._send_body_key = _body_key(recv_key), _body_key(send_key)
        if seal:
            self._recv_seal, self._send_seal = _seal_key(recv_key), _seal_key(send_key)
            self._scratch_in = memoryview(bytearray(SEAL_CHUNK))
            self._scratch_out = bytearray(SEAL_CHUNK + SEAL_SLACK)
        self._recv_seq, self._send_seq = 0, 0
        self._lowat = 1   # the socket's SO_RCVLOWAT (0: cannot be set)
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self.buffers = ReceiveBuffers() if pooled else ReceiveBuffers(keep=0)
        self._send_lock = threading.Lock()
        self.closed = False
        self._outbox: queue.SimpleQueue | None = None

    def start_sender(self, name: str) -> None:
        """Send the answers queued by :meth:`post` from one thread of this connection, so the thread that
        completes an answer (a producer finishing a batch) never waits for the network."""
        self._outbox = queue.SimpleQueue()
        threading.Thread(target=self._drain, name=name, daemon=True).start()

    def post(self, meta: dict, value: Any, call_id: int) -> None:
        if self._outbox is None:
            _send_now(self, meta, value, call_id)
        else:
            self._outbox.put((meta, value, call_id))

    def _drain(self) -> None:
        assert self._outbox is not None
        while (item := self._outbox.get()) is not None:
            _send_now(self, *item)

    def send(self, meta: dict, value: Any = None) -> None:
        vh, buffers = wire.encode(value)
        offsets, body_len = wire.layout(buffers)
        header = wire.dumps_header(dict(meta, v=vh, b=[[o, int(b.numel())] for o, b in zip(offsets, buffers)]))
        if len(header) > MAX_HEADER:
            raise wire.WireError(f"a frame's header of {len(header)} bytes exceeds {MAX_HEADER}")
        prefix = PREFIX.pack(len(header), body_len)
        body: list = []
        for b in buffers:
            n = int(b.numel())
            if n:
                body.append(b.numpy().data)
            pad = wire._aligned(n) - n
            if pad:
                body.append(bytes(pad))
        if self.seal:
            self._send_sealed(prefix, header, body)
            return
        with self._send_lock:
            pieces: list = [prefix, header]
            if self.mac:
                seq = self._send_seq.to_bytes(8, "big")
                pieces.append(hmac.digest(self._send_key, seq + b"h" + prefix + header, "sha256"))
                body.append(_body_tag(self._send_body_key, seq, body))
            self._send_seq += 1
            self._count_sent(len(header) + body_len)
            _send_pieces(self.sock, pieces + body)

    def recv(self) -> tuple[dict, Any]:
        """The next frame's ``(header, value)``; FrameError (drop the connection) when it does not authenticate."""
        prefix = recv_exact(self.sock, PREFIX.size)
        header_len, body_len = PREFIX.unpack(prefix)
        if header_len > self.max_header or body_len > self.max_body:
            raise FrameError(f"a frame of {header_len} + {body_len} bytes (header + body) exceeds this end's limits "
                             f"({self.max_header} + {self.max_body}); it was not read")
        if self.seal:
            header, body = self._recv_sealed(prefix, header_len, body_len)
            return _decoded(header, body, body_len)
        header = recv_exact(self.sock, header_len)
        seq = self._recv_seq.to_bytes(8, "big")
        if self.mac:   # the header (and the body's length) is checked before the body is allocated
            got = recv_exact(self.sock, MAC)
            if not hmac.compare_digest(got, hmac.digest(self._recv_key, seq + b"h" + prefix + header, "sha256")):
                raise FrameError("a frame's header failed its MAC (tampered, replayed or reordered)")
        body = self.buffers.take(body_len)
        mac = _body_mac(self._recv_body_key, seq) if self.mac else None
        if body_len:   # MAC'd piece by piece as it arrives, while the piece is in cache
            self._recv_into(body.numpy().data, None if mac is None else mac.authenticate_additional_data)
        if mac is not None:
            got = recv_exact(self.sock, BODY_TAG)
            mac.finalize()
            if not hmac.compare_digest(got, mac.tag):
                raise FrameError("a frame's body failed its MAC (tampered)")
        self._recv_seq += 1
        self._count_received(header_len + body_len)
        return _decoded(header, body, body_len)

    # ---- sealed frames (TLS configured: AES-256-GCM under keys agreed inside TLS) -------------------------

    def _send_sealed(self, prefix: bytes, header: bytes, body: list) -> None:
        with self._send_lock:
            seq = self._send_seq.to_bytes(8, "big")
            self._send_seq += 1
            out = _SealedOut(self.sock, self._scratch_out)
            head = _gcm(self._send_seal, seq + b"head").encryptor()
            head.authenticate_additional_data(prefix)
            out.raw(prefix)
            out.seal(head, header)
            head.finalize()
            out.raw(head.tag)
            sealer = _gcm(self._send_seal, seq + b"body").encryptor()
            for piece in body:
                out.seal(sealer, piece)
            sealer.finalize()
            out.raw(sealer.tag)
            out.flush()
            self._count_sent(sum(PREFIX.unpack(prefix)))

    def _recv_sealed(self, prefix: bytes, header_len: int, body_len: int) -> tuple[bytes, torch.Tensor]:
        """The header (its tag checked before it is parsed) and the body (its tag checked before it is decoded),
        decrypted straight into a (reused) receive buffer from 1 MiB socket reads."""
        seq = self._recv_seq.to_bytes(8, "big")
        sealed = recv_exact(self.sock, header_len + SEAL_TAG)
        head = _gcm(self._recv_seal, seq + b"head", sealed[header_len:]).decryptor()
        head.authenticate_additional_data(prefix)
        try:
            header = head.update(sealed[:header_len]) + head.finalize()
        except InvalidTag:
            raise FrameError("a frame's header failed its tag (tampered, replayed or reordered)") from None
        slack = SEAL_SLACK
        whole = self.buffers.take(body_len + slack)
        opener = _gcm(self._recv_seal, seq + b"body").decryptor()
        target, scratch = whole.numpy().data, self._scratch_in
        got = 0
        while got < body_len:
            k = min(len(scratch), body_len - got)
            self._recv_into(scratch[:k])
            opener.update_into(scratch[:k], target[got:got + k + slack])
            got += k
        tag = recv_exact(self.sock, SEAL_TAG)
        try:
            opener.finalize_with_tag(tag)
        except InvalidTag:
            raise FrameError("a frame's body failed its tag (tampered)") from None
        self._recv_seq += 1
        self._count_received(header_len + body_len)
        return header, whole[:body_len]

    # ---- rekey -----------------------------------------------------------------------------------------

    def _due(self, counts: list[int], nbytes: int) -> bool:
        counts[0] += 1
        counts[1] += nbytes
        if counts[0] < self.rekey_frames and counts[1] < self.rekey_bytes:
            return False
        counts[0] = counts[1] = 0
        return True

    def _count_sent(self, nbytes: int) -> None:
        """After a frame went out (under the send lock): the next send key when this frame reached a limit."""
        if self._due(self._sent, nbytes):
            self._send_key = ratchet(self._send_key)
            self._send_body_key = _body_key(self._send_key)
            if self.seal:
                self._send_seal = _seal_key(self._send_key)
            self.rekeys[0] += 1

    def _count_received(self, nbytes: int) -> None:
        if self._due(self._received, nbytes):
            self._recv_key = ratchet(self._recv_key)
            self._recv_body_key = _body_key(self._recv_key)
            if self.seal:
                self._recv_seal = _seal_key(self._recv_key)
            self.rekeys[1] += 1

    def _recv_into(self, view: memoryview, each: Callable[[memoryview], Any] | None = None) -> None:
        """Fill ``view`` (part of a frame whose length the prefix announced) from the socket.

        The reader is woken once per :data:`RECV_LOWAT` bytes queued rather than for every packet that arrives:
        a trainer receiving a 100 MB batch across hosts otherwise wakes, copies a few tens of KB and sleeps again
        thousands of times per batch (about a third of its receive CPU).  It drains what is queued without
        blocking, then polls with the socket's low-water mark (``SO_RCVLOWAT``) set to at most the bytes still
        due in ``view``: bytes the sender has committed to, so every wait ends (a closed or reset connection
        wakes it whatever the mark).  A blocking ``recv`` would not do: it counts the bytes it already copied
        against the mark's wake-up, and waits for more than the frame still holds.  The mark is 1 again when
        the frame's bytes are in, where nothing more is due.  ``each``: called with every piece as it is received
        (what was queued at a wake-up, up to a low-water mark's worth or so: still in the last-level cache)."""
        got, n = 0, len(view)
        try:
            while got < n:
                left = n - got
                try:
                    k = self.sock.recv_into(view[got:got + min(CHUNK, left)], 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    self._set_lowat(min(RECV_LOWAT, left))
                    self._poll.poll()
                    continue
                if k == 0:
                    raise ConnectionError(f"connection to {self.where} closed in the middle of a frame")
                if each is not None:
                    each(view[got:got + k])
                got += k
        finally:
            self._set_lowat(1)

    def _set_lowat(self, nbytes: int) -> None:
        if nbytes == self._lowat or self._lowat == 0:
            return
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError:   # not settable here: the poll wakes per packet, as a plain recv does
            self._lowat = 0
            return
        self._lowat = nbytes

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._outbox is not None:
            self._outbox.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def _send_now(conn: Connection, meta: dict, value: Any, call_id: int) -> None:
    if conn.closed:
        return
    try:
        conn.send(meta, value)
    except wire.WireError as exc:   # an answer the codec refuses: a bug, said to the caller
        kind, message = wire.error_fields(exc)
        _send_now(conn, {"k": "err", "id": call_id, "type": kind, "msg": message}, None, call_id)
    except OSError:
        pass   # the caller went away
