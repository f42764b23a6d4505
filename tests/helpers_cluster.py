"""Start real ``graphfeed serve`` daemons for tests, and stop them checking their exit codes.

    from helpers_cluster import running_cluster

    with running_cluster(partition_dir) as servers:          # one daemon per part, port 0
        addresses = [s.address for s in servers]             # "127.0.0.1:PORT"
        ...
    # on exit: SIGTERM each, wait (bounded), assert exit code 0 (AssertionError with the log tail)

Readiness: the daemon prints ``graphfeed-serve listening port=N ...`` on stdout once it
is SERVING; the helper reads that line (bounded) and then confirms gRPC health SERVING
with a Watch stream (no sleeps).  Each daemon's stderr (structured logs) goes to a file,
``server.logs()`` returns it.  ``GRAPHFEED_<KEY>`` settings of the calling environment are
not passed on unless given in ``env`` (tests stay hermetic).
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT = 90.0       # seconds: import torch + map the partition + bind, on a loaded 2-core CI box
STOP_TIMEOUT = 60.0        # seconds after SIGTERM (must exceed the daemon's drain grace)
READY_LINE = re.compile(r"^graphfeed-serve listening port=(\d+)")
METRICS_PORT = re.compile(r" metrics_port=(\d+)")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CONTROL_SERVICE = "graphfeed.control.v1.Control"
SERVE_COMMAND = (sys.executable, "-m", "graphfeed.cli", "serve")
CONFIG_ENV_KEYS = ("GRAPHFEED_CONFIG",)


def hermetic_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without daemon settings (GRAPHFEED_<CONFIG KEY>), plus ``extra``."""
    from graphfeed.server.daemon.config import KEYS, env_name

    drop = {env_name(k) for k in KEYS} | set(CONFIG_ENV_KEYS)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


def wait_for_health(address: str, status: int = SERVING, service: str = "", timeout: float = 30.0) -> None:
    """Block until ``address`` reports ``status`` for ``service`` (gRPC health Watch stream, bounded)."""
    deadline = time.monotonic() + timeout
    seen = None
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(service=service), wait_for_ready=True,
                                    timeout=max(0.1, deadline - time.monotonic())):
                seen = reply.status
                if reply.status == status:
                    return
        except grpc.RpcError as exc:
            raise AssertionError(f"{address}: health of {service!r} did not become "
                                 f"{health_pb2.HealthCheckResponse.ServingStatus.Name(status)} within {timeout:g} s "
                                 f"(last seen {seen}; {exc.code().name}: {exc.details()})") from None
    raise AssertionError(f"{address}: health stream of {service!r} ended before reaching status {status}")


def health_status(address: str, service: str = "", timeout: float = 5.0) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


@dataclass
class ServerProcess:
    """One running daemon."""

    proc: subprocess.Popen
    part: int
    host: str
    port: int
    log_path: Path
    metrics_port: int | None = None   # from the ready line, when started with --metrics-port
    expect_exit: int = 0        # what teardown asserts (a test that kill -9s a server sets -9)
    checked: bool = False       # stop() already asserted the exit code
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.logs().splitlines()[-lines:])

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """The exit code; AssertionError (with the log tail) if the process is still running after ``timeout``."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"server part {self.part} (pid {self.pid}) did not exit within {timeout:g} s; "
                                 f"killed it. Log tail:\n{self.log_tail()}") from None
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code

    def stop(self, expect: int = 0, timeout: float = STOP_TIMEOUT, send: bool = True) -> int:
        """SIGTERM (once; ``send=False`` if the caller already did), wait (bounded), assert the exit code."""
        if send and self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        self.checked = True
        assert code == expect, (f"server part {self.part} (pid {self.pid}) exited with {code}, expected {expect}. "
                                f"Log tail:\n{self.log_tail()}")
        return code


def _read_stdout(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def start_server(partition: str | os.PathLike, part: int, *, args=(), env: dict[str, str] | None = None,
                 host: str = "127.0.0.1", log_dir: str | os.PathLike | None = None,
                 timeout: float = START_TIMEOUT, command=SERVE_COMMAND) -> ServerProcess:
    """Start one daemon on port 0 (unless ``args`` say otherwise) and wait until it is SERVING."""
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="graphfeed-serve-"))
    log_path = log_dir / f"serve-part{part}-{time.monotonic_ns()}.log"
    argv = [*command, "--partition", str(partition), "--part", str(part), "--host", host]
    if "--port" not in args:
        argv += ["--port", "0"]
    argv += list(args)
    with open(log_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=hermetic_env(env),
                                start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_stdout, args=(proc, lines), daemon=True)
    reader.start()
    server = ServerProcess(proc=proc, part=part, host=host, port=0, log_path=log_path, _reader=reader)
    server.port = _wait_ready_line(server, lines, timeout)
    try:
        wait_for_health(server.address, SERVING, CONTROL_SERVICE, timeout=30.0)
    except AssertionError:
        server.proc.kill()
        server.wait(10)
        raise
    return server


def _wait_ready_line(server: ServerProcess, lines: queue.Queue, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(0.0, remaining))
        except queue.Empty:
            server.proc.kill()
            server.wait(10)
            raise AssertionError(f"server part {server.part} printed no ready line within {timeout:g} s; "
                                 f"killed it. Log tail:\n{server.log_tail()}") from None
        if line is None:
            code = server.wait(10)
            raise AssertionError(f"server part {server.part} exited with code {code} before it was ready. "
                                 f"Log tail:\n{server.log_tail()}")
        m = READY_LINE.match(line)
        if m:
            metrics = METRICS_PORT.search(line)
            server.metrics_port = int(metrics.group(1)) if metrics else None
            return int(m.group(1))


@contextmanager
def running_cluster(partition: str | os.PathLike, parts=None, *, args=(), env=None, log_dir=None,
                    command=SERVE_COMMAND):
    """One daemon per part (all parts of META.json by default); teardown asserts every exit code is 0."""
    if parts is None:
        from graphfeed.server.partition.format import read_meta

        parts = range(read_meta(partition).num_parts)
    servers: list[ServerProcess] = []
    try:
        for k in parts:
            servers.append(start_server(partition, k, args=args, env=env, log_dir=log_dir, command=command))
        yield servers
    finally:
        for s in servers:  # signal all first, so they drain in parallel
            if not s.checked and s.proc.poll() is None:
                s.signal(signal.SIGTERM)
        failures = []
        for s in servers:
            if s.checked:
                continue
            try:
                s.stop(expect=s.expect_exit, send=False)
            except AssertionError as exc:
                failures.append(str(exc))
        if failures:
            raise AssertionError("\n\n".join(failures))
