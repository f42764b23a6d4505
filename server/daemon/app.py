"""The daemon's lifecycle: startup -> serve -> drain -> shutdown.

- **startup**: open the partition (memory maps), decide the sampling implementation (the
  pure-torch fallback is logged once as ``sampler_fallback``; a first-use native build
  happens here), bind the gRPC aio server, register the Control servicer, gRPC health and
  server reflection, start; only then set health SERVING (for "" and
  ``graphfeed.control.v1.Control``), write ``--port-file``, print the ready line
  ``graphfeed-serve listening port=N ...`` on stdout and tell systemd ``READY=1``
  (:mod:`.sdnotify`; ``WATCHDOG=1`` pings follow when the unit asks for them).
- **serve** until SIGTERM or SIGINT, or a ``Drain`` control call (``graphfeed drain``): each starts the
  same drain (:meth:`Daemon.start_drain`, once).  Signal handlers only set events.
- **drain**: systemd ``STOPPING=1``, health NOT_SERVING, new OpenGroup/OpenSession get UNAVAILABLE,
  open groups get up to ``drain_grace_seconds`` to close (their trainers keep
  pulling meanwhile), then the remaining workers are stopped.
- **shutdown**: stop the gRPC server, exit 0.  A second signal forces exit (130):
  workers are SIGKILLed and nothing more is waited for (a Drain call counts as no signal: the first
  signal after one joins its drain).

Startup failures raise :class:`StartupError` with the exit code of :mod:`.exitcodes`.
"""
from __future__ import annotations

import asyncio
import errno
import functools
import os
import signal
import socket
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from graphfeed.proto import control_pb2_grpc as pb_grpc
from graphfeed.server.daemon import logs, sdnotify, security
from graphfeed.server.daemon.config import ServerConfig, token_file_exposure
from graphfeed.server.daemon.control import SERVICE_NAME, ControlServicer, WorkerFactory
from graphfeed.server.daemon.exitcodes import ExitCode, StartupError
from graphfeed.server.daemon.metrics import MetricsEndpoint, WorkerFigures
from graphfeed.server.daemon.registry import WORKER_STOP_GRACE, Registry
from graphfeed.server.daemon.served import ServedPartition, load_partition
from graphfeed.server.worker.commands import GroupSpec
from graphfeed.server.worker.handle import SessionWorkerHandle, SpawnedWorker, WarmWorkers
from graphfeed.server.worker.memory import map_large_blocks
from graphfeed.transport import registry

READY_PREFIX = "graphfeed-serve listening"
MAX_REPLY_BYTES = 256 << 20   # replies (GetStats of many sessions); requests are capped by max_message_bytes
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


DATA_PATH_SERVICE = "graphfeed.data_path"   # health: NOT_SERVING while a worker's data listener is saturated
DATA_PATH_CHECK_ROUNDS = 5   # housekeeping rounds between two looks at the workers' data listeners
DATA_PATH_REFRESH_WAIT = 1.0   # seconds such a look waits for the workers' fresh figures
HOUSEKEEPING_INTERVAL = 1.0   # seconds between part-file checks and malloc_trim calls (each well under 1 ms)


