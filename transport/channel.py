"""The trainer's end of the data path: how a loader asks a session worker for a batch.

A :class:`BatchChannel` is chosen once per trainer group (``graphfeed.client.group.DataGroup``
opens it after the group formed and closes it when the group closes); the remote loader
talks only to it.  A request is one pull of batch ``seq`` of an epoch of a session: it
returns a :class:`~graphfeed.transport.pending.Pending` at once, so the loader keeps
``prefetch`` requests in flight per server (its credits) and checks the group's liveness
while it waits (``Pending.wait_done`` in slices).  A failed pull -- the worker's error, a
timeout, a lost peer -- is the pending batch's exception; the loader names the server.

Implementations: :class:`CallsChannel` over any :class:`~graphfeed.transport.calls.DataCalls` --
:class:`graphfeed.transport.torch_rpc.TorchRpcChannel` (torch RPC, trusted networks) and
:class:`graphfeed.transport.secure.SecureCalls` (authenticated, TLS when configured) -- and
:class:`graphfeed.transport.shm.ShmChannel` (same host, shared memory).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from graphfeed.transport.calls import DataCalls
from graphfeed.transport.pending import Pending


class ChannelClosed(RuntimeError):
    """A request on a channel that was closed (its trainer group was closed)."""


class BatchChannel(ABC):
    """Pulls of finished batches from the group's session workers (one per part)."""

    #: a short name of the transport, for messages and stats
    kind: str = "abstract"

    def __init__(self) -> None:
        self.closed = False

    @abstractmethod
    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        """Pull batch ``seq`` of ``epoch`` of session ``session_id`` from part ``part``'s worker.

        ``secret`` is the session's secret (OpenSessionReply.session_secret).  Returns at
        once; the pending result is the batch's wire dict (:mod:`graphfeed.core.batch`) or
        the error that the pull failed with.
        """

    def close(self) -> None:
        """Refuse further requests (pulls in flight end with the group's transport)."""
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosed(f"the {self.kind} batch channel was closed with its trainer group: "
                                f"connect a new client to pull more batches")


class CallsChannel(BatchChannel):
    """A pull is the worker's ``pull`` function called through ``calls``, bounded by ``rpc_timeout`` seconds."""

    def __init__(self, calls: DataCalls, rpc_timeout: float):
        super().__init__()
        self.calls, self.rpc_timeout = calls, float(rpc_timeout)
        self.kind = calls.kind

    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        self._check_open()
        return self.calls.call(part, "pull", (session_id, int(epoch), int(seq), secret), self.rpc_timeout)
