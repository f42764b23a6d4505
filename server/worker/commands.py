"""The daemon <-> session worker protocol: what starts a worker, its commands, replies and errors.

The daemon starts a worker with a :class:`GroupSpec` and then sends it one :class:`Command`
at a time over a private pipe (:mod:`.handle`); the worker answers each with the command's
:attr:`~Command.reply` type or with a :class:`WorkerError` (:mod:`.process`).  Every record
here is frozen and travels pickled.

Commands and their replies:

==============================================  ======================================
:class:`OpenSession` (session id, secret, spec)  :class:`SessionOpened` (local input nodes)
:class:`StartEpoch` (session, epoch, counts, start) :class:`EpochStarted` (number of batches)
:class:`CloseSession` (session id)               :class:`SessionClosed`
:class:`Stats`                                   :class:`SessionRows` (one row per session)
:class:`Metrics`                                 :class:`MetricsSnapshot` (cumulative figures)
:class:`JoinPeers` (every worker's data address)   :class:`PeersJoined` (a data path whose workers listen)
:class:`Stop`                                    :class:`Stopped`
==============================================  ======================================

Errors are classified where they happen: the worker raises :class:`BadRequest` when the
request is wrong, :class:`NotFound` for an unknown session, :class:`NotReady` while the
trainer's group has not formed.  Any other exception inside a worker reaches the daemon
as a plain :class:`WorkerError` (an internal failure, never the caller's fault).
:class:`WorkerGone` is raised by the handle when the worker died or stopped answering.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from graphfeed.core.spec import LoaderSpec
from graphfeed.server.sampling.budget import WorkBudget
from graphfeed.server.worker.settings import WorkerSettings
from graphfeed.transport.registry import TORCH_RPC

START_ID = "start"   # the message id of the worker's first answer: Started, to its GroupSpec


@dataclass(frozen=True)
class GroupSpec(WorkerSettings):
    """What a session worker is started with (the first message on its pipe): the daemon's
    :class:`~.settings.WorkerSettings` (``settings_of`` its config) and what it sets per trainer group."""

    group_id: str
    rendezvous: str          # "host:port" of the trainer's store
    world_size: int
    rank: int                # 1 + part_id
    part_id: int
    partition_root: str      # the partition folder (META.json inside)
    data_address: str = "127.0.0.1"   # interface TensorPipe binds to
    budget: WorkBudget = WorkBudget()   # caps of one batch (the daemon's max_hops / max_batch_*)
    # the data path: a name of graphfeed.transport.registry (a path with a rendezvous joins the trainer's group
    # there; one whose workers listen binds ``data_address`` for holders of ``group_key``, TLS with ``tls_cert``)
    data_path: str = TORCH_RPC
    # the trainer group's key as the data path gives it to a worker (DataPath.worker_key: the secure path's is this
    # part's ring of pair keys, not the group's key; never logged)
    group_key: Any = field(default=b"", repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None   # the daemon's mTLS client CA: the trainer must show a certificate it signed
    tls_peer_ca: str | None = None     # the CA of the other daemons' certificates: peers' are checked against it
    namespace: str = "default"   # the job's folder under embedding_dir: its tables' checkpoints live there only


# ---- errors ---------------------------------------------------------------------------------------

class WorkerError(Exception):
    """A worker command failed.  Raised as itself, it is an internal failure (a bug, a torch error);
    the subclasses say what the caller did wrong or what is missing."""


class BadRequest(WorkerError):
    """The command asks for something invalid (the daemon answers INVALID_ARGUMENT)."""


class NotFound(WorkerError):
    """The command names a session the worker does not have (NOT_FOUND)."""


class NotReady(WorkerError):
    """The worker cannot do this yet, e.g. the trainer's RPC group has not formed (FAILED_PRECONDITION)."""


class WorkerGone(WorkerError):
    """The worker process died, was stopped, or did not answer in time (raised by the handle)."""


# ---- replies --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Started:
    """The worker mapped its partition and serves commands."""

    pid: int
    endpoint: str = ""    # "host:port" of the worker's data-path listener ("" for a path whose workers do not listen)


@dataclass(frozen=True)
class SessionOpened:
    local_input_nodes: int    # this part's input nodes for the session (StartEpoch's counts[part])


@dataclass(frozen=True)
class EpochStarted:
    num_batches: int          # the batches this part produces for the epoch


@dataclass(frozen=True)
class SessionClosed:
    pass


@dataclass(frozen=True)
class ServedCounts:
    """The data-path figures of a session, or summed over the sessions of a kind: the one list of these
    keys (the worker's stats rows and metrics, the daemon's ``GetStats`` and ``/metrics`` read them from
    here).  The cumulative ones only grow (``graphfeed_<name>_total`` counters); the gauges are state now."""

    batches_produced: int = 0
    batches_served: int = 0
    bytes_served: int = 0
    buffered_batches: int = 0   # gauge: produced batches waiting for their pull
    buffered_bytes: int = 0     # gauge: their tensor bytes

    GAUGES: ClassVar[tuple[str, ...]] = ("buffered_batches", "buffered_bytes")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def cumulative_names(cls) -> tuple[str, ...]:
        return tuple(n for n in cls.names() if n not in cls.GAUGES)

    def __add__(self, other: ServedCounts) -> ServedCounts:
        return ServedCounts(*(getattr(self, n) + getattr(other, n) for n in self.names()))

    def cumulative(self) -> ServedCounts:
        """These counts with the gauges at 0 (what a closed session leaves behind)."""
        return replace(self, **dict.fromkeys(self.GAUGES, 0))

    def as_dict(self) -> dict[str, int]:
        return {n: int(getattr(self, n)) for n in self.names()}


