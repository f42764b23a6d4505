"""The torch RPC batch channel: a pull is ``rpc_async(worker, PULL, ...)`` over the group's TensorPipe.

The worker's half is ``graphfeed.server.worker.rpc_api.pull`` (async: it answers when the
batch is ready); its errors arrive as exceptions of the RPC future (``RemoteException``
re-raised by torch), or -- from older workers -- as an exception delivered as the value,
which is raised the same way here.  Each pull is bounded by ``rpc_timeout`` seconds.
"""
from __future__ import annotations

from graphfeed.transport import rpc_group
from graphfeed.transport.channel import BatchChannel
from graphfeed.transport.pending import Pending


class TorchRpcChannel(BatchChannel):
    """Pulls over the torch RPC group this process joined as the trainer (:func:`rpc_group.join_group`)."""

    kind = "torch-rpc"

    def __init__(self, rpc_timeout: float):
        import torch.distributed.rpc as rpc

        super().__init__()
        self._rpc = rpc
        self.rpc_timeout = float(rpc_timeout)

    def request(self, part: int, session_id: str, secret: bytes, epoch: int, seq: int) -> Pending:
        return self._call(part, rpc_group.PULL, (session_id, epoch, seq, secret))

    def sample(self, part: int, session_id: str, secret: bytes, node_ids, seed: int) -> Pending:
        return self._call(part, rpc_group.SAMPLE, (session_id, secret, node_ids, int(seed)))

    def hot_rows(self, part: int, ntype: str, start: int, count: int, dtype: str | None) -> Pending:
        return self._call(part, rpc_group.HOT_ROWS, (ntype, int(start), int(count), dtype))

    def _call(self, part: int, func, args: tuple) -> Pending:
        """``func(*args)`` on part ``part``'s worker, bounded by ``rpc_timeout``; its answer as a Pending."""
        self._check_open()
        fut = self._rpc.rpc_async(rpc_group.worker_name(part), func, args=args, timeout=self.rpc_timeout)
        pending = Pending()
        fut.add_done_callback(lambda f: settle(pending, f))
        return pending


def settle(pending: Pending, fut) -> None:
    """Move a completed torch future's batch -- or its error -- into ``pending``."""
    try:
        value = fut.wait()
    except Exception as exc:  # noqa: BLE001 -- RPC errors arrive as RuntimeError with the remote message
        pending.set_exception(exc)
        return
    if isinstance(value, BaseException):  # an error delivered as a value (older workers)
        pending.set_exception(value)
    else:
        pending.set_result(value)
