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

from graphfeed.transport.calls import Function
from graphfeed.transport.secure.buffers import ReceiveBuffers
from graphfeed.transport.secure.client import SecureCalls, SecureClient
from graphfeed.transport.secure.connection import Connection
from graphfeed.transport.secure.frames import FrameError
from graphfeed.transport.secure.handshake import Refused, TlsServer, check_key, client_tls, new_group_key
from graphfeed.transport.secure.server import RefusalLog, SecureServer

__all__ = ["Connection", "FrameError", "Function", "ReceiveBuffers", "RefusalLog", "Refused", "SecureCalls",
           "SecureClient", "SecureServer", "TlsServer", "check_key", "client_tls", "new_group_key"]
