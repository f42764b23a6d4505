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

Transport: ``channel`` is how the measured epochs' batches travelled (``shm``: same-host shared
memory, ``torch-rpc``, or ``shm+torch-rpc`` when some of them came each way -- e.g. batches too big
for a slot before the ring grew), with ``shm_batches`` / ``rpc_batches`` counting them and
``shm_grown`` the rings that grew to the batches; ``--channel rpc`` forces torch RPC (the figure
before the shared-memory ring).
Peers: servers started here on one host read each other's parts from the shared files
(``colocated_reads``, the default); ``--peer-path rpc`` turns that off, so every remote hop and
feature row goes over torch RPC between the workers as it does between hosts.
``feature_dtype`` casts features on the servers (``bf16``/``fp16``); ``feature_cache_mb`` gives the
loader a hot-feature cache of that many MiB (the servers skip its rows); ``feature_bytes_per_epoch``
is the bytes of ``x`` the servers sent per measured epoch (median): the trainer's ``x`` less the rows
its feature cache filled in.  ``peer_cache_mb`` has each started server keep that many MiB of the other
parts' rows its edges reach most (``peer_cache_bytes``): its peers are asked only for the rest.

Memory: ``peak_rss_mb`` is the trainer's (this process's ``ru_maxrss``, as ``bench
sample``); ``servers_peak_rss_mb`` sums the peak resident sets (``VmHWM``) of every
daemon and its session workers, read just before the client disconnects (servers this
command started only).  Memory-mapped partition pages count in every process that
touched them, so the sum over-states physical memory when processes share pages.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from graphfeed.bench.sample import EpochStats, peak_rss_mb, summarize, workload_fields, workload_spec
from graphfeed.core.spec import LoaderSpec
from graphfeed.testing.cluster import LocalCluster
from graphfeed.transport import registry


def check_servers(servers, graph) -> int | tuple[str, ...]:
    """``--servers`` as a bench takes it: a count N >= 1 of servers to start over the partition folder
    ``graph`` (which must then be given and exist), or a non-empty sequence of ``host:port`` (as a tuple);
    ValueError (FileNotFoundError for a missing folder) naming the flag otherwise.  Shared by every bench that
    runs through servers."""
    if isinstance(servers, int) and not isinstance(servers, bool):
        if servers < 1:
            raise ValueError(f"--servers must be at least 1 (or a host:port list), got {servers}")
        if graph is None:
            raise ValueError("--servers N starts N servers over a partition folder: give --graph DIR")
        if not os.path.isdir(os.fspath(graph)):
            raise FileNotFoundError(f"--graph {graph}: no such partition folder; "
                                    f"create one with `graphfeed partition ... --output {graph}`")
        return servers
    servers = tuple(servers)
    if not servers:
        raise ValueError("--servers: give a number of servers to start or a host:port list")
    return servers


