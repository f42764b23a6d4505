"""Calls to a trainer group's session workers, in no transport's terms: ``call(part, name, args)``.

The data path's one seam for everything that is not a batch pull through a
:class:`~graphfeed.transport.channel.BatchChannel` -- the shared-memory ring's set-up, online
samples, the hot-feature cache, and a worker's calls to its peers -- and the way the channels
themselves reach the workers.  ``name`` is one of :data:`graphfeed.transport.rpc_group.WORKER_RPC_FUNCTIONS`;
the answer (or the worker's error, raised as the same kind of exception) arrives in a
:class:`~graphfeed.transport.pending.Pending`.

Implementations: :class:`TorchRpcCalls` (torch RPC over the group the process joined: trusted
networks only) and :class:`graphfeed.transport.secure.SecureCalls` (authenticated, TLS when
configured, no pickle).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from graphfeed.transport.pending import Pending

SYNC_SLACK = 5.0   # seconds beyond a call's own timeout that call_sync waits for its answer


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
        """Call worker function ``name(*args)`` on part ``part``'s worker; returns at once."""

    def call_sync(self, part: int, name: str, args: tuple, timeout: float) -> Any:
        """:meth:`call` and wait for its answer (raises the worker's error, or TimeoutError)."""
        return self.call(part, name, args, timeout).result(timeout + SYNC_SLACK)

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionError(f"the {self.kind} data path was closed with its trainer group")


class TorchRpcCalls(DataCalls):
    """Calls over the torch RPC group this process joined (:func:`graphfeed.transport.rpc_group.join_group`)."""

    kind = "torch-rpc"
    label = "torch RPC"

    def __init__(self, group_key: bytes = b""):
        super().__init__()
        self.group_key = group_key

    def call(self, part: int, name: str, args: tuple, timeout: float) -> Pending:
        import torch.distributed.rpc as rpc

        from graphfeed.transport import rpc_group

        self._check_open()
        pending = Pending()
        try:
            fut = rpc.rpc_async(rpc_group.worker_name(part), rpc_group.remote(name, self.group_key), args=tuple(args),
                                timeout=timeout)
        except Exception as exc:  # noqa: BLE001 -- e.g. the group is shut down
            pending.set_exception(exc)
            return pending
        fut.add_done_callback(lambda f: settle(pending, f))
        return pending


def settle(pending: Pending, fut) -> None:
    """Move a completed torch future's value -- or its error -- into ``pending``."""
    try:
        value = fut.wait()
    except Exception as exc:  # noqa: BLE001 -- RPC errors arrive as RuntimeError with the remote message
        pending.set_exception(exc)
        return
    if isinstance(value, BaseException):  # an error delivered as a value (older workers)
        pending.set_exception(value)
    else:
        pending.set_result(value)
