"""The trainer's data-path group: one session worker per server, reached over one of two transports.

* ``secure`` (what a server with a token or TLS demands, or ``connect(transport="secure")``):
  the trainer makes the group's key (32 random bytes) and sends it in ``OpenGroup`` over the
  authenticated control plane; each reply names the address its worker listens on; ``JoinGroup``
  tells every worker where its peers are; the trainer then connects to each worker and both
  sides prove the key (:mod:`graphfeed.transport.secure`; TLS when the client uses TLS).  The
  trainer listens on nothing.
* ``torch-rpc`` (servers without security, trusted networks): reserve a rendezvous port on the
  advertised host (a listening socket the store takes over, so no other process can take the port),
  ``OpenGroup`` on every server (in parallel: each starts a worker process),
  then join as rank 0 ``"trainer"`` -- the join returns when every worker is in, or fails after
  ``timeout`` seconds.  Every call names the group's key.

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
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from graphfeed.client.cluster import ServerConn
from graphfeed.client.errors import NotFound, ServerError
from graphfeed.proto import control_pb2 as pb
from graphfeed.transport import rpc_group
from graphfeed.transport.calls import DataCalls, TorchRpcCalls
from graphfeed.transport.channel import BatchChannel, CallsChannel
from graphfeed.transport.secure import SecureCalls, client_tls, new_group_key
from graphfeed.transport.shm import ShmChannel, ShmUnavailable

log = logging.getLogger(__name__)
CHANNELS = ("auto", "rpc")
TRANSPORTS = ("auto", "secure", "torch-rpc")
_ACTIVE_LOCK = threading.Lock()
_ACTIVE: list["DataGroup"] = []
PROBE_TIMEOUT = 3.0
# seconds a pull waits for a free shared-memory slot before it goes over torch RPC.  A loop that drops
# each batch never waits (slots > prefetch + 1); one that keeps every batch (``list(loader)``) can
# never free a slot, so each of its pulls would wait this long: keep it short.
SHM_SLOT_WAIT = 2.0
# MiB of a shared-memory slot before it grows to the batches (``shm_slot_mb=None``, the default)
SHM_START_MB = 64.0
HEARTBEAT_MISSES = 2   # consecutive failed heartbeats before a server counts as gone


def local_address_towards(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), port))
        return s.getsockname()[0]


class DataGroup:
    def __init__(self, servers: Sequence[ServerConn], *, advertise_host: str | None, timeout: float,
                 rpc_timeout: float, lease_seconds: float | None, channel: str = "auto", shm_slots: int = 8,
                 shm_slot_mb: float | None = None, shm_max_slot_mb: float = 1024.0, transport: str = "auto"):
        if channel not in CHANNELS:
            raise ValueError(f"channel must be 'auto' (shared memory with same-host servers, else torch RPC) or "
                             f"'rpc' (torch RPC only), got {channel!r}")
        if shm_slots < 1 or (shm_slot_mb is not None and not shm_slot_mb > 0):
            raise ValueError(f"shm_slots must be >= 1 and shm_slot_mb > 0 (or None: slots grow to the batches), "
                             f"got {shm_slots} and {shm_slot_mb}")
        if not shm_max_slot_mb > 0:
            raise ValueError(f"shm_max_slot_mb must be > 0 (MiB: the largest a growing slot gets), "
                             f"got {shm_max_slot_mb}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be 'auto' (secure when a server asks for it), 'secure' (authenticated, "
                             f"TLS when the client uses TLS) or 'torch-rpc' (trusted networks), got {transport!r}")
        self.transport_choice = transport
        self.channel_choice, self.shm_slots = channel, int(shm_slots)
        self.shm_slot_mb = None if shm_slot_mb is None else float(shm_slot_mb)
        self.shm_max_slot_mb = float(shm_max_slot_mb)
        self.servers = list(servers)
        self.timeout, self.rpc_timeout = float(timeout), float(rpc_timeout)
        host, port = self.servers[0].address.rsplit(":", 1)
        self.host = advertise_host or local_address_towards(host.strip("[]"), int(port))
        self.group_id = f"trainer-{uuid.uuid4().hex[:16]}"
        self.lease_request = float(lease_seconds or 0.0)
        self.failures: dict[str, str] = {}   # server name -> why its heartbeat failed
        # called as on_failure(server name, reason) when a heartbeat fails (the client fails its pulls in flight)
        self.on_failure: Callable[[str, str], None] | None = None
        self.draining: set[str] = set()      # servers whose health said NOT_SERVING: stopping on purpose
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.opened: list[ServerConn] = []
        self.rendezvous = ""   # torch-rpc: the store's address, reserved (listening) from OpenGroup until the join
        self.joined = False
        self._channel: BatchChannel | None = None   # opened once the group formed
        self.group_key = new_group_key()
        self.data_path = self._data_path()
        self.endpoints: dict[int, str] = {}          # secure: part -> its worker's listener
        self._calls: DataCalls | None = None

    def _data_path(self) -> str:
        if self.transport_choice != "auto":
            return self.transport_choice
        wanted = {getattr(s.info, "data_path", "") for s in self.servers if s.info is not None}
        return "secure" if "secure" in wanted else "torch-rpc"

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
        secure = self.data_path == "secure"
        if not secure:
            self.rendezvous = rpc_group.reserve_rendezvous(self.host, backlog=max(64, len(self.servers)))
        world = len(self.servers) + 1

        def open_one(s: ServerConn):
            req = pb.OpenGroupRequest(group_id=self.group_id, rendezvous=self.rendezvous, world_size=world,
                                      rank=1 + s.part, lease_seconds=self.lease_request, group_key=self.group_key,
                                      data_path=self.data_path)
            reply = s.call("OpenGroup", req, timeout=self.timeout)
            s.group_lease = reply.lease_seconds
            self._start_heartbeat(s)
            s.extra["worker_pid"] = reply.worker_pid
            if secure:
                if reply.data_path != "secure" or not reply.data_endpoint:
                    raise ServerError(s.name, "the server did not open a secure data path (an older graphfeed "
                                              "server?); upgrade it, or connect with transport='torch-rpc' on a "
                                              "trusted network")
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

    def _join(self) -> None:
        if self.data_path == "secure":
            self._join_secure()
            return
        try:
            rpc_group.join_group(rpc_group.TRAINER, 0, len(self.servers) + 1, self.rendezvous,
                                rpc_timeout=self.rpc_timeout, join_timeout=self.timeout, data_address=self.host)
        except Exception as exc:  # noqa: BLE001 -- any join failure becomes a ServerError naming the servers
            dead = self.probe()
            who = "; ".join(f"{k}: {v}" for k, v in dead.items()) or "every server still answers on its control port"
            if isinstance(exc, ValueError):   # found before any wait: a set-up that can never form a group
                raise ServerError("cluster", f"the data-path group cannot form at {self.rendezvous}: "
                                             f"{_first_line(exc)}") from None
            fix = (rpc_group.gloo_hint(self.host) if "gloo" in str(exc).lower()
                   else f"is {self.host} reachable from the servers? (set advertise_host)")
            raise ServerError(", ".join(dead) or "cluster",
                              f"the data-path group did not form within {self.timeout:g} s at {self.rendezvous} "
                              f"({who}); {fix}; cause: {_first_line(exc)}") from None
        self.joined = True
        self._calls = TorchRpcCalls(self.group_key)

    def _join_secure(self) -> None:
        """Tell every worker where its peers listen, then connect to each and prove the group key."""
        endpoints = [self.endpoints[p] for p in range(len(self.servers))]

        def join_one(s: ServerConn) -> None:
            s.call("JoinGroup", pb.JoinGroupRequest(group_id=self.group_id, endpoints=endpoints), timeout=self.timeout)

        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(join_one, self.servers))
        security = self.servers[0].security
        tls = None
        if security is not None and getattr(security, "tls", False):
            tls = client_tls(ca=getattr(security, "tls_ca", None), cert=getattr(security, "tls_cert", None),
                             key=getattr(security, "tls_key", None))
        calls = SecureCalls(self.group_key, self.endpoints, tls=tls, name=lambda p: self.servers[p].name)
        try:
            calls.connect()
        except ConnectionError as exc:
            calls.close()
            raise ServerError(", ".join(s.name for s in self.servers),
                              f"the secure data path did not form: {exc}; is the servers' data address reachable "
                              f"from this host?") from None
        self._calls = calls

    def _open_channel(self) -> BatchChannel:
        """The batch channel of this group: shared-memory rings with the servers on this host (``channel="auto"``),
        torch RPC over the group just joined for the others, or for all when no ring can be set up (one log line)."""
        if self.channel_choice == "rpc":
            return CallsChannel(self.calls, self.rpc_timeout)
        max_bytes: int | None = None
        if self.shm_slot_mb is None:   # slots grow to the batches, from SHM_START_MB up to shm_max_slot_mb
            max_bytes = int(self.shm_max_slot_mb * 2**20)
            slot_bytes = min(int(SHM_START_MB * 2**20), max_bytes)
        else:
            slot_bytes = int(self.shm_slot_mb * 2**20)
        try:
            return ShmChannel.open([s.part for s in self.servers], rpc_timeout=self.rpc_timeout,
                                   slots=self.shm_slots, slot_bytes=slot_bytes, max_slot_bytes=max_bytes,
                                   slot_wait=min(SHM_SLOT_WAIT, self.rpc_timeout / 2), group=self.group_id,
                                   calls=self.calls)
        except ShmUnavailable as exc:
            log.log(logging.WARNING if exc.no_room else logging.INFO,
                    "batch channel: %s (no shared-memory ring: %s)", self.calls.label, exc)
        except OSError as exc:   # the trainer's own segments could not be made (no /dev/shm, no room)
            log.warning("batch channel: %s (shared-memory ring could not be allocated: %s)", self.calls.label, exc)
        return CallsChannel(self.calls, self.rpc_timeout)

    # ---- liveness -------------------------------------------------------------------------------

    def _heartbeat(self, s: ServerConn) -> None:
        interval = max(0.2, min(5.0, (s.group_lease or 30.0) / 4))
        misses = 0
        while not self._stop.wait(interval):
            try:
                s.call("Heartbeat", pb.HeartbeatRequest(group_id=self.group_id), timeout=max(1.0, interval))
                self.failures.pop(s.name, None)
                misses = 0
                if s.draining(timeout=max(1.0, interval)):   # the daemon announced a drain
                    self.draining.add(s.name)
            except NotFound:
                self._failed(s.name, "the server no longer knows this trainer's group (it was reaped or restarted)")
            except Exception as exc:  # noqa: BLE001 -- a missed heartbeat of any cause counts
                misses += 1
                if misses >= HEARTBEAT_MISSES:  # one slow answer on a loaded host is not a dead server
                    self._failed(s.name, f"its control port does not answer ({_first_line(exc)})")

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
        return [n for n in names if n in self.draining or (n in by_name and by_name[n].draining(PROBE_TIMEOUT))]

    def probe(self) -> dict[str, str]:
        """Servers that fail a heartbeat now (name -> reason), checked in parallel."""
        def check(s: ServerConn):
            try:
                s.call("Heartbeat", pb.HeartbeatRequest(group_id=self.group_id), timeout=PROBE_TIMEOUT)
                return None
            except NotFound as exc:   # the server's message says why: a worker's signal, a lapsed lease
                return f"the server no longer knows this trainer's group ({_first_line(exc)})"
            except Exception as exc:  # noqa: BLE001 -- any failure means the server is not answering
                return f"its control port does not answer ({_first_line(exc)})"

        with ThreadPoolExecutor(len(self.servers)) as pool:
            results = list(pool.map(check, self.servers))
        return {s.name: r for s, r in zip(self.servers, results) if r is not None}

    # ---- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        if self._channel is not None:  # kept, closed: a late pull is refused with ChannelClosed
            self._channel.close()
        if self._calls is not None:
            self._calls.close()
        if self.joined:
            rpc_group.leave_group()   # not graceful (a dead worker would hang it), without TensorPipe's
            self.joined = False       # warnings about the pipes it closes
        if self.rendezvous:
            rpc_group.release_rendezvous(self.rendezvous)   # a group that failed before its store took the port

        def close_one(s: ServerConn):
            try:
                s.call("CloseGroup", pb.CloseGroupRequest(group_id=self.group_id), timeout=min(self.timeout, 10.0))
            except Exception:  # noqa: BLE001 -- a dead server reaps the group itself (lease)
                pass

        if self.opened:
            with ThreadPoolExecutor(len(self.opened)) as pool:
                list(pool.map(close_one, self.opened))
            self.opened = []
        for t in self._threads:
            t.join(timeout=10.0)
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