def through_servers(servers: int | tuple[str, ...], graph, name: str, measure: Callable[[Sequence[str]], dict]) -> dict:
    """``measure(addresses)`` through ``servers`` (:func:`check_servers`'s form): a count starts that many local
    daemons over ``graph`` for the run (their logs in a temporary folder named after the bench ``name``), a
    ``host:port`` list is used as it is."""
    if not isinstance(servers, int):
        return measure(servers)
    _check_parts(os.fspath(graph or ""), servers)
    with server_logs(f"graphfeed-bench-{name}-") as log_dir, \
            LocalCluster(os.fspath(graph or ""), servers, log_dir=log_dir) as local:
        return measure(local.addresses)


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
    channel: str = "auto"             # connect(channel=...): "auto" (shared memory on this host) or "rpc"
    peer_path: str = "auto"           # started servers: "auto" (colocated_reads) or "rpc" (peers over the data path)
    transport: str = "auto"           # connect(transport=...), the started servers' data_path (auto/secure/torch-rpc)
    tls_cert: str | None = None       # started servers: TLS with this certificate (its own CA for the client) ...
    tls_key: str | None = None        # ... and key
    feature_dtype: str | None = None  # features cast on the servers ("bf16", "fp16"); None = as stored
    feature_cache_mb: float = 0.0     # the loader's hot-feature cache (MiB; 0 = none)
    peer_cache_mb: float = 0.0        # started servers: other parts' hottest rows replicated on each (MiB; 0 = none)
    link: bool = False                # seeds are the edges of link split ``input`` (bench.sample's link mode)
    neg_ratio: float = 1.0            # link mode: binary negatives per seed edge (0 = none)
    server_device: str = "cpu"        # started servers: where their workers sample ("cpu", "cuda[:N]")
    trainer_device: str | None = None  # the loader's device= (batches moved there one ahead); None = host
    pin_memory: bool = False          # the loader's pin_memory=
    step_ms: float = 0.0              # a simulated training step per batch on trainer_device (GPU time, then a sync)
    loader: LoaderSpec = field(init=False, repr=False)   # what every epoch runs (bench.sample.workload_spec)

    @property
    def graph_folder(self) -> str:
        """The partition folder (``--servers N`` and ``--compare`` need one; checked at construction)."""
        if self.graph is None:
            raise ValueError("this run needs the partition folder: give --graph DIR")
        return os.fspath(self.graph)

    def __post_init__(self):
        object.__setattr__(self, "servers", check_servers(self.servers, self.graph))
        if self.compare and self.graph is None:
            raise ValueError("--compare runs the in-process bench on the same graph: give --graph DIR")
        if self.graph is not None and not os.path.isdir(self.graph):
            raise FileNotFoundError(f"--graph {self.graph}: no such partition folder; "
                                    f"create one with `graphfeed partition ... --output {self.graph}`")
        loader = dataclasses.replace(workload_spec(self), feature_dtype=self.feature_dtype)
        object.__setattr__(self, "loader", loader)
        object.__setattr__(self, "num_neighbors", loader.sampling.num_neighbors)
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.server_device):
            raise ValueError(f"--server-device must be cpu, cuda or cuda:N, got {self.server_device!r}")
        if self.step_ms < 0:
            raise ValueError(f"--step-ms must be >= 0, got {self.step_ms}")
        if self.peer_path not in ("auto", "rpc"):
            raise ValueError(f"--peer-path must be auto or rpc, got {self.peer_path!r}")
        if self.prefetch < 1:
            raise ValueError(f"--prefetch must be at least 1 (pulls in flight per server), got {self.prefetch}")
        if not 0 <= self.feature_cache_mb < float("inf"):   # NaN fails too
            raise ValueError(f"--feature-cache-mb must be a number of MiB >= 0 (0 = no cache), "
                             f"got {self.feature_cache_mb}")
        if not 0 <= self.peer_cache_mb < float("inf"):
            raise ValueError(f"--peer-cache-mb must be a number of MiB >= 0 (0 = none), got {self.peer_cache_mb}")

    def server_env(self) -> dict[str, str]:
        """The daemon settings of the servers this run starts (``GRAPHFEED_<KEY>`` variables)."""
        env = {"GRAPHFEED_COLOCATED_READS": "false"} if self.peer_path == "rpc" else {}
        env["GRAPHFEED_DEVICE"] = self.server_device
        if self.transport != "auto":
            env["GRAPHFEED_DATA_PATH"] = self.transport
        if self.tls_cert and self.tls_key:
            env.update(GRAPHFEED_TLS_CERT=self.tls_cert, GRAPHFEED_TLS_KEY=self.tls_key)
        if self.peer_cache_mb:
            env["GRAPHFEED_PEER_CACHE_BYTES"] = str(int(self.peer_cache_mb * 2**20))
        return env


# ---- servers on loopback (graphfeed.testing.cluster starts and stops them) -------------------------

def servers_peak_rss_mb(cluster: LocalCluster) -> list[float]:
    """Per server: the summed peak RSS of the daemon and every process below it (MiB)."""
    return [round(tree_peak_rss_mb(s.pid), 1) for s in cluster.servers]


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


GPU_SPIN_HZ = 1.5e9    # cycles per second torch.cuda._sleep spins at (about a data-centre GPU's clock)


