"""The secure data path: authenticated (and, with TLS, encrypted) calls to session workers -- no pickle.

Used when a daemon has a token or TLS configured (or ``data_path: secure``): then no torch RPC,
TensorPipe or TCPStore listener exists; a session worker listens here instead, on its daemon's
data address (port 0), and the trainer and the peer workers connect to it.

Connection set-up (each TCP connection; inside TLS when the daemon has a certificate):

1. client -> server: ``GFDP`` + version byte + 32-byte fresh nonce ``cn``   (37 bytes)
2. server -> client: ``GFDP`` + version byte + fresh nonce ``sn`` + ``HMAC(K, "server" | cn | sn | B)``
3. client -> server: ``HMAC(K, "client" | cn | sn | B)``

``K`` is the trainer group's key (32 random bytes the trainer made and sent to every daemon over
the authenticated control plane in ``OpenGroup``; the daemon hands it to its worker over their
private pipe).  ``B`` binds the proofs to the TLS session: the SHA-256 of the server's certificate
(empty without TLS), so a man in the middle who terminates TLS with its own certificate cannot
relay the proofs.  The server reads only the fixed 37 bytes of step 1 and the 32 of step 3 from
an unauthenticated sender, within :data:`HANDSHAKE_TIMEOUT`; a wrong proof, a wrong magic, a slow
or failed TLS handshake drops the connection, calls the server's ``on_refused`` (the worker counts
it in ``graphfeed_errors_total{kind="data_path_refused"}`` and logs one line per
:data:`REFUSAL_LOG_INTERVAL`).  Nothing the sender wrote is ever decoded.

Frames (after the set-up, both directions), without TLS: authenticated, in clear::

    prefix   !IQ      header length, body length
    header   JSON     {"k": "call" | "ok" | "err", "id": n, "fn": name, "v": value, "b": [[offset, nbytes], ...]}
    mac      32 B     HMAC-SHA256(direction key, counter | "h" | prefix | header)
    body     bytes    the value's tensor buffers (:mod:`graphfeed.transport.wire`)
    mac      16 B     AES-128-GMAC(body key, nonce = counter | "body", body)

With TLS, sealed: the set-up above runs inside TLS (the server's certificate checked by the trainer,
``cn`` and ``sn`` secret to the two ends, behind TLS's ephemeral key exchange), then both ends leave
TLS on that TCP connection and every frame is AES-256-GCM under a seal key of its direction::

    prefix   !IQ      header length, body length (plaintext lengths; in clear, authenticated as the header's AAD)
    header   sealed   AES-256-GCM(seal key, nonce = counter | "head", aad = prefix, header) + 16-byte tag
    body     sealed   AES-256-GCM(seal key, nonce = counter | "body", body) + 16-byte tag

The direction keys are ``HMAC(K, "c2s"/"s2c" | cn | sn | B)``; a body key is the first 16 bytes of
``HMAC(direction key, "body-gmac")`` and a seal key ``HMAC(direction key, "frame-aes256-gcm")``.
The counter keeps every nonce fresh under its key and makes a replayed, dropped or reordered frame
fail.  A frame whose header MAC or tag fails ends the connection before its header is parsed and
before its body is allocated; a body is decoded only after its MAC or tag checked.
Why not TLS records for the frames: Python's :mod:`ssl` hands over one 16 KiB record per call, with
two syscalls and a copy each, and links an OpenSSL whose AES-GCM is about half as fast as the one
``cryptography`` ships -- about 0.75 CPU-s per GB on each end against AES's 0.1-0.25 (``graphfeed
bench channel``).  Sealed frames are read and written in 1 MiB pieces, decrypted into the receive
buffer while the piece is in cache: about what the authenticated-only frames cost, plus AES.
GMAC, not HMAC-SHA256, for bodies without TLS: 0.07 vs 0.6 CPU-s per GB with AES instructions.
Values are encoded with :mod:`graphfeed.transport.wire` (JSON + raw tensor bytes; records by an
allow-list); the body is received straight into one buffer and the decoded tensors are views of it.
Large bodies reuse the buffers of earlier frames once nothing of those frames is alive
(:class:`ReceiveBuffers`), so a trainer's receive costs no fresh pages per batch.
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import queue
import secrets
import select
import socket
import ssl
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from graphfeed.transport import wire
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.pending import Pending

log = logging.getLogger(__name__)

MAGIC = b"GFDP"
VERSION = 3   # 3: with TLS, sealed frames after the set-up; compact batches (2: TLS records; 1: HMAC bodies)
NONCE = 32
HELLO = len(MAGIC) + 1 + NONCE
MAC = 32
KEY_BYTES = 32
HANDSHAKE_TIMEOUT = 10.0      # seconds an unauthenticated sender has to finish the set-up
CONNECT_TIMEOUT = 10.0
REFUSAL_LOG_INTERVAL = 60.0   # seconds between two log lines about refused connections
PREFIX = struct.Struct("!IQ")
MAX_HEADER = 16 << 20
MAX_BODY = 16 << 30
SWEEP_INTERVAL = 0.25         # seconds between checks for calls past their timeout
CHUNK = 16 << 20              # bytes per recv_into
RECV_LOWAT = 4 << 20          # bytes a frame's reader waits for per wake-up (SO_RCVLOWAT; capped at tcp_rmem[2] / 2)
BODY_TAG = 16                 # bytes of a body's GMAC
POOLED_BODY = 1 << 20         # bodies of at least this many bytes are received into reused buffers
POOL_BUFFERS = 6              # reused receive buffers per connection (about the batches in flight and in use)
POOL_HEADROOM = 1 / 16        # a pooled buffer's spare room beyond the body it was made for (batches vary by ~1%)
SENDMSG_PIECES = 64           # buffers per sendmsg call (Linux allows 1024)
SEAL_CHUNK = 1 << 20          # bytes per socket read / write of sealed frames (decrypted or encrypted while in cache)
SEAL_TAG = 16                 # bytes of a sealed header's or body's GCM tag
SEAL_SLACK = 16               # bytes past a Cipher.update_into output it may need (a block less one)


class Refused(ConnectionError):
    """The other end failed the group handshake (wrong key, not a graphfeed data-path peer)."""


class FrameError(ConnectionError):
    """A frame that does not authenticate or exceeds the limits: the connection is dropped."""


def new_group_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def check_key(key: Any) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise ValueError("a data-path group key must be at least 16 random bytes")
    return bytes(key)


# ---- TLS ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TlsServer:
    """A worker's TLS: its daemon's certificate and key (PEM paths)."""

    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.verify_mode = ssl.CERT_NONE   # clients prove the group key, bound to this certificate
        ctx.num_tickets = 0               # no session resumption, and nothing sent over TLS after the set-up
        return ctx

    def binding(self) -> bytes:
        """SHA-256 of this server's (leaf) certificate, DER."""
        with open(self.cert, encoding="ascii", errors="replace") as f:
            pem = f.read()
        end = pem.find("-----END CERTIFICATE-----")
        if end < 0:
            raise ValueError(f"{self.cert} holds no PEM certificate")
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem[:end + len("-----END CERTIFICATE-----")])).digest()


