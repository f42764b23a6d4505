"""The secure data path's connection set-up: the group-key handshake, bound to the TLS certificate when there is one.

See :mod:`graphfeed.transport.secure` for the protocol.  Only these few fixed-size messages are read from
a sender before it has proved the group's key.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl
from dataclasses import dataclass
from typing import Any

MAGIC = b"GFDP"
VERSION = 3   # 3: with TLS, sealed frames after the set-up; compact batches (2: TLS records; 1: HMAC bodies)
NONCE = 32
HELLO = len(MAGIC) + 1 + NONCE
MAC = 32
KEY_BYTES = 32
HANDSHAKE_TIMEOUT = 10.0      # seconds an unauthenticated sender has to finish the set-up


class Refused(ConnectionError):
    """The other end failed the group handshake (wrong key, not a graphfeed data-path peer)."""


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


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def server_handshake(sock, key: bytes, binding: bytes) -> tuple[bytes, bytes]:
    hello = recv_exact(sock, HELLO)
    if hello[:len(MAGIC)] != MAGIC:
        raise Refused("not a graphfeed data-path hello")
    if hello[len(MAGIC)] != VERSION:
        raise Refused(f"data-path protocol version {hello[len(MAGIC)]} (this worker speaks {VERSION})")
    cn, sn = hello[len(MAGIC) + 1:], secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + bytes([VERSION]) + sn + _proof(key, b"server", cn, sn, binding))
    got = recv_exact(sock, MAC)
    if not hmac.compare_digest(got, _proof(key, b"client", cn, sn, binding)):
        raise Refused("wrong group proof (the sender does not hold this trainer group's key)")
    return _direction_keys(key, cn, sn, binding)


def client_handshake(sock, key: bytes, binding: bytes, where: str) -> tuple[bytes, bytes]:
    cn = secrets.token_bytes(NONCE)
    sock.sendall(MAGIC + bytes([VERSION]) + cn)
    reply = recv_exact(sock, HELLO + MAC)
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

def leave_tls(sock: ssl.SSLSocket) -> socket.socket:
    """The TCP socket under ``sock`` once the set-up is done over TLS: the frames that follow are sealed with keys
    agreed inside it.  The peer sends nothing more over TLS, so nothing TLS decrypted may be left unread (OpenSSL
    reads a record at a time without read-ahead: the sealed bytes behind the last record stay in the socket)."""
    if sock.pending():
        raise Refused("data arrived over TLS after the set-up")
    timeout = sock.gettimeout()
    raw = socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    raw.settimeout(timeout)
    return raw



def close_socket(sock) -> None:
    try:
        sock.close()
    except OSError:
        pass