def run_epoch(loader, server_pids: Sequence[int] = (), feature_bytes: list[int] | None = None,
              link: bool = False, step_ms: float = 0.0, wait_ms: list[float] | None = None) -> tuple[EpochStats, float]:
    """One epoch of ``loader`` as the trainer sees it (StartEpoch included, as the plan is in-process).

    Returns the epoch's stats (``cpu_s``: trainer + ``server_pids`` trees) and the trainer's CPU share;
    appends the bytes of ``x`` the servers sent to ``feature_bytes`` when given (those the loader's feature
    cache filled in are not sent).  ``link``: seeds are counted
    in seed edges (``input_id``), not in the batch's seed nodes.  ``step_ms``: a simulated training step per
    batch (:func:`training_step`); ``wait_ms`` gets the trainer's mean wait per batch (time inside ``next``).
    """
    t0, own0, srv0 = time.perf_counter(), time.process_time(), tree_cpu_s(server_pids)
    seeds = batches = edges = x_bytes = 0
    waited, it = 0.0, iter(loader)
    while True:
        w0 = time.perf_counter()
        batch = next(it, None)   # Data, or HeteroData (batch_size on the input type; edges of every edge type)
        waited += time.perf_counter() - w0
        if batch is None:
            break
        if step_ms:
            training_step(batch, step_ms)
        seeds += int(batch.input_id.numel()) if link else \
            sum(int(store.batch_size) for store in batch.node_stores if "batch_size" in store)
        edges += int(batch.num_edges)
        x_bytes += sum(store.x.numel() * store.x.element_size() for store in batch.node_stores
                       if getattr(store, "x", None) is not None)
        batches += 1
    wall, own = time.perf_counter() - t0, time.process_time() - own0
    if feature_bytes is not None:
        feature_bytes.append(x_bytes - loader.stats()["feature_cache"]["bytes_filled"])
    if wait_ms is not None:
        wait_ms.append(1000.0 * waited / max(batches, 1))
    return EpochStats(wall, seeds, batches, edges, own + tree_cpu_s(server_pids) - srv0), own


def training_step(batch, step_ms: float) -> None:
    """A stand-in for a training step on the batch's device: ``step_ms`` of GPU work reading the batch
    (a spin kernel on its stream), then a synchronize, as ``loss.item()`` does; on the CPU a sleep."""
    x = batch.x if "x" in batch else None
    if x is not None and x.is_cuda:
        x.sum()                                                     # the step reads the batch
        torch.cuda._sleep(int(step_ms * 1e-3 * GPU_SPIN_HZ))
        torch.cuda.synchronize(x.device)
    else:
        time.sleep(step_ms / 1000.0)


def _loader(client, cfg: RemoteBenchConfig):
    return client.open_loader(cfg.loader, prefetch=cfg.prefetch, feature_cache_mb=cfg.feature_cache_mb,
                              pin_memory=cfg.pin_memory, device=cfg.trainer_device)


def measure(addresses: Sequence[str], cfg: RemoteBenchConfig, servers: LocalCluster | None = None,
            mark: Callable[[str], None] | None = None) -> dict:
    """Connect to ``addresses``, run the warm-up and measured epochs; returns the summary fields.

    ``mark`` is called with ``"warm"`` right before the measured epochs and ``"measured"`` right after
    them (an outside observer reads its own counters then: :mod:`graphfeed.bench.hosts`)."""
    import graphfeed.client as gf

    pids = [s.pid for s in servers.servers] if servers is not None else []
    mark = mark or (lambda _phase: None)
    no_shm: dict[str, Any] = {"shm_slots": 0} if cfg.channel == "rpc" else {}   # every pull over the data path
    with gf.connect(list(addresses), transport=cfg.transport, tls_ca=cfg.tls_cert, **no_shm) as client, \
            _loader(client, cfg) as loader:
        run_epoch(loader, pids, link=cfg.link)                     # warm-up, not reported
        before = channel_counts(client.group.channel)
        feature_bytes: list[int] = []
        wait_ms: list[float] = []
        mark("warm")
        runs = [run_epoch(loader, pids, feature_bytes, cfg.link, cfg.step_ms, wait_ms) for _ in range(cfg.epochs)]
        mark("measured")
        transport = dict(transport_fields(client.group.channel, before), data_path=client.group.data_path,
                         tls=cfg.tls_cert is not None)
        server_rss = servers_peak_rss_mb(servers) if servers is not None else None  # before the workers exit
        num_parts = client.num_parts
    result = summarize([stats for stats, _ in runs])
    result["cpu_s_per_epoch_trainer"] = round(statistics.median(own for _, own in runs), 3)
    if servers is None:
        result["cpu_s_per_epoch"] = None   # the servers' CPU is not visible from here
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    result["servers_peak_rss_mb"] = round(sum(server_rss), 1) if server_rss is not None else None
    result["servers_peak_rss_mb_each"] = server_rss
    result["num_parts"] = num_parts
    result.update(transport)
    result["feature_dtype"] = cfg.feature_dtype
    result["feature_cache_mb"] = cfg.feature_cache_mb
    result["peer_cache_mb"] = cfg.peer_cache_mb
    result["feature_bytes_per_epoch"] = int(statistics.median(feature_bytes))
    result["wait_ms_per_batch"] = round(statistics.median(wait_ms), 3)
    result.update(server_device=cfg.server_device, trainer_device=cfg.trainer_device, pin_memory=cfg.pin_memory,
                  step_ms=cfg.step_ms)
    if servers is not None and cfg.server_device != "cpu":
        result["server_gpu"] = [line for line in server_logs_lines(servers) if "samples part" in line][:4]
    return result