def client_tls(ca: str | None = None, cert: str | None = None, key: str | None = None,
               verify: bool = True) -> ssl.SSLContext:
    """A client's TLS context: the server's certificate checked against ``ca`` (None: the system's roots)
    when ``verify`` (host names are not checked: a data address need not be in the certificate; the
    group proofs are bound to the certificate the client saw).  ``cert``/``key``: a client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    if verify:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if ca:
            ctx.load_verify_locations(ca)
        else:
            ctx.load_default_certs()
    else:
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx


# ---- handshake ---------------------------------------------------------------------------------------

def _proof(key: bytes, label: bytes, cn: bytes, sn: bytes, binding: bytes) -> bytes:
    return hmac.new(key, label + cn + sn + binding, hashlib.sha256).digest()


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _server_handshake(sock, key: bytes, binding: bytes) -> tuple[bytes, bytes]:
    hello = _recv_exact(sock, HELLO)
    if hello[:len(MAGIC)] != MAGIC:
        raise Refused("not a graphfeed data-path hello")
    if hello[len(MAGIC)] != VERSION:
        raise Refused(f"data-path protocol version {hello[len(MAGIC)]} (this worker speaks {VERSION})")
    cn, sn = hello[len(MAGIC) + 1:], secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + bytes([VERSION]) + sn + _proof(key, b"server", cn, sn, binding))
    got = _recv_exact(sock, MAC)
    if not hmac.compare_digest(got, _proof(key, b"client", cn, sn, binding)):
        raise Refused("wrong group proof (the sender does not hold this trainer group's key)")
    return _direction_keys(key, cn, sn, binding)


def _client_handshake(sock, key: bytes, binding: bytes, where: str) -> tuple[bytes, bytes]:
    cn = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + bytes([VERSION]) + cn)
    reply = _recv_exact(sock, HELLO + MAC)
    if reply[:len(MAGIC)] != MAGIC or reply[len(MAGIC)] != VERSION:
        raise Refused(f"{where} is not a graphfeed data-path listener of protocol version {VERSION}")
    sn, proof = reply[len(MAGIC) + 1:HELLO], reply[HELLO:]
    if not hmac.compare_digest(proof, _proof(key, b"server", cn, sn, binding)):
        raise Refused(f"{where} failed the group proof: it does not hold this trainer group's key, or a "
                      f"man in the middle terminated TLS")
    sock.sendall(_proof(key, b"client", cn, sn, binding))
    c2s, s2c = _direction_keys(key, cn, sn, binding)
    return s2c, c2s   # (receive key, send key) of the client


def _direction_keys(key: bytes, cn: bytes, sn: bytes, binding: bytes) -> tuple[bytes, bytes]:
    return _proof(key, b"c2s", cn, sn, binding), _proof(key, b"s2c", cn, sn, binding)


# ---- framed connection -------------------------------------------------------------------------------

def _body_key(direction_key: bytes) -> bytes:
    return hmac.digest(direction_key, b"body-gmac", "sha256")[:16]


def _body_mac(key: bytes, seq: bytes):
    """An AES-128-GMAC context under ``key`` with nonce ``seq`` (8 bytes) | ``"body"``: feed it the body's bytes in
    order (``authenticate_additional_data``), ``finalize``, read ``tag``."""
    return _gcm(key, seq + b"body").encryptor()


def _body_tag(key: bytes, seq: bytes, pieces) -> bytes:
    """AES-128-GMAC of the concatenated ``pieces`` (:func:`_body_mac`)."""
    mac = _body_mac(key, seq)
    for piece in pieces:
        mac.authenticate_additional_data(piece)
    mac.finalize()
    return mac.tag


def _seal_key(direction_key: bytes) -> bytes:
    return hmac.digest(direction_key, b"frame-aes256-gcm", "sha256")


def _gcm(key: bytes, nonce: bytes, tag: bytes | None = None) -> Cipher:
    """AES-GCM under ``key`` with the 12-byte ``nonce`` (a frame's counter | "head" or "body": never repeated
    under one key); ``tag``: the tag a decryptor's ``finalize`` checks."""
    return Cipher(algorithms.AES(key), modes.GCM(nonce, tag))


