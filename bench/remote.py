"""Throughput through the service (``graphfeed bench remote``): the in-process figure, remotely.

The definitions are :mod:`graphfeed.bench.sample`'s (one warm-up epoch, then the median and
min/max over ``epochs`` shuffled epochs of the input nodes; ``seeds_per_s``,
``batches_per_s``, ``sampled_edges_per_s`` = sum of ``edge_index.size(1)`` / wall time),
measured on the batches a trainer receives from
:meth:`graphfeed.client.Client.neighbor_loader` -- sampled, stitched and filled with
``x``/``y`` by the servers, pulled over the data path, converted to PyG ``Data``.

Remote batches always carry features, so the fair in-process comparison is
``bench sample --features`` (the full :func:`produce_batch` path); ``compare`` runs exactly
that in a separate process (so its memory and CPU time are its own) and reports
``ratio_vs_inprocess`` = remote ``seeds_per_s`` / in-process ``seeds_per_s``.

CPU: ``cpu_s_per_epoch`` is the median CPU time per measured epoch of the trainer plus (for
servers this command started) every daemon and session worker -- the service's whole cost,
comparable with the in-process ``cpu_s_per_epoch`` and steadier than wall time on a shared
machine (``cpu_s_per_epoch_trainer`` is the trainer's share).

Memory: ``peak_rss_mb`` is the trainer's (this process's ``ru_maxrss``, as ``bench
sample``); ``servers_peak_rss_mb`` sums the peak resident sets (``VmHWM``) of every
daemon and its session workers, read just before the client disconnects (servers this
command started only).  Memory-mapped partition pages count in every process that
touched them, so the sum over-states physical memory when processes share pages.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from graphfeed.core.spec import LoaderSpec

from graphfeed.bench.sample import EpochStats, peak_rss_mb, summarize, workload_spec

START_TIMEOUT_S = 180.0    # a daemon: import torch, map its partition, bind, become SERVING
STOP_TIMEOUT_S = 60.0      # after SIGTERM (the daemon's drain grace is 20 s by default)
READY_LINE = re.compile(r"^graphfeed-serve listening port=(\d+)")
CONTROL_SERVICE = "graphfeed.control.v1.Control"


@dataclass(frozen=True)
class RemoteBenchConfig:
    """What ``bench remote`` measures; validated on construction.

    ``servers``: an int N (start N daemons over ``graph``, which must have N parts) or a
    sequence of ``host:port`` of running servers.
    """

    servers: int | tuple[str, ...]
    graph: str | None = None
    num_neighbors: tuple[int, ...] = (15, 10, 5)
    batch_size: int = 1024
    prefetch: int = 4
    epochs: int = 3
    input: str = "train"
    seed: int = 0
    replace: bool = False
    direction: str = "in"
    compare: bool = False
    compare_timeout: float = 3600.0   # seconds for the whole in-process comparison run
    loader: LoaderSpec = field(init=False, repr=False)   # what every epoch runs (bench.sample.workload_spec)

    def __post_init__(self):
        if isinstance(self.servers, int) and not isinstance(self.servers, bool):
            if self.servers < 1:
                raise ValueError(f"--servers must be at least 1 (or a host:port list), got {self.servers}")
            if self.graph is None:
                raise ValueError("--servers N starts N servers over a partition folder: give --graph DIR")
        else:
            object.__setattr__(self, "servers", tuple(self.servers))
            if not self.servers:
                raise ValueError("--servers: give a number of servers to start or a host:port list")
        if self.compare and self.graph is None:
            raise ValueError("--compare runs the in-process bench on the same graph: give --graph DIR")
        if self.graph is not None and not os.path.isdir(self.graph):
            raise FileNotFoundError(f"--graph {self.graph}: no such partition folder; "
                                    f"create one with `graphfeed partition ... --output {self.graph}`")
        loader = workload_spec(self)
        object.__setattr__(self, "loader", loader)
        object.__setattr__(self, "num_neighbors", loader.sampling.num_neighbors)
        if self.prefetch < 1:
            raise ValueError(f"--prefetch must be at least 1 (pulls in flight per server), got {self.prefetch}")


# ---- servers on loopback ----------------------------------------------------------------------------

@dataclass
class LocalServer:
    proc: subprocess.Popen
    part: int
    log_path: Path
    port: int = 0
    reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalServers:
    """``graphfeed serve`` for every part of ``graph`` on 127.0.0.1, port 0; a context manager.

    Entering starts them all and waits (bounded) until each is SERVING; leaving sends
    SIGTERM to all, waits (bounded) and raises RuntimeError unless every one exited 0.
    """

    def __init__(self, graph: str, num_parts: int, log_dir: str | None = None):
        self.graph, self.num_parts = graph, num_parts
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="graphfeed-bench-remote-"))
        self.servers: list[LocalServer] = []

    def __enter__(self) -> "LocalServers":
        try:
            for k in range(self.num_parts):
                self.servers.append(self._spawn(k))
            for s in self.servers:
                self._wait_ready(s)
        except BaseException:
            self.stop()   # the others too (exit codes not checked: the start already failed)
            raise
        return self

    def __exit__(self, exc_type, *_):
        codes = self.stop()
        bad = [(s, c) for s, c in zip(self.servers, codes) if c != 0]
        if bad and exc_type is None:
            s, c = bad[0]
            raise RuntimeError(f"server part {s.part} (pid {s.proc.pid}) exited with code {c}, expected 0; "
                               f"log {s.log_path}:\n{s.log_tail()}")

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def _spawn(self, part: int) -> LocalServer:
        log_path = self.log_dir / f"serve-part{part}.log"
        argv = [sys.executable, "-m", "graphfeed.cli", "serve", "--partition", os.fspath(self.graph),
                "--part", str(part), "--host", "127.0.0.1", "--port", "0"]
        with open(log_path, "wb") as err:
            # own session: a Ctrl-C of the bench reaches the daemons only through stop()
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                    text=True, start_new_session=True)
        return LocalServer(proc, part, log_path)

    def _wait_ready(self, s: LocalServer) -> None:
        lines: queue.Queue = queue.Queue()

        def read() -> None:
            for line in s.proc.stdout:
                lines.put(line)
            lines.put(None)

        s.reader = threading.Thread(target=read, daemon=True, name=f"serve-part{s.part}-stdout")
        s.reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not s.port:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"server part {s.part} was not ready within {START_TIMEOUT_S:.0f} s; "
                                   f"log {s.log_path}:\n{s.log_tail()}") from None
            if line is None:
                code = s.proc.wait(10)
                raise RuntimeError(f"server part {s.part} exited with code {code} before it was ready; "
                                   f"log {s.log_path}:\n{s.log_tail()}")
            m = READY_LINE.match(line)
            if m:
                s.port = int(m.group(1))
        wait_serving(s.address, max(1.0, deadline - time.monotonic()))

    def stop(self) -> list[int | None]:
        """SIGTERM every live server (they drain in parallel), wait bounded; SIGKILL stragglers."""
        for s in self.servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        codes = []
        for s in self.servers:
            try:
                codes.append(s.proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(10)
                codes.append(None)  # did not stop in time: reported as a failure
        for s in self.servers:
            if s.reader is not None:
                s.reader.join(5)    # it ends at EOF, now that the process is gone
            s.proc.stdout.close()
        return codes

    def peak_rss_mb(self) -> list[float]:
        """Per server: the summed peak RSS of the daemon and every process below it (MiB)."""
        return [round(tree_peak_rss_mb(s.proc.pid), 1) for s in self.servers]


def wait_serving(address: str, timeout: float) -> None:
    """Block until ``address`` reports SERVING for the control service (health Watch, bounded)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(service=CONTROL_SERVICE), wait_for_ready=True,
                                    timeout=timeout):
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError as exc:
            raise RuntimeError(f"{address}: not SERVING within {timeout:.0f} s ({exc.code().name}: "
                               f"{exc.details()})") from None
    raise RuntimeError(f"{address}: the health stream ended before the server was SERVING")


