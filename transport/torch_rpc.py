"""The torch RPC batch channel: a pull is ``rpc_async(worker, pull, ...)`` over the group's TensorPipe.

The worker's half is ``graphfeed.server.worker.rpc_api.pull`` (async: it answers when the
batch is ready); its errors arrive as exceptions of the RPC future (``RemoteException``
re-raised by torch), or -- from older workers -- as an exception delivered as the value,
which is raised the same way here.  Each pull is bounded by ``rpc_timeout`` seconds and
names the group's key (:func:`graphfeed.transport.rpc_group.remote_function`).

torch RPC unpickles every request before any check runs: it is for trusted networks only
(a daemon with a token or TLS uses :mod:`graphfeed.transport.secure` instead).
"""
from __future__ import annotations

from graphfeed.transport.calls import TorchRpcCalls, settle  # noqa: F401 -- settle: the shm channel's import
from graphfeed.transport.channel import CallsChannel


class TorchRpcChannel(CallsChannel):
    """Pulls over the torch RPC group this process joined as the trainer (:func:`rpc_group.join_group`)."""

    kind = "torch-rpc"

    def __init__(self, rpc_timeout: float, group_key: bytes = b""):
        super().__init__(TorchRpcCalls(group_key), rpc_timeout)