class _SealedOut:
    """A sealed frame on its way out: raw pieces (prefix, tags) and pieces encrypted by a GCM context, gathered
    in one scratch buffer and sent whenever it fills -- one ``sendall`` per :data:`SEAL_CHUNK`, not per piece."""

    def __init__(self, sock, scratch: bytearray):
        self.sock, self.view, self.used = sock, memoryview(scratch), 0
        self.cap = len(scratch) - SEAL_SLACK   # update_into needs room for a block more than it writes

    def raw(self, data) -> None:
        data = memoryview(data).cast("B")
        if self.used + len(data) > self.cap:
            self.flush()
        if len(data) > self.cap:
            self.sock.sendall(data)
            return
        self.view[self.used:self.used + len(data)] = data
        self.used += len(data)

    def seal(self, ctx, piece) -> None:
        data = memoryview(piece).cast("B")
        start = 0
        while start < len(data):
            if self.used >= self.cap:
                self.flush()
            k = min(self.cap - self.used, len(data) - start)
            self.used += ctx.update_into(data[start:start + k], self.view[self.used:self.used + k + SEAL_SLACK])
            start += k

    def flush(self) -> None:
        if self.used:
            self.sock.sendall(self.view[:self.used])
            self.used = 0


def _decoded(header: bytes, body: torch.Tensor, body_len: int) -> tuple[dict, Any]:
    """An authenticated frame's ``(header, value)``: its JSON header parsed, its buffer table checked."""
    meta = wire.loads_header(header)
    if not isinstance(meta, dict):
        raise wire.WireError("a frame's header is not an object")
    descriptors = meta.get("b", [])
    if (not isinstance(descriptors, list)
            or not all(isinstance(d, list) and len(d) == 2 and all(isinstance(x, int) for x in d)
                       and 0 <= d[0] and 0 <= d[1] and d[0] + d[1] <= body_len for d in descriptors)):
        raise wire.WireError("a frame's buffer table is malformed")
    return meta, wire.decode(meta.get("v"), body, descriptors)