def tree_peak_rss_mb(pid: int) -> float:
    """Sum of ``VmHWM`` (peak RSS) over ``pid`` and its descendants, in MiB (0 for vanished ones)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    return sum(_vm_hwm_kib(p) for p in procs) / 1024.0


def _vm_hwm_kib(proc) -> int:
    import psutil

    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    try:
        return proc.memory_info().rss // 1024  # no /proc (not Linux): the current RSS
    except psutil.Error:
        return 0


# ---- the measurement --------------------------------------------------------------------------------

def tree_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes ``pids`` and their descendants."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


def run_epoch(loader, server_pids: Sequence[int] = ()) -> tuple[EpochStats, float]:
    """One epoch of ``loader`` as the trainer sees it (StartEpoch included, as the plan is in-process).

    Returns the epoch's stats (``cpu_s``: trainer + ``server_pids`` trees) and the trainer's CPU share.
    """
    t0, own0, srv0 = time.perf_counter(), time.process_time(), tree_cpu_s(server_pids)
    seeds = batches = edges = 0
    for batch in loader:
        seeds += int(batch.batch_size)
        edges += int(batch.edge_index.size(1))
        batches += 1
    wall, own = time.perf_counter() - t0, time.process_time() - own0
    return EpochStats(wall, seeds, batches, edges, own + tree_cpu_s(server_pids) - srv0), own


def _loader(client, cfg: RemoteBenchConfig):
    return client.open_loader(cfg.loader, prefetch=cfg.prefetch)


def measure(addresses: Sequence[str], cfg: RemoteBenchConfig, servers: LocalServers | None = None) -> dict:
    """Connect to ``addresses``, run the warm-up and measured epochs; returns the summary fields."""
    import graphfeed.client as gf

    pids = [s.proc.pid for s in servers.servers] if servers is not None else []
    with gf.connect(list(addresses)) as client, _loader(client, cfg) as loader:
        run_epoch(loader, pids)                                    # warm-up, not reported
        runs = [run_epoch(loader, pids) for _ in range(cfg.epochs)]
        server_rss = servers.peak_rss_mb() if servers is not None else None  # before the workers exit
        num_parts = client.num_parts
    result = summarize([stats for stats, _ in runs])
    result["cpu_s_per_epoch_trainer"] = round(statistics.median(own for _, own in runs), 3)
    if servers is None:
        result["cpu_s_per_epoch"] = None   # the servers' CPU is not visible from here
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    result["servers_peak_rss_mb"] = round(sum(server_rss), 1) if server_rss is not None else None
    result["servers_peak_rss_mb_each"] = server_rss
    result["num_parts"] = num_parts
    return result


def inprocess_features(cfg: RemoteBenchConfig) -> dict:
    """``bench sample --features`` with the same settings, in its own process; its JSON result."""
    argv = [sys.executable, "-m", "graphfeed.cli", "bench", "sample", "--graph", os.fspath(cfg.graph), "--features",
            "--num-neighbors", ",".join(map(str, cfg.num_neighbors)), "--batch-size", str(cfg.batch_size),
            "--epochs", str(cfg.epochs), "--input", cfg.input, "--seed", str(cfg.seed), "--direction", cfg.direction]
    if cfg.replace:
        argv.append("--replace")
    # Through sh, which forks it: a child exec'd straight from this (large) process would inherit
    # its peak RSS as ru_maxrss (Linux keeps the high-water mark across execve).
    launch = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv] if os.path.exists("/bin/sh") else argv
    try:
        res = subprocess.run(launch, capture_output=True, text=True, timeout=cfg.compare_timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the in-process comparison did not finish within {cfg.compare_timeout:.0f} s") from None
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the in-process comparison (`{' '.join(argv[1:])}`) failed with exit code "
                           f"{res.returncode}: {res.stderr.strip()[-500:]}")
    return json.loads(lines[-1])


def bench_remote(cfg: RemoteBenchConfig) -> dict:
    """Measure throughput through the servers; returns the JSON-ready result (see the module doc)."""
    from graphfeed.server.sampling import dispatch

    with ExitStack() as stack:
        if isinstance(cfg.servers, int):
            _check_parts(cfg.graph, cfg.servers)
            local = stack.enter_context(LocalServers(cfg.graph, cfg.servers))
            result = measure(local.addresses, cfg, local)
        else:
            result = measure(cfg.servers, cfg)
    nservers = cfg.servers if isinstance(cfg.servers, int) else len(cfg.servers)
    result.update({
        "implementation": dispatch.IMPLEMENTATION,
        "servers": nservers,
        "server_addresses": None if isinstance(cfg.servers, int) else list(cfg.servers),
        "prefetch": cfg.prefetch,
        "graph": None if cfg.graph is None else os.fspath(cfg.graph),
        "num_neighbors": list(cfg.num_neighbors),
        "batch_size": cfg.batch_size,
        "features": True,   # remote batches always carry x and y
        "epochs": cfg.epochs,
        "warmup_epochs": 1,
        "input": cfg.input,
        "seed": cfg.seed,
        "replace": cfg.replace,
        "direction": cfg.direction,
    })
    if cfg.compare:
        ref = inprocess_features(cfg)
        result["inprocess_features"] = True
        result["inprocess"] = {k: ref.get(k) for k in (
            "seeds_per_s", "batches_per_s", "sampled_edges_per_s", "epoch_s", "min", "max", "seeds_per_epoch",
            "batches_per_epoch", "sampled_edges_per_epoch", "cpu_s_per_epoch", "peak_rss_mb", "threads", "num_parts")}
        result["ratio_vs_inprocess"] = round(result["seeds_per_s"] / max(ref["seeds_per_s"], 1e-9), 3)
        if result["cpu_s_per_epoch"] and ref.get("cpu_s_per_epoch"):
            # CPU the service spends per epoch over what in-process sampling spends (1.0 = no overhead)
            result["cpu_ratio_vs_inprocess"] = round(result["cpu_s_per_epoch"] / ref["cpu_s_per_epoch"], 3)
    return result


def _check_parts(graph: str, n: int) -> None:
    from graphfeed.server.partition.format import read_meta

    parts = read_meta(graph).num_parts
    if parts != n:
        raise ValueError(f"--servers {n} needs a partition folder with {n} part(s); {graph} has {parts}: "
                         f"use --servers {parts} or `graphfeed partition ... --num-parts {n}`")
