"""The ``graphfeed.control.v1.Control`` servicer.

Every request is validated before any worker is touched; refusals are gRPC status
codes with a message saying what was wrong and how to fix it.  Worker commands run in
a thread (``asyncio.to_thread``) with a timeout; a worker that died or stopped
answering gets its group reaped and the caller gets UNAVAILABLE naming the group.
No error here takes the daemon down.  The one call that ends it is ``Drain``, the remote SIGTERM of a
rolling upgrade: it starts the daemon's own drain, and on a daemon with an ``admin_token`` only that
token may make it.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import math
import os
import re
import time
import uuid
from importlib import metadata
from typing import Any, Callable

import grpc

from graphfeed.core.constants import SPLITS, check_drain_reason, worker_name
from graphfeed.core.spec import LinkInput, LoaderSpec, check_link_ids
from graphfeed.proto import control_pb2 as pb
from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.proto.convert import check_lengths, edge_type_to_proto, loader_spec_from_proto
from graphfeed.server.daemon.config import ServerConfig
from graphfeed.server.daemon.logs import EventLogger
from graphfeed.server.daemon.metrics import WorkerFigures
from graphfeed.server.daemon.registry import Group, Registry, RequestError, Session
from graphfeed.server.daemon.security import Authority, bearer_token, check_capability, holds, new_capability
from graphfeed.server.daemon.served import ServedPartition
from graphfeed.server.partition.format.layout import PartitionPaths
from graphfeed.server.partition.format.store import check_every_edge, check_link_split_type, check_link_types
from graphfeed.server.sampling.budget import BatchEstimate, BudgetExceeded, footprint, graph_bound
from graphfeed.server.sampling.budget import estimate as budget_estimate
from graphfeed.server.worker.commands import (
    BadRequest,
    CloseSession,
    Command,
    GroupSpec,
    JoinPeers,
    NotFound,
    NotReady,
    OpenSession,
    ServedCounts,
    StartEpoch,
    Stats,
    WorkerError,
    WorkerGone,
)
from graphfeed.server.worker.memory import loader_memory
from graphfeed.transport import registry
from graphfeed.transport.path import DataPath
from graphfeed.transport.secure.keys import group_root, session_secret

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Control"].full_name   # "graphfeed.control.v1.Control"
MAX_EPOCH = 1 << 40
MAX_LEASE_SECONDS = 3600.0
MAX_ID_LENGTH = 256
MAX_OPEN_KEY = 64          # characters of an OpenSession's open_key kept (the client sends 32)
MIN_GROUP_KEY_BYTES = 16   # the trainer group's data-path key (the client makes 32 random bytes)
MAX_GROUP_KEY_BYTES = 1024
STATS_TIMEOUT = 5.0        # seconds: GetStats must answer even when a worker is slow
CALL_SLACK = 5.0           # seconds beyond the worker's own timeout before the daemon gives up waiting
IDLE_SCAN_MIN, IDLE_SCAN_MAX = 0.5, 60.0   # seconds between idle-session scans (a quarter of the limit)

# The worker's error classes -> status code; any other WorkerError is an internal failure (INTERNAL).
WORKER_ERROR_CODES: tuple[tuple[type[WorkerError], grpc.StatusCode], ...] = (
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (NotReady, grpc.StatusCode.FAILED_PRECONDITION),
)
STATS_FIELDS = set(pb.SessionStats.DESCRIPTOR.fields_by_name)
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")   # a job's namespace: a folder name under embedding_dir
DEFAULT_JOB = "default"

WorkerFactory = Callable[[GroupSpec], Any]   # GroupSpec -> a started worker handle (see server.worker.handle)


def worker_error_code(exc: WorkerError) -> grpc.StatusCode:
    """The status a refused or failed worker command answers with (INTERNAL unless the worker said why)."""
    for cls, code in WORKER_ERROR_CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def server_version() -> str:
    try:
        return metadata.version("graphfeed")
    except metadata.PackageNotFoundError:
        return "unknown"


def _invalid(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _label_type(meta) -> str:
    """The node type loaders seed from by default: the partition's ``label_type``, else its only node type."""
    label_type = getattr(meta, "label_type", None)
    if label_type:
        return label_type
    return meta.node_types[0] if len(meta.node_types) == 1 else ""


def job_namespace(job: str, team: str = "") -> str:
    """The namespace of a group's embedding checkpoints (``embedding_dir/<namespace>/``): the job name the
    trainer gave (``connect(job=...)``, "default" when none), under its team's folder when its token is a
    team's (``@<team>/<job>``: the team is what the token proves, the job only what the trainer says; no job
    name holds '@', so no job's folder is a team's); INVALID_ARGUMENT for a name that is no plain folder name."""
    if job and not JOB_NAME.fullmatch(job):
        raise _invalid(f"job = {job[:80]!r} is not a job name: give 1-64 letters, digits, '.', '_' or '-' "
                       f"(starting with a letter or digit)")
    name = job or DEFAULT_JOB
    return f"@{team}/{name}" if team else name


