"""The secure data path: authenticated, encrypted calls between the parties of a trainer group -- no pickle.

Used when a daemon has a token or TLS configured (or ``data_path: secure``): then no torch RPC,
TensorPipe or TCPStore listener exists; a session worker listens here instead, on its daemon's
data address (port 0), and the trainer and the peer workers connect to it.

Keys (:mod:`.keys`): the trainer's group key ``G`` (sent in ``OpenGroup``) and the control plane's token make the
group's root; every pair of parties (the trainer, each part's worker) has a pair key derived from it; a worker holds
only its own pair keys, handed over by its daemon -- never ``G`` or the root.

Connection set-up (each TCP connection; inside TLS 1.3 when the daemon has a certificate):

1. client -> server: ``GFDP`` + version byte + (client party, server party: two int32) + nonce ``cn`` + X25519
   share ``A``   (77 bytes)
2. server -> client: ``GFDP`` + version byte + nonce ``sn`` + X25519 share ``B`` + ``HMAC(M, "server")``
3. client -> server: ``HMAC(M, "client")``

``M = HKDF(ikm = X25519(a, B), salt = P(client, server), info = SHA-256(hello | reply | binding))``: the
connection's secret (a fresh exchange per connection, so a capture of every message, ``G`` included, gives no
connection key) behind the pair key of the two parties (so only the party the hello names can finish, and the
listener learns who called).  The binding is the SHA-256 of the server's certificate (empty without TLS), so a man
in the middle who terminates TLS with its own certificate cannot relay the proofs.  The server reads only the fixed
77 bytes of step 1 and the 32 of step 3 from an unauthenticated sender, within one deadline from accept to proof
(``ListenerLimits.handshake_timeout``; one thread, :mod:`.gate`, runs every set-up without blocking); a wrong
proof, an unknown party, a wrong magic, a slow or failed TLS handshake drops the connection, calls the server's
``on_refused`` (the worker counts it in ``graphfeed_errors_total{kind="data_path_refused"}`` and logs one line per
:data:`REFUSAL_LOG_INTERVAL`).  Nothing the sender wrote is ever decoded.  The trainer may then call every function
of the worker's table; a peer worker only those marked ``peers`` (``rpc_group.PEER_FUNCTIONS``).

Frames (after the set-up, both directions), sealed -- with or without TLS: both ends leave TLS on that TCP
connection and every frame is AES-256-GCM under a seal key of its direction::

    prefix   !IQ      header length, body length (plaintext lengths; in clear, authenticated as the header's AAD)
    header   sealed   AES-256-GCM(seal key, nonce = counter | "head", aad = prefix, header) + 16-byte tag
    body     sealed   AES-256-GCM(seal key, nonce = counter | "body", body) + 16-byte tag

    header   JSON     {"k": "call" | "ok" | "err", "id": n, "fn": name, "v": value, "b": [[offset, nbytes], ...]}
    body     bytes    the value's tensor buffers (:mod:`graphfeed.transport.wire`)

The direction keys are ``HKDF(M, "c2s"/"s2c")``; a seal key is ``HMAC(direction key, "frame-aes256-gcm")``.  After
``keys.REKEY_FRAMES`` frames or ``keys.REKEY_BYTES`` bytes in a direction, both ends replace its key by
``HKDF(key, "rekey")`` at the same frame (:class:`Connection`).  (:class:`Connection` also has MACed frames -- a
header HMAC-SHA256 and a body AES-GMAC, the body in clear -- which the data path no longer uses.)
The counter keeps every nonce fresh under its key and makes a replayed, dropped or reordered frame
fail.  A frame whose header tag fails ends the connection before its header is parsed and
before its body is allocated; a body is decoded only after its tag checked.
Why not TLS records for the frames: Python's :mod:`ssl` hands over one 16 KiB record per call, with
two syscalls and a copy each, and links an OpenSSL whose AES-GCM is about half as fast as the one
``cryptography`` ships -- about 0.75 CPU-s per GB on each end against AES's 0.1-0.25 (``graphfeed
bench channel``).  Sealed frames are read and written in 1 MiB pieces, decrypted into the receive
buffer while the piece is in cache: about what the authenticated-only frames cost, plus AES.
Sealed without TLS too: with a token and no TLS, the session secrets that ``pull`` carries, the feature rows and the
calls stay off the wire (AES-GCM costs little more than the GMAC of the MACed frames).
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
from graphfeed.transport.secure.handshake import Refused, TlsServer, client_tls, new_group_key
from graphfeed.transport.secure.keys import TRAINER, PartyKeys
from graphfeed.transport.secure.server import RefusalLog, SecureServer

__all__ = ["TRAINER", "Connection", "FrameError", "Function", "PartyKeys", "ReceiveBuffers", "RefusalLog", "Refused",
           "SecureCalls", "SecureClient", "SecureServer", "TlsServer", "client_tls", "new_group_key"]
