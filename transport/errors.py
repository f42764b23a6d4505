"""The data path's one typed error for "the peer is lost": :class:`PeerLost`.

Every :class:`~graphfeed.transport.calls.DataCalls` implementation turns its own wording of a lost peer
(torch RPC's ``EOF``, the secure path's reset connection, TensorPipe's ``process_vm_readv``) into a
:class:`PeerLost` for the part it called, so callers above the seam test a type, never a message.  The
words of the transports that only say it in text live here, once (:func:`lost_in_text`).
"""
from __future__ import annotations

# what an error says when the peer process went away (TensorPipe / torch RPC and the secure path's wording)
LOST_WORDS = ("eof", "end of file", "connection reset", "econnreset", "broken pipe", "epipe", "pipe closed",
              "connection refused", "connection closed", "peer closed", "was lost", "'s worker is lost",
              # TensorPipe's same-host channel reading a peer process that is gone (a worker killed mid-call)
              "process_vm_readv: no such process")
# a refused request whose message happens to hold one of the words (a batch over its byte cap says "EOF"-like
# things about its tensors): never a lost peer
NOT_LOST_WORDS = ("max_batch",)
# errors that are never a lost peer, whatever they say: a timeout (the peer may be slow) and a worker's refusal
KEPT: tuple[type[BaseException], ...] = (TimeoutError, ValueError, LookupError, PermissionError)


class PeerLost(ConnectionError):
    """A call to part ``part``'s worker lost its peer (the process or its connection is gone); ``wording`` is
    the transport's own message.  Raised by :meth:`Pending.result` of a :class:`DataCalls` call; the client
    waits for the part and re-forms its group (``Client.call_with_recovery``)."""

    def __init__(self, part: int, wording: str, transport: str = "the data path"):
        super().__init__(f"part {part}'s worker is lost ({transport}): {wording}")
        self.part, self.wording, self.transport = int(part), wording, transport

    def __reduce__(self):   # pickles (and unpickles) with its fields, e.g. through torch RPC
        return (PeerLost, (self.part, self.wording, self.transport))


def lost_in_text(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says in words that its peer went away: the rule of
    the transports that report it only in text (torch RPC's remote errors, a worker's failed peer call)."""
    while exc is not None:
        if isinstance(exc, PeerLost):
            return True
        text = str(exc).lower()
        if any(word in text for word in LOST_WORDS) and not any(word in text for word in NOT_LOST_WORDS):
            return True
        exc = exc.__cause__
    return False


def peer_lost(exc: BaseException | None) -> PeerLost | None:
    """The :class:`PeerLost` ``exc`` is, or was raised from; None when it is not about a lost peer."""
    while exc is not None:
        if isinstance(exc, PeerLost):
            return exc
        exc = exc.__cause__
    return None


def translated(part: int, exc: BaseException, transport: str) -> BaseException:
    """``exc`` as the caller should see it: :class:`PeerLost` when its words say the peer is gone, else ``exc``
    itself.  A timeout stays a timeout (the peer may only be slow), a worker's refusal a refusal."""
    if isinstance(exc, (PeerLost,) + KEPT) or not lost_in_text(exc):
        return exc
    lost = PeerLost(part, _first_line(exc), transport)
    lost.__cause__ = exc
    return lost


def _first_line(exc: BaseException) -> str:
    for line in str(exc).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
