"""Joining a trainer's torch RPC data-path group: the part both sides (trainer, session workers) share.

* Names and ranks: the trainer is rank 0 ``"trainer"``; part ``K``'s worker is rank
  ``1 + K`` named :func:`worker_name` ``(K)``.
* Rendezvous: the trainer hosts a TCPStore at ``host:port``, listening on that address only.  It reserves
  the port with a listening socket (:func:`reserve_rendezvous`) before it tells the servers the address,
  and the store takes over that very socket: no other process can take the port in between (the servers'
  workers start in between, seconds).  torch's ``tcp://`` method
  waits for the others for 30 minutes; graphfeed registers its own ``graphfeed-tcp://``
  scheme whose store waits only ``join_timeout`` seconds, so a trainer or worker whose
  peers never come fails within that bound.
* Interface: TensorPipe listens on the interface named by ``TP_SOCKET_IFNAME``; graphfeed
  configures an address, :func:`interface_for` maps it to the interface.  torch RPC's start-up
  also forms a Gloo process group (its barrier), whose address comes from ``GLOO_SOCKET_IFNAME`` or
  else from this host's *name*: where the name does not resolve to the cluster address (127.0.1.1
  in /etc/hosts, or not at all) Gloo announces 127.0.0.1 and its peers cannot reach it.  The same
  interface is therefore pinned for Gloo (unless the variable is set already).
* Bounds: every wait of the start-up is bounded by ``join_timeout``: the store's wait for the
  members, Gloo's full mesh (torch's default is 2^31-1 ms: a trainer would wait for weeks on a
  member that failed) with what is left of it, and the start-up's all-gather.  Gloo's mesh waits up
  to about five times the timeout it is given (74 s for 14.8 s with torch 2.13, a member gone):
  it gets a fifth.  An address Gloo would announce that the other hosts cannot reach (loopback
  while the group's address is not) fails at once, before any wait (:func:`check_gloo_address`).

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
import time
import warnings
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from graphfeed.core.constants import TRAINER, worker_name  # noqa: F401 -- the group's member names

SCHEME = "graphfeed-tcp"
SIOCGIFADDR = 0x8915


_join_deadline = [0.0]   # time.monotonic() by which the group of the join in progress must have formed
_reserved: dict[tuple[str, int], socket.socket] = {}   # (host, port) -> the listening socket a rank-0 store takes
_store_sockets: list[tuple[tuple, int]] = []   # (address, fd) of each listening socket a rank-0 store took
MIN_GLOO_TIMEOUT_S = 1.0
GLOO_WAIT_FACTOR = 5.0   # Gloo's mesh waits up to this many times its timeout (see the module doc)


def _bound_gloo(deadline: float) -> None:
    """Give the Gloo group torch RPC forms next what is left until ``deadline`` (torch reads this constant
    when it forms the group, right after the rendezvous)."""
    import torch.distributed.rpc.constants as rpc_constants

    left = max(MIN_GLOO_TIMEOUT_S, (deadline - time.monotonic()) / GLOO_WAIT_FACTOR)
    rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT = timedelta(seconds=left)


def _rendezvous_handler(url: str, **kwargs):
    import torch.distributed as dist

    u = urlparse(url)
    if u.hostname is None or u.port is None:
        raise ValueError(f"rendezvous url {url!r} needs a host and a port (tcp://HOST:PORT?rank=..)")
    q = {k: v[0] for k, v in parse_qs(u.query).items()}
    rank, world_size = int(q["rank"]), int(q["world_size"])
    timeout = timedelta(seconds=float(q.get("join_timeout", "60")))
    listen_fd = None
    if rank == 0:   # the store listens on the rendezvous address only (torch's own server listens on every one)
        listener = _reserved.pop((u.hostname, u.port), None) or \
            socket.create_server((u.hostname, u.port), backlog=max(64, world_size))
        _store_sockets.append((listener.getsockname(), listener.fileno()))
        listen_fd = listener.detach()   # the store owns the socket from here on
    store = dist.TCPStore(u.hostname, u.port, world_size, rank == 0, timeout=timeout, wait_for_workers=True,
                          multi_tenant=True, master_listen_fd=listen_fd)
    _bound_gloo(_join_deadline[0] or time.monotonic() + timeout.total_seconds())
    yield store, rank, world_size
    raise RuntimeError(f"{SCHEME}:// cannot re-rendezvous: open a new group")


def reserve_rendezvous(host: str, backlog: int = 64) -> str:
    """A rendezvous address ``host:port`` on a free port, held by a listening socket until the rank-0 store of
    this process takes it (:func:`join_group`) or :func:`release_rendezvous` closes it."""
    listener = socket.create_server((host, 0), backlog=backlog)
    port = listener.getsockname()[1]
    _reserved[(host.lower(), port)] = listener   # as urlparse gives the host back: lower case
    return f"{host}:{port}"


def release_rendezvous(address: str) -> None:
    """Close the reservation of ``address`` if no store took it (a group that failed before its join)."""
    host, _, port = address.rpartition(":")
    listener = _reserved.pop((host.lower(), int(port)), None)
    if listener is not None:
        listener.close()


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
    """``rpc.init_rpc`` for the data path; returns when every member joined, raises after the bounds.

    The start-up's waits (rendezvous, Gloo's mesh, the first all-gather) are bounded by ``join_timeout``
    seconds; ``rpc_timeout`` is the group's default per call once it has formed."""
    import torch.distributed.rpc as rpc

    if data_address:
        pin_interfaces(data_address)
        check_gloo_address(data_address)
    register_rendezvous()
    reset_rpc_counters()
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method(rendezvous, join_timeout),
                                           rpc_timeout=min(rpc_timeout, join_timeout),
                                           num_worker_threads=num_worker_threads, _transports=list(TRANSPORTS))
    _join_deadline[0] = time.monotonic() + join_timeout
    try:
        with warnings.catch_warnings():
            # torch's own start-up uses a deprecated ProcessGroup path and warns about it.
            warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
            rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
    finally:
        _join_deadline[0] = 0.0
    rpc._set_rpc_timeout(rpc_timeout)