@dataclass(frozen=True)
class SessionRow:
    """One open session's stats (the fields of ``SessionStats`` in the control protocol)."""

    session_id: str
    group_id: str
    kind: str
    epoch: int                 # the running (or last) epoch; -1 before the first
    counts: ServedCounts
    idle_seconds: float = 0.0  # since the session's last StartEpoch, pull or sample (the daemon expires it)

    def as_fields(self) -> dict[str, Any]:
        """The flat fields (those of ``SessionStats`` in the control protocol, and ``idle_seconds``)."""
        return dict(session_id=self.session_id, group_id=self.group_id, kind=self.kind, epoch=self.epoch,
                    idle_seconds=self.idle_seconds, **self.counts.as_dict())


@dataclass(frozen=True)
class SessionRows:
    rows: tuple[SessionRow, ...]    # one row per open session


@dataclass(frozen=True)
class MetricsSnapshot:
    """Cumulative figures since the worker started: the telemetry sections (``stages``, ``remote``,
    ``remote_errors``, ``errors``, see :mod:`.telemetry`) and ``kinds``: per session kind, its
    :class:`ServedCounts` (closed sessions included; gauges of the open ones)."""

    figures: dict[str, Any]


@dataclass(frozen=True)
class Stopped:
    pass


@dataclass(frozen=True)
class PeersJoined:
    pass


# ---- commands -------------------------------------------------------------------------------------

class Command:
    """Base of the commands; ``reply`` is the type a successful answer has."""

    reply: ClassVar[type]

    @property
    def name(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class OpenSession(Command):
    """Open a loader's session; the worker resolves ``spec.input`` on its part."""

    reply: ClassVar[type] = SessionOpened
    session_id: str
    secret: bytes = field(repr=False)   # what every pull of the session must carry
    spec: LoaderSpec


@dataclass(frozen=True)
class StartEpoch(Command):
    """Plan ``epoch`` from every part's input count and start producing this part's batches."""

    reply: ClassVar[type] = EpochStarted
    session_id: str
    epoch: int
    counts: tuple[int, ...] = ()   # every part's local_input_nodes; () only for a one-part graph
    start: int = 0                 # first position of the rank's list still wanted (resume); 0 = all


@dataclass(frozen=True)
class CloseSession(Command):
    reply: ClassVar[type] = SessionClosed
    session_id: str


@dataclass(frozen=True)
class Stats(Command):
    reply: ClassVar[type] = SessionRows


@dataclass(frozen=True)
class Metrics(Command):
    reply: ClassVar[type] = MetricsSnapshot


@dataclass(frozen=True)
class JoinPeers(Command):
    """The group of a data path whose workers listen is formed: ``endpoints[p]`` is part ``p``'s worker listener."""

    reply: ClassVar[type] = PeersJoined
    endpoints: tuple[str, ...]


@dataclass(frozen=True)
class Stop(Command):
    """Leave the group and exit (the worker answers, then ends its command loop)."""

    reply: ClassVar[type] = Stopped


# The one dispatch table: command type -> the worker's method that answers it (``method(command) -> reply``).
HANDLERS: dict[type[Command], str] = {
    OpenSession: "open_session",
    StartEpoch: "start_epoch",
    CloseSession: "close_session",
    Stats: "stats",
    Metrics: "metrics",
    JoinPeers: "join_peers",
    Stop: "stop",
}


def execute(worker, command: Command):
    """``command``'s reply from ``worker``, or the :class:`WorkerError` to send back instead.

    A :class:`WorkerError` raised by the worker keeps its class; any other exception becomes a
    plain (internal) :class:`WorkerError` naming the command and the exception type.
    """
    try:
        method = HANDLERS.get(type(command))
        if method is None:
            raise WorkerError(f"unknown worker command {type(command).__name__}: the daemon and the worker "
                              f"come from different graphfeed versions; reinstall one version")
        reply = getattr(worker, method)(command)
        if not isinstance(reply, command.reply):
            raise WorkerError(f"{command.name} answered {type(reply).__name__}, not {command.reply.__name__}")
        return reply
    except WorkerError as exc:
        return _protocol_error(exc)
    except Exception as exc:  # noqa: BLE001 -- every failure goes back to the daemon, as internal
        return WorkerError(f"{command.name} failed inside the worker: {type(exc).__name__}: {exc}")


def _protocol_error(exc: WorkerError) -> WorkerError:
    """A copy of ``exc`` as the nearest error class of this module: what crosses the pipe needs no
    worker-only module to unpickle, and carries no traceback or chained exception."""
    cls = next(c for c in type(exc).__mro__ if c.__module__ == __name__)
    return cls(str(exc))
