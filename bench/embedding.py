"""Typed training with server-held embeddings (``graphfeed bench embedding``).

On a typed graph whose other node types have no features (the ``mag`` presets: authors), the same
``to_hetero`` GraphSAGE model is trained three times through the servers, on one client, epochs interleaved
(plain, constant, embedding, plain, ...) so a loaded machine slows them alike:

* ``plain``: every featureless type gets zero features (what a model without embeddings sees);
* ``constant``: fixed random rows of the tables' shape, handed out as leaves that require grad: the model's
  own extra forward/backward on learnable inputs, with nothing travelling (the "without system" baseline);
* ``embedding``: every featureless type gets a learnable server table (``client.embedding(..., field="x")``)
  stepped by :class:`graphfeed.client.SparseAdam` on the owners.

Reported per run: validation accuracy, the median training step time (``batch_ms``: wait for the batch +
forward/backward + dense step + the sparse push) and its phases (``wait_ms``, ``forward_ms``, ``backward_ms``,
``dense_step_ms``, ``sparse_step_ms``: medians), CPU ms per batch of this process and of the servers' process
trees (``cpu_ms_trainer``, ``cpu_ms_servers``: robust where wall time is not, on a shared machine), and for the
embedding run the rows' bytes per batch and the push figures (``push_ms``: what ``step()`` costs the trainer,
one step in flight; ``rows_applied_per_s_per_server``: synchronous pushes of 50,000 random gradient rows, merged
and applied with Adam on the owners, per second per server).
``overhead`` = embedding / plain - 1 (the issue's target: at most 0.2); ``model_overhead`` = constant / plain - 1
(the model's part, which any embedding store pays); ``system_overhead`` = embedding / constant - 1 (pulling
the rows with the batch and pushing their gradients).
"""
from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from graphfeed.bench.remote import check_servers
from graphfeed.testing.cluster import LocalCluster


@dataclass(frozen=True)
class EmbeddingBenchConfig:
    """``servers``: N (start N daemons over ``graph``) or running ``host:port`` addresses."""

    servers: int | tuple[str, ...]
    graph: str | None = None
    dim: int = 128
    hidden: int = 64
    num_neighbors: tuple[int, ...] = (10, 5)
    batch_size: int = 512
    epochs: int = 3
    lr: float = 0.01
    emb_lr: float = 0.05
    seed: int = 0
    edge_types: tuple[tuple[str, str, str], ...] | None = None   # sampled edge types (None: every one)
    threads: int = 0   # the trainer's torch threads (0: torch's default)
    feature_dtype: str | None = None   # the loaders' feature_dtype (bfloat16: the rows travel in it too)

    def __post_init__(self):
        object.__setattr__(self, "servers", check_servers(self.servers, self.graph))
        if self.dim < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("--dim, --epochs and --batch-size must be >= 1")
        if self.threads < 0:
            raise ValueError("--threads must be >= 0 (0: torch's default)")


def _model(client, hidden: int):
    from torch_geometric.nn import SAGEConv, to_hetero

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = SAGEConv((-1, -1), hidden)
            self.conv2 = SAGEConv((-1, -1), client.num_classes)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    return to_hetero(SAGE(), (list(client.node_types), [tuple(e) for e in client.edge_types]), aggr="sum")


def featureless_types(client) -> list[str]:
    """The node types without ``x``: a batch carries ``x`` (empty or not) for every type that has features, so one
    online sample of one node shows them."""
    probe = client.sample(torch.tensor([0]), [1])
    return [t for t in client.node_types if "x" not in probe[t]]


#: per-batch phases a run times (ms each; ``step_ms`` is their sum plus the loop's own bookkeeping)
PHASES = ("wait", "forward", "backward", "dense_step", "sparse_step")