def server_logs_lines(cluster: LocalCluster) -> list[str]:
    """The started servers' log lines (where a GPU worker says where it samples)."""
    return [line for s in cluster.servers for line in s.logs().splitlines()]


def channel_counts(channel) -> dict[str, int]:
    """The batch channel's counters now (a channel without counters: none)."""
    return dict(getattr(channel, "counts", {}))


def transport_fields(channel, before: dict[str, int]) -> dict:
    """``channel`` (how the measured epochs' batches travelled: ``shm``, ``torch-rpc`` or ``shm+torch-rpc``),
    ``shm_batches`` / ``rpc_batches`` (their counts; None for a channel that does not count) and
    ``shm_grown`` (shared-memory rings that grew to the batches, warm-up included)."""
    counts = channel_counts(channel)
    if not counts:
        return {"channel": channel.kind, "shm_batches": None, "rpc_batches": None, "shm_grown": None}
    shm = counts[registry.SHM] - before.get(registry.SHM, 0)
    rpc = sum(counts[k] - before.get(k, 0) for k in ("rpc", "too_big", "slot_wait"))
    # what carries what shared memory cannot
    over = getattr(getattr(channel, "calls", None), "kind", registry.TRUSTED_DEFAULT)
    kind = f"{registry.SHM}+{over}" if shm and rpc else (registry.SHM if shm else over)
    return {"channel": kind, "shm_batches": shm, "rpc_batches": rpc, "shm_grown": counts.get("grown", 0)}


def inprocess_features(cfg: RemoteBenchConfig) -> dict:
    """``bench sample --features`` with the same settings, in its own process; its JSON result."""
    argv = [sys.executable, "-m", "graphfeed.cli", "bench", "sample", "--graph", cfg.graph_folder, "--features",
            "--num-neighbors", ",".join(map(str, cfg.num_neighbors)), "--batch-size", str(cfg.batch_size),
            "--epochs", str(cfg.epochs), "--input", cfg.input, "--seed", str(cfg.seed), "--direction", cfg.direction]
    if cfg.replace:
        argv.append("--replace")
    if cfg.link:
        argv += ["--link", "--neg-ratio", str(cfg.neg_ratio)]
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


@contextmanager
def server_logs(prefix: str) -> Iterator[str]:
    """A fresh folder for the logs of the servers a bench starts: removed when the run succeeds, kept when it
    fails (the error names a server's log), so runs do not pile folders up in the temp directory."""
    log_dir = tempfile.mkdtemp(prefix=prefix)
    yield log_dir
    shutil.rmtree(log_dir, ignore_errors=True)


def bench_remote(cfg: RemoteBenchConfig) -> dict:
    """Measure throughput through the servers; returns the JSON-ready result (see the module doc)."""
    from graphfeed.server.sampling import dispatch

    with ExitStack() as stack:
        if isinstance(cfg.servers, int):
            _check_parts(cfg.graph_folder, cfg.servers)
            env = cfg.server_env()
            log_dir = stack.enter_context(server_logs("graphfeed-bench-remote-"))
            probe = None
            if cfg.tls_cert and cfg.tls_key:
                import grpc

                with open(cfg.tls_cert, "rb") as f:   # the health probe trusts the servers' own certificate
                    probe = grpc.ssl_channel_credentials(root_certificates=f.read())
            local = stack.enter_context(LocalCluster(cfg.graph_folder, cfg.servers, env=env, log_dir=log_dir,
                                                     tls=probe))
            result = measure(local.addresses, cfg, local)
        else:
            result = measure(cfg.servers, cfg)
    nservers = cfg.servers if isinstance(cfg.servers, int) else len(cfg.servers)
    result.update({
        "implementation": dispatch.IMPLEMENTATION,
        "servers": nservers,
        "server_addresses": None if isinstance(cfg.servers, int) else list(cfg.servers),
        "prefetch": cfg.prefetch,
        "peer_path": cfg.peer_path if isinstance(cfg.servers, int) else None,   # running servers: their config
        "graph": None if cfg.graph is None else os.fspath(cfg.graph),
        "features": True,   # remote batches always carry x and y
        **workload_fields(cfg),
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
    from graphfeed.server.partition.format.layout import read_meta

    parts = read_meta(graph).num_parts
    if parts != n:
        raise ValueError(f"--servers {n} needs a partition folder with {n} part(s); {graph} has {parts}: "
                         f"use --servers {parts} or `graphfeed partition ... --num-parts {n}`")