def rpc(method):
    """Turn :class:`RequestError` into a status, log unexpected errors, keep serving.

    The status is set on the context and the handler returns, rather than ``context.abort``: abort's
    exception would tie the request (up to ``max_message_bytes``, hundreds of MB once decoded) into a
    reference cycle with the call's state, kept until the garbage collector happens to run.
    """
    @functools.wraps(method)
    async def wrapper(self: "ControlServicer", request, context: grpc.aio.ServicerContext):
        try:
            return await method(self, request, context)
        except RequestError as exc:
            self.errors[exc.code.name.lower()] += 1
            self.log.info("request_refused", rpc=method.__name__, peer=context.peer(),
                          code=exc.code.name, cause=exc.message)
            code, message = exc.code, exc.message
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            self.errors["internal"] += 1
            self.log.error("rpc_error", rpc=method.__name__, peer=context.peer(), cause=repr(exc), exc_info=exc)
            code, message = grpc.StatusCode.INTERNAL, f"{method.__name__} failed on the server: {exc!r}"
        del request   # nothing of the refused request outlives this answer
        context.set_code(code)
        context.set_details(message)
        return None
    return wrapper


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, config: ServerConfig, served: ServedPartition, registry: Registry, log: EventLogger,
                 worker_factory: WorkerFactory, is_draining: Callable[[], bool], start_drain: Callable[[], bool],
                 started_at: float | None = None, figures: WorkerFigures | None = None):
        self.config = config
        self.served = served
        self.registry = registry
        self.log = log
        self.worker_factory = worker_factory
        self.is_draining = is_draining
        self.start_drain = start_drain   # the daemon's drain start (Daemon.start_drain): True when it started it
        self.started_at = time.monotonic() if started_at is None else started_at
        self.errors: collections.Counter[str] = collections.Counter()   # refusals by status; the metrics read it
        self.figures = figures          # the workers' cumulative figures (GetStats totals)
        self.metrics_port = 0           # set by the daemon when its metrics endpoint runs
        self.sampler = ""               # set by the daemon: "native" or "reference"
        self.gpu_topology = "auto"      # set by the daemon when it samples on a GPU: "gpu" or "uva"
        self.unreadable: str | None = None   # set by the daemon while the part's files cannot be read
        self.authority = Authority.of(config)
        # new at every daemon start: a trainer whose Heartbeat answers another one knows its group is gone
        self.incarnation = uuid.uuid4().hex
        # session workers starting at once (worker_starts): the others wait their turn, in order
        self._starts = asyncio.Semaphore(starts_at_once(config))

    # ---- per-job authorization: a group's calls carry the capability its OpenGroup returned ------------

    def _owned_group(self, group_id: str, context) -> Group:
        """The open group ``group_id`` when the call carries its capability; PERMISSION_DENIED otherwise."""
        group = self.registry.group(group_id)
        check_capability(group.capability, context.invocation_metadata(), f"group {group_id[:MAX_ID_LENGTH]!r}")
        return group

    def _owned_session(self, session_id: str, context) -> tuple[Session, Group]:
        session, group = self.registry.session(session_id)
        check_capability(group.capability, context.invocation_metadata(),
                         f"session {session_id[:MAX_ID_LENGTH]!r}")
        return session, group

    # ---- helpers ---------------------------------------------------------------------------------

    def _refuse_if_draining(self) -> None:
        if self.unreadable is not None:
            raise RequestError(grpc.StatusCode.UNAVAILABLE,
                               f"this server's part cannot be read ({self.unreadable}); restore the partition "
                               f"files (or restart the server on an intact copy), or use another server")
        if self.is_draining():
            raise RequestError(grpc.StatusCode.UNAVAILABLE,
                               "server is draining (shutting down): no new groups or sessions; "
                               "use another server or retry after it restarts")

    async def _call(self, group: Group, command: Command, timeout: float | None = None, *, reap: bool = True):
        """Run a worker command off the loop and return its reply; map worker failures to statuses.

        A worker that is gone (or, with ``reap``, does not answer in time) gets its group reaped.
        """
        timeout = self.config.call_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(group.handle.call, command, timeout=timeout), timeout + CALL_SLACK)
        except asyncio.TimeoutError:
            if not reap:  # e.g. stats while a long command holds the worker's pipe: not a failure
                raise RequestError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"group {group.group_id!r}: worker busy, no {command.name} answer "
                                   f"within {timeout:g} s") from None
            return self._worker_gone(group, command.name, f"no answer within {timeout + CALL_SLACK:g} s")
        except WorkerGone as exc:
            return self._worker_gone(group, command.name, str(exc))
        except WorkerError as exc:
            code = worker_error_code(exc)
            if code is grpc.StatusCode.INTERNAL:
                self.log.error("worker_error", group=group.group_id, command=command.name, cause=str(exc))
            raise RequestError(code, str(exc)) from None

    def _worker_gone(self, group: Group, command: str, why: str):
        cause = f"{command} failed: {why}"
        self.errors["worker_gone"] += 1
        self.registry.remove_group(group.group_id, event="group_reap", cause=cause)
        raise RequestError(grpc.StatusCode.UNAVAILABLE,
                           f"group {group.group_id!r}: its session worker is gone ({cause}); "
                           f"the group was closed, open a new one")

    # ---- schema ----------------------------------------------------------------------------------

    @rpc
    async def GetClusterInfo(self, request, context):
        meta = self.served.meta
        ntype = _label_type(meta) or meta.node_types[0]
        features = [pb.FeatureInfo(name=name, shape=[int(s) for s in f["shape"]], dtype=str(f["dtype"]))
                    for name, f in sorted(meta.features.get(ntype, {}).items())]
        return pb.ClusterInfo(
            server_version=server_version(), format_version=meta.format_version, graph_name=meta.graph_name,
            fingerprint=meta.source_fingerprint, num_parts=meta.num_parts, part_id=self.served.part_id,
            node_ranges=[int(r) for r in meta.node_ranges[ntype]], num_edges=int(sum(meta.num_edges.values())),
            features=features, num_classes=meta.num_classes,
            split_sizes={k: int(v) for k, v in meta.split_sizes.items()},
            local_split_sizes=dict(self.served.local_split_sizes), topologies=list(meta.topologies),
            data_address=self.config.effective_data_address, node_types=list(meta.node_types),
            edge_types=[edge_type_to_proto(e) for e in meta.edge_types], label_type=_label_type(meta),
            num_nodes_by_type={t: int(r[-1]) for t, r in meta.node_ranges.items()},
            data_path=self.config.data_transport.name, worker_start_seconds=self.config.worker_start_seconds)

    # ---- groups ----------------------------------------------------------------------------------

    def _group_spec(self, request, team: str = "", token: str | None = None) -> tuple[GroupSpec, float]:
        """The worker's spec of an OpenGroup; ``team``: the caller's (its embedding namespace), ``token``: the
        bearer token it showed, which its data-path keys are bound to (the trainer derives them from the same)."""
        num_parts, part = self.served.meta.num_parts, self.served.part_id
        if not request.group_id or len(request.group_id) > MAX_ID_LENGTH:
            raise _invalid(f"group_id must be a non-empty string of at most {MAX_ID_LENGTH} characters")
        path = self._data_path(request.data_path)
        if not MIN_GROUP_KEY_BYTES <= len(request.group_key) <= MAX_GROUP_KEY_BYTES:
            raise _invalid(f"group_key has {len(request.group_key)} bytes: the trainer group's data-path key must be "
                           f"{MIN_GROUP_KEY_BYTES}..{MAX_GROUP_KEY_BYTES} random bytes (graphfeed clients send 32; "
                           f"upgrade an older client)")
        if path.needs_rendezvous:
            _check_rendezvous(request.rendezvous)
        if request.world_size != num_parts + 1:
            raise _invalid(f"world_size = {request.world_size} is wrong: the group is 1 trainer + {num_parts} "
                           f"workers (one per part), so world_size must be {num_parts + 1}")
        if request.rank != 1 + part:
            raise _invalid(f"rank = {request.rank} is wrong: this server holds part {part}, "
                           f"its worker's rank is {1 + part}")
        lease = request.lease_seconds or self.config.lease_seconds
        if not (0 < lease <= MAX_LEASE_SECONDS) or math.isnan(lease):
            raise _invalid(f"lease_seconds = {request.lease_seconds:g} is out of range: give 0 (server default "
                           f"{self.config.lease_seconds:g} s) or a value in (0, {MAX_LEASE_SECONDS:g}]")
        c = self.config
        settings = {**GroupSpec.settings_of(c), "gpu_topology": self.gpu_topology}   # "auto" resolved at start-up
        spec = GroupSpec(group_id=request.group_id, rendezvous=request.rendezvous, world_size=request.world_size,
                         rank=request.rank, part_id=part, partition_root=self.served.root,
                         data_address=c.effective_data_address, budget=c.work_budget, data_path=path.name,
                         group_key=path.worker_key(bytes(request.group_key), token, part, num_parts),
                         tls_cert=c.tls_cert, tls_key=c.tls_key, tls_client_ca=c.tls_client_ca,
                         tls_peer_ca=c.tls_peer_ca, namespace=job_namespace(request.job, team), **settings)
        return spec, float(lease)

    def _data_path(self, asked: str) -> DataPath:
        """The data path a group asks for ("": the server's), refused when unknown or when this server
        serves an authenticated path and it is not."""
        served = self.config.data_transport
        if not asked:
            return served
        if asked not in registry.names():
            raise _invalid(f"data_path = {asked!r} is unknown: give {registry.listed((*registry.names(), ''))} "
                           f"(the server's default)")
        path = registry.data_path(asked)
        if served.authenticated and not path.authenticated:
            raise RequestError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"this server serves {served.label} only (data_path: {self.config.data_path}; "
                               f"{path.label} only where a daemon's data_path names it): {path.label} would unpickle "
                               f"requests from anyone who reaches the port; connect with a graphfeed client that "
                               f"asks for data_path {served.name!r}")
        return path

    @rpc
    async def OpenGroup(self, request, context):
        self._refuse_if_draining()
        metadata = context.invocation_metadata()
        token = bearer_token(metadata)   # the caller's own (a team's, or the trainers'): its keys are bound to it
        spec, lease = self._group_spec(request, self.authority.team(metadata), token)
        self.registry.reserve_group(spec.group_id)
        try:
            if registry.data_path(spec.data_path).needs_rendezvous:   # a listening path dials no trainer
                await asyncio.to_thread(check_dial_back, spec.rendezvous, context.peer(),
                                        self.config.effective_data_address)
        except BaseException:
            self.registry.release_group(spec.group_id)
            raise
        try:
            handle, queued, took = await self._start_worker(spec, context)
        except BaseException:
            self.registry.release_group(spec.group_id)
            raise
        member = worker_name(spec.part_id)
        group = Group(group_id=spec.group_id, handle=handle, peer=context.peer(), lease_seconds=lease,
                      deadline=self.registry.clock() + lease, worker_name=member, capability=new_capability(),
                      secret_root=group_root(bytes(request.group_key), token))
        self.registry.add_group(group)
        endpoint = str(getattr(handle, "endpoint", "") or "")
        self.log.info("group_open", group=spec.group_id, peer=context.peer(), worker_pid=handle.pid,
                      data_path=spec.data_path, rendezvous=spec.rendezvous or None, endpoint=endpoint or None,
                      lease_seconds=lease, queued_seconds=round(queued, 3), start_seconds=round(took, 3))
        if self.is_draining():  # the drain began while the worker was starting
            self.registry.remove_group(spec.group_id, event="group_close", cause="server is draining")
            self._refuse_if_draining()
        return pb.OpenGroupReply(worker_name=member, worker_pid=int(handle.pid or 0), lease_seconds=lease,
                                 data_path=spec.data_path, data_endpoint=endpoint,
                                 group_capability=group.capability, incarnation=self.incarnation)

    async def _start_worker(self, spec: GroupSpec, context) -> tuple[Any, float, float]:
        """The group's session worker, with the seconds it waited for its turn and took to start.

        At most ``worker_starts`` workers start at once (:func:`starts_at_once`); the others wait their turn in
        order, so a burst of trainers connects one after another instead of every start sharing the CPUs until
        all pass the bound together.  Waiting and starting run off the loop and take at most
        ``worker_start_seconds`` (+ :data:`CALL_SLACK`; UNAVAILABLE naming the setting past it).  The start runs
        on whatever the caller does: when the caller gives up meanwhile (its deadline passes -- gRPC then cancels
        this handler -- or it cancels), a worker still waiting for its turn is never started, a starting one is
        stopped as soon as it is up, and the abandonment is logged, so no worker outlives a trainer that never
        got its reply."""
        bound = self.config.worker_start_seconds
        asked = time.monotonic()
        gave_up = asyncio.Event()

        async def start_in_turn() -> tuple[Any, float, float]:
            async with self._starts:
                if gave_up.is_set():
                    raise asyncio.CancelledError   # its caller is gone: the turn passes on, nothing started
                turn = time.monotonic()
                handle = await asyncio.to_thread(self.worker_factory, spec)
                return handle, turn - asked, time.monotonic() - turn

        start = asyncio.ensure_future(start_in_turn())
        try:
            handle, queued, took = await asyncio.wait_for(asyncio.shield(start), bound + CALL_SLACK)
        except asyncio.CancelledError:
            gave_up.set()
            self._abandon(start, spec, context.peer(), "the caller gave up (its deadline passed or it cancelled) "
                                                       "while its session worker started")
            raise
        except asyncio.TimeoutError:
            gave_up.set()
            self._abandon(start, spec, context.peer(), f"the session worker did not start within "
                                                       f"worker_start_seconds={bound:g} s")
            raise RequestError(grpc.StatusCode.UNAVAILABLE,
                               f"the session worker did not start within worker_start_seconds={bound:g} s (+"
                               f"{CALL_SLACK:g} s, {starts_at_once(self.config)} starting at once): the host is "
                               f"busy; retry, or raise worker_start_seconds in the server config") from None
        except (WorkerError, OSError) as exc:
            self.log.error("group_open_failed", group=spec.group_id, peer=context.peer(), cause=str(exc))
            raise RequestError(grpc.StatusCode.UNAVAILABLE, f"cannot start a session worker (waited for its start "
                                                            f"up to worker_start_seconds={bound:g} s): {exc}") from None
        if _caller_gone(context):   # its deadline passed as the worker came up, before gRPC cancelled this handler
            self._abandon(start, spec, context.peer(), f"the caller gave up before its session worker pid "
                                                       f"{handle.pid} was up")
            raise RequestError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"the caller's deadline passed while its session worker (pid {handle.pid}) started; "
                               f"the worker was stopped: give OpenGroup more time than worker_start_seconds="
                               f"{bound:g} s")
        return handle, queued, took

    def _abandon(self, start: asyncio.Future, spec: GroupSpec, peer: str, cause: str) -> None:
        """Stop the worker ``start`` gives (now, or once it is up) and log why nobody will use it."""
        def stop(done: asyncio.Future) -> None:
            if done.cancelled() or done.exception() is not None:   # it never started: nothing to stop
                self.log.warning("group_open_abandoned", group=spec.group_id, peer=peer, cause=cause)
                return
            handle = done.result()[0]
            self.log.warning("group_open_abandoned", group=spec.group_id, peer=peer, worker_pid=handle.pid,
                             cause=cause)
            self.registry.stop_worker(spec.group_id, handle)

        start.add_done_callback(stop)

    @rpc
    async def JoinGroup(self, request, context):
        group = self._owned_group(request.group_id, context)
        num_parts = self.served.meta.num_parts
        if len(request.endpoints) != num_parts:
            raise _invalid(f"endpoints has {len(request.endpoints)} entries: give one per part ({num_parts}), the "
                           f"OpenGroupReply.data_endpoint of every server in part order")
        for address in request.endpoints:
            _check_endpoint(address)
        own = str(getattr(group.handle, "endpoint", "") or "")
        await asyncio.to_thread(check_peer_endpoints, list(request.endpoints), self.served.part_id, context.peer(),
                                own or self.config.effective_data_address, self.config.peer_networks)
        group.renew(self.registry.clock())
        await self._call(group, JoinPeers(tuple(request.endpoints)))
        return pb.JoinGroupReply()

    @rpc
    async def Heartbeat(self, request, context):
        group = self._owned_group(request.group_id, context)
        group.renew(self.registry.clock())
        return pb.HeartbeatReply(lease_seconds=group.lease_seconds, incarnation=self.incarnation)

    @rpc
    async def CloseGroup(self, request, context):
        self._owned_group(request.group_id, context)
        self.registry.remove_group(request.group_id, event="group_close", cause="closed by client")
        return pb.CloseGroupReply()

    # ---- sessions --------------------------------------------------------------------------------

    def _loader_spec(self, request) -> LoaderSpec:
        """Validate an OpenSession request into the loader it asks for (INVALID_ARGUMENT naming the field),
        including the checks that need this partition: topology, split and id range."""
        meta = self.served.meta
        try:
            check_lengths(request, {t: int(r[-1]) for t, r in meta.node_ranges.items()},
                          _label_type(meta) or meta.node_types[0])   # before decoding any id
            spec = loader_spec_from_proto(request)
            spec.check_schema(meta.node_types, meta.edge_types)   # the node type / fanout dict's edge types exist
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        sampling = spec.sampling
        if sampling.topology not in meta.topologies:
            raise _invalid(f"spec.direction = {sampling.direction!r} needs the {sampling.topology.upper()} topology, "
                           f"which this partition lacks (it has {', '.join(meta.topologies)}); re-partition "
                           f"with `--topology both` or use direction "
                           f"{'in' if sampling.direction == 'out' else 'out'}")
        self._check_input(spec)
        self._check_budget(spec)
        return spec

    def _check_budget(self, spec: LoaderSpec) -> None:
        """The loader's hops and its batches' estimated size (batch size x fanouts) within the work caps."""
        budget, meta = self.config.work_budget, self.served.meta
        try:
            budget.check_hops(spec.sampling.num_hops)
        except BudgetExceeded as exc:
            raise _invalid(str(exc)) from None
        try:
            budget.check_estimate(estimate_batch(spec, meta))
            check_footprint(spec, meta, self.config)
        except BudgetExceeded as exc:
            raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None

    def _check_input(self, spec: LoaderSpec) -> None:
        """The split exists in this partition; the ids are original node ids of the graph."""
        node_input, meta = spec.input, self.served.meta
        if isinstance(node_input, LinkInput):
            self._check_link(node_input)
            return
        if node_input.split is not None:
            label = _label_type(meta)
            if node_input.node_type is not None and node_input.node_type != label:
                raise _invalid(f"node type {node_input.node_type!r} has no splits (they are on {label!r}); use "
                               f"input_nodes=({label!r}, {node_input.split!r}) or pass {node_input.node_type!r} ids")
            known = [s for s in SPLITS if s in self.served.meta.split_sizes]
            if node_input.split not in known:
                raise _invalid(f"unknown split {node_input.split!r}: use one of {', '.join(known)} or pass node_ids")
            return
        ntype = node_input.type_or(_label_type(meta) or meta.node_types[0])
        ids, n = node_input.ids, int(meta.node_ranges[ntype][-1])
        if ids is None:   # every node of the type
            return
        lo, hi = int(ids.min()), int(ids.max())   # never empty: the conversion refuses empty node_ids
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            what = "node" if meta.is_homogeneous else f"{ntype!r} node"
            raise _invalid(f"node_ids has id {bad}, outside the graph: original {what} ids are 0..{n - 1}")

    def _check_link(self, link: LinkInput) -> None:
        """Link seeds: an edge type of the graph (required on a typed graph); edge_label_index's ids are
        original ids of its source / destination node types, or its split is stored in this partition."""
        meta = self.served.meta
        if link.split is not None:
            try:
                check_link_split_type(meta, link)
            except ValueError as exc:
                raise _invalid(str(exc)) from None
            if link.split not in meta.link_splits:
                raise _invalid(f"edge_label_index={link.split!r}: the partition has no link split {link.split!r} "
                               f"(it has {', '.join(meta.link_split_sizes()) or 'none'}); re-partition with `graphfeed "
                               f"partition --link-split val=0.05,test=0.10` or pass edge_label_index as a tensor")
            return
        try:
            check_link_types(meta, link)
            check_link_ids(link, lambda ntype: int(meta.node_ranges[ntype or _label_type(meta)][-1]))
            if link.every_edge:
                check_every_edge(meta, link.edge_type, PartitionPaths(self.served.root))  # type: ignore[arg-type]
        except ValueError as exc:
            raise _invalid(str(exc)) from None

    @rpc
    async def OpenSession(self, request, context):
        self._refuse_if_draining()
        group = self._owned_group(request.group_id, context)
        spec = self._loader_spec(request)
        group.renew(self.registry.clock())
        key = request.open_key[:MAX_OPEN_KEY]
        if not key:
            return await self._open_session(group, spec, context)
        earlier = group.opens.get(key)
        if earlier is not None:   # the trainer sent this open again (it had no answer in time): the first's session
            reply = await asyncio.shield(earlier)
            if reply is not None and reply.session_id in group.sessions:
                self.log.info("session_open_repeat", session=reply.session_id, group=group.group_id,
                              peer=context.peer())
                return reply
        opening, reply = group.begin_open(key), None
        try:
            reply = await self._open_session(group, spec, context)
            return reply
        finally:
            group.end_open(key, opening, reply)

    async def _open_session(self, group: Group, spec: LoaderSpec, context) -> pb.OpenSessionReply:
        self.registry.reserve_session(group)
        session_id = uuid.uuid4().hex
        # derived, never sent: the trainer derives the same secret from its group key (keys.session_secret)
        secret = session_secret(group.secret_root, self.served.part_id, session_id)
        try:
            opened = await self._call(group, OpenSession(session_id, secret, spec))
        finally:
            self.registry.release_session(group)
        if self.registry.groups.get(group.group_id) is not group:  # closed or reaped meanwhile
            raise RequestError(grpc.StatusCode.NOT_FOUND, f"group {group.group_id!r} was closed while the session "
                                                          f"was opening; open a new group")
        local = int(opened.local_input_nodes)
        self.registry.add_session(Session(session_id=session_id, group_id=group.group_id, kind=spec.kind,
                                          local_input_nodes=local))
        self.log.info("session_open", session=session_id, group=group.group_id, peer=context.peer(),
                      kind=spec.kind, input=spec.input.describe(), batch_size=spec.batch_size,
                      local_input_nodes=local)
        return pb.OpenSessionReply(session_id=session_id, local_input_nodes=local)

    @rpc
    async def StartEpoch(self, request, context):
        session, group = self._owned_session(request.session_id, context)
        if not 0 <= request.epoch <= MAX_EPOCH:
            raise _invalid(f"epoch = {request.epoch} is out of range: give 0..{MAX_EPOCH}")
        group.renew(self.registry.clock())
        if request.start_seq < 0:
            raise _invalid(f"start_seq = {request.start_seq} is negative: give 0..the epoch's number of batches")
        started = await self._call(group, StartEpoch(session.session_id, request.epoch,
                                                     tuple(request.part_input_counts), int(request.start_seq)))
        n = int(started.num_batches)
        session.epoch = request.epoch
        self.log.debug("epoch_start", session=session.session_id, group=group.group_id, epoch=request.epoch,
                       start_seq=request.start_seq, num_batches=n)
        return pb.StartEpochReply(num_batches=n)

    @rpc
    async def CloseSession(self, request, context):
        session, group = self._owned_session(request.session_id, context)
        self.registry.remove_session(session.session_id)
        try:
            await self._call(group, CloseSession(session.session_id))
        finally:
            self.log.info("session_close", session=session.session_id, group=group.group_id, peer=context.peer())
        return pb.CloseSessionReply()

    # ---- idle sessions ---------------------------------------------------------------------------

    async def expire_idle_sessions(self) -> int:
        """Close every session whose worker saw no StartEpoch, pull or sample for ``session_idle_seconds``
        (a loader its trainer dropped without close()); returns how many were closed."""
        limit, closed = self.config.session_idle_seconds, 0
        for group in list(self.registry.groups.values()):
            try:
                reply = await self._call(group, Stats(), timeout=min(STATS_TIMEOUT, self.config.call_timeout),
                                         reap=False)
            except RequestError:
                continue   # a busy or dead worker: the next scan (or the reaper) sees it
            for row in reply.rows:
                sid, idle = row.session_id, float(row.idle_seconds)
                if idle > limit and sid in group.sessions:
                    cause = f"expired: no StartEpoch, pull or sample for session_idle_seconds={limit:g} s"
                    self.registry.expire_session(sid, cause)
                    self.log.warning("session_expired", session=sid, group=group.group_id, peer=group.peer,
                                     kind=row.kind, idle_seconds=round(idle, 1), cause=cause)
                    try:
                        await self._call(group, CloseSession(sid), reap=False)
                    except RequestError:
                        pass   # already gone in the worker
                    closed += 1
        return closed

    async def run_idle_expiry(self) -> None:
        limit = self.config.session_idle_seconds
        if limit <= 0:
            return
        interval = min(IDLE_SCAN_MAX, max(IDLE_SCAN_MIN, limit / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.expire_idle_sessions()
            except Exception as exc:  # noqa: BLE001 -- the scan must go on
                self.log.error("idle_expiry_error", cause=repr(exc))

    # ---- drain -----------------------------------------------------------------------------------

    @rpc
    async def Drain(self, request, context):
        """Start the daemon's drain, as SIGTERM does; a repeat answers the same (the grace is not restarted).
        PERMISSION_DENIED for a caller without the admin token on a daemon that has one; INVALID_ARGUMENT for
        a reason that is too long or not printable."""
        self._check_may_drain(context.invocation_metadata())
        try:
            reason = check_drain_reason(request.reason)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        started = self.start_drain()
        self.log.info("drain_requested", peer=context.peer(), reason=reason or None, started=started,
                      grace_seconds=self.config.drain_grace_seconds)
        return pb.DrainReply(state="draining", grace_seconds=self.config.drain_grace_seconds)

    def _check_may_drain(self, metadata) -> None:
        """Where the daemon has an admin token, only it may drain: the token check let the trainers' and the
        teams' tokens through too, and a trainer must not stop a server other jobs use."""
        if not self.authority.admin_token or self.authority.is_admin(metadata):
            return
        raise RequestError(grpc.StatusCode.PERMISSION_DENIED,
                           "Drain needs the operators' admin token (admin_token) on this server, and this call "
                           "carries another (a trainer's or a team's token): pass the admin token (graphfeed drain "
                           "--token-file ADMIN_TOKEN_FILE, or GRAPHFEED_TOKEN)")

    # ---- stats -----------------------------------------------------------------------------------

    async def _group_stats(self, group: Group) -> list[pb.SessionStats]:
        try:
            reply = await self._call(group, Stats(), timeout=min(STATS_TIMEOUT, self.config.call_timeout),
                                     reap=False)
        except RequestError:
            return []
        out = []
        for row in reply.rows:
            fields = {k: v for k, v in row.as_fields().items() if k in STATS_FIELDS}
            fields["group_id"] = fields.get("group_id") or group.group_id
            out.append(pb.SessionStats(**fields))
        return out

    @rpc
    async def GetStats(self, request, context):
        """The server's state and the caller's groups: every group and the server's totals for the admin
        token (or a daemon without a token); otherwise only the groups whose capabilities the call carries,
        and no server-wide counts (they would tell one job of the others' work)."""
        metadata = context.invocation_metadata()
        everything = self.authority.sees_all(metadata)
        groups = [g for g in list(self.registry.groups.values()) if everything or holds(g.capability, metadata)]
        per_group = await asyncio.gather(*(self._group_stats(g) for g in groups))
        common = dict(state="draining" if self.is_draining() else "serving", part_id=self.served.part_id,
                      groups_open=len(groups), sessions_open=sum(len(g.sessions) for g in groups),
                      sessions=[s for rows in per_group for s in rows], metrics_port=self.metrics_port,
                      uptime_seconds=time.monotonic() - self.started_at, sampler=self.sampler)
        if not everything:
            return pb.ServerStats(**common)
        reg = self.registry
        return pb.ServerStats(
            **common, sessions_opened_total=reg.sessions_opened_total,
            sessions_reaped_total=reg.sessions_reaped_total, sessions_closed_total=reg.sessions_closed_total,
            **await self._served_totals())

    async def _served_totals(self) -> dict:
        """Batches/bytes served by every session so far and buffered now, from the workers' figures."""
        if self.figures is None:
            return {}
        try:
            await asyncio.wait_for(asyncio.shield(self.figures.refresh()), STATS_TIMEOUT)
        except asyncio.TimeoutError:
            pass  # a busy worker: its cached figures answer
        total = sum(self.figures.merged()[0]["kinds"].values(), ServedCounts())
        return dict(batches_served_total=total.batches_served, bytes_served_total=total.bytes_served,
                    buffered_batches=total.buffered_batches, buffered_bytes=total.buffered_bytes)


def starts_at_once(config: ServerConfig) -> int:
    """Session workers a daemon starts at once: ``worker_starts``, or (0) the CPUs this process may use."""
    if config.worker_starts:
        return config.worker_starts
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _caller_gone(context) -> bool:
    """Whether the caller of this handler no longer waits for its answer: it cancelled, or its deadline passed."""
    if context.cancelled() or context.done():
        return True
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def estimate_batch(spec: LoaderSpec, meta) -> BatchEstimate:
    """Upper bounds of one batch of ``spec`` on the partition ``meta`` describes (:func:`budget.estimate`)."""
    per_type = spec.sampling.fanouts_for(meta.edge_types).values()
    hops = [-1 if any(f[h] < 0 for f in per_type) else max(f[h] for f in per_type)
            for h in range(spec.sampling.num_hops)]
    return budget_estimate(_batch_seeds(spec), hops, **_graph_size(spec, meta))


def _batch_seeds(spec: LoaderSpec) -> int:
    """Seed nodes of one batch: a link batch's are both endpoints of each seed edge and its negatives'."""
    seeds = spec.batch_size
    if isinstance(spec.input, LinkInput):
        neg = spec.input.neg
        seeds *= 2 + (0 if neg is None else math.ceil(neg.amount) * (2 if neg.mode == "binary" else 1))
    return seeds


def _graph_size(spec: LoaderSpec, meta) -> dict:
    return dict(disjoint=spec.sampling.disjoint, num_nodes=sum(int(r[-1]) for r in meta.node_ranges.values()),
                num_edges=int(sum(meta.num_edges.values())),
                row_bytes=max((_row_bytes(f) for f in meta.features.values()), default=0))


def check_footprint(spec: LoaderSpec, meta, config: ServerConfig) -> None:
    """BudgetExceeded unless the loader's whole footprint in its session worker (:func:`budget.footprint`)
    fits what one loader may use here (:func:`memory.loader_memory`: ``loader_memory``, or half of this
    process's cgroup limit / the host's memory available now)."""
    whole = graph_bound(_batch_seeds(spec), **_graph_size(spec, meta))
    need = footprint(estimate_batch(spec, meta), whole, max_bytes=config.max_batch_bytes,
                     producers=config.num_producers, buffer_batches=config.buffer_batches,
                     buffer_bytes=config.buffer_bytes)
    limit = loader_memory(config.loader_memory)
    need.check(limit.bytes, limit.source)


def _row_bytes(features: dict) -> int:
    """Bytes of one node's stored features (every feature of a node type: x, y, ...)."""
    import numpy as np

    return sum(int(np.prod(f["shape"], dtype=np.int64)) * np.dtype(f["dtype"]).itemsize for f in features.values())


def peer_host(peer: str) -> str:
    """The IP address of a gRPC peer string (``ipv4:10.0.0.5:4242``, ``ipv6:[::1]:4242``, ``ipv6:%5B::1%5D:4242``)."""
    from urllib.parse import unquote

    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return ""
    host = rest.rpartition(":")[0] if rest.count(":") and not rest.endswith("]") else rest
    return host.strip("[]")


def _addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The IP addresses ``host`` (an address or a name) stands for; empty when it does not resolve."""
    import socket

    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return set()
    out = set()
    for *_, addr in infos:
        ip = ipaddress.ip_address(str(addr[0]).split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        out.add(mapped if mapped is not None else ip)
    return out


def check_dial_back(rendezvous: str, peer: str, data_address: str) -> None:
    """The session worker dials the trainer's rendezvous: allowed only to the caller's own address (the
    peer of this OpenGroup) or to this server's advertised data address (a trainer on the server's host).
    PERMISSION_DENIED otherwise: a client cannot make the server connect to a third party."""
    host = rendezvous.rpartition(":")[0]
    wanted = _addresses(host)
    caller = _addresses(peer_host(peer)) if peer_host(peer) else set()
    allowed = caller | _addresses(data_address)
    if wanted & allowed or (wanted and caller and all(ip.is_loopback for ip in wanted | caller)):
        return
    shown = peer_host(peer) or peer
    raise RequestError(grpc.StatusCode.PERMISSION_DENIED,
                       f"rendezvous = {rendezvous!r} is not the address this OpenGroup came from ({shown}) nor "
                       f"this server's data address ({data_address}): the server dials back only its caller; "
                       f"set advertise_host to the address this trainer reaches the server from, or leave it unset")


def check_peer_endpoints(endpoints: list[str], part: int, peer: str, data_address: str,
                         networks: tuple[str, ...] = ()) -> None:
    """JoinGroup's endpoints are dialled by this server's worker (every part's but its own): each must stand
    for addresses the worker may dial -- the caller's own (workers on the trainer's host), this server's
    data address (same-host peers), or addresses in ``networks`` (the daemon's ``peer_networks``; when
    empty, the network of the interface that holds the data address, from the routing table).  A name
    counts only when every address it resolves to is allowed.  PERMISSION_DENIED naming the endpoint and
    the fix otherwise: an authenticated client cannot make a worker connect to a third party."""
    caller = _addresses(peer_host(peer)) if peer_host(peer) else set()
    own = _addresses(data_address.rpartition(":")[0] if data_address.count(":") == 1 or "]:" in data_address
                     else data_address)
    nets = [ipaddress.ip_network(n) for n in networks] if networks else connected_networks(own)
    for p, address in enumerate(endpoints):
        if p == part:   # the worker never dials its own entry
            continue
        wanted = _addresses(address.rpartition(":")[0])
        loopback = wanted and caller and all(ip.is_loopback for ip in wanted | caller)
        if wanted and (loopback or all(ip in caller or ip in own or any(ip in n for n in nets) for ip in wanted)):
            continue
        shown = ", ".join(map(str, nets)) or "none"
        raise RequestError(grpc.StatusCode.PERMISSION_DENIED,
                           f"endpoint {address[:80]!r} of part {p} is not an address this server's worker may dial "
                           f"(the caller {peer_host(peer) or peer}, this server's data address {data_address}, "
                           f"peer networks: {shown}): a worker dials only its group's servers; give every server's "
                           f"OpenGroupReply.data_endpoint, or set peer_networks to the servers' network")


def connected_networks(addresses) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The directly connected IPv4 networks (routes without a gateway, ``/proc/net/route``) that hold one of
    ``addresses``; none where the table cannot be read (only exact addresses are allowed then)."""
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return []
    out = []
    for row in rows:
        if len(row) < 8 or row[2] != "00000000" or row[7] == "00000000":
            continue
        dest, mask = (ipaddress.IPv4Address(int(h, 16).to_bytes(4, "little")) for h in (row[1], row[7]))
        net = ipaddress.ip_network(f"{dest}/{mask}", strict=False)
        if any(ip in net for ip in addresses if ip.version == 4) and net not in out:
            out.append(net)
    return out


def _check_endpoint(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not (sep and host.strip("[]") and len(address) <= MAX_ID_LENGTH and port.isdigit() and 1 <= int(port) <= 65535):
        raise _invalid(f"endpoint {address[:80]!r} is not host:port (an OpenGroupReply.data_endpoint)")


def _check_rendezvous(address: str) -> None:
    host, sep, port = address.rpartition(":")
    ok = bool(sep and host.strip("[]") and port.isdigit() and 1 <= int(port) <= 65535)
    if not ok:
        raise _invalid(f"rendezvous = {address!r} is not host:port (the trainer's TCPStore address, "
                       f"e.g. 10.0.0.5:29500)")
