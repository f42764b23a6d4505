"""Joining a trainer's torch RPC data-path group: the part both sides (trainer, session workers) share.

* Names and ranks: the trainer is rank 0 ``"trainer"``; part ``K``'s worker is rank
  ``1 + K`` named :func:`worker_name` ``(K)``.
* Rendezvous: the trainer hosts a TCPStore at ``host:port``.  torch's ``tcp://`` method
  waits for the others for 30 minutes; graphfeed registers its own ``graphfeed-tcp://``
  scheme whose store waits only ``join_timeout`` seconds, so a trainer or worker whose
  peers never come fails within that bound.
* Interface: TensorPipe listens on the interface named by ``TP_SOCKET_IFNAME``; graphfeed
  configures an address, :func:`interface_for` maps it to the interface.

torch keeps a few per-process counters for its RPC start-up (store prefix, all-gather
sequence numbers); a process that leaves one group and joins a fresh one (a trainer that
connects twice) must reset them, or its keys no longer match the new peers'
(:func:`reset_rpc_counters`).
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import warnings
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from graphfeed.core.constants import TRAINER, worker_name  # noqa: F401 -- the group's member names

SCHEME = "graphfeed-tcp"
SIOCGIFADDR = 0x8915


def _rendezvous_handler(url: str, **kwargs):
    import torch.distributed as dist

    u = urlparse(url)
    if u.hostname is None or u.port is None:
        raise ValueError(f"rendezvous url {url!r} needs a host and a port (tcp://HOST:PORT?rank=..)")
    q = {k: v[0] for k, v in parse_qs(u.query).items()}
    rank, world_size = int(q["rank"]), int(q["world_size"])
    timeout = timedelta(seconds=float(q.get("join_timeout", "60")))
    store = dist.TCPStore(u.hostname, u.port, world_size, rank == 0, timeout=timeout, wait_for_workers=True,
                          multi_tenant=True)
    yield store, rank, world_size
    raise RuntimeError(f"{SCHEME}:// cannot re-rendezvous: open a new group")


def register_rendezvous() -> None:
    import importlib

    import torch.distributed as dist

    # torch.distributed.rendezvous is shadowed by the function of that name: import the module.
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if SCHEME not in handlers:
        dist.register_rendezvous_handler(SCHEME, _rendezvous_handler)


def init_method(rendezvous: str, join_timeout: float) -> str:
    return f"{SCHEME}://{rendezvous}?join_timeout={float(join_timeout):g}"


def reset_rpc_counters() -> None:
    import torch.distributed.rpc as rpc
    import torch.distributed.rpc.api as rpc_api

    with rpc._init_counter_lock:
        rpc._init_counter = 0
    with rpc_api._all_gather_dict_lock:
        rpc_api._all_gather_sequence_id.clear()
        rpc_api._all_gather_sequence_id_to_states.clear()


# TensorPipe transports of the data path.  Not "shm": its reactor thread busy-polls, and on
# a shared host that spin costs each member 2.4-3.8 CPU s per epoch of `bench remote` on the
# medium graph (1 server: epoch 9.5-13 s -> 5.1 s, trainer CPU 5.5-7.3 s -> 3.3 s).  Batch
# tensors still move in one copy through the CMA channel on one host; "uv" (TCP, event
# driven) carries the messages, and is what crosses hosts anyway.
TRANSPORTS = ("uv",)


def join_group(name: str, rank: int, world_size: int, rendezvous: str, *, rpc_timeout: float,
               join_timeout: float, num_worker_threads: int = 16, data_address: str | None = None) -> None:
    """``rpc.init_rpc`` for the data path; returns when every member joined, raises after the bounds."""
    import torch.distributed.rpc as rpc

    if data_address and "TP_SOCKET_IFNAME" not in os.environ:
        ifname = interface_for(data_address)
        if ifname is not None:
            os.environ["TP_SOCKET_IFNAME"] = ifname
    register_rendezvous()
    reset_rpc_counters()
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method(rendezvous, join_timeout),
                                           rpc_timeout=rpc_timeout, num_worker_threads=num_worker_threads,
                                           _transports=list(TRANSPORTS))
    with warnings.catch_warnings():
        # torch's own start-up uses a deprecated ProcessGroup path and warns about it.
        warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)


def interface_address(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_for(address: str) -> str | None:
    """The interface whose IPv4 address is ``address`` (host names are resolved); None if none is."""
    try:
        ip = socket.gethostbyname(address)
    except OSError:
        return None
    if ip.startswith("127."):
        ip = "127.0.0.1"
    for _, name in socket.if_nameindex():
        if interface_address(name) == ip:
            return name
    return None


# ---- naming a worker's RPC function without importing the server ----------------------------------

WORKER_RPC_MODULE = "graphfeed.server.worker.rpc_api"
WORKER_RPC_FUNCTIONS = ("pull", "one_hop", "gather", "pull_into", "attach", "detach", "sample", "hot_rows")


def remote_function(module: str, name: str):
    """Unpickling side of :class:`RemoteFunction`: only the worker's allow-listed functions resolve."""
    import importlib

    if module != WORKER_RPC_MODULE or name not in WORKER_RPC_FUNCTIONS:
        raise PermissionError(f"{module}.{name} is not a graphfeed worker RPC function")
    return getattr(importlib.import_module(module), name)


