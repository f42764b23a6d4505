"""The trainer's end of the data path: how a loader asks a session worker for a batch.

A :class:`BatchChannel` is chosen once per trainer group (``graphfeed.client.group.DataGroup``
opens it after the group formed and closes it when the group closes); the remote loader
talks only to it.  A request is one pull of batch ``seq`` of an epoch of a session: it
returns a :class:`~graphfeed.transport.pending.Pending` at once, so the loader keeps
``prefetch`` requests in flight per server (its credits) and checks the group's liveness
while it waits (``Pending.wait_done`` in slices).  A failed pull -- the worker's error, a
timeout, a lost peer -- is the pending batch's exception; the loader names the server.

Besides pulls, the channel carries the trainer's other data-path calls to a worker: online
sampling (:meth:`BatchChannel.sample`) and the feature-cache fill (:meth:`BatchChannel.hot_rows`),
so the client never names a transport.

Implementations: :class:`CallsChannel` over any :class:`~graphfeed.transport.calls.DataCalls` --
:class:`graphfeed.transport.torch_rpc.TorchRpcChannel` (torch RPC, trusted networks) and
:class:`graphfeed.transport.secure.SecureCalls` (authenticated, TLS when configured) -- and
:class:`graphfeed.transport.shm.ShmChannel` (same host, shared memory).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from graphfeed.core.compact import unpack
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

    @abstractmethod
    def sample(self, part: int, session_id: str, secret: bytes, node_ids, seed: int) -> Pending:
        """Online sampling: one batch for original ids ``node_ids`` made by part ``part``'s worker with
        session ``session_id``'s sampling options (``rpc_api.sample``).  Returns at once; the pending result
        is the batch's wire dict, or the worker's error (ValueError for bad ids)."""

    @abstractmethod
    def hot_rows(self, part: int, ntype: str, start: int, count: int, dtype: str | None) -> Pending:
        """A trainer's feature-cache fill: ``(original ids, x rows)`` of part ``part``'s ``ntype`` nodes ranked
        ``start .. start + count - 1`` by in-degree, rows cast to ``dtype`` (``rpc_api.hot_rows``)."""

    def close(self) -> None:
        """Refuse further requests (pulls in flight end with the group's transport)."""
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosed(f"the {self.kind} batch channel was closed with its trainer group: "
                                f"connect a new client to pull more batches")


class CallsChannel(BatchChannel):
    """A pull is the worker's ``pull`` function called through ``calls``, bounded by ``rpc_timeout`` seconds.

    The worker answers pulls and samples in the compact wire form (:mod:`graphfeed.core.compact`); the
    pending batch is the unpacked one, bit-identical to what the worker produced."""

    def __init__(self, calls: DataCalls, rpc_timeout: float):
        super().__init__()
        self.calls, self.rpc_timeout = calls, float(rpc_timeout)
        self.kind = calls.kind

    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        self._check_open()
        pending = self.calls.call(part, "pull", (session_id, int(epoch), int(seq), secret), self.rpc_timeout)
        return pending.then(unpack)

    def sample(self, part: int, session_id: str, secret: bytes, node_ids, seed: int) -> Pending:
        self._check_open()
        return self.calls.call(part, "sample", (session_id, secret, node_ids, int(seed)), self.rpc_timeout).then(unpack)

    def hot_rows(self, part: int, ntype: str, start: int, count: int, dtype: str | None) -> Pending:
        self._check_open()
        return self.calls.call(part, "hot_rows", (ntype, int(start), int(count), dtype), self.rpc_timeout)