class TypedRun:
    """One model trained through ``client``, with server tables on the featureless types (``embeddings``), or
    without them: zeros there (the plain model), or -- ``constant`` -- fixed random rows of the tables' shape as
    leaves that require grad, so the model does the same forward and backward on them as on server rows but
    nothing travels (the "without system" baseline: the model's own cost of learnable inputs)."""

    def __init__(self, client, cfg: EmbeddingBenchConfig, *, embeddings: bool, constant: bool = False):
        import graphfeed.client as gf

        if embeddings and constant:
            raise ValueError("a run has server tables or constant rows, not both")
        torch.manual_seed(cfg.seed)
        self.client, self.cfg, self.label = client, cfg, client.label_type
        self.types = featureless_types(client)
        self.tables = ([client.embedding(t, dim=cfg.dim, seed=cfg.seed, field="x") for t in self.types]
                       if embeddings else [])
        self.constant = _ConstantRows(cfg.dim, cfg.seed) if constant else None
        fanouts: list[int] | dict = list(cfg.num_neighbors)
        if cfg.edge_types is not None:
            fanouts = {tuple(e): list(cfg.num_neighbors) for e in cfg.edge_types}
        self.train = client.neighbor_loader((self.label, "train"), fanouts, batch_size=cfg.batch_size, shuffle=True,
                                            seed=cfg.seed, embeddings=self.tables, feature_dtype=cfg.feature_dtype)
        self.val = client.neighbor_loader((self.label, "val"), fanouts, batch_size=cfg.batch_size,
                                          embeddings=self.tables, feature_dtype=cfg.feature_dtype)
        self.model = _model(client, cfg.hidden)
        self.opt: torch.optim.Optimizer | None = None
        self.sparse = gf.SparseAdam(self.tables, lr=cfg.emb_lr) if self.tables else None
        self.step_ms: list[float] = []
        self.phase_ms: dict[str, list[float]] = {k: [] for k in PHASES}
        self.pushed = 0
        self.rows_bytes = 0
        self.cpu_s = {"trainer": 0.0, "servers": 0.0}

    def timed_epoch(self, cpu: CpuClock) -> None:
        """:meth:`epoch`, adding the CPU seconds this process and the servers' processes spent meanwhile."""
        before = cpu.read()
        self.epoch()
        for k, v in cpu.since(before).items():
            self.cpu_s[k] += v

    def epoch(self) -> None:
        """One training epoch; each step's time (wait + forward/backward + steps) into ``step_ms``, its phases into
        ``phase_ms``."""
        label, t0 = self.label, time.perf_counter()
        for batch in self.train:
            t1 = time.perf_counter()
            self._featureless_inputs(batch)
            size = batch[label].batch_size
            out = self.model(_float_inputs(batch), batch.edge_index_dict)[label][:size]
            loss = torch.nn.functional.cross_entropy(out, batch[label].y[:size])
            if self.opt is None:   # lazy layers have their shapes after the first forward
                self.opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr)
            self.opt.zero_grad()
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            self.opt.step()
            t4 = time.perf_counter()
            if self.sparse is not None:
                rows = [batch[t].x for t in self.types]
                self.pushed += sum(int(r.size(0)) for r in rows)
                self.rows_bytes += sum(r.numel() * r.element_size() for r in rows)
                self.sparse.step()
            now = time.perf_counter()
            for phase, ms in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, now - t4)):
                self.phase_ms[phase].append(ms * 1e3)
            self.step_ms.append((now - t0) * 1e3)
            t0 = now

    def _featureless_inputs(self, batch) -> None:
        """The stand-in of a featureless type when the run has no tables: zeros, or the constant leaf rows."""
        if self.tables:
            return
        for t in self.types:
            n = batch[t].num_nodes
            batch[t].x = self.constant.leaf(n) if self.constant is not None else torch.zeros(n, self.cfg.dim)

    def accuracy(self) -> float:
        correct = total = 0
        with torch.no_grad():
            for batch in self.val:
                self._featureless_inputs(batch)
                size = batch[self.label].batch_size
                pred = self.model(_float_inputs(batch), batch.edge_index_dict)[self.label][:size].argmax(-1)
                correct += int((pred == batch[self.label].y[:size]).sum())
                total += size
        return correct / max(1, total)

    def finish(self) -> dict:
        """Accuracy and timings (medians over the batches); closes the loaders and tables."""
        result = {"val_accuracy": self.accuracy(), "batch_ms": statistics.median(self.step_ms),
                  "batches": len(self.step_ms),
                  **{f"{k}_ms": round(statistics.median(v), 3) for k, v in self.phase_ms.items()},
                  **{f"cpu_ms_{k}": round(v * 1e3 / max(1, len(self.step_ms)), 3) for k, v in self.cpu_s.items()}}
        if self.sparse is not None:
            steps = max(1, len(self.step_ms))
            result.update(push_ms=result["sparse_step_ms"], rows_pushed_per_step=self.pushed / steps,
                          emb_bytes_per_batch=self.rows_bytes / steps,
                          table_rows=sum(t.num_rows for t in self.tables),
                          rows_applied_per_s_per_server=push_throughput(self.tables[0], self.sparse,
                                                                        len(self.client.servers)))
        for loader in (self.train, self.val):
            loader.close()
        for t in self.tables:
            t.close()
        return result