class RemoteFunction:
    """A worker RPC function as the trainer names it (the client never imports ``graphfeed.server``).

    Pickles to a reference that the worker resolves with :func:`remote_function`; carries
    torch's async-execution marker so the worker may answer with a future.
    """

    def __init__(self, name: str, is_async: bool = False):
        if name not in WORKER_RPC_FUNCTIONS:
            raise ValueError(f"unknown worker RPC function {name!r}")
        self.name = name
        if is_async:
            self._wrapped_async_rpc_function = self  # torch checks for this attribute when sending

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{WORKER_RPC_MODULE}.{self.name} runs on a session worker: call it with torch RPC")

    def __reduce__(self):
        return remote_function, (WORKER_RPC_MODULE, self.name)


PULL = RemoteFunction("pull", is_async=True)
PULL_INTO = RemoteFunction("pull_into", is_async=True)   # the shared-memory channel's pull
ATTACH = RemoteFunction("attach")                        # the shared-memory channel's set-up (and growth)
DETACH = RemoteFunction("detach")                        # ... and its retired slots
SAMPLE = RemoteFunction("sample", is_async=True)         # online sampling (Client.sample)
HOT_ROWS = RemoteFunction("hot_rows")                     # a loader's hot-feature cache (chunks of rows)


# TensorPipe's C++ agent warns about every pipe its own shutdown closes ("... encountered error when
# reading incoming request from part0: pipe closed" / "EOF: end of file"): expected on a normal leave.
CLOSING_PIPE_WARNING = "encountered error when reading incoming request from"
DRAIN_TIMEOUT_S = 10.0   # bound on reading what the shutdown wrote to stderr


def leave_group() -> None:
    """``rpc.shutdown(graceful=False)`` without TensorPipe's closing-pipe warnings on stderr.

    Not graceful: a graceful shutdown is a barrier over the group and would hang on a dead member.
    While the agent shuts down, file descriptor 2 goes to a pipe; afterwards every line it got is
    written to the real stderr except those warnings, so nothing else said meanwhile is lost.
    """
    import sys
    import threading

    import torch.distributed.rpc as rpc

    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    chunks: list[bytes] = []

    def drain() -> None:
        with os.fdopen(read_end, "rb") as r:
            while data := r.read1(65536):
                chunks.append(data)

    reader = threading.Thread(target=drain, name="rpc-shutdown-stderr", daemon=True)
    reader.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        rpc.shutdown(graceful=False)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)          # the pipe's last writer is gone: the reader sees its end
        os.close(saved)
        reader.join(DRAIN_TIMEOUT_S)
        kept = [line for line in b"".join(chunks).decode(errors="replace").splitlines(keepends=True)
                if CLOSING_PIPE_WARNING not in line]
        if kept:
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