IFNAME_VARIABLES = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")   # TensorPipe's, Gloo's
_OUR_PINS: dict[str, str] = {}   # the values pin_interfaces set itself (the operator's own values are kept)


def pin_interfaces(data_address: str) -> str | None:
    """Have TensorPipe and Gloo use the interface of ``data_address`` (a variable the operator set wins);
    the interface, or None when no interface here has that address (then both pick their own).  A value
    this function set for an earlier group (e.g. ``lo`` for a cluster on loopback) is replaced, never
    carried over to a group at another address."""
    ifname = interface_for(data_address)
    for var in IFNAME_VARIABLES:
        current = os.environ.get(var)
        if current is not None and current != _OUR_PINS.get(var):
            continue   # set by the operator
        if ifname is None:
            os.environ.pop(var, None)
            _OUR_PINS.pop(var, None)
        else:
            os.environ[var] = _OUR_PINS[var] = ifname
    return ifname


def gloo_address() -> str:
    """The IPv4 address Gloo announces in this process: its interface's, else the one this host's name
    resolves to, else 127.0.0.1 (Gloo's fallback)."""
    pinned = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if pinned:
        return interface_address(pinned) or "0.0.0.0"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def check_gloo_address(data_address: str) -> None:
    """ValueError naming the fix when Gloo would announce a loopback address while the group's address is not
    one: the other members could never connect, and would find out only after the timeout."""
    try:
        ip = socket.gethostbyname(data_address)
    except OSError:
        return
    gloo = gloo_address()
    if gloo.startswith("127.") and not ip.startswith("127."):
        raise ValueError(f"Gloo (torch RPC's start-up) would announce {gloo} to the other hosts, not {ip}: "
                         f"{gloo_hint(data_address)}")


def gloo_hint(address: str) -> str:
    """The fix to name when the start-up's Gloo group did not form (see the module doc)."""
    pinned = os.environ.get("GLOO_SOCKET_IFNAME")
    where = f"GLOO_SOCKET_IFNAME={pinned} here" if pinned else "no GLOO_SOCKET_IFNAME here"
    return (f"torch RPC's Gloo start-up did not connect ({where}): set GLOO_SOCKET_IFNAME on every host to the "
            f"interface of its cluster address (here: the one of {address}), or make each host's name resolve "
            f"to its cluster address")


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
#: what a trainer calls on its session workers
TRAINER_FUNCTIONS = ("pull", "pull_into", "attach", "detach", "sample", "hot_rows", "sample_seeds", "node_rows",
                     "part_edges", "emb_create", "emb_close", "emb_attach", "emb_push", "emb_save", "emb_load")
#: what a session worker calls on its peers (``emb_rows`` also the trainer, to read a table)
PEER_FUNCTIONS = ("one_hop", "gather", "has_edges", "edge_attr", "to_global", "part_identity", "emb_rows",
                  "input_seeds")