def _leave_tls(sock: ssl.SSLSocket) -> socket.socket:
    """The TCP socket under ``sock`` once the set-up is done over TLS: the frames that follow are sealed with keys
    agreed inside it.  The peer sends nothing more over TLS, so nothing TLS decrypted may be left unread (OpenSSL
    reads a record at a time without read-ahead: the sealed bytes behind the last record stay in the socket)."""
    if sock.pending():
        raise Refused("data arrived over TLS after the set-up")
    timeout = sock.gettimeout()
    raw = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    raw.settimeout(timeout)
    return raw


class ReceiveBuffers:
    """The memory a connection receives frame bodies into: a large body (:data:`POOLED_BODY` bytes or more)
    goes into a buffer of an earlier frame once no tensor decoded from that frame is alive, so its pages are
    not faulted in (and zeroed by the kernel) again for every batch.

    A buffer is a numpy array; the tensors viewing it share one storage, which holds one reference to the
    array until the last of them is freed -- the array's reference count says whether it is in use.  At most
    ``keep`` buffers are kept; a body that finds none free (or none of a fitting size) gets fresh memory, with
    :data:`POOL_HEADROOM` to spare, so the next batches -- a little larger or smaller each -- fit in it.
    """

    def __init__(self, keep: int = POOL_BUFFERS):
        self.keep = keep
        self._owned: list[np.ndarray] = []
        self.reused = 0

    def take(self, n: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``n`` bytes (one reader thread calls this)."""
        if n < POOLED_BODY:
            return torch.empty(n, dtype=torch.uint8)
        for buf in self._owned:
            # references: the list, the loop variable and the argument -- no storage of a live tensor
            if n <= buf.nbytes <= 2 * n and sys.getrefcount(buf) == 3:
                self.reused += 1
                return torch.from_numpy(buf)[:n]
        if len(self._owned) >= self.keep:   # replace a free buffer of the wrong size, if there is one
            free = [k for k in range(len(self._owned)) if sys.getrefcount(self._owned[k]) == 2]   # list, argument
            if not free:
                return torch.empty(n, dtype=torch.uint8)   # every kept buffer in use: this one is not kept
            del self._owned[free[0]]   # by position: list.remove would compare arrays elementwise
        fresh = np.empty(_with_headroom(n), dtype=np.uint8)
        self._owned.append(fresh)
        return torch.from_numpy(fresh)[:n]


def _with_headroom(n: int) -> int:
    """Bytes of a fresh pooled buffer for an ``n``-byte body: :data:`POOL_HEADROOM` more, in whole MiB."""
    return -(-int(n * (1 + POOL_HEADROOM)) // (1 << 20)) << 20


class Connection:
    """One authenticated socket: :meth:`send` (thread-safe) and :meth:`recv` (one reader thread)."""

    def __init__(self, sock, recv_key: bytes, send_key: bytes, mac: bool, where: str, seal: bool = False):
        if mac and seal:
            raise ValueError("a connection's frames are MACed (no TLS) or sealed (TLS), not both")
        self.sock, self.where, self.mac, self.seal = sock, where, mac, seal
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
        self.buffers = ReceiveBuffers()
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
            _send_pieces(self.sock, pieces + body)

    def recv(self) -> tuple[dict, Any]:
        """The next frame's ``(header, value)``; FrameError (drop the connection) when it does not authenticate."""
        prefix = _recv_exact(self.sock, PREFIX.size)
        header_len, body_len = PREFIX.unpack(prefix)
        if header_len > MAX_HEADER or body_len > MAX_BODY:
            raise FrameError(f"frame of {header_len} + {body_len} bytes exceeds the limits")
        if self.seal:
            header, body = self._recv_sealed(prefix, header_len, body_len)
            return _decoded(header, body, body_len)
        header = _recv_exact(self.sock, header_len)
        seq = self._recv_seq.to_bytes(8, "big")
        if self.mac:   # the header (and the body's length) is checked before the body is allocated
            got = _recv_exact(self.sock, MAC)
            if not hmac.compare_digest(got, hmac.digest(self._recv_key, seq + b"h" + prefix + header, "sha256")):
                raise FrameError("a frame's header failed its MAC (tampered, replayed or reordered)")
        body = self.buffers.take(body_len)
        mac = _body_mac(self._recv_body_key, seq) if self.mac else None
        if body_len:   # MAC'd piece by piece as it arrives, while the piece is in cache
            self._recv_into(body.numpy().data, None if mac is None else mac.authenticate_additional_data)
        if mac is not None:
            got = _recv_exact(self.sock, BODY_TAG)
            mac.finalize()
            if not hmac.compare_digest(got, mac.tag):
                raise FrameError("a frame's body failed its MAC (tampered)")
        self._recv_seq += 1
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

    def _recv_sealed(self, prefix: bytes, header_len: int, body_len: int) -> tuple[bytes, torch.Tensor]:
        """The header (its tag checked before it is parsed) and the body (its tag checked before it is decoded),
        decrypted straight into a (reused) receive buffer from 1 MiB socket reads."""
        seq = self._recv_seq.to_bytes(8, "big")
        sealed = _recv_exact(self.sock, header_len + SEAL_TAG)
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
        tag = _recv_exact(self.sock, SEAL_TAG)
        try:
            opener.finalize_with_tag(tag)
        except InvalidTag:
            raise FrameError("a frame's body failed its tag (tampered)") from None
        self._recv_seq += 1
        return header, whole[:body_len]

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


def _send_pieces(sock, pieces: list) -> None:
    """Send a MACed frame's ``pieces`` in ``sendmsg`` calls that gather them, so its prefix, header and MAC do not
    each leave as a segment of their own (TCP_NODELAY is on); a partial send goes on where it stopped."""
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    while views:
        sent = sock.sendmsg(views[:SENDMSG_PIECES])
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


# ---- server ------------------------------------------------------------------------------------------

Handler = Callable[..., Any]


@dataclass(frozen=True)
class Function:
    """A function the server answers: ``fn(*args)``; ``is_async``: it returns a :class:`Pending` at once."""

    fn: Handler
    is_async: bool = False


class RefusalLog:
    """Counts refused connections and logs at most one line per ``interval`` seconds (with the count since)."""

    def __init__(self, say: Callable[[str], None], count: Callable[[], None] | None = None,
                 interval: float = REFUSAL_LOG_INTERVAL, clock=time.monotonic):
        self.say, self.count, self.interval, self.clock = say, count, interval, clock
        self.total = 0
        self._since = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    def __call__(self, peer: str, reason: str) -> None:
        with self._lock:
            self.total += 1
            self._since += 1
            now = self.clock()
            if self._last is not None and now - self._last < self.interval:
                line = None
            else:
                line = (f"data path: refused a connection from {peer}: {reason} ({self._since} refused since the "
                        f"last such line; at most one line per {self.interval:g} s)")
                self._last, self._since = now, 0
        if self.count is not None:
            self.count()
        if line is not None:
            self.say(line)


class SecureServer:
    """A listener on ``host`` (port 0 unless given) answering :class:`Function` calls from holders of ``key``."""

    def __init__(self, host: str, key: bytes, functions: Mapping[str, Function], *, name: str,
                 tls: TlsServer | None = None, on_refused: Callable[[str, str], None] | None = None,
                 threads: int = 16, port: int = 0):
        self.key, self.functions, self.name = check_key(key), dict(functions), name
        self.tls = tls
        self._ctx = tls.context() if tls is not None else None
        self._binding = tls.binding() if tls is not None else b""
        self.on_refused = on_refused or (lambda peer, reason: None)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{name}-call")
        self._sock = socket.create_server((host, port), backlog=64)
        self.host, self.port = self._sock.getsockname()[:2]
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._accept = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> "SecureServer":
        self._accept.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, addr = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock, f"{addr[0]}:{addr[1]}"), daemon=True,
                             name=f"{self.name}-conn").start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            if self._ctx is not None:
                sock = self._ctx.wrap_socket(sock, server_side=True)
            recv_key, send_key = _server_handshake(sock, self.key, self._binding)
            if isinstance(sock, ssl.SSLSocket):
                sock = _leave_tls(sock)
        except (Refused, OSError, ssl.SSLError, ValueError) as exc:
            reason = str(exc) if isinstance(exc, Refused) else f"no group handshake ({type(exc).__name__}: {exc})"
            if isinstance(exc, socket.timeout):
                reason = f"no group handshake within {HANDSHAKE_TIMEOUT:g} s"
            _close(sock)
            if not self._closed:
                self.on_refused(peer, reason)
            return
        sock.settimeout(None)
        conn = Connection(sock, recv_key, send_key, mac=self._ctx is None, seal=self._ctx is not None, where=peer)
        conn.start_sender(f"{self.name}-send")
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                meta, value = conn.recv()
                self._dispatch(conn, meta, value)
        except FrameError as exc:
            if not self._closed and not conn.closed:
                self.on_refused(peer, str(exc))
        except (OSError, ValueError):
            pass   # the peer went away, or sent a frame this version cannot read: end its connection
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)

    def _dispatch(self, conn: Connection, meta: dict, value: Any) -> None:
        call_id, name = meta.get("id"), meta.get("fn")
        if meta.get("k") != "call" or not isinstance(call_id, int):
            raise wire.WireError("expected a call frame")
        func = self.functions.get(name) if isinstance(name, str) else None
        if func is None:
            allowed = ", ".join(sorted(self.functions))
            _reply_error(conn, call_id, PermissionError(
                f"{name!r} is not callable on a graphfeed session worker (allowed: {allowed})"))
            return
        args = value if isinstance(value, (list, tuple)) else ()
        if func.is_async:
            try:
                pending = func.fn(*args)
            except Exception as exc:  # noqa: BLE001 -- the caller gets it
                _reply_error(conn, call_id, exc)
                return
            pending.add_done_callback(lambda p: _reply(conn, call_id, p))
        else:
            self._pool.submit(self._run, conn, call_id, func.fn, args)

    @staticmethod
    def _run(conn: Connection, call_id: int, fn: Handler, args) -> None:
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 -- the caller gets it
            _reply_error(conn, call_id, exc)
            return
        _send(conn, {"k": "ok", "id": call_id}, value, call_id)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        try:
            self._sock.close()
        except OSError:
            pass
        for c in conns:
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reply(conn: Connection, call_id: int, pending: Pending) -> None:
    try:
        value = pending.result()
    except Exception as exc:  # noqa: BLE001 -- the caller gets it
        _reply_error(conn, call_id, exc)
        return
    _send(conn, {"k": "ok", "id": call_id}, value, call_id)


