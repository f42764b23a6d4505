"""The trainer's data-path group: one session worker per server, reached over a data path of the registry.

Which data path: the one ``connect(transport=...)`` names, or (``auto``) the authenticated one
(:func:`graphfeed.transport.registry.agreed`: a server offering a weaker one is refused, never followed).  The
path's :class:`~graphfeed.transport.path.TrainerEnd` does its part of each step: before ``OpenGroup`` (a path
with a rendezvous reserves it on the advertised host: a listening socket the store takes over, so no other
process can take the port), ``OpenGroup`` on every server (in parallel: each starts a worker process; each
reply may name its worker's listener), ``JoinGroup`` with every listener (a path whose workers listen), then
the join -- bounded by ``timeout`` seconds -- which gives the group's calls.  Every call names or proves the
group's key (32 random bytes the trainer made, sent in ``OpenGroup`` over the authenticated control plane).

Once formed, the
group opens its :class:`~graphfeed.transport.channel.BatchChannel` (:attr:`DataGroup.channel`),
the one way its loaders pull batches; closing the group closes it.  A heartbeat thread
per server renews the group's lease; a failed heartbeat is remembered so a waiting pull
can say which server went away.

torch allows one RPC group per process at a time; :data:`_ACTIVE` enforces it with a
clear error.
"""
from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Sequence

from graphfeed.client.cluster import CAPABILITY_HEADER, ServerConn
from graphfeed.client.errors import NotFound, ServerError, unanswered
from graphfeed.client.settings import ConnectSettings
from graphfeed.proto import control_pb2 as pb
from graphfeed.transport import registry
from graphfeed.transport.calls import DataCalls
from graphfeed.transport.channel import BatchChannel, CallsChannel
from graphfeed.transport.path import GroupError, TlsFiles, first_line
from graphfeed.transport.registry import Route
from graphfeed.transport.secure.keys import group_root, session_secret

log = logging.getLogger(__name__)
_ACTIVE_LOCK = threading.Lock()
_ACTIVE: list["DataGroup"] = []
PROBE_TIMEOUT = 3.0
GROUP_KEY_BYTES = 32
HEARTBEAT_MISSES = 2   # consecutive failed heartbeats before a server counts as gone
# seconds a silent server whose part has another replica is waited for at least (it then counts as gone and the
# part moves): two heartbeats, and never less than this, so one slow answer on a loaded host moves nothing
REPLICA_PATIENCE_MIN = 3.0
# seconds an OpenGroup waits beyond the server's worker_start_seconds (ClusterInfo): the daemon's own slack
# over the worker's start and its queueing on a busy host
OPEN_GROUP_SLACK = 15.0


def local_address_towards(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port))
        return s.getsockname()[0]


