"""The secure data path's connection set-up: an X25519 exchange authenticated by the two parties' pair key, bound to
the TLS certificate when there is one (:mod:`.keys` says who holds which key).

See :mod:`graphfeed.transport.secure` for the protocol.  Only these few fixed-size messages are read from
a sender before it has proved the group's key.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl
import struct
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from graphfeed.transport.secure.keys import TRAINER, PartyKeys, hkdf, party_name

MAGIC = b"GFDP"
VERSION = 4   # 4: X25519 per connection, pair keys, sealed frames, rekey (3: group-key HMAC; 2: TLS records)
NONCE = 32
SHARE = 32                    # an X25519 public key
_PARTIES = struct.Struct("!ii")   # the sender's party, the party it asks for
HELLO = len(MAGIC) + 1 + _PARTIES.size + NONCE + SHARE
REPLY = len(MAGIC) + 1 + NONCE + SHARE
MAC = 32
KEY_BYTES = 32


class Refused(ConnectionError):
    """The other end failed the group handshake (wrong key, not a graphfeed data-path peer)."""


def new_group_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


# ---- TLS ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TlsServer:
    """A worker's TLS: its daemon's certificate and key (PEM paths); ``client_ca``: the CA that must have signed a
    client certificate (the daemon's ``tls_client_ca``: mTLS on the control plane, so here too): the trainer must
    show one; a peer worker shows none (it proves its pair key)."""

    cert: str
    key: str
    client_ca: str | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3   # AEAD suites only, no renegotiation
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca:   # a certificate shown must be valid; the trainer must show one (server_handshake)
            ctx.verify_mode = ssl.CERT_OPTIONAL
            ctx.load_verify_locations(self.client_ca)
        else:
            ctx.verify_mode = ssl.CERT_NONE   # clients prove their pair key, bound to this certificate
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
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
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

@dataclass(frozen=True)
class Agreed:
    """What a finished set-up gives one end: its direction keys and the party at the other end."""

    recv_key: bytes = field(repr=False)
    send_key: bytes = field(repr=False)
    party: int            # the other end's party (keys.TRAINER or a part number), proven by its pair key


def _hello(me: int, them: int, nonce: bytes, public: bytes) -> bytes:
    return MAGIC + bytes([VERSION]) + _PARTIES.pack(me, them) + nonce + public


def _ephemeral() -> tuple[X25519PrivateKey, bytes]:
    private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _master(private: X25519PrivateKey, their_public: bytes, pair: bytes, transcript: bytes) -> bytes:
    """The connection's master key: the X25519 secret, salted with the pair key, bound to the transcript (both
    hellos and the TLS certificate's hash).  ValueError when the other end's public key is degenerate."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(their_public))
    return hkdf(shared, salt=pair, info=b"graphfeed handshake v4" + hashlib.sha256(transcript).digest())


def _proof(master: bytes, label: bytes) -> bytes:
    return hmac.new(master, label, hashlib.sha256).digest()


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def server_handshake(sock, keys: PartyKeys, binding: bytes, trainer_cert: bool = False) -> Agreed:
    """The listener's side on a blocking socket: read the fixed-size hello, answer with this end's share and proof,
    check the client's proof.  Refused when the client is not a party holding a pair key with this worker, or
    fails; ``trainer_cert``: also when it claims to be the trainer without a client certificate TLS verified.
    (The listener itself runs the same steps without blocking: :class:`.gate.Setup`.)"""
    hello = recv_exact(sock, HELLO_START)   # refused at once when it is no hello of this version
    check_hello_start(hello)
    hello += recv_exact(sock, HELLO - len(hello))
    answer = ServerAnswer.of(hello, keys, binding, trainer_cert and not sock.getpeercert())
    sock.sendall(answer.reply)
    return answer.check(recv_exact(sock, MAC))


HELLO_START = len(MAGIC) + 1   # the bytes of a hello that say whether it is one of this version


def check_hello_start(start: bytes) -> None:
    """Refused unless ``start`` (the first :data:`HELLO_START` bytes) opens a hello of this version."""
    if start[:len(MAGIC)] != MAGIC:
        raise Refused("not a graphfeed data-path hello")
    if start[len(MAGIC)] != VERSION:
        raise Refused(f"data-path protocol version {start[len(MAGIC)]} (this worker speaks {VERSION})")


@dataclass(frozen=True)
class ServerAnswer:
    """The listener's answer to a whole hello: ``reply`` (its share and proof) to send, and what checks the
    client's proof (:meth:`check`)."""

    reply: bytes
    master: bytes = field(repr=False)
    client: int

    @classmethod
    def of(cls, hello: bytes, keys: PartyKeys, binding: bytes, no_trainer_cert: bool = False) -> "ServerAnswer":
        """Refused when the hello names another listener or no party of the group, or the trainer without the
        client certificate mTLS asks for (``no_trainer_cert``: TLS verified none)."""
        check_hello_start(hello)
        client, server = _PARTIES.unpack_from(hello, len(MAGIC) + 1)
        if server != keys.me:
            raise Refused(f"the sender asked for {party_name(server)}; this listener is {party_name(keys.me)}")
        pair = keys.key(client)
        if pair is None:
            raise Refused(f"the sender claims to be {party_name(client)}, which is no party of this group")
        if no_trainer_cert and client == TRAINER:
            raise Refused("the trainer showed no client certificate (this daemon's control plane is mTLS: so is its "
                          "data path; connect with tls_cert and tls_key)")
        private, public = _ephemeral()
        reply = MAGIC + bytes([VERSION]) + secrets.token_bytes(NONCE) + public
        master = _master(private, hello[-SHARE:], pair, hello + reply + binding)
        return cls(reply + _proof(master, b"server"), master, client)

    def check(self, proof: bytes) -> Agreed:
        """The connection's keys once ``proof`` (the client's :data:`MAC` bytes) is right; Refused otherwise."""
        if not hmac.compare_digest(proof, _proof(self.master, b"client")):
            raise Refused(f"wrong proof from a sender claiming to be {party_name(self.client)} (it does not hold "
                          f"that party's key of this trainer group)")
        return Agreed(_direction(self.master, b"c2s"), _direction(self.master, b"s2c"), self.client)


def client_handshake(sock, keys: PartyKeys, server: int, binding: bytes, where: str) -> Agreed:
    """The connecting side: prove this party (``keys.me``) to party ``server`` and check that it is that party."""
    pair = keys.key(server)
    if pair is None:
        raise Refused(f"{party_name(keys.me)} holds no key for {where} ({party_name(server)})")
    private, public = _ephemeral()
    hello = _hello(keys.me, server, secrets.token_bytes(NONCE), public)
    sock.sendall(hello)
    reply = recv_exact(sock, REPLY + MAC)
    if reply[:len(MAGIC)] != MAGIC or reply[len(MAGIC)] != VERSION:
        raise Refused(f"{where} is not a graphfeed data-path listener of protocol version {VERSION}")
    try:
        master = _master(private, reply[REPLY - SHARE:REPLY], pair, hello + reply[:REPLY] + binding)
    except ValueError:
        raise Refused(f"{where} sent a degenerate key share") from None
    if not hmac.compare_digest(reply[REPLY:], _proof(master, b"server")):
        raise Refused(f"{where} failed the group proof: it is not {party_name(server)} of this trainer group, or "
                      f"a man in the middle terminated TLS")
    sock.sendall(_proof(master, b"client"))
    return Agreed(_direction(master, b"s2c"), _direction(master, b"c2s"), server)


def _direction(master: bytes, label: bytes) -> bytes:
    return hkdf(master, info=b"graphfeed direction " + label)


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