def _reply_error(conn: Connection, call_id: int, exc: BaseException) -> None:
    kind, message = wire.error_fields(exc)
    _send(conn, {"k": "err", "id": call_id, "type": kind, "msg": message}, None, call_id)


def _send(conn: Connection, meta: dict, value: Any, call_id: int) -> None:
    conn.post(meta, value, call_id)


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


def _close(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass


# ---- client ------------------------------------------------------------------------------------------

class SecureClient:
    """One authenticated connection to a worker's :class:`SecureServer`; calls are multiplexed on it."""

    def __init__(self, address: str, key: bytes, *, where: str, tls: ssl.SSLContext | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT):
        self.address, self.key, self.where, self.tls = address, check_key(key), where, tls
        self.connect_timeout = float(connect_timeout)
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[Pending, float]] = {}
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._broken: str | None = None

    def connect(self) -> Connection:
        host, _, port = self.address.rpartition(":")
        try:
            raw = socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout)
        except OSError as exc:
            raise ConnectionError(f"cannot reach {self.where}'s data path at {self.address}: {exc}") from None
        sock: socket.socket = raw
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            binding = b""
            if self.tls is not None:
                sock = self.tls.wrap_socket(raw, server_side=False)
                der = sock.getpeercert(binary_form=True)
                binding = hashlib.sha256(der or b"").digest()
            recv_key, send_key = _client_handshake(sock, self.key, binding, f"{self.where} at {self.address}")
            suite = None
            if isinstance(sock, ssl.SSLSocket):
                suite = sock.cipher()
                sock = _leave_tls(sock)
        except ssl.SSLError as exc:
            _close(sock)
            raise ConnectionError(f"TLS with {self.where}'s data path at {self.address} failed: {exc}") from None
        except (Refused, OSError) as exc:
            _close(sock)
            raise ConnectionError(f"{self.where}'s data path at {self.address}: {exc}") from None
        sock.settimeout(None)
        conn = Connection(sock, recv_key, send_key, mac=self.tls is None, seal=self.tls is not None,
                          where=f"{self.where} ({self.address})")
        conn.tls_suite = suite
        threading.Thread(target=self._read, args=(conn,), name=f"graphfeed-dp-{self.where}", daemon=True).start()
        return conn

    def _connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and not self._conn.closed:
                return self._conn
        conn = self.connect()
        with self._lock:
            if self._conn is not None and not self._conn.closed:   # another caller connected meanwhile
                conn.close()
                return self._conn
            self._conn = conn
            return conn

    def call(self, name: str, args: tuple, timeout: float) -> Pending:
        pending = Pending()
        try:
            conn = self._connection()
        except ConnectionError as exc:
            pending.set_exception(exc)
            return pending
        call_id = next(self._ids)
        with self._lock:
            self._calls[call_id] = (pending, time.monotonic() + float(timeout))
        try:
            conn.send({"k": "call", "id": call_id, "fn": name}, list(args))
        except (OSError, wire.WireError) as exc:
            self._fail(call_id, exc if isinstance(exc, wire.WireError)
                       else ConnectionError(f"cannot send {name} to {self.where}: {exc}"))
        return pending

    def _read(self, conn: Connection) -> None:
        why = "closed"
        try:
            while True:
                meta, value = conn.recv()
                call_id = meta.get("id")
                with self._lock:
                    entry = self._calls.pop(call_id, None) if isinstance(call_id, int) else None
                if entry is None:
                    continue   # the answer of a call that timed out
                if meta.get("k") == "ok":
                    entry[0].set_result(value)
                else:
                    entry[0].set_exception(wire.rebuild_error(meta.get("type"), meta.get("msg"), self.where))
        except (OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            self._fail_all(conn, ConnectionError(f"the data-path connection to {self.where} ({self.address}) "
                                                 f"was lost: {why}"))

    def _fail(self, call_id: int, exc: BaseException) -> None:
        with self._lock:
            entry = self._calls.pop(call_id, None)
        if entry is not None:
            entry[0].set_exception(exc)

    def _fail_all(self, conn: Connection, exc: BaseException) -> None:
        with self._lock:
            if self._conn is not conn:
                return
            self._conn = None
            calls, self._calls = list(self._calls.values()), {}
        for pending, _ in calls:
            pending.set_exception(exc)

    def sweep(self, now: float) -> None:
        """Fail the calls past their deadline."""
        with self._lock:
            late = [k for k, (_, deadline) in self._calls.items() if deadline <= now]
            entries = [self._calls.pop(k) for k in late]
        for pending, _ in entries:
            pending.set_exception(TimeoutError(f"the call to {self.where} ({self.address}) timed out"))

    def close(self) -> None:
        with self._lock:
            conn = self._conn
        if conn is not None:
            conn.close()


class SecureCalls(DataCalls):
    """Calls to the group's workers over :class:`SecureClient` connections (one per part, made on first use)."""

    kind = "secure"
    label = "the secure data path"

    def __init__(self, key: bytes, endpoints: Mapping[int, str] | None = None, *,
                 tls: ssl.SSLContext | None = None, name: Callable[[int], str] = lambda p: f"part{p}"):
        super().__init__()
        self.key, self.tls, self.name = check_key(key), tls, name
        self._clients: dict[int, SecureClient] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        if endpoints:
            self.set_endpoints(endpoints)

    def set_endpoints(self, endpoints: Mapping[int, str]) -> None:
        with self._lock:
            for part, address in endpoints.items():
                old = self._clients.get(int(part))
                if old is None or old.address != address:
                    if old is not None:
                        old.close()
                    self._clients[int(part)] = SecureClient(address, self.key, where=self.name(int(part)),
                                                            tls=self.tls)
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, name="graphfeed-dp-sweep", daemon=True)
                self._sweeper.start()

    def connect(self, parts=None) -> None:
        """Open (and authenticate) the connections now: ConnectionError naming the first part that fails."""
        for part in (parts if parts is not None else list(self._clients)):
            self._client(part)._connection()

    def _client(self, part: int) -> SecureClient:
        client = self._clients.get(int(part))
        if client is None:
            raise ConnectionError(f"no data-path address for part {part} (the group has not formed)")
        return client

    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        self._check_open()
        try:
            client = self._client(part)
        except ConnectionError as exc:
            return Pending.failed(exc)
        return client.call(name, args, timeout)

    def _sweep(self) -> None:
        while not self._stop.wait(SWEEP_INTERVAL):
            now = time.monotonic()
            for client in list(self._clients.values()):
                client.sweep(now)

    def close(self) -> None:
        super().close()
        self._stop.set()
        for client in list(self._clients.values()):
            client.close()