class DataGroup:
    """``transport``: a name of :func:`graphfeed.transport.registry.connect_choices` or a :class:`Route`;
    ``settings`` / ``options``: as :func:`graphfeed.client.connect`'s."""

    def __init__(self, servers: Sequence[ServerConn], *, transport: str | Route = registry.AUTO,
                 settings: ConnectSettings | None = None, **options):
        self.route = registry.route(transport) if isinstance(transport, str) else transport
        self.settings = ConnectSettings.of(settings, options, "DataGroup")
        self.servers = list(servers)
        self.timeout, self.rpc_timeout = float(self.settings.timeout), float(self.settings.rpc_timeout)
        host, port = self.servers[0].address.rsplit(":", 1)
        self.host = self.settings.advertise_host or local_address_towards(host.strip("[]"), int(port))
        self.group_id = f"trainer-{uuid.uuid4().hex[:16]}"
        self.lease_request = float(self.settings.lease_seconds or 0.0)
        self.failures: dict[str, str] = {}   # server name -> why its heartbeat failed
        # called as on_failure(server name, reason) when a heartbeat fails (the client fails its pulls in flight)
        self.on_failure: Callable[[str, str], None] | None = None
        self.draining: set[str] = set()      # servers whose health said NOT_SERVING: stopping on purpose
        # servers whose control port does not answer in time (DEADLINE_EXCEEDED: paused or busy, not gone) ->
        # since when (time.monotonic()); a server silent past patience() counts as gone, and is in given_up
        self.silent: dict[str, float] = {}
        self.given_up: set[str] = set()
        # has_replica(server name): whether its part has another server to move to (the client sets it); such a
        # server is waited for only while its heartbeats lapse (:meth:`patience`), not reconnect_timeout
        self.has_replica: Callable[[str], bool] | None = None
        self._intervals: dict[str, float] = {}   # server name -> its heartbeat interval
        self._silence_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.opened: list[ServerConn] = []
        self._channel: BatchChannel | None = None   # opened once the group formed
        self.group_key = secrets.token_bytes(GROUP_KEY_BYTES)
        token = getattr(self.servers[0].security, "token", None) if self.servers else None
        self._secret_root = group_root(self.group_key, token)   # its session secrets derive from it
        self.path = self._data_path()
        self.data_path = self.path.name
        self.end = self.path.trainer(self.group_key, token)
        self.endpoints: dict[int, str] = {}          # part -> its worker's listener (a path whose workers listen)
        self._calls: DataCalls | None = None

    def _data_path(self):
        """The route's data path by name, or on ``auto`` the authenticated one (a server offering a weaker one is
        refused, :func:`graphfeed.transport.registry.agreed`)."""
        if self.route.data_path != registry.AUTO:
            return registry.data_path(self.route.data_path)
        offers = [(s.name, getattr(s.info, "data_path", "")) for s in self.servers if s.info is not None]
        try:
            return registry.agreed(offers, credentials=self._holds_credentials())
        except registry.DowngradeRefused as exc:
            raise ServerError(exc.server, exc.message) from None

    def _holds_credentials(self) -> bool:
        """This trainer holds a token or TLS material (said in a refused downgrade's error)."""
        security = self.servers[0].security
        return security is not None and bool(getattr(security, "token", None) or getattr(security, "tls", False))

    def session_secret(self, part: int, session_id: str) -> bytes:
        """The secret of session ``session_id`` on ``part`` (derived as its daemon does; never on the wire)."""
        return session_secret(self._secret_root, part, session_id)

    @property
    def rendezvous(self) -> str:
        """The address a path with a rendezvous reserved for the group ("" for one without)."""
        return self.end.rendezvous

    @property
    def calls(self) -> DataCalls:
        """Calls to the group's workers (after :meth:`start`): online samples, the hot-feature cache, the ring."""
        if self._calls is None:
            raise RuntimeError("the data group has not formed yet: no data path to call")
        return self._calls

    @property
    def channel(self) -> BatchChannel:
        """The group's batch channel (after :meth:`start`; closed, not gone, after :meth:`close`)."""
        if self._channel is None:
            raise RuntimeError("the data group has not formed yet: no batch channel to pull from")
        return self._channel

    # ---- set-up ---------------------------------------------------------------------------------

    def start(self) -> None:
        with _ACTIVE_LOCK:
            if _ACTIVE:
                raise RuntimeError("this process already has an open graphfeed client (torch allows one RPC "
                                   "group per process): reuse it, or close() it before connecting again")
            _ACTIVE.append(self)
        try:
            self._open_all()     # starts each server's heartbeat as soon as that server holds the group
            self._join()
            self._channel = self._open_channel()
        except BaseException:
            self.close()
            raise

    def _start_heartbeat(self, s: ServerConn) -> None:
        """Renew ``s``'s lease from now on.  Started the moment ``s`` holds the group, not after every server
        does: on a loaded host another server's OpenGroup (a worker process starting) can take longer than a
        short lease, which must not lapse on the servers that answered first."""
        t = threading.Thread(target=self._heartbeat, args=(s,), name=f"graphfeed-heartbeat-{s.part}", daemon=True)
        t.start()
        self._threads.append(t)

    def _open_all(self) -> None:
        self.end.open(self.host, len(self.servers))
        world = len(self.servers) + 1

        def open_one(s: ServerConn):
            req = pb.OpenGroupRequest(group_id=self.group_id, rendezvous=self.rendezvous, world_size=world,
                                      rank=1 + s.part, lease_seconds=self.lease_request, group_key=self.group_key,
                                      data_path=self.data_path, job=self.settings.job)
            reply = s.call("OpenGroup", req, timeout=self.open_timeout(s))
            s.capability = bytes(reply.group_capability)   # every later call on the group carries it
            s.incarnation = reply.incarnation
            s.group_lease = reply.lease_seconds
            self._start_heartbeat(s)
            s.extra["worker_pid"] = reply.worker_pid
            refused = self.end.opened(s.part, reply.data_path, reply.data_endpoint)
            if refused is not None:
                raise ServerError(s.name, refused)
            if reply.data_endpoint:
                self.endpoints[s.part] = reply.data_endpoint
            return s

        with ThreadPoolExecutor(len(self.servers)) as pool:
            futures = [pool.submit(open_one, s) for s in self.servers]
            errors = []
            for f in futures:
                try:
                    self.opened.append(f.result())
                except Exception as exc:  # noqa: BLE001 -- the first one is raised after all finished
                    errors.append(exc)
        if errors:
            raise errors[0]

    def open_timeout(self, s: ServerConn) -> float:
        """Seconds ``s``'s OpenGroup may take: ``timeout``, and at least the server's own bound on its worker's
        start (``worker_start_seconds``, which a busy host may need) plus :data:`OPEN_GROUP_SLACK`, so the
        server's error naming that bound, not this deadline, is what a slow start ends with."""
        bound = s.worker_start_seconds
        return max(self.timeout, bound + OPEN_GROUP_SLACK) if bound > 0 else self.timeout

    def _join(self) -> None:
        if self.path.joins_peers:
            self._join_peers()
            return
        self._calls = self._join_path()

    def _join_peers(self) -> None:
        """Tell every worker where its peers listen, then form the group over their listeners."""
        endpoints = [self.endpoints[p] for p in range(len(self.servers))]

        def join_one(s: ServerConn) -> None:
            s.call("JoinGroup", pb.JoinGroupRequest(group_id=self.group_id, endpoints=endpoints), timeout=self.timeout)

        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(join_one, self.servers))
        self._calls = self._join_path()

    def _join_path(self) -> DataCalls:
        """The data path's join: the group's calls, or a ServerError naming the servers it did not form with."""
        security = self.servers[0].security
        tls = None
        if security is not None and getattr(security, "tls", False):
            tls = TlsFiles(ca=getattr(security, "tls_ca", None), cert=getattr(security, "tls_cert", None),
                           key=getattr(security, "tls_key", None))
        try:
            return self.end.join(endpoints=self.endpoints, names=[s.name for s in self.servers], host=self.host,
                                 timeout=self.timeout, rpc_timeout=self.rpc_timeout, tls=tls, probe=self.probe)
        except GroupError as exc:
            raise ServerError(exc.server, exc.message) from None

    def _open_channel(self) -> BatchChannel:
        """The batch channel of this group: through the route's pull channel (shared-memory rings with the
        servers on this host, the data path for the others or for all when no ring can be set up), or every
        pull over the data path."""
        if self.route.pulls is None:
            return CallsChannel(self.calls, self.rpc_timeout)
        return registry.pull_channel(self.route.pulls).open(
            [s.part for s in self.servers], self.calls, group=self.group_id, rpc_timeout=self.rpc_timeout,
            **self.settings.pull_options())

    # ---- liveness -------------------------------------------------------------------------------

    def _heartbeat(self, s: ServerConn) -> None:
        """Renew ``s``'s lease every quarter lease (0.2..5 s) until the group closes, and judge ``s``'s liveness
        by the answers: gone when it no longer knows the group (NOT_FOUND), answers with another incarnation
        (it restarted), refuses HEARTBEAT_MISSES heartbeats in a row (its port closed: UNAVAILABLE) or stays
        silent past :meth:`patience`; a heartbeat that merely times out is a paused or busy server, waited for."""
        interval = max(0.2, min(5.0, (s.group_lease or 30.0) / 4))
        self._intervals[s.name] = interval
        misses = 0
        while not self._stop.wait(interval):
            try:
                reply = s.call("Heartbeat", pb.HeartbeatRequest(group_id=self.group_id), timeout=max(1.0, interval))
            except NotFound:
                self._heard(s.name)
                self._failed(s.name, "the server no longer knows this trainer's group (it was reaped or restarted)")
                continue
            except Exception as exc:  # noqa: BLE001 -- a missed heartbeat of any cause counts
                if unanswered(exc):
                    self._unanswered(s.name, exc, interval)
                    continue
                misses += 1
                if misses >= HEARTBEAT_MISSES:  # one slow answer on a loaded host is not a dead server
                    self._failed(s.name, f"its control port does not answer ({first_line(exc)})")
                continue
            misses = 0
            restarted = self._restarted(s, reply.incarnation)
            if restarted:
                self._heard(s.name)
                self._failed(s.name, restarted)
                continue
            self._answered(s.name)
            if s.draining(timeout=max(1.0, interval)):   # the daemon announced a drain
                self.draining.add(s.name)

    def patience(self, interval: float = 0.0, server: str | None = None) -> float:
        """Seconds a server may stay silent (its control calls time out: paused, overloaded) before it counts
        as gone: ``reconnect_timeout`` -- the wait a lost server gets anyway -- and at least HEARTBEAT_MISSES
        heartbeats of ``interval`` s (``reconnect_timeout=0``: a silent server fails as soon as that).

        A ``server`` whose part has another replica (:attr:`has_replica`) is waited for only until its
        heartbeats lapse -- HEARTBEAT_MISSES of its interval, at least REPLICA_PATIENCE_MIN s, at most the
        above -- and its part then moves, instead of the trainer stalling for it."""
        if interval <= 0 and server is not None:
            interval = self._intervals.get(server, 0.0)
        wait = max(float(self.settings.reconnect_timeout), HEARTBEAT_MISSES * interval)
        if server is not None and self.has_replica is not None and self.has_replica(server):
            return min(wait, max(REPLICA_PATIENCE_MIN, HEARTBEAT_MISSES * interval))
        return wait

    def _unanswered(self, server: str, exc: BaseException, interval: float = 0.0) -> str | None:
        """Note that ``server`` did not answer in time; the reason it counts as gone once silent past
        :meth:`patience` (also pushed to :attr:`on_failure`), else None."""
        now = time.monotonic()
        with self._silence_lock:
            since = self.silent.setdefault(server, now)
        silent_for, patience = now - since, self.patience(interval, server)
        if since == now:
            log.warning("graphfeed: %s does not answer in time (%s): paused or busy; waiting up to %g s for it",
                        server, first_line(exc), patience)
        if silent_for < patience:
            return None
        waited = (f"{patience:g} s, its heartbeats' lapse: its part has another replica" if
                  patience < self.settings.reconnect_timeout else
                  f"reconnect_timeout={self.settings.reconnect_timeout:g} s for a paused or busy server")
        reason = f"its control port has not answered for {silent_for:.0f} s ({first_line(exc)}; waited {waited})"
        self.given_up.add(server)
        self._failed(server, reason)
        return reason

    def _heard(self, server: str) -> None:
        """``server`` answered something (perhaps that it no longer knows the group): it is not silent."""
        with self._silence_lock:
            since = self.silent.pop(server, None)
        if since is not None:
            log.warning("graphfeed: %s answers again after %.1f s", server, time.monotonic() - since)
        self.given_up.discard(server)

    def _answered(self, server: str) -> None:
        """``server`` answered and holds the group: it is neither silent nor failed (any more)."""
        self._heard(server)
        self.failures.pop(server, None)

    @staticmethod
    def _restarted(s: ServerConn, incarnation: str) -> str | None:
        """Why ``s`` counts as gone when a heartbeat answered with another daemon incarnation than its
        OpenGroup (the daemon restarted: this group is gone with its worker); None when it is the same (or either
        is unknown: an older server)."""
        if not (incarnation and s.incarnation) or incarnation == s.incarnation:
            return None
        return (f"the server restarted (incarnation {s.incarnation[:8]} -> {incarnation[:8]}): this trainer's "
                f"group is gone with its worker")

    def _failed(self, server: str, reason: str) -> None:
        """Record a failed heartbeat and push it to :attr:`on_failure` (pulls waiting on the server fail at once)."""
        self.failures[server] = reason
        listener = self.on_failure
        if listener is not None and not self._stop.is_set():
            try:
                listener(server, reason)
            except Exception:  # noqa: BLE001 -- the heartbeat thread keeps running whatever a listener does
                log.exception("graphfeed: a failure listener raised")

    def stopping(self, names) -> list[str]:
        """Those of the servers ``names`` that stop on purpose: they said they drain (SIGTERM/SIGINT;
        :meth:`ServerConn.draining`) at a heartbeat, or say so now."""
        by_name = {s.name: s for s in self.servers}
        return [n for n in names if n in self.draining or
                (n in by_name and n not in self.given_up and by_name[n].draining(PROBE_TIMEOUT))]

    def probe(self) -> dict[str, str]:
        """Servers that are gone now (name -> reason), checked in parallel: those that refuse a heartbeat (their
        port closed: UNAVAILABLE), no longer know the group, answer with another incarnation, or have been silent
        past :meth:`patience`.  A server that only does not answer in time is in :attr:`silent`, not here."""
        def check(s: ServerConn):
            if s.name in self.given_up:   # silent past its patience: gone until its heartbeat is answered again
                return self.failures.get(s.name, "its control port has not answered past the patience")
            try:
                reply = s.call("Heartbeat", pb.HeartbeatRequest(group_id=self.group_id), timeout=PROBE_TIMEOUT)
            except NotFound as exc:   # the server's message says why: a worker's signal, a lapsed lease
                self._heard(s.name)
                return f"the server no longer knows this trainer's group ({first_line(exc)})"
            except Exception as exc:  # noqa: BLE001 -- any other failure means the server is not answering
                if unanswered(exc):
                    return self._unanswered(s.name, exc)
                return f"its control port does not answer ({first_line(exc)})"
            restarted = self._restarted(s, reply.incarnation)
            (self._heard if restarted else self._answered)(s.name)
            return restarted

        with ThreadPoolExecutor(len(self.servers)) as pool:
            results = list(pool.map(check, self.servers))
        return {s.name: r for s, r in zip(self.servers, results) if r is not None}

    # ---- teardown -------------------------------------------------------------------------------

    def close(self, gone: Iterable[str] = ()) -> None:
        """Leave the group on every server; the servers named in ``gone`` (lost: killed, frozen) are told from a
        background thread, so a frozen one does not hold up a failover (its lease reaps the group otherwise)."""
        gone = set(gone)
        self._stop.set()
        if self._channel is not None:  # kept, closed: a late pull is refused with ChannelClosed
            self._channel.close()
        if self._calls is not None:
            self._calls.close()
        self.end.close()   # leaves the group; frees a rendezvous a group that failed before its join reserved

        # each server's capability is taken off its connection now: a restarted server may be in the next group
        # before a background close below ran, and must keep that group's capability
        closing = [(s, s.capability) for s in self.opened]
        for s, _ in closing:
            s.capability = b""
        req = pb.CloseGroupRequest(group_id=self.group_id)

        def close_one(s: ServerConn, capability: bytes) -> None:
            try:
                s.stub.CloseGroup(req, timeout=min(self.timeout, 10.0),
                                  metadata=[(CAPABILITY_HEADER, capability)] if capability else None)
            except Exception:  # noqa: BLE001 -- a dead server reaps the group itself (lease)
                pass

        later = [c for c in closing if c[0].name in gone]
        now = [c for c in closing if c[0].name not in gone]
        def close_all(which: list[tuple[ServerConn, bytes]]) -> None:
            for c in which:
                close_one(*c)

        if later:
            threading.Thread(target=close_all, args=(later,), name="graphfeed-close-lost", daemon=True).start()
        if now:
            with ThreadPoolExecutor(len(now)) as pool:
                list(pool.map(lambda c: close_one(*c), now))
        self.opened = []
        for t in self._threads:
            t.join(timeout=10.0)
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
