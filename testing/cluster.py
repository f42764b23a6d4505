"""Start real ``graphfeed serve`` daemons on this machine and stop them cleanly.

The one launcher of ``graphfeed demo``, ``graphfeed bench remote`` and the tests::

    from graphfeed.testing.cluster import LocalCluster

    with LocalCluster("runs/parts", parts=2, log_dir="runs/logs") as cluster:  # one daemon per part
        client = graphfeed.client.connect(cluster.addresses)                     # ["127.0.0.1:PORT", ...]
        ...
    # leaving: SIGTERM to every server (they drain in parallel), a bounded wait, SIGKILL after
    # it; ClusterError unless each exited with its expected code (``expect_exit``, 0)

Starting one server (:func:`start_server`): ``graphfeed serve --host 127.0.0.1 --port 0
--port-file F``, stdin closed, stdout and stderr to one log file.  It is ready when, each
wait bounded by ``start_timeout``:

1. the port file exists -- the daemon writes it (atomically) once it is SERVING, so the
   chosen port is known without parsing output;
2. gRPC health reports SERVING for the Control service (a Watch stream, over TLS when
   ``tls`` credentials are given; skipped with ``check_health=False``);
3. its ready line (``graphfeed-serve listening port=N ... [metrics_port=M]``), printed right
   after the port file, is in the log: it names the metrics port of ``--metrics-port 0``.

Every failure is a :class:`ClusterError` (a RuntimeError) that names the server, its exit
code when it has one and the tail of its log.  A server gets its own session (process
group) unless ``own_session=False``: a terminal's Ctrl-C then reaches it only through
``stop()``, and a SIGKILL after the grace goes to the whole group, session workers included.

Settings come from flags (``args``) and variables (``env``, added to this process's
environment).  Only the control plane is imported (grpc, grpc health, the Control service
name from the proto): no server module, so this stays a thin launcher.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from graphfeed.proto import control_pb2

START_TIMEOUT_S = 180.0   # a daemon: import torch, map its partition, bind, become SERVING (loaded 2-core box)
STOP_TIMEOUT_S = 60.0     # after SIGTERM; above the daemon's default drain grace (20 s)
KILL_WAIT_S = 10.0        # after SIGKILL
POLL_S = 0.05             # the port file has no event to wait on
LOG_TAIL_LINES = 30
SERVE_COMMAND = (sys.executable, "-m", "graphfeed.cli", "serve")
CONTROL_SERVICE = control_pb2.DESCRIPTOR.services_by_name["Control"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READY_LINE = re.compile(r"^graphfeed-serve listening port=(\d+)\b.*$", re.MULTILINE)
METRICS_PORT = re.compile(r" metrics_port=(\d+)")
META_FILE = "META.json"


class ClusterError(RuntimeError):
    """A local server did not start, did not stop in time, or exited with an unexpected code."""


# ---- gRPC health ------------------------------------------------------------------------------------

def _channel(address: str, tls: grpc.ChannelCredentials | None) -> grpc.Channel:
    return grpc.secure_channel(address, tls) if tls is not None else grpc.insecure_channel(address)


def _status_name(status: int | None) -> str:
    return "nothing" if status is None else health_pb2.HealthCheckResponse.ServingStatus.Name(status)


def wait_for_health(address: str, status: int = SERVING, service: str = "", timeout: float = 30.0,
                    tls: grpc.ChannelCredentials | None = None) -> None:
    """Block until ``address`` reports ``status`` for ``service`` (a health Watch stream, at most ``timeout`` s)."""
    seen = None
    with _channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service), wait_for_ready=True,
                                    timeout=max(0.1, timeout)):
                seen = reply.status
                if reply.status == status:
                    return
        except grpc.RpcError as exc:
            raise ClusterError(f"{address}: health of {service!r} did not become {_status_name(status)} within "
                               f"{timeout:g} s (last seen: {_status_name(seen)}; {exc.code().name}: "
                               f"{exc.details()})") from None
    raise ClusterError(f"{address}: the health stream of {service!r} ended before it reported "
                       f"{_status_name(status)} (last seen: {_status_name(seen)})")


def health_status(address: str, service: str = "", timeout: float = 5.0,
                  tls: grpc.ChannelCredentials | None = None) -> int:
    """The health status ``address`` reports for ``service`` now (one Check call)."""
    with _channel(address, tls) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


# ---- stopping processes -----------------------------------------------------------------------------

def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``; its whole process group when it leads one (a server and its session workers)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
            return
    except ProcessLookupError:
        return  # already reaped
    proc.kill()


def _reap(proc: subprocess.Popen) -> int:
    """The exit code of a process just sent SIGKILL (bounded)."""
    try:
        return proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"pid {proc.pid} did not exit within {KILL_WAIT_S:g} s of SIGKILL "
                           f"(stuck in the kernel?)") from None


def stop_processes(procs: Sequence[subprocess.Popen], timeout: float = STOP_TIMEOUT_S) -> list[int | None]:
    """SIGTERM every live process of ``procs`` (at once: they stop in parallel) and wait until ``timeout``.

    Those still running then are SIGKILLed (with their process group when they lead one).
    Returns the exit codes, ``None`` for each process that had to be killed.
    """
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            _kill(proc)
            _reap(proc)
            codes.append(None)
    return codes


# ---- one server -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServeOptions:
    """How :func:`start_server` runs and checks one daemon (the keyword arguments of the launchers).

    ``args``: extra ``graphfeed serve`` flags (``--port`` and ``--port-file`` given here win);
    ``env``: variables added to this process's environment; ``command``: the serve command
    line (a stand-in daemon in tests); ``tls``: channel credentials for the health probe of a
    TLS server; ``check_health=False`` trusts the port file alone (a server no probe can
    reach); ``own_session``: see the module doc.
    """

    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    host: str = "127.0.0.1"
    command: tuple[str, ...] = SERVE_COMMAND
    start_timeout: float = START_TIMEOUT_S
    own_session: bool = True
    tls: grpc.ChannelCredentials | None = None
    check_health: bool = True

    def __post_init__(self):
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "command", tuple(self.command))
        if self.start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0 seconds, got {self.start_timeout}")


@dataclass
class ServerProcess:
    """One running ``graphfeed serve`` daemon."""

    proc: subprocess.Popen
    part: int
    host: str
    log_path: Path
    port_file: Path
    port: int = 0
    metrics_port: int | None = None   # from the ready line, when it serves metrics
    expect_exit: int = 0              # what a cluster's teardown checks (a test that kill -9s it sets -9)
    checked: bool = False             # stop() already checked the exit code
    options: ServeOptions = field(default_factory=ServeOptions, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def name(self) -> str:
        return f"server part {self.part} (pid {self.pid})"

    def logs(self) -> str:
        """Everything it wrote so far (stderr's structured logs and its stdout ready line)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.logs().splitlines()[-lines:]) or "(empty)"

    def failure(self, what: str) -> ClusterError:
        """A ClusterError: ``what`` happened to this server, with where its log is and the log's tail."""
        return ClusterError(f"{what}; log {self.log_path}:\n{self.log_tail()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """Its exit code; if it is still running after ``timeout`` s: SIGKILL (its group) and ClusterError."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            _reap(self.proc)
            raise self.failure(f"{self.name} did not exit within {timeout:g} s; killed it (SIGKILL)") from None

    def stop(self, expect: int | None = None, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (if running), bounded wait, SIGKILL after it; ClusterError unless it exits with ``expect``.

        ``expect`` defaults to :attr:`expect_exit` (0).  Returns the exit code.
        """
        expect = self.expect_exit if expect is None else expect
        self.checked = True
        code = stop_processes([self.proc], timeout)[0]
        problem = exit_problem(self, code, expect, timeout)
        if problem or code is None:
            raise self.failure(problem or "did not exit")
        return code


def exit_problem(server: ServerProcess, code: int | None, expect: int, timeout: float) -> str | None:
    """What is wrong with exit code ``code`` (None: killed after ``timeout``) of ``server``; None if nothing."""
    if code is None:
        return f"{server.name} did not exit within {timeout:g} s of SIGTERM; killed it (SIGKILL)"
    if code != expect:
        return f"{server.name} exited with code {code}, expected {expect}"
    return None


def _log_stem(log_dir: Path, part: int) -> Path:
    """``serve-part{K}``, or ``serve-part{K}-{N}`` when an earlier server's files are already there."""
    stem, n = log_dir / f"serve-part{part}", 1
    while stem.with_suffix(".log").exists() or stem.with_suffix(".port").exists():
        n += 1
        stem = log_dir / f"serve-part{part}-{n}"
    return stem


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``), or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def spawn_server(partition: str | os.PathLike, part: int, log_dir: str | os.PathLike | None = None,
                 options: ServeOptions | None = None) -> ServerProcess:
    """Start one daemon for ``part`` of ``partition`` (port 0 unless ``options.args`` say otherwise); no wait.

    Its log (and port file) go to ``log_dir`` (a new temporary folder when None).
    """
    options = options or ServeOptions()
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="graphfeed-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = _log_stem(log_dir, part)
    argv = [*options.command, "--partition", os.fspath(partition), "--part", str(part), "--host", options.host]
    if _flag_value(options.args, "--port") is None:
        argv += ["--port", "0"]
    port_file = _flag_value(options.args, "--port-file")
    if port_file is None:
        port_file = str(stem.with_suffix(".port"))
        argv += ["--port-file", port_file]
    Path(port_file).unlink(missing_ok=True)   # a stale one would announce a port nobody serves
    argv += options.args
    env = dict(os.environ, **(options.env or {}))
    log_path = stem.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=options.own_session)
    return ServerProcess(proc=proc, part=part, host=options.host, log_path=log_path, port_file=Path(port_file),
                         options=options)


def wait_ready(server: ServerProcess) -> None:
    """Wait (bounded by ``start_timeout``) until ``server`` is SERVING; sets its port and metrics port.

    On failure the server is killed (if still running) and ClusterError says why.
    """
    deadline = time.monotonic() + server.options.start_timeout
    try:
        server.port = _wait_port_file(server, deadline)
        if server.options.check_health:
            _wait_serving(server, deadline)
        server.metrics_port = _wait_ready_line(server, deadline)
    except BaseException:
        if server.proc.poll() is None:
            _kill(server.proc)
            _reap(server.proc)
        raise


def _wait_port_file(server: ServerProcess, deadline: float) -> int:
    while True:
        text = server.port_file.read_text().strip() if server.port_file.exists() else ""
        if text:
            return int(text)
        code = server.proc.poll()
        if code is not None:
            raise server.failure(f"server part {server.part} exited with code {code} before it was ready")
        if time.monotonic() > deadline:
            raise server.failure(f"{server.name} was not ready within {server.options.start_timeout:g} s "
                                 f"(no port file {server.port_file}); killed it")
        time.sleep(POLL_S)


def _wait_serving(server: ServerProcess, deadline: float) -> None:
    try:
        wait_for_health(server.address, SERVING, CONTROL_SERVICE, timeout=deadline - time.monotonic(),
                        tls=server.options.tls)
    except ClusterError as exc:
        code = server.proc.poll()
        state = "still running: killed it" if code is None else f"exit code {code}"
        raise server.failure(f"{server.name} wrote its port file but is not SERVING ({state}): {exc}") from None


def _wait_ready_line(server: ServerProcess, deadline: float) -> int | None:
    """The metrics port named by the ready line (None: no metrics endpoint)."""
    while True:
        line = READY_LINE.search(server.logs())
        if line:
            metrics = METRICS_PORT.search(line.group(0))
            return int(metrics.group(1)) if metrics else None
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise server.failure(f"{server.name} wrote its port file but no ready line "
                                 f"(exit code {server.proc.poll()})")
        time.sleep(POLL_S)


def start_server(partition: str | os.PathLike, part: int, *, log_dir: str | os.PathLike | None = None,
                 **options) -> ServerProcess:
    """Start one daemon and wait until it is SERVING (``options``: the fields of :class:`ServeOptions`)."""
    server = spawn_server(partition, part, log_dir, ServeOptions(**options))
    wait_ready(server)
    return server


# ---- a cluster --------------------------------------------------------------------------------------

def _part_ids(partition: str | os.PathLike, parts: int | Iterable[int] | None) -> list[int]:
    """``parts`` as a list of part ids; all parts of ``partition``'s META.json when None."""
    if isinstance(parts, int):
        return list(range(parts))
    if parts is not None:
        return list(parts)
    meta = Path(partition) / META_FILE
    try:
        return list(range(int(json.loads(meta.read_text())["num_parts"])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"cannot read num_parts from {meta} ({type(exc).__name__}: {exc}): give parts=, or "
                           f"create the partition folder with `graphfeed partition --output {partition}`") from None


class LocalCluster:
    """One ``graphfeed serve`` per part of ``partition``; a context manager (see the module doc).

    ``parts``: a count N (parts 0..N-1), part ids, or None (every part of META.json).
    ``options``: the fields of :class:`ServeOptions`, the same for every server.
    """

    def __init__(self, partition: str | os.PathLike, parts: int | Iterable[int] | None = None, *,
                 log_dir: str | os.PathLike | None = None, stop_timeout: float = STOP_TIMEOUT_S, **options):
        self.partition = partition
        self.parts = _part_ids(partition, parts)
        self.log_dir = log_dir
        self.stop_timeout = stop_timeout
        self.options = ServeOptions(**options)
        self.servers: list[ServerProcess] = []

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def start(self) -> "LocalCluster":
        """Start every server at once, then wait for each; if one fails, stop them all and raise."""
        try:
            for k in self.parts:
                self.servers.append(spawn_server(self.partition, k, self.log_dir, self.options))
            for s in self.servers:
                wait_ready(s)
        except BaseException:
            self.stop()   # the exit codes do not matter: the start already failed
            raise
        return self

    def stop(self) -> list[int | None]:
        """SIGTERM every live server (they drain in parallel), bounded wait, SIGKILL after it.

        Returns the exit codes (None: it had to be killed); :meth:`check` judges them.
        """
        return stop_processes([s.proc for s in self.servers], self.stop_timeout)

    def check(self, codes: Sequence[int | None]) -> None:
        """ClusterError unless each server not already checked exited with its ``expect_exit``."""
        problems = []
        for server, code in zip(self.servers, codes):
            problem = None if server.checked else exit_problem(server, code, server.expect_exit, self.stop_timeout)
            if problem:
                problems.append(str(server.failure(problem)))
        if problems:
            raise ClusterError("\n\n".join(problems))

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, exc_type, *_) -> None:
        codes = self.stop()
        if exc_type is None:   # otherwise the body's error is the one to see
            self.check(codes)


@contextmanager
def running_cluster(partition: str | os.PathLike, parts: int | Iterable[int] | None = None, *,
                    log_dir: str | os.PathLike | None = None, stop_timeout: float = STOP_TIMEOUT_S,
                    **options) -> Iterator[list[ServerProcess]]:
    """:class:`LocalCluster` as its list of servers (a test may replace one: the list is what is stopped)."""
    with LocalCluster(partition, parts, log_dir=log_dir, stop_timeout=stop_timeout, **options) as cluster:
        yield cluster.servers