WORKER_RPC_FUNCTIONS = TRAINER_FUNCTIONS + PEER_FUNCTIONS
#: the functions that answer with a future (torch's async execution)
ASYNC_FUNCTIONS = frozenset({"pull", "pull_into", "sample", "sample_seeds"})

_group_key: bytes | None = None   # set in a session worker: the key every call to it must name


def serve_group(key: bytes) -> None:
    """This process (a session worker) answers calls that carry ``key`` -- its trainer group's key."""
    global _group_key
    _group_key = bytes(key)


class Verified:
    """A worker function whose caller named the group's key (what :func:`remote_function` resolves to)."""

    def __init__(self, func):
        self.func = func
        self.__name__ = self.__qualname__ = func.__name__
        self.__module__ = func.__module__

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


def remote_function(module: str, name: str, key: bytes = b""):
    """Unpickling side of :class:`RemoteFunction`: only the worker's allow-listed functions resolve, and
    only for a caller that names this worker's group key (PermissionError otherwise)."""
    import hmac
    import importlib

    if module != WORKER_RPC_MODULE or name not in WORKER_RPC_FUNCTIONS:
        raise PermissionError(f"{module}.{name} is not a graphfeed worker RPC function")
    if _group_key is None or not isinstance(key, bytes) or not hmac.compare_digest(key, _group_key):
        raise PermissionError(f"{name}: the call does not carry this worker's trainer group key (only the "
                              f"trainer and the workers of the group may call it)")
    return Verified(getattr(importlib.import_module(module), name))


class RemoteFunction:
    """A worker RPC function as the trainer (or a peer) names it (the client never imports ``graphfeed.server``).

    Pickles to a reference that the worker resolves with :func:`remote_function`, carrying the
    group key the worker checks; carries torch's async-execution marker so the worker may answer
    with a future.
    """

    def __init__(self, name: str, is_async: bool = False, key: bytes = b""):
        if name not in WORKER_RPC_FUNCTIONS:
            raise ValueError(f"unknown worker RPC function {name!r}")
        self.name, self.key = name, bytes(key)
        if is_async:
            self._wrapped_async_rpc_function = self  # torch checks for this attribute when sending

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{WORKER_RPC_MODULE}.{self.name} runs on a session worker: call it with torch RPC")

    def __reduce__(self):
        return remote_function, (WORKER_RPC_MODULE, self.name, self.key)


def remote(name: str, key: bytes = b"") -> RemoteFunction:
    """The :class:`RemoteFunction` of worker function ``name`` carrying group key ``key``."""
    return RemoteFunction(name, is_async=name in ASYNC_FUNCTIONS, key=key)


# TensorPipe's C++ agent warns about every pipe its own shutdown closes ("... encountered error when
# reading incoming request from part0: pipe closed" / "EOF: end of file"): expected on a normal leave.
CLOSING_PIPE_WARNING = "encountered error when reading incoming request from"
DRAIN_TIMEOUT_S = 10.0   # bound on reading what the shutdown wrote to stderr


def drop_rendezvous() -> None:
    """Stop the rendezvous of the group this process left from listening: after ``shutdown`` torch keeps its
    rendezvous iterator in a module global (``torch.distributed.rpc.rendezvous_iterator``, closed here: it ends
    :func:`_rendezvous_handler` at its ``yield``) and the rank-0 store inside, whose socket would go on
    listening for the life of the trainer; its listening socket is shut down (:func:`stop_listening`)."""
    import torch.distributed.rpc as rpc

    iterator = getattr(rpc, "rendezvous_iterator", None)
    if iterator is not None:
        del rpc.rendezvous_iterator   # torch sets it afresh at its next init_rpc
        iterator.close()
    while _store_sockets:
        stop_listening(*_store_sockets.pop())


def stop_listening(address: tuple, fd: int) -> None:
    """End listening on the socket a store took (``fd``, bound to ``address``), if it still is that socket: the
    store itself is kept alive inside torch after ``shutdown`` (its agent), so its port would stay open for
    the life of the process.  ``shutdown`` acts on the socket, not the descriptor, so a duplicate ends it
    while the store's own descriptor stays valid (closed by the store whenever torch frees it)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return   # the store closed it already
    with sock:
        try:
            if sock.getsockname() != address or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return   # the descriptor was closed and reused: not ours to touch
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return


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
        drop_rendezvous()
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
