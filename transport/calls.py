"""Calls to a trainer group's session workers, in no transport's terms: ``call(part, name, args)``.

The data path's one seam for everything that is not a batch pull through a
:class:`~graphfeed.transport.channel.BatchChannel` -- the shared-memory ring's set-up, online
samples, the hot-feature cache, and a worker's calls to its peers -- and the way the channels
themselves reach the workers.  ``name`` is one of :data:`graphfeed.transport.rpc_group.WORKER_RPC_FUNCTIONS`;
the answer (or the worker's error, raised as the same kind of exception) arrives in a
:class:`~graphfeed.transport.pending.Pending`.  A peer that is gone (its process killed, its connection
reset or refused) is one typed error whatever the transport: each implementation translates its own
wording into :class:`~graphfeed.transport.errors.PeerLost` (a ConnectionError naming the part), which
the Pending raises; the client's one recovery path (``Client.call_with_recovery``) waits on it.

Implementations: :class:`graphfeed.transport.torch_rpc.TorchRpcCalls` (torch RPC over the group the
process joined: trusted networks only) and :class:`graphfeed.transport.secure.SecureCalls`
(authenticated, TLS when configured, no pickle).  :class:`Function` is an entry of the table a
worker's listener answers.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from graphfeed.transport.errors import PeerLost
from graphfeed.transport.pending import Pending

__all__ = ["SYNC_SLACK", "DataCalls", "Function", "Handler", "PeerLost"]

SYNC_SLACK = 5.0   # seconds beyond a call's own timeout that call_sync waits for its answer

Handler = Callable[..., Any]


@dataclass(frozen=True)
class Function:
    """A function a worker's listener answers: ``fn(*args)``; ``is_async``: it returns a :class:`Pending` at once;
    ``peers``: the group's other workers may call it too (otherwise only the trainer may)."""

    fn: Handler
    is_async: bool = False
    peers: bool = False


class DataCalls(ABC):
    """Calls to the group's workers by part number."""

    #: the transport's name, for messages and stats
    kind: str = "abstract"
    #: the transport in words, for log lines ("torch RPC", "the secure data path")
    label: str = "the data path"

    def __init__(self) -> None:
        self.closed = False

    @abstractmethod
    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        """Call worker function ``name(*args)`` on part ``part``'s worker; returns at once.  The Pending raises
        the worker's error, TimeoutError, or :class:`PeerLost` when the worker (or its connection) is gone."""

    def call_sync(self, part: int, name: str, args: tuple, timeout: float) -> Any:
        """:meth:`call` and wait for its answer (raises the worker's error, or TimeoutError)."""
        return self.call(part, name, args, timeout).result(timeout + SYNC_SLACK)

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionError(f"the {self.kind} data path was closed with its trainer group")