def _float_inputs(batch) -> dict:
    """The batch's ``x`` per type in float32 (a narrow ``feature_dtype`` widened here, rows' gradients included)."""
    return {t: x if x.dtype == torch.float32 else x.float() for t, x in batch.x_dict.items()}


class CpuClock:
    """CPU seconds (user + system) of this process and of the server processes (``server_pids`` and their
    children: daemons and their workers), read with psutil; processes that end meanwhile drop out."""

    def __init__(self, server_pids):
        self.server_pids = list(server_pids)

    def read(self) -> dict[str, dict[int, float]]:
        import psutil

        me = psutil.Process()
        servers: dict[int, float] = {}
        for pid in self.server_pids:
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    t = p.cpu_times()
                    servers[p.pid] = t.user + t.system
            except psutil.Error:
                continue
        t = me.cpu_times()
        return {"trainer": {me.pid: t.user + t.system}, "servers": servers}

    def since(self, before: dict[str, dict[int, float]]) -> dict[str, float]:
        now = self.read()
        return {k: sum(v - before[k].get(pid, 0.0) for pid, v in now[k].items()) for k in now}


class _ConstantRows:
    """Fixed random rows ``[n, dim]`` handed out as fresh leaves that require grad (their gradients dropped)."""

    def __init__(self, dim: int, seed: int):
        self.dim, self.gen = dim, torch.Generator().manual_seed(seed)
        self.rows = torch.empty(0, dim)

    def leaf(self, n: int) -> torch.Tensor:
        if n > self.rows.size(0):
            self.rows = torch.randn(max(n, 2 * self.rows.size(0)), self.dim, generator=self.gen) * 0.1
        return self.rows[:n].detach().requires_grad_(torch.is_grad_enabled())


def train_typed(client, cfg: EmbeddingBenchConfig, *, embeddings: bool) -> dict:
    """Train the model through ``client`` (with or without server tables) for ``cfg.epochs``; accuracy and
    timings (:meth:`TypedRun.finish`)."""
    run = TypedRun(client, cfg, embeddings=embeddings)
    for _ in range(cfg.epochs):
        run.epoch()
    return run.finish()


def push_throughput(table, sparse, servers: int, rows: int = 50_000, steps: int = 5) -> float:
    """Gradient rows applied per second per server: ``steps`` synchronous pushes of ``rows`` random rows
    (duplicates included, ids on every server), each waited for (send, merge, Adam update, answer)."""
    gen = torch.Generator().manual_seed(1)
    work = [(torch.randint(0, table.num_rows, (rows,), generator=gen),
             torch.randn(rows, table.spec.dim, generator=gen) * 1e-3) for _ in range(steps)]
    began = time.perf_counter()
    for ids, grads in work:
        table.push(ids, grads, sparse.update)
        table.flush()
    return rows * steps / (time.perf_counter() - began) / servers


def bench_embedding(cfg: EmbeddingBenchConfig) -> dict:
    """The three runs on one client and the same servers, their epochs interleaved (plain, constant, embedding,
    plain, ...) so a loaded machine slows them alike; the figures as one dict."""
    import graphfeed.client as gf

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with ExitStack() as stack:
        pids: list[int] = []   # servers this bench started: their CPU is counted
        if isinstance(cfg.servers, int):
            cluster = stack.enter_context(LocalCluster(str(cfg.graph), cfg.servers))
            addresses, pids = cluster.addresses, [s.pid for s in cluster.servers]
        else:
            addresses = list(cfg.servers)
        with gf.connect(addresses, timeout=120) as client:
            runs = {"plain": TypedRun(client, cfg, embeddings=False),
                    "constant": TypedRun(client, cfg, embeddings=False, constant=True),
                    "embedding": TypedRun(client, cfg, embeddings=True)}
            cpu = CpuClock(pids)
            for _ in range(cfg.epochs):
                for run in runs.values():
                    run.timed_epoch(cpu)
            types = runs["plain"].types
            results = {name: run.finish() for name, run in runs.items()}
    ms = {name: r["batch_ms"] for name, r in results.items()}
    return {"servers": len(addresses), "dim": cfg.dim, "trainer_threads": torch.get_num_threads(),
            "featureless_types": types, "epochs": cfg.epochs,
            "batch_size": cfg.batch_size, **{f"{k}_{name}": v for name, r in results.items() for k, v in r.items()},
            "overhead": ms["embedding"] / ms["plain"] - 1,
            "model_overhead": ms["constant"] / ms["plain"] - 1,
            "system_overhead": ms["embedding"] / ms["constant"] - 1}
