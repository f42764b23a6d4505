"""The torch RPC data path (trusted networks only): the group is a torch RPC group, a call is ``rpc_async``.

The trainer reserves a rendezvous (:func:`~graphfeed.transport.rpc_group.reserve_rendezvous`) and joins as
rank 0 ``"trainer"``; each session worker joins as ``part<K>`` in a background thread once it reported
``Started`` (bounded by ``join_timeout``).  Every call names the group's key
(:func:`graphfeed.transport.rpc_group.remote_function`), and a worker runs only the allow-listed functions.

The worker's half of a pull is ``graphfeed.server.worker.rpc_api.pull`` (async: it answers when the
batch is ready); its errors arrive as exceptions of the RPC future (``RemoteException``
re-raised by torch), or -- from older workers -- as an exception delivered as the value,
which is raised the same way here.  Each pull is bounded by ``rpc_timeout`` seconds.

torch RPC unpickles every request before any check runs: it is for trusted networks only
(a daemon with a token or TLS uses :mod:`graphfeed.transport.secure` instead).
"""
from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

from graphfeed.transport import rpc_group
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.channel import CallsChannel
from graphfeed.transport.errors import translated
from graphfeed.transport.path import (
    DataPath,
    GroupError,
    TlsFiles,
    TrainerEnd,
    WorkerEnd,
    WorkerHooks,
    WorkerPlace,
    first_line,
)
from graphfeed.transport.pending import Pending
from graphfeed.transport.registry import TORCH_RPC


class TorchRpcCalls(DataCalls):
    """Calls over the torch RPC group this process joined (:func:`graphfeed.transport.rpc_group.join_group`)."""

    kind = TORCH_RPC
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
        except Exception as exc:  # noqa: BLE001 -- e.g. the group is shut down, or the peer is gone
            pending.set_exception(translated(part, exc, self.label))
            return pending
        fut.add_done_callback(lambda f: settle(pending, f, part))
        return pending


def settle(pending: Pending, fut, part: int | None = None) -> None:
    """Move a completed torch future's value -- or its error -- into ``pending``.  A lost peer (torch RPC says
    it only in words: ``EOF``, ``connection reset``, ...) becomes :class:`PeerLost` for ``part``."""
    try:
        value = fut.wait()
    except Exception as exc:  # noqa: BLE001 -- RPC errors arrive as RuntimeError with the remote message
        pending.set_exception(exc if part is None else translated(part, exc, TorchRpcCalls.label))
        return
    if isinstance(value, BaseException):  # an error delivered as a value (older workers)
        pending.set_exception(value)
    else:
        pending.set_result(value)


class TorchRpcChannel(CallsChannel):
    """Pulls over the torch RPC group this process joined as the trainer (:func:`rpc_group.join_group`)."""

    kind = TORCH_RPC

    def __init__(self, rpc_timeout: float, group_key: bytes = b""):
        super().__init__(TorchRpcCalls(group_key), rpc_timeout)


class TorchRpcWorker(WorkerEnd):
    """A worker joins the trainer's group at its rendezvous, after ``Started``; only the guarded calls run."""

    def __init__(self, place: WorkerPlace):
        super().__init__(place)
        self.calls = TorchRpcCalls(place.group_key)

    def serve(self, hooks: WorkerHooks) -> None:
        rpc_group.serve_group(self.place.group_key)
        hooks.guard()
        threading.Thread(target=self._join, args=(hooks,), name="join-group", daemon=True).start()

    def _join(self, hooks: WorkerHooks) -> None:
        p = self.place
        try:
            rpc_group.join_group(rpc_group.worker_name(p.part_id), p.rank, p.world_size, p.rendezvous,
                                rpc_timeout=p.rpc_timeout, join_timeout=p.join_timeout, data_address=p.data_address)
        except BaseException as exc:  # noqa: BLE001 -- reported to the daemon, then the process exits
            hooks.failed(f"could not join the trainer's group at {p.rendezvous}: {type(exc).__name__}: {exc}")
            return
        hooks.formed()

    def not_joined(self) -> str:
        return (f"the trainer's RPC group did not form within {self.place.join_timeout:g} s; the trainer must join "
                f"the group (rendezvous {self.place.rendezvous}) before StartEpoch")

    def close(self, formed: bool) -> None:
        if formed:
            import torch.distributed.rpc as rpc

            # Not graceful: a graceful shutdown is a barrier over the whole group and would
            # wait for the trainer (or hang on a dead peer).
            rpc.shutdown(graceful=False)


class TorchRpcTrainer(TrainerEnd):
    """The trainer reserves the rendezvous before OpenGroup and joins as rank 0 once every server opened."""

    def __init__(self, group_key: bytes):
        self.group_key = group_key
        self.joined = False

    def open(self, host: str, servers: int) -> None:
        self.rendezvous = rpc_group.reserve_rendezvous(host, backlog=max(64, servers))

    def join(self, *, endpoints: Mapping[int, str], names: Sequence[str], host: str, timeout: float,
             rpc_timeout: float, tls: TlsFiles | None, probe: Callable[[], dict[str, str]]) -> DataCalls:
        try:
            rpc_group.join_group(rpc_group.TRAINER, 0, len(names) + 1, self.rendezvous,
                                rpc_timeout=rpc_timeout, join_timeout=timeout, data_address=host)
        except Exception as exc:  # noqa: BLE001 -- any join failure becomes a GroupError naming the servers
            dead = probe()
            who = "; ".join(f"{k}: {v}" for k, v in dead.items()) or "every server still answers on its control port"
            if isinstance(exc, ValueError):   # found before any wait: a set-up that can never form a group
                raise GroupError("cluster", f"the data-path group cannot form at {self.rendezvous}: "
                                            f"{first_line(exc)}") from None
            fix = (rpc_group.gloo_hint(host) if "gloo" in str(exc).lower()
                   else f"is {host} reachable from the servers? (set advertise_host)")
            raise GroupError(", ".join(dead) or "cluster",
                             f"the data-path group did not form within {timeout:g} s at {self.rendezvous} "
                             f"({who}); {fix}; cause: {first_line(exc)}") from None
        self.joined = True
        return TorchRpcCalls(self.group_key)

    def close(self) -> None:
        if self.joined:
            rpc_group.leave_group()   # not graceful (a dead worker would hang it), without TensorPipe's
            self.joined = False       # warnings about the pipes it closes
        if self.rendezvous:
            rpc_group.release_rendezvous(self.rendezvous)   # a group that failed before its store took the port
            rpc_group.drop_rendezvous()   # ... or after: a store that took it listens until stopped


class TorchRpc(DataPath):
    """torch RPC: a rendezvous the trainer reserves, workers that dial it; unauthenticated (trusted networks)."""

    label = "torch RPC"
    needs_rendezvous = True

    def worker(self, place: WorkerPlace) -> WorkerEnd:
        return TorchRpcWorker(place)

    def trainer(self, group_key: bytes, token: str | None = None) -> TrainerEnd:
        return TorchRpcTrainer(group_key)


PATH = TorchRpc()
