"""What a data path is, as one object: the protocol every transport of :mod:`graphfeed.transport.registry` implements.

A :class:`DataPath` answers the questions the daemon, the session worker and the trainer used to ask a
flag: is it authenticated (a daemon with a token or TLS serves only such paths), does the trainer reserve a
rendezvous the workers dial (:attr:`DataPath.needs_rendezvous`), do the workers listen and learn their peers'
addresses from ``JoinGroup`` (:attr:`DataPath.joins_peers`).  It makes the two ends of a group's data path:

* :class:`WorkerEnd` (a session worker, :meth:`DataPath.worker`): listens before the worker reports
  ``Started`` (:meth:`WorkerEnd.listen`), serves once it did (:meth:`WorkerEnd.serve`), learns its peers
  (:meth:`WorkerEnd.join_peers`) and closes; its :attr:`WorkerEnd.calls` reach the peers.
* :class:`TrainerEnd` (the trainer, :meth:`DataPath.trainer`): prepares before ``OpenGroup``
  (:meth:`TrainerEnd.open`), notes each server's reply (:meth:`TrainerEnd.opened`), forms the group
  (:meth:`TrainerEnd.join`: the trainer's :class:`~graphfeed.transport.calls.DataCalls`) and closes.

A :class:`PullChannel` is the optional other kind of entry: a way to pull batches (a
:class:`~graphfeed.transport.channel.BatchChannel`) over a data path's calls, such as same-host shared memory.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from graphfeed.transport.calls import DataCalls, Function
from graphfeed.transport.channel import BatchChannel


class GroupError(ConnectionError):
    """The trainer's data-path group did not form; ``server`` names who is to blame ("cluster": no one server)."""

    def __init__(self, server: str, message: str):
        super().__init__(message)
        self.server, self.message = server, message


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (its type's name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class TlsFiles:
    """The trainer's TLS (PEM paths): the CA its servers' certificates are checked against (None: the system's),
    and its own certificate and key (mTLS)."""

    ca: Any = None
    cert: Any = None
    key: Any = None


@dataclass(frozen=True)
class ListenerLimits:
    """The bounds of a worker's data listener (the daemon's ``data_*`` settings): what an outsider who can reach it
    may hold, and what the key holders may.

    ``handshake_timeout``: seconds from accept to the client's proof, one deadline however the bytes trickle in;
    ``handshakes``: connections in set-up at once (more are closed at once); ``handshakes_per_source``: of those,
    from one IP address; ``connections``: authenticated connections at once (a group's trainer and peers);
    ``call_bytes``: the largest frame body one call may carry (a longer one ends its connection, unread)."""

    handshake_timeout: float = 10.0
    handshakes: int = 256
    handshakes_per_source: int = 32
    connections: int = 256
    call_bytes: int = 1 << 30

    def __post_init__(self):
        if not (self.handshake_timeout > 0 and min(self.handshakes, self.handshakes_per_source, self.connections,
                                                   self.call_bytes) >= 1):
            raise ValueError(f"listener limits must be positive: {self}")


@dataclass(frozen=True)
class WorkerPlace:
    """Where a session worker's end stands: its group as the daemon described it (``GroupSpec``)."""

    part_id: int
    group_id: str
    group_key: Any = field(repr=False)   # what DataPath.worker_key made of the group key (bytes, or a key ring)
    data_address: str = "127.0.0.1"   # the interface the worker's end binds to
    rendezvous: str = ""              # "host:port" the trainer reserved (paths that need one)
    rank: int = 0
    world_size: int = 0
    rpc_timeout: float = 60.0
    join_timeout: float = 60.0
    tls_cert: str | None = None       # the daemon's certificate and key (PEM paths), when it has TLS
    tls_key: str | None = None
    tls_client_ca: str | None = None  # the CA of the daemon's mTLS clients: the trainer must show a certificate
    tls_peer_ca: str | None = None    # the CA of the other daemons' certificates: a peer's is checked against it
    listener: ListenerLimits = ListenerLimits()   # the bounds of a listening path's listener

    def say(self, line: str) -> str:
        """A log line of this worker (the daemon's log: the worker's stderr)."""
        return f"graphfeed session worker part{self.part_id} group {self.group_id}: {line}"


@dataclass(frozen=True)
class WorkerHooks:
    """What a session worker lends its end: the calls it answers and how it reports."""

    functions: Callable[[], Mapping[str, Function]]   # the allow-listed calls a listener answers
    guard: Callable[[], None]          # refuse any other call in this process (torch RPC runs what it unpickles)
    say: Callable[[str], None]         # one line to the daemon's log
    refused: Callable[[], None]        # count a connection refused at the handshake
    formed: Callable[[], None]         # the group formed (run in a background thread: colocated reads, ...)
    failed: Callable[[str], None]      # the group cannot form: say why and end the worker


class WorkerEnd(ABC):
    """A session worker's end of its group's data path."""

    calls: DataCalls   # to the peer workers

    def __init__(self, place: WorkerPlace):
        self.place = place

    def listen(self, hooks: WorkerHooks) -> str:
        """Before the worker reports ``Started``: the ``host:port`` the trainer and the peers dial ("": none)."""
        return ""

    def serve(self, hooks: WorkerHooks) -> None:  # noqa: B027 -- optional: a listening path serves already
        """After ``Started``: take part in the group (in the background); ``hooks.formed`` once it formed."""

    def listener_figures(self) -> dict[str, Any]:
        """The listener's cumulative counts by kind (``counts``) and whether its set-up slots are all taken
        (``saturated``: 0 or 1), for the worker's metrics; {} for a path without a listener."""
        return {}

    def join_peers(self, endpoints: Mapping[int, str], hooks: WorkerHooks) -> None:
        """The peers' listeners (part -> ``host:port``, this part left out), for a path that :attr:`joins_peers`."""
        raise NotImplementedError

    @abstractmethod
    def not_joined(self) -> str:
        """Why a command that needs the group cannot run yet: what the trainer must do first."""

    @abstractmethod
    def close(self, formed: bool) -> None:
        """Leave the group (``formed``: it had formed) and stop listening."""


class TrainerEnd(ABC):
    """The trainer's end of its group's data path."""

    rendezvous: str = ""   # what OpenGroup names to the servers ("" for a path without a rendezvous)

    def open(self, host: str, servers: int) -> None:  # noqa: B027 -- optional: most paths reserve nothing
        """Before OpenGroup: reserve what the servers' workers will dial (``host`` is this trainer's address)."""

    def opened(self, part: int, data_path: str, endpoint: str) -> str | None:
        """A server's OpenGroup reply (its data path and its worker's listener): None, or why it cannot be used."""
        return None

    @abstractmethod
    def join(self, *, endpoints: Mapping[int, str], names: Sequence[str], host: str, timeout: float,
             rpc_timeout: float, tls: TlsFiles | None, probe: Callable[[], dict[str, str]]) -> DataCalls:
        """Form the group; its calls (``tls``: the trainer's, when it uses TLS).  :class:`GroupError` naming
        the servers when it does not form (``probe``: the servers that lost the group now, name -> why)."""

    def close(self) -> None:  # noqa: B027 -- optional: the calls' close is enough for most paths
        """Leave the group and free what :meth:`open` reserved."""


class DataPath(ABC):
    """One data-path transport: the traits others ask about and the two ends it makes."""

    name: str = ""                  # its registry name, the wire value of OpenGroup's data_path (set by register)
    label: str = "the data path"    # in words, for messages
    authenticated: bool = False     # every connection proves the group key; nothing is unpickled
    needs_rendezvous: bool = False  # the trainer reserves a rendezvous the workers dial (a daemon checks it)
    joins_peers: bool = False       # the workers listen; JoinGroup tells each where its peers are

    @abstractmethod
    def worker(self, place: WorkerPlace) -> WorkerEnd:
        """A session worker's end (in the worker process)."""

    @abstractmethod
    def trainer(self, group_key: bytes, token: str | None = None) -> TrainerEnd:
        """The trainer's end of a group with key ``group_key`` (``token``: the control plane's, when it has one)."""

    def worker_key(self, group_key: bytes, token: str | None, part: int, num_parts: int) -> Any:
        """What the daemon hands part ``part``'s worker as its key of the group (:attr:`WorkerPlace.group_key`):
        by default the group key itself."""
        return group_key

    def not_joinable(self) -> str:
        """What a worker says to JoinPeers on a path whose workers do not listen."""
        return f"JoinPeers is for a data path whose workers listen; this worker joined {self.label}"


class PullChannel(ABC):
    """A way to pull batches over a data path's calls (e.g. shared memory with the servers on this host)."""

    name: str = ""

    @abstractmethod
    def open(self, parts: Sequence[int], calls: DataCalls, *, group: str, rpc_timeout: float,
             **options: Any) -> BatchChannel:
        """The group's batch channel; falls back to pulls through ``calls`` (one log line) when it cannot be set up."""
