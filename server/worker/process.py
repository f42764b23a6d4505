"""The session worker process: ``python -m graphfeed.server.worker.process --fd N``.

Started by :class:`graphfeed.server.worker.handle.SessionWorkerHandle`.  It reads its
:class:`GroupSpec` from the private pipe (fd ``N``), maps its partition and serves the
daemon's commands (:mod:`.commands`) on the pipe in the main thread.  The data path
(:mod:`.rpc_api` answers it) is the :class:`~graphfeed.transport.path.DataPath` the daemon named
(``GroupSpec.data_path``, :mod:`graphfeed.transport.registry`): its worker end listens before the worker
answers :class:`Started` (a path whose workers listen reports the address), serves once it did (a path
with a rendezvous joins the trainer's group in a background thread, bounded by ``join_timeout``), and
learns its peers from :class:`JoinPeers` (a path that joins peers).  Only the allow-listed calls are
answered, and only for holders of the group key.

It exits when told to :class:`Stop`, when the pipe closes (the daemon died: no orphans),
or when joining the group fails (exit code :data:`EXIT_JOIN_FAILED`).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import hmac
import os
import pickle
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Callable

from graphfeed.server.embedding import EmbeddingStore
from graphfeed.server.partition.format.store import Partition
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.gpu import GpuSource, unsupported_on_gpu
from graphfeed.server.worker.commands import (
    START_ID,
    BadRequest,
    CloseSession,
    EpochStarted,
    GroupSpec,
    JoinPeers,
    Metrics,
    MetricsSnapshot,
    NotFound,
    NotReady,
    OpenSession,
    PeersJoined,
    ServedCounts,
    SessionClosed,
    SessionOpened,
    SessionRow,
    SessionRows,
    Started,
    StartEpoch,
    Stats,
    Stop,
    Stopped,
    WorkerError,
    execute,
)
from graphfeed.server.worker.memory import released, trim_heap
from graphfeed.server.worker.peers import PeerError, colocate, replicate_hot_rows, worker_graph
from graphfeed.server.worker.session import Session, part_input_seeds
from graphfeed.server.worker.telemetry import WorkerTelemetry
from graphfeed.transport import registry
from graphfeed.transport.path import WorkerEnd, WorkerHooks, WorkerPlace
from graphfeed.transport.pending import Pending

EXIT_JOIN_FAILED = 3
EXIT_BAD_START = 4
PR_SET_PDEATHSIG = 1
COLOCATE_TIMEOUT = 10.0   # seconds a peer has to answer part_identity before it stays on RPC


def own_source(spec: GroupSpec, part: Partition) -> GpuSource | None:
    """The worker's source of ``part`` (its own, or a peer's it reads from the files): None (the CPU's) unless
    the daemon samples on a GPU; then a :class:`GpuSource`, and one line on stderr (the daemon's log) says
    where its topology lives."""
    if spec.device == "cpu":
        return None
    source = GpuSource(part, spec.device, cache_bytes=spec.gpu_cache_bytes, placement=spec.gpu_topology)
    print(f"graphfeed session worker part{spec.part_id} group {spec.group_id}: samples part {part.part_id} on "
          f"{source.describe()}", file=sys.stderr, flush=True)
    return source


def place_of(spec: GroupSpec) -> WorkerPlace:
    """The worker's group as its data path's end sees it."""
    return WorkerPlace(part_id=spec.part_id, group_id=spec.group_id, group_key=spec.group_key,
                       data_address=spec.data_address, rendezvous=spec.rendezvous, rank=spec.rank,
                       world_size=spec.world_size, rpc_timeout=spec.rpc_timeout, join_timeout=spec.join_timeout,
                       tls_cert=spec.tls_cert, tls_key=spec.tls_key, tls_client_ca=spec.tls_client_ca,
                       tls_peer_ca=spec.tls_peer_ca, listener=spec.listener_limits)


class SessionNotFound(NotFound, LookupError):
    """No such session here.  Also a LookupError: the type a trainer's pull of a closed session sees."""


def job_folder(spec: GroupSpec) -> str:
    """Where this group's embedding checkpoints live: its job's folder under ``embedding_dir`` ("" = saving
    refused).  Another job's tables (another namespace) are out of reach: a tag or table name is one folder
    name (``check_name``), so nothing a trainer sends leads out of its own folder."""
    if not spec.embedding_dir:
        return ""
    return os.path.join(spec.embedding_dir, spec.namespace)


class SessionWorker:
    """The worker's state: its partition, the group, and the trainer's sessions."""

    def __init__(self, spec: GroupSpec, part: Partition):
        self.spec, self.part = spec, part
        self.telemetry = WorkerTelemetry()
        self.gpu_sources: list[GpuSource] = []   # device: cuda -- their feature cache counts go to the metrics
        self.path = registry.data_path(spec.data_path)
        self.end: WorkerEnd = self.path.worker(place_of(spec))
        self.calls = self.end.calls
        self.graph = worker_graph(part, spec.peer_bound, self.telemetry, self._source(part), self.calls)
        self.graph.budget = spec.budget   # every batch and online sample stays within the daemon's caps
        # the group's learnable embedding tables (rows of this part's nodes; others' rows through the peers)
        self.embeddings = EmbeddingStore(spec.part_id, self.graph.books,
                                         lambda p, name, args: self.calls.call(p, name, args, spec.rpc_timeout),
                                         timeout=spec.rpc_timeout, save_dir=job_folder(spec),
                                         budget_bytes=spec.embedding_bytes, log_updates=spec.embedding_log)
        self.closed_totals: dict[str, ServedCounts] = {}   # kind -> counters of closed sessions
        self.sessions: dict[str, Session] = {}
        self.secrets: dict[str, bytes] = {}   # session id -> the secret its pulls must carry
        self.lock = threading.Lock()
        self.joined = threading.Event()
        self.join_error: str | None = None
        # online samples (rpc_api.sample) run here, never on torch RPC's threads: a sample waits on its
        # peers' one_hop/gather calls, and RPC threads that all wait on peers could starve each other
        self._online = ThreadPoolExecutor(max_workers=max(2, spec.num_producers), thread_name_prefix="online")

    # ---- the group --------------------------------------------------------------------------------

    def hooks(self) -> WorkerHooks:
        """What this worker lends its data path's end."""
        from graphfeed.server.worker import rpc_api

        return WorkerHooks(functions=rpc_api.listener_functions, guard=rpc_api.install_guard, say=self._say,
                           refused=lambda: self.telemetry.count_error("data_path_refused"),
                           formed=self._colocate, failed=self._join_failed)

    def _say(self, line: str) -> None:
        print(self.end.place.say(line), file=sys.stderr, flush=True)

    def _join_failed(self, why: str) -> None:
        self.join_error = why
        self._say(why)
        os._exit(EXIT_JOIN_FAILED)

    def join_peers(self, cmd: JoinPeers) -> PeersJoined:
        """Every worker listens (a path that joins peers): note where, then read same-host peers' files
        (in the background)."""
        if not self.path.joins_peers:
            raise BadRequest(self.path.not_joinable())
        if len(cmd.endpoints) != self.part.meta.num_parts:
            raise BadRequest(f"JoinPeers names {len(cmd.endpoints)} workers; the graph has "
                             f"{self.part.meta.num_parts} parts")
        self.end.join_peers({p: str(a) for p, a in enumerate(cmd.endpoints) if p != self.spec.part_id}, self.hooks())
        return PeersJoined()

    def _colocate(self) -> None:
        s = self.spec
        if s.colocated_reads and self.part.meta.num_parts > 1:
            local = colocate(self.graph, self.part, min(s.rpc_timeout, COLOCATE_TIMEOUT),
                             None if s.device == "cpu" else self._source)
            if local:
                print(f"graphfeed session worker part{s.part_id} group {s.group_id}: reads part(s) "
                      f"{', '.join(map(str, local))} from their files on this host, not over the data path "
                      f"(colocated_reads: false turns this off)", file=sys.stderr, flush=True)
        if s.peer_cache_bytes and self.part.meta.num_parts > 1:
            self._replicate()
        self.joined.set()

    def _replicate(self) -> None:
        """Copy the other parts' hottest rows here (``peer_cache_bytes``); a failure costs only the copies."""
        s = self.spec
        say = f"graphfeed session worker part{s.part_id} group {s.group_id}:"
        try:
            copied = replicate_hot_rows(self.graph, self.part, s.peer_cache_bytes, s.peer_bound)
        except PeerError as exc:
            print(f"{say} {exc}; those rows come from their peers for every batch", file=sys.stderr, flush=True)
            return
        if copied:
            print(f"{say} keeps {copied / 2**20:.1f} MiB of other parts' hottest rows (peer_cache_bytes)",
                  file=sys.stderr, flush=True)

    def _source(self, part: Partition) -> GpuSource | None:
        """:func:`own_source` of ``part`` (None on the CPU), kept for the metrics."""
        source = own_source(self.spec, part)
        if source is not None:
            self.gpu_sources.append(source)
        return source

    def wait_joined(self) -> None:
        if not self.joined.wait(self.spec.join_timeout):
            raise NotReady(self.end.not_joined())

    # ---- commands (see commands.HANDLERS) -------------------------------------------------------------

    def open_session(self, cmd: OpenSession) -> SessionOpened:
        if cmd.session_id in self.sessions:
            raise BadRequest(f"session {cmd.session_id} is already open")
        if not isinstance(cmd.secret, bytes) or len(cmd.secret) < 16:
            raise BadRequest("the session secret must be at least 16 random bytes")
        refused = None if self.graph.device.type == "cpu" else unsupported_on_gpu(cmd.spec)
        if refused is not None:
            raise BadRequest(f"part {self.spec.part_id} samples on {self.graph.device}: {refused}")
        try:
            self.part.check_loader(cmd.spec)
            inputs, positions, _ = part_input_seeds(self.part, cmd.spec.input)
        except ValueError as exc:  # ids out of range, unknown split, bad weights: the request's fault
            raise BadRequest(str(exc)) from None
        s = self.spec
        session = Session(cmd.session_id, cmd.spec, inputs, self.graph, s.part_id, self.part.meta.num_parts,
                          num_producers=s.num_producers, buffer_batches=s.buffer_batches,
                          buffer_bytes=s.buffer_bytes, telemetry=self.telemetry, positions=positions)
        with self.lock:
            self.sessions[cmd.session_id] = session
            self.secrets[cmd.session_id] = cmd.secret
        return SessionOpened(session.local_input_nodes)

    def session(self, session_id: str) -> Session:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"unknown session {session_id!r} on part {self.spec.part_id} "
                                  f"(closed, or never opened here)") from None

    def start_epoch(self, cmd: StartEpoch) -> EpochStarted:
        session = self.session(cmd.session_id)
        self.wait_joined()
        return EpochStarted(session.start_epoch(int(cmd.epoch), cmd.counts, start=int(cmd.start)))

    def close_session(self, cmd: CloseSession) -> SessionClosed:
        with self.lock:
            session = self.sessions.pop(cmd.session_id, None)
            self.secrets.pop(cmd.session_id, None)
        if session is None:
            raise SessionNotFound(f"unknown session {cmd.session_id!r} on part {self.spec.part_id}")
        session.close()
        row = session.stats()
        self.closed_totals[row.kind] = self.closed_totals.get(row.kind, ServedCounts()) + row.counts.cumulative()
        return SessionClosed()

    def stats(self, cmd: Stats) -> SessionRows:
        return SessionRows(tuple(self._rows()))

    def _rows(self) -> list[SessionRow]:
        return [s.stats(self.spec.group_id) for s in list(self.sessions.values())]

    def metrics(self, cmd: Metrics) -> MetricsSnapshot:
        """Cumulative figures since this worker started (see :mod:`.telemetry`), plus ``kinds``:
        per session kind, its :class:`ServedCounts` (closed sessions included; the open ones' gauges); ``listener``:
        its data listener's counts by kind and ``listener_saturated`` (1 while its set-up slots are all taken)."""
        kinds = dict(self.closed_totals)
        for row in self._rows():
            kinds[row.kind] = kinds.get(row.kind, ServedCounts()) + row.counts
        hits = sum(g.hits for g in self.gpu_sources)
        listener = self.end.listener_figures()
        return MetricsSnapshot(dict(self.telemetry.snapshot(), kinds=kinds, listener=listener.get("counts", {}),
                                    listener_saturated=listener.get("saturated", 0),
                                    gpu_cache={"hit": hits, "miss": sum(g.reads for g in self.gpu_sources) - hits},
                                    embeddings=self.embeddings.stats()))

    def stop(self, cmd: Stop) -> Stopped:
        """Close every session and leave the group (the command loop ends after answering)."""
        self.shutdown()
        return Stopped()

    def pull(self, session_id: str, epoch: int, seq: int) -> Pending:
        return self.session(session_id).pull(epoch, seq)

    def sample(self, session_id: str, node_ids, seed: int) -> Pending:
        """One online batch for original ids ``node_ids`` with the sampling options of session
        ``session_id`` (:meth:`Session.sample`), produced on the worker's online threads; the Pending
        fails with ValueError (naming the bad id and the valid range) for bad ids."""
        return self._run_online(functools.partial(self.session(session_id).sample, node_ids, int(seed)))

    def sample_seeds(self, session_id: str, seeds, positions, batch_seed: int) -> Pending:
        """One batch for a seed record (PyG's samplers, :meth:`Session.sample_seeds`) with session
        ``session_id``'s sampling options, produced on the worker's online threads; the Pending fails with
        ValueError for bad seeds."""
        session = self.session(session_id)
        return self._run_online(functools.partial(session.sample_seeds, seeds, positions, int(batch_seed)))

    def _run_online(self, job: Callable[[], dict]) -> Pending:
        """``job()`` on the online threads, its batch or error into the Pending returned.

        The request (``job`` holds the ids or seeds) is dropped before the Pending completes, and the
        error loses its traceback: the Pending's callbacks re-raise the error, which links its traceback
        to this frame -- a cycle that would keep a refused request's tensors until the next garbage
        collection (hundreds of MB after a few refused 8 M-id samples)."""
        out, held = Pending(), [job]

        def run() -> None:
            work = held.pop()
            try:
                value, error = work(), None
            except Exception as exc:  # noqa: BLE001 -- every failure goes to the caller's future
                self.telemetry.count_error("online")
                value, error = None, released(exc)
            del work
            if error is None:
                out.set_result(value)
            else:
                out.set_exception(error)
                trim_heap()   # give the refused request's freed pages back

        self._online.submit(run)
        return out

    def authorize(self, session_id: str, secret) -> None:
        """PermissionError unless ``secret`` is the one the daemon issued for ``session_id`` (constant time)."""
        expected = self.secrets.get(session_id)
        if expected is None:
            self.session(session_id)  # raises SessionNotFound
        if expected is None or not isinstance(secret, bytes) or not hmac.compare_digest(secret, expected):
            raise PermissionError(f"session {session_id}: wrong session secret; only the process that opened "
                                  f"the session (its secret derives from the group's key) may pull its batches")

    def shutdown(self) -> None:
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
            self.secrets = {}
        for s in sessions:
            s.close()
        self._online.shutdown(wait=False, cancel_futures=True)
        self.end.close(self.joined.is_set())


def serve_commands(conn: Connection, worker: SessionWorker) -> None:
    """Answer ``(msg_id, command)`` messages with ``(msg_id, reply or WorkerError)`` until
    :class:`Stop` or the pipe closes."""
    while True:
        try:
            msg_id, command = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the daemon is gone
        _reply(conn, msg_id, execute(worker, command))
        if isinstance(command, Stop):
            return


def _reply(conn: Connection, msg_id, answer) -> None:
    try:
        data = pickle.dumps((msg_id, answer))
    except Exception as exc:  # noqa: BLE001 -- a reply that cannot be pickled is a bug: say so, do not hang
        data = pickle.dumps((msg_id, WorkerError(f"the worker's answer {type(answer).__name__} cannot be "
                                                 f"sent: {type(exc).__name__}: {exc}")))
    try:
        conn.send_bytes(data)
    except (OSError, EOFError):
        pass


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the daemon that started it dies (even by SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # the closed pipe still ends the command loop


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="graphfeed-session-worker")
    parser.add_argument("--fd", type=int, required=True, help="the private pipe to the daemon")
    args = parser.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    conn = Connection(args.fd)
    try:
        first = conn.recv_bytes()   # a warm worker waits here, imports done, until a group takes it
    except (EOFError, OSError):
        return 0                    # the daemon discarded it (or died) before it got a group
    try:
        spec = pickle.loads(first)
        part = Partition(spec.partition_root, spec.part_id)
        part.topology(part.meta.topologies[0])  # map (and check) the files now, not on the first batch
    except Exception as exc:  # noqa: BLE001 -- any start failure goes back to the daemon as its reason
        _reply(conn, START_ID, WorkerError(f"session worker cannot start: {exc}"))
        return EXIT_BAD_START
    from graphfeed.server.worker import rpc_api

    try:
        worker = SessionWorker(spec, part)
        rpc_api.bind(worker)
        hooks = worker.hooks()
        endpoint = worker.end.listen(hooks)
    except Exception as exc:  # noqa: BLE001 -- e.g. the data address cannot be bound: the daemon says why
        _reply(conn, START_ID, WorkerError(f"session worker cannot start its data path on {spec.data_address}: "
                                           f"{type(exc).__name__}: {exc}"))
        return EXIT_BAD_START
    _reply(conn, START_ID, Started(os.getpid(), endpoint))
    # a batch's large buffers reuse pooled pages instead of fresh zeroed ones
    if not dispatch.use_block_pool() and dispatch.has_fused_sampler():
        print("graphfeed session worker: another CPU allocator outranks the block pool; large buffers come from "
              "it (fresh pages per batch)", file=sys.stderr, flush=True)
    worker.end.serve(hooks)
    serve_commands(conn, worker)
    if not worker.joined.is_set():
        os._exit(0)  # the join thread may still be blocked in init_rpc
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0)  # let daemon threads see the end
    os._exit(code)  # skip torch's atexit hooks: the group is already left
