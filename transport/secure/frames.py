"""The secure data path's frame codec: prefix, JSON header and tensor body, authenticated (HMAC + GMAC) or sealed
(AES-256-GCM), and the crypto of both (see :mod:`graphfeed.transport.secure` for the layout)."""
from __future__ import annotations

import hmac
import struct
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from graphfeed.transport import wire

PREFIX = struct.Struct("!IQ")
MAX_HEADER = 16 << 20
MAX_BODY = 16 << 30
BODY_TAG = 16                 # bytes of a body's GMAC
SENDMSG_PIECES = 64           # buffers per sendmsg call (Linux allows 1024)
SEAL_CHUNK = 1 << 20          # bytes per socket read / write of sealed frames (decrypted or encrypted while in cache)
SEAL_TAG = 16                 # bytes of a sealed header's or body's GCM tag
SEAL_SLACK = 16               # bytes past a Cipher.update_into output it may need (a block less one)


class FrameError(ConnectionError):
    """A frame that does not authenticate or exceeds the limits: the connection is dropped."""


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

