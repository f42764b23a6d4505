"""The secure data path's key schedule: who holds which key, from the group root down to one frame.

* **Group root** ``R = HKDF(ikm = group key G, salt = SHA-256("graphfeed token" | token))`` -- ``G`` is the 32 random
  bytes the trainer sends in ``OpenGroup``; the token is the control plane's bearer token (empty salt without one).
  With a token and no TLS, ``G`` crosses the network in clear: on its own it opens nothing.
* **Parties**: the trainer (:data:`TRAINER`, -1) and the worker of each part ``K`` (``K >= 0``).
* **Pair keys** ``P(a, b) = HKDF(R, info = "pair" | min(a, b) | max(a, b))``: one per pair of parties.  The trainer
  holds ``R`` and derives any of them; the daemon derives its worker's ring -- the worker's pair keys with the trainer
  and with every other part -- and hands the worker only that ring, never ``R``.  So worker ``K`` can prove "I am part
  K" to anyone, and nobody else's identity: it cannot pose as the trainer to part ``J``, nor as part ``J``.
* **Connection keys** (:mod:`.handshake`): an X25519 exchange per connection, its transcript MACed with
  ``HKDF(ikm = X25519 secret, salt = P(client, server), info = transcript hash)``: an observer of the control plane
  and of the connection learns no key of the connection; a sender without the pair key cannot finish it.
* **Session secrets** ``HKDF(R, info = "session" | part | session id)``: the daemon derives the secret it gives its
  worker; the trainer derives the same one; neither sends it anywhere.
* **Rekey** (:func:`ratchet`): a direction's key is replaced by ``HKDF(key, info = "rekey")`` after
  :data:`REKEY_FRAMES` frames or :data:`REKEY_BYTES` bytes, by both ends at the same frame.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
TRAINER = -1                  # the trainer's party number; a part's worker is its part number
REKEY_FRAMES = 1 << 20        # frames per direction under one key
REKEY_BYTES = 1 << 30         # bytes (headers and bodies) per direction under one key


def hkdf(ikm: bytes, *, salt: bytes = b"", info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 (RFC 5869)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt or None, info=info).derive(ikm)


def party_name(party: int) -> str:
    return "the trainer" if party == TRAINER else f"part{party}"


def group_root(group_key: bytes, token: str | None) -> bytes:
    """``R``: the group key ``G`` bound to the control plane's token (None/empty: no token)."""
    salt = hashlib.sha256(b"graphfeed token" + (token or "").encode("utf-8")).digest() if token else b""
    return hkdf(bytes(group_key), salt=salt, info=b"graphfeed data-path root v4")


def pair_key(root: bytes, a: int, b: int) -> bytes:
    lo, hi = sorted((int(a), int(b)))
    return hkdf(root, info=b"graphfeed pair" + lo.to_bytes(4, "big", signed=True) + hi.to_bytes(4, "big", signed=True))


def session_secret(root: bytes, part: int, session_id: str) -> bytes:
    """The secret of session ``session_id`` on ``part`` (the daemon's worker checks it; the trainer sends it)."""
    return hkdf(root, info=b"graphfeed session" + int(part).to_bytes(4, "big", signed=True) + session_id.encode())


def ratchet(key: bytes) -> bytes:
    """A direction's next key (:data:`REKEY_FRAMES` / :data:`REKEY_BYTES`)."""
    return hkdf(key, info=b"graphfeed rekey")


@dataclass(frozen=True)
class PartyKeys:
    """What one party holds: its number ``me`` and its pair key with each party it may talk to."""

    me: int
    pairs: Mapping[int, bytes] = field(repr=False)
    root: bytes = field(default=b"", repr=False)    # the trainer only: every pair key derives from it

    def key(self, other: int) -> bytes | None:
        """The pair key with ``other`` (None: this party shares none with it)."""
        if other == self.me:
            return None
        if self.root:
            return pair_key(self.root, self.me, other)
        return self.pairs.get(other)

    @classmethod
    def of_root(cls, root: bytes, me: int = TRAINER) -> "PartyKeys":
        """A holder of the root (the trainer; tests): any pair key with ``me``."""
        if len(root) < 16:
            raise ValueError("a data-path group key must be at least 16 random bytes")
        return cls(me=me, pairs={}, root=bytes(root))

    @classmethod
    def of_worker(cls, root: bytes, part: int, num_parts: int) -> "PartyKeys":
        """Part ``part``'s worker's ring (made by its daemon): its pair keys with the trainer and the other parts."""
        others = [TRAINER, *(p for p in range(num_parts) if p != part)]
        return cls(me=part, pairs={o: pair_key(root, part, o) for o in others})


def party_keys(key, me: int = TRAINER) -> PartyKeys:
    """``key`` as a :class:`PartyKeys`: bytes are a group root, held here as party ``me`` (tests, benches)."""
    if isinstance(key, PartyKeys):
        return key
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError("a data-path key must be a PartyKeys or at least 16 random bytes")
    return PartyKeys.of_root(bytes(key), me)