def _malloc_trim():
    """glibc's ``malloc_trim`` (None where the C library has none, e.g. musl or macOS)."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def check_bindable(host: str, port: int) -> None:
    """Fail early, with the OS's reason, when ``host:port`` cannot be bound (gRPC's own error is vague)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(ExitCode.BIND, f"cannot bind {host}:{port}: host {host!r} does not resolve "
                                          f"({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
        try:
            sock.bind(addr)
        except OSError as exc:
            hint = " (another process listens there; pick another --port or stop it)" \
                if exc.errno == errno.EADDRINUSE else ""
            raise StartupError(ExitCode.BIND, f"cannot bind {host}:{port}: {exc.strerror}{hint}") from None


def spawn_worker(part: int) -> SpawnedWorker:
    """A session worker process of part ``part``, not yet given a group; what it prints becomes one
    ``worker_output`` log line per line (so JSON logs stay JSON), naming its group once it has one."""
    log = logs.get()
    spawned: list[SpawnedWorker] = []

    def output(line: str) -> None:
        log.warning("worker_output", group=spawned[0].group if spawned else None, part=part, line=line)

    spawned.append(SpawnedWorker.spawn(output))
    return spawned[0]


def default_factory(spec: GroupSpec, start_timeout: float, warm: WarmWorkers | None = None) -> SessionWorkerHandle:
    """The group's session worker -- a warm one when ``warm`` holds one, else a new process -- started within
    ``start_timeout`` s (tests pass ``Daemon(worker_factory=...)`` instead).  A warm worker taken is replaced
    once this one started."""
    spawned = warm.take() if warm is not None else None
    try:
        return (spawned or spawn_worker(spec.part_id)).begin(spec, start_timeout)
    finally:
        if warm is not None:
            warm.fill()


#: what a token without TLS protects, and what not (docs/how-to/security.md has the table)
TOKEN_WITHOUT_TLS = ("a token without TLS: batches, session secrets and data-path keys stay off the wire (each data "
                     "connection is encrypted under its own X25519 keys), but the token and every control call "
                     "travel in clear text: whoever reads them can call this server as any trainer and, with a "
                     "group's OpenGroup, join or intercept that group's new data connections; set tls_cert and "
                     "tls_key unless the network is trusted")


class Daemon:
    """One ``graphfeed serve`` process.  ``await Daemon(config).run()`` returns the exit code."""

    def __init__(self, config: ServerConfig, *, worker_factory: WorkerFactory | None = None,
                 port_file: str | os.PathLike | None = None, ready_stream: TextIO | None = None,
                 install_signals: bool = True, log: logs.EventLogger | None = None):
        self.config = config
        # session workers started ahead of their groups (warm_workers; only for the real worker processes)
        self.warm = WarmWorkers(config.warm_workers, functools.partial(spawn_worker, config.part)) \
            if config.warm_workers and worker_factory is None else None
        factory: WorkerFactory = functools.partial(default_factory, start_timeout=config.worker_start_seconds)
        if self.warm is not None:   # (a stand-in default_factory of the tests takes no warm=)
            factory = functools.partial(default_factory, start_timeout=config.worker_start_seconds, warm=self.warm)
        self.worker_factory = worker_factory or factory
        self.port_file = Path(port_file) if port_file else None
        self.ready_stream = ready_stream if ready_stream is not None else sys.stdout
        self.install_signals = install_signals
        self.log = log or logs.get()
        self.port: int | None = None
        self.draining = False
        self.served: ServedPartition | None = None
        self.registry: Registry | None = None
        self.control: ControlServicer | None = None
        self.figures: WorkerFigures | None = None
        self._data_path_saturated = False
        self.metrics: MetricsEndpoint | None = None
        self.metrics_port: int | None = None
        self.implementation = ""          # "native" or "reference": what the session workers sample with
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._reaper: asyncio.Task | None = None
        self._idle: asyncio.Task | None = None
        self._trim: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        self._signals = 0
        self.ready = asyncio.Event()

    # ---- the drain's start: SIGTERM/SIGINT and the Drain call; only set events -------------------

    def start_drain(self) -> bool:
        """Start the drain :meth:`run` then carries out (the one start of both SIGTERM/SIGINT and the Drain
        call): from now on the daemon counts as draining (new groups and sessions refused, GetStats says so).
        True when this call started it; a later call changes nothing (the grace is not restarted)."""
        if self._stop.is_set():
            return False
        self.draining = True
        self._stop.set()
        return True

    def request_stop(self, signame: str = "request") -> None:
        """A signal: the first starts the drain (or joins the one a Drain call started), a second forces exit."""
        self._signals += 1
        if self._signals == 1:
            started = self.start_drain()
            self.log.info("signal", signal=signame, action="drain" if started else "drain (already draining)")
        else:
            self.log.warning("signal", signal=signame, action="force exit")
            self._force.set()

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)

    def _remove_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    # ---- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        if self.install_signals:
            self._install_signal_handlers(loop)
        try:
            try:
                await self.startup()
            except BaseException:
                await self._close_server()
                raise
            await self._stop.wait()
            drain = asyncio.ensure_future(self.drain())
            force = asyncio.ensure_future(self._force.wait())
            await asyncio.wait({drain, force}, return_when=asyncio.FIRST_COMPLETED)
            if self._force.is_set():
                drain.cancel()
                return await self.force_exit()
            force.cancel()
            await self.shutdown()
            return ExitCode.OK
        finally:
            if self.install_signals:
                self._remove_signal_handlers(loop)

    async def startup(self) -> None:
        c = self.config
        self.served = served = load_partition(c)
        self.implementation = self._check_sampler()
        gpu_topology, on_device = self._check_device(served)
        self.registry = registry = Registry(max_groups=c.max_groups, max_sessions_per_group=c.max_sessions_per_group,
                                 log=self.log)
        check_bindable(c.host, c.port)
        server = grpc.aio.server(interceptors=security.server_interceptors(c, self.log),
                                 options=[("grpc.so_reuseport", 0),
                                          # a larger request is refused from its length prefix, unread
                                          ("grpc.max_receive_message_length", c.max_message_bytes),
                                          ("grpc.max_send_message_length", MAX_REPLY_BYTES)])
        self.figures = figures = WorkerFigures(registry, c.call_timeout)
        registry.before_stop = figures.retire  # a stopping worker's last figures are kept
        control = ControlServicer(c, served, registry, self.log, self.worker_factory,
                                  is_draining=lambda: self.draining, figures=figures, start_drain=self.start_drain)
        control.sampler = self.implementation + on_device
        control.gpu_topology = gpu_topology
        pb_grpc.add_ControlServicer_to_server(control, server)
        self.control = control
        self._health = health.aio.HealthServicer()
        await self._health.set("", NOT_SERVING)
        await self._health.set(SERVICE_NAME, NOT_SERVING)
        await self._health.set(DATA_PATH_SERVICE, NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        self.port = self._add_port(server)
        await server.start()
        self._server = server
        # Worker commands block a thread each (a starting worker up to minutes): size the pool for
        # every group at once, so one slow worker cannot starve the others' calls.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(
            max_workers=4 * c.max_groups + 8, thread_name_prefix="worker-call"))
        self._reaper = asyncio.get_running_loop().create_task(registry.run_reaper())
        self._idle = asyncio.get_running_loop().create_task(control.run_idle_expiry())
        self._trim = asyncio.get_running_loop().create_task(self._housekeeping())
        self._start_metrics(figures, control)
        await self._health.set("", SERVING)
        await self._health.set(SERVICE_NAME, SERVING)
        await self._health.set(DATA_PATH_SERVICE, SERVING)
        if self.warm is not None:   # after the sampler check: a first-use native build is in the cache by now
            self.warm.fill()
        self._announce(served)
        self._notify(f"READY=1\nSTATUS=serving part {c.part} on port {self.port}\nMAINPID={os.getpid()}")
        interval = sdnotify.watchdog_interval()
        if interval is not None:
            self._watchdog = asyncio.get_running_loop().create_task(self._ping_watchdog(interval))
        self.ready.set()

    def _notify(self, state: str) -> None:
        """Tell systemd (``Type=notify``); a broken ``$NOTIFY_SOCKET`` is logged, never fatal."""
        try:
            sdnotify.notify(state)
        except OSError as exc:
            self.log.warning("sd_notify_failed", socket=os.environ.get(sdnotify.NOTIFY_ENV), cause=str(exc))

    async def _ping_watchdog(self, interval: float) -> None:
        """``WATCHDOG=1`` every ``interval`` seconds from the event loop (a stuck loop stops the pings)."""
        while True:
            self._notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _housekeeping(self) -> None:
        """Every HOUSEKEEPING_INTERVAL s: check the part's files and give freed heap pages back to the OS.

        A part file truncated, removed or replaced under the running server turns health NOT_SERVING (and new
        groups are refused) until it is back as it was.  gRPC reads a refused oversized request (and the buffers
        of any large one) into many small heap blocks; freed, they would stay in glibc's arenas -- hundreds of
        MB after a few refused requests -- until ``malloc_trim``.
        """
        trim = _malloc_trim()
        rounds = 0
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            await self._check_files()
            rounds += 1
            if rounds % DATA_PATH_CHECK_ROUNDS == 0:
                await self._check_data_path()
            if trim is not None:
                trim(0)

    async def _check_files(self) -> None:
        if self.served is None or self.control is None or self._health is None:
            return
        problem = self.served.unreadable()
        if problem == self.control.unreadable:
            return
        self.control.unreadable = problem
        if problem is not None:
            self.log.error("partition_unreadable", part=self.config.part, cause=problem)
            status = NOT_SERVING
        else:
            self.log.info("partition_readable", part=self.config.part)
            status = NOT_SERVING if self.draining else SERVING
        await self._health.set("", status)
        await self._health.set(SERVICE_NAME, status)

    async def _check_data_path(self) -> None:
        """Health of :data:`DATA_PATH_SERVICE`: NOT_SERVING while a worker's secure data listener has every set-up
        slot taken (``data_handshakes``: a flood, or a burst of trainers), so a balancer or an operator sees it;
        SERVING again once a slot is free (``graphfeed_data_path_saturated`` says the same on /metrics)."""
        if self.figures is None or self._health is None or self.draining:
            return
        try:   # a worker slow to answer leaves its last figures in use; the file checks do not wait for it
            await asyncio.wait_for(asyncio.shield(self.figures.refresh()), DATA_PATH_REFRESH_WAIT)
        except asyncio.TimeoutError:
            pass
        saturated = self.figures.merged()[0]["listener_saturated"] > 0
        if saturated == self._data_path_saturated:
            return
        self._data_path_saturated = saturated
        if saturated:
            self.log.warning("data_path_saturated", part=self.config.part, handshakes=self.config.data_handshakes,
                             cause="a session worker's data listener has every set-up slot taken; new connections "
                                   "are closed at once (a flood? else raise data_handshakes)")
        else:
            self.log.info("data_path_unsaturated", part=self.config.part)
        await self._health.set(DATA_PATH_SERVICE, NOT_SERVING if saturated else SERVING)

    def _check_sampler(self) -> str:
        """Decide the sampling implementation once, before any worker starts (a first-use native build
        happens here, so workers find it in the cache); the fallback is logged once, as a warning."""
        from graphfeed import cuda_ext

        cuda_ext.announce = lambda message: self.log.info("native_build", message=message)
        with warnings.catch_warnings():   # reported below as one structured line instead
            warnings.simplefilter("ignore", RuntimeWarning)
            from graphfeed.server.sampling import dispatch
        reason = dispatch.fallback_reason()
        if reason is not None:
            self.log.warning("sampler_fallback", implementation=dispatch.IMPLEMENTATION, cause=reason)
        return dispatch.IMPLEMENTATION

    def _check_device(self, served: ServedPartition) -> tuple[str, str]:
        """``(topology placement, what status shows)`` of ``device: cuda[:N]`` (``("auto", "")`` on the CPU):
        :class:`StartupError` (one line, exit code CONFIG) when this host cannot sample on that GPU.  The
        placement is decided here once (``gpu`` when the topology fits in GPU memory, else ``uva``: pinned
        host memory the GPU reads) and logged."""
        c = self.config
        if c.device == "cpu":
            return "auto", ""
        import torch

        from graphfeed.server.partition.format.store import Partition
        from graphfeed.server.sampling import gpu

        part = Partition(served.root, served.part_id, served.meta)
        try:
            device = gpu.check_device(c.device)
            placement = gpu.choose_placement(part, device, c.gpu_topology)
        except RuntimeError as exc:
            raise StartupError(ExitCode.CONFIG, f"{exc}; set device: cpu to sample on the CPU") from None
        self.log.info("device", device=str(device), name=torch.cuda.get_device_name(device), topology=placement,
                      topology_bytes=gpu.topology_bytes(part), gpu_cache_bytes=c.gpu_cache_bytes)
        return placement, f" on {device} topology={placement}"

    def _add_port(self, server: grpc.aio.Server) -> int:
        c = self.config
        credentials = security.server_credentials(c)
        path = c.data_transport
        if not path.authenticated:
            self.log.warning("data_path", transport=path.name,
                             cause=f"data_path: {path.name}: batches travel over {path.label}, which unpickles "
                                   f"every request before any check -- trusted networks only; trainers must ask "
                                   f"for it by name (connect(transport={path.name!r})); data_path: {registry.AUTO} "
                                   f"serves the authenticated data path")
        if c.authenticates and credentials is None:
            self.log.warning("token_without_tls", cause=TOKEN_WITHOUT_TLS)
        for exposed in filter(None, map(token_file_exposure, (c.token_file, c.admin_token_file, c.tokens_file))):
            self.log.warning("token_file_readable", cause=exposed)
        try:
            if credentials is None:
                return server.add_insecure_port(_bind_address(c.host, c.port))
            return server.add_secure_port(_bind_address(c.host, c.port), credentials)
        except RuntimeError:
            if credentials is not None:
                raise StartupError(ExitCode.CONFIG, f"cannot serve TLS on {c.host}:{c.port} with tls_cert "
                                                    f"{c.tls_cert} and tls_key {c.tls_key}: does the key belong "
                                                    f"to the certificate?") from None
            raise StartupError(ExitCode.BIND, f"cannot bind {c.host}:{c.port} (address in use or not local to "
                                              f"this host)") from None

    def _start_metrics(self, figures: WorkerFigures, control: ControlServicer) -> None:
        c = self.config
        if c.metrics_port is None:
            return
        self.metrics = MetricsEndpoint(self, figures, asyncio.get_running_loop())
        try:
            self.metrics_port = self.metrics.start(c.host, c.metrics_port)
        except OSError as exc:
            raise StartupError(ExitCode.BIND, f"cannot bind the metrics port {c.host}:{c.metrics_port}: "
                                              f"{exc.strerror or exc}") from None
        control.metrics_port = self.metrics_port

    def _announce(self, served: ServedPartition) -> None:
        c, meta = self.config, served.meta
        if self.port_file is not None:
            tmp = self.port_file.with_name(self.port_file.name + ".tmp")
            try:
                tmp.write_text(f"{self.port}\n")
                os.replace(tmp, self.port_file)
            except OSError as exc:
                raise StartupError(ExitCode.CONFIG, f"cannot write --port-file {self.port_file}: "
                                                    f"{exc.strerror or exc}") from None
        self.log.info("serving", host=c.host, port=self.port, part=c.part, num_parts=meta.num_parts,
                      sampler=self.implementation,
                      graph=meta.graph_name, nodes=served.num_local_nodes, pid=os.getpid(),
                      tls="mtls" if c.tls_client_ca else "on" if c.tls else "off", token=bool(c.token),
                      metrics_port=self.metrics_port)
        metrics = f" metrics_port={self.metrics_port}" if self.metrics_port is not None else ""
        print(f"{READY_PREFIX} port={self.port} host={c.host} part={c.part} pid={os.getpid()}{metrics}",
              file=self.ready_stream, flush=True)

    async def drain(self) -> None:
        self.draining = True
        self._discard_warm()
        self._notify("STOPPING=1\nSTATUS=draining")
        if self._health is not None:
            await self._health.set("", NOT_SERVING)
            await self._health.set(SERVICE_NAME, NOT_SERVING)
            await self._health.set(DATA_PATH_SERVICE, NOT_SERVING)
        reg, grace = self.registry, self.config.drain_grace_seconds
        if reg is None:   # stopped before startup loaded the partition: nothing to drain
            return
        self.log.info("drain_start", groups=len(reg.groups), sessions=len(reg.sessions), grace_seconds=grace)
        started = time.monotonic()
        if not await reg.wait_empty(grace):
            n = reg.close_all(cause=f"drain grace of {grace:g} s expired")
            self.log.warning("drain_timeout", groups_stopped=n)
        if not await reg.wait_stopped(WORKER_STOP_GRACE + 5.0):
            self.log.error("drain_workers_left", cause="some session workers did not stop in time")
        self.log.info("drain_done", seconds=round(time.monotonic() - started, 3))

    def _discard_warm(self) -> None:
        if self.warm is not None:
            self.warm.close()

    async def _close_server(self, grace: float | None = 1.0) -> None:
        self._discard_warm()
        if self._reaper is not None:
            self._reaper.cancel()
        if self._idle is not None:
            self._idle.cancel()
        if self._trim is not None:
            self._trim.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._server is not None:
            await self._server.stop(grace=grace)
        if self.metrics is not None:
            self.metrics.stop()

    async def shutdown(self) -> None:
        await self._close_server()
        self.log.info("shutdown", exitcode=int(ExitCode.OK))

    async def force_exit(self) -> int:
        if self.registry is not None:
            self.registry.kill_all()
        await self._close_server(grace=None)
        self.log.warning("shutdown", exitcode=int(ExitCode.FORCED), cause="second signal: forced exit")
        return ExitCode.FORCED


def serve(config: ServerConfig, *, port_file=None, worker_factory: WorkerFactory | None = None) -> int:
    """Run the daemon on a uvloop event loop until it is stopped; returns the exit code.

    Raises :class:`StartupError` when startup fails (the caller prints its one line).
    """
    import uvloop

    log = logs.configure(config.log_format, config.log_level)
    map_large_blocks()   # a refused large request's memory goes back to the OS when it is freed
    daemon = Daemon(config, worker_factory=worker_factory, port_file=port_file, log=log)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            code = int(runner.run(daemon.run()))
    finally:
        # The loop's handlers are gone: a signal during the remaining teardown is a forced exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _exit_forced)
    if code == ExitCode.FORCED:
        _exit_forced()
    return code


def _exit_forced(*_) -> None:
    """Exit now, without waiting for threads still blocked in a worker call."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(ExitCode.FORCED))
