"""Learnable node embeddings held by the servers: the records both sides share, and the sparse optimizers.

A table is one learnable row per node of one node type.  Each server holds the rows of the nodes its part
owns (a contiguous range of global ids), in the trainer group's session worker
(:mod:`graphfeed.server.embedding`); the local loader holds every part's rows in its own process.  Rows
travel with the batch (node field ``emb`` of :data:`graphfeed.core.batch.BATCH_FIELDS`, keyed by the
batch nodes' global ids ``emb_gid``), the trainer turns them into a leaf tensor that requires grad, and a
sparse optimizer here sends each table's ``(global ids, gradient rows)`` to the owners, which merge
duplicate ids (summed, as torch coalesces sparse gradients) and apply the update with their per-row state.

Records:

* :class:`EmbeddingSpec` -- a table: its name, node type, dimension, dtype and initialisation.  The rows of
  a part are a pure function of (spec, part range), so every replica (each DDP rank's group, the local
  loader, a restarted server) starts from the same rows.
* :class:`SparseUpdate` -- one optimizer step's rule and hyper-parameters (SGD, Adagrad, Adam), sent with
  the gradients.

Consistency (why all ranks see the same rows): under DDP every rank's trainer group holds its own replica
of a table (groups are per trainer process, so a dead trainer locks out nobody).  At ``step()`` the ranks
all-gather their gradient rows over the trainer's own process group, average them as DDP averages dense
gradients, and each rank pushes the same gradients, in the same order, to its replica: the owners apply
identical updates, so after every step each rank reads identical rows.  A remote table keeps one step in
flight: ``step()`` returns once the previous step is applied everywhere and this one is sent, so the owners
apply it while the trainer computes the next batch; ``table.rows()``, checkpoints and ``close()`` wait for it.
Rows in a batch are read when the batch is produced, so with prefetch a batch may carry rows from before the
last few steps (as any prefetching pipeline of an asynchronous embedding store).
"""
from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import torch

#: torch dtype names a table may have
TABLE_DTYPES = ("float32", "float16", "bfloat16", "float64")
INITS = ("normal", "uniform", "zeros")
RULES = ("sgd", "adagrad", "adam")
MAX_DIM = 1 << 16
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
#: per-row optimizer state, in rows of the table's width, per rule (Adam also keeps a step count per row)
STATE_ROWS = {"sgd": 0, "adagrad": 1, "adam": 2}


def check_name(name: Any, what: str = "table name") -> str:
    """``name`` if it is a usable table name (it becomes a folder name), else ValueError naming the fix."""
    if not isinstance(name, str) or not name or len(name) > 128 or not set(name) <= NAME_CHARS or name[0] == ".":
        raise ValueError(f"{what} {name!r} must be 1-128 characters of letters, digits, '_', '-', '.', not "
                         f"starting with '.'")
    return name


@dataclass(frozen=True)
class EmbeddingSpec:
    """A learnable table: ``dim`` values of ``dtype`` per node of type ``ntype``, named ``name`` (per trainer
    group: another job's table of the same name is another table).  ``init``: ``"normal"`` (mean 0, std
    ``scale``), ``"uniform"`` (in ``[-scale, scale]``) or ``"zeros"``; ``seed`` makes the rows reproducible.
    ValueError (naming the field and the allowed values) when constructed with bad values."""

    name: str
    ntype: str
    dim: int
    dtype: str = "float32"
    init: str = "normal"
    scale: float = 0.1
    seed: int = 0

    def __post_init__(self):
        check_name(self.name)
        if not isinstance(self.ntype, str) or not self.ntype:
            raise ValueError(f"node type must be a non-empty string, got {self.ntype!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or not 1 <= self.dim <= MAX_DIM:
            raise ValueError(f"dim must be an integer in 1..{MAX_DIM}, got {self.dim!r}")
        if self.dtype not in TABLE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not a table dtype: use one of {', '.join(TABLE_DTYPES)}")
        if self.init not in INITS:
            raise ValueError(f"init {self.init!r} is not known: use one of {', '.join(INITS)}")
        if not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale) or self.scale < 0:
            raise ValueError(f"scale must be a finite number >= 0, got {self.scale!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63:
            raise ValueError(f"seed must be an integer in 0..2**63-1, got {self.seed!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def row_bytes(self) -> int:
        return self.dim * torch.empty((), dtype=self.torch_dtype).element_size()

    def nbytes(self, rows: int, rule: str | None = "adam") -> int:
        """Bytes of ``rows`` rows plus the per-row state of optimizer ``rule`` (float32 state)."""
        state = STATE_ROWS.get(rule or "sgd", 0) * self.dim * 4 + (8 if rule == "adam" else 0)
        return rows * (self.row_bytes + state)

    def initial_rows(self, start: int, count: int) -> torch.Tensor:
        """The first rows of global ids ``start .. start + count - 1`` ([count, dim], this spec's dtype): a pure
        function of (spec, start, count), so every replica of a part begins equal."""
        out = torch.empty(count, self.dim, dtype=torch.float32)
        if self.init == "zeros" or count == 0:
            out.zero_()
        else:
            gen = torch.Generator().manual_seed(_mix(self.seed, zlib.crc32(f"{self.name}/{self.ntype}".encode()),
                                                     start))
            if self.init == "normal":
                out.normal_(0.0, float(self.scale), generator=gen)
            else:
                out.uniform_(-float(self.scale), float(self.scale), generator=gen)
        return out.to(self.torch_dtype)

    def checked_ids(self, gids, num_rows: int) -> torch.Tensor:
        """``gids`` (ids of this table's ``num_rows`` rows: its node type's) as a flat int64 tensor; ValueError naming
        the first id outside ``0..num_rows - 1``.  The trainer's table and the servers' stores check alike."""
        gids = torch.as_tensor(gids, dtype=torch.int64).reshape(-1)
        bad = (gids < 0) | (gids >= num_rows)
        if bool(bad.any()):
            raise ValueError(f"embedding table {self.name!r}: id {int(gids[bad][0])} is outside the {self.ntype!r} "
                             f"nodes 0..{num_rows - 1}")
        return gids


#: float feature dtypes a loader may ask for (``feature_dtype``) that also narrow its tables' rows on the wire
NARROW_DTYPES = (torch.bfloat16, torch.float16)


def rows_dtype(spec: EmbeddingSpec, feature_dtype: torch.dtype | None) -> str | None:
    """The dtype name a loader's batches carry table ``spec``'s rows in: the loader's ``feature_dtype`` when it
    is a narrow float (bf16, fp16) and the table is wider -- the rows then travel, from peers too, in the
    bytes the trainer asked features to travel in, and their gradients come back in float32 -- else None
    (the table's own dtype; int8 features do not quantize rows)."""
    if feature_dtype not in NARROW_DTYPES:
        return None
    return str(feature_dtype).removeprefix("torch.") if spec.torch_dtype.itemsize > feature_dtype.itemsize else None


def check_rows_dtype(dtype) -> torch.dtype | None:
    """``dtype`` (a :data:`TABLE_DTYPES` name or None) as a torch dtype; ValueError naming the choices."""
    if dtype is None:
        return None
    if dtype not in TABLE_DTYPES:
        raise ValueError(f"rows dtype {dtype!r} is not a table dtype: use one of {', '.join(TABLE_DTYPES)}")
    return getattr(torch, dtype)


def _mix(*values: int) -> int:
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    return h & 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class SparseUpdate:
    """One step's update rule (``"sgd"``, ``"adagrad"``, ``"adam"``) and its hyper-parameters, as
    ``torch.optim.SGD`` / ``Adagrad`` / ``Adam`` name them (no weight decay, momentum or lr decay).
    ValueError for an unknown rule or a value out of range."""

    rule: str
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"optimizer rule {self.rule!r} is not known: use one of {', '.join(RULES)}")
        if not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) or self.lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {self.lr!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if not isinstance(self.eps, (int, float)) or not self.eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {self.eps!r}")


def coalesce(gids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(distinct ids ascending, summed gradient rows)``: duplicate ids' rows added in float32, as torch
    coalesces a sparse gradient (the owner applies one update per row and step).

    Ids without duplicates (one trainer's batch: its nodes are distinct) are only put in order, one row
    gather; ids already strictly ascending (a trainer that coalesced them itself) are taken as they are.
    Only duplicates pay for ``index_add_``, whose CPU kernel is a scatter several times slower than a
    gather."""
    gids = gids.reshape(-1).to(torch.int64)
    grads = grads.to(torch.float32)
    if gids.numel() < 2 or bool((gids[1:] > gids[:-1]).all()):
        return gids, grads
    ordered, order = torch.sort(gids)
    if bool((ordered[1:] != ordered[:-1]).all()):
        return ordered, grads.index_select(0, order)
    ids, inverse = torch.unique_consecutive(ordered, return_inverse=True)
    summed = torch.zeros(ids.numel(), grads.size(1), dtype=torch.float32)
    summed.index_add_(0, inverse, grads.index_select(0, order))
    return ids, summed


def apply_update(rows: torch.Tensor, state: dict[str, torch.Tensor], local: torch.Tensor, grads: torch.Tensor,
                 update: SparseUpdate) -> None:
    """Apply ``update`` to ``rows[local]`` (distinct local row indices) with gradient rows ``grads`` (float32,
    already coalesced), in place, keeping per-row state in ``state`` (made on first use: Adagrad's
    ``sum``, Adam's ``exp_avg``, ``exp_avg_sq`` and per-row ``step``).  Each row's arithmetic is that of
    ``torch.optim``'s dense rule with the default options, applied on the steps that row gets a gradient
    (Adam counts steps per row, as DGL's sparse Adam does).  Each touched row of ``rows`` and of each state
    tensor is gathered once and written back once; the arithmetic is in place on the gathered copies."""
    n = rows.size(0)
    w = rows.index_select(0, local)
    if w.dtype != torch.float32:
        w = w.to(torch.float32)
    if update.rule == "sgd":
        w.add_(grads, alpha=-update.lr)
    elif update.rule == "adagrad":
        acc = _state(state, "sum", n, rows.size(1), torch.float32)
        s = acc.index_select(0, local).addcmul_(grads, grads)
        acc.index_copy_(0, local, s)
        w.addcdiv_(grads, s.sqrt_().add_(update.eps), value=-update.lr)
    else:
        b1, b2 = update.betas
        m_all = _state(state, "exp_avg", n, rows.size(1), torch.float32)
        v_all = _state(state, "exp_avg_sq", n, rows.size(1), torch.float32)
        step_all = _state(state, "step", n, 0, torch.float32)
        step = step_all.index_select(0, local).add_(1)
        step_all.index_copy_(0, local, step)
        m = m_all.index_select(0, local).lerp_(grads, 1 - b1)   # b1 m + (1 - b1) g
        m_all.index_copy_(0, local, m)
        v = v_all.index_select(0, local).mul_(b2).addcmul_(grads, grads, value=1 - b2)
        v_all.index_copy_(0, local, v)
        bc1 = 1 - torch.pow(b1, step)
        bc2 = 1 - torch.pow(b2, step)
        # torch.optim.Adam: w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), per row here (per-row steps)
        denom = v.sqrt_().div_(bc2.sqrt_().unsqueeze(1)).add_(update.eps)
        w.addcdiv_(m.mul_((update.lr / bc1).unsqueeze(1)), denom, value=-1.0)
    rows.index_copy_(0, local, w.to(rows.dtype))


def _state(state: dict[str, torch.Tensor], key: str, n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    t = state.get(key)
    if t is None:
        t = torch.zeros((n, dim) if dim else (n,), dtype=dtype)
        state[key] = t
    return t


# ---- the trainer side: tables as an optimizer sees them, and the sparse optimizers -----------------------

class EmbeddingTable(Protocol):
    """What a sparse optimizer needs of a table (:class:`graphfeed.client.embedding.RemoteEmbedding`, the local
    loader's :class:`graphfeed.server.embedding.LocalEmbedding`)."""

    spec: EmbeddingSpec

    def take_grads(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(global ids, gradient rows)`` of the rows handed out since the last step (None: none got one)."""

    def push(self, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate) -> None:
        """Send ``(gids, grads)`` to the owners, which apply ``update`` (a remote table returns once it is sent
        and the previous step applied)."""


class SparseOptimizer:
    """Base of :class:`SparseSGD`, :class:`SparseAdagrad`, :class:`SparseAdam`: ``step()`` after
    ``backward()`` sends each table's gradient rows to the rows' owners (see the module docstring for the
    DDP consistency model); ``zero_grad()`` forgets the rows handed out without stepping."""

    def __init__(self, params: Iterable, update: SparseUpdate):
        self.params = list(params)
        if not self.params:
            raise ValueError("a sparse optimizer needs at least one embedding table")
        for p in self.params:
            if not (hasattr(p, "take_grads") and hasattr(p, "push")):
                raise TypeError(f"{type(p).__name__} is not an embedding table (client.embedding(...)); dense "
                                f"parameters go to a torch.optim optimizer")
        self.update, self.steps = update, 0

    def step(self) -> None:
        for table in self.params:
            taken = table.take_grads()
            gids, grads = taken if taken is not None else (torch.empty(0, dtype=torch.int64),
                                                             torch.empty(0, table.spec.dim))
            gids, grads = all_gather_grads(gids, grads)
            if gids.numel():
                table.push(gids, grads, self.update)
        self.steps += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        for table in self.params:
            table.take_grads()


class SparseSGD(SparseOptimizer):
    """``torch.optim.SGD`` (plain: no momentum, no weight decay) on the owners' rows."""

    def __init__(self, params: Iterable, lr: float):
        super().__init__(params, SparseUpdate("sgd", lr))


class SparseAdagrad(SparseOptimizer):
    """``torch.optim.Adagrad`` (default options, ``eps``=1e-10) on the owners' rows, with per-row sums."""

    def __init__(self, params: Iterable, lr: float = 0.01, eps: float = 1e-10):
        super().__init__(params, SparseUpdate("adagrad", lr, eps=eps))


class SparseAdam(SparseOptimizer):
    """``torch.optim.Adam`` (no weight decay, not amsgrad) on the owners' rows, each row with its own moments
    and step count (a row is updated only on the steps it gets a gradient)."""

    def __init__(self, params: Iterable, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        super().__init__(params, SparseUpdate("adam", lr, betas, eps))


def all_gather_grads(gids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Under DDP (``torch.distributed`` initialised, world size > 1): every rank's ``(gids, grads)`` in rank
    order, gradients divided by the world size (DDP's average); else the arguments unchanged.  Collective:
    every rank must call it, in the same order of tables."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return gids, grads
    world = dist.get_world_size()
    # NCCL gathers device tensors only: the collective runs on this rank's GPU there, on the host otherwise
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([gids.numel()], dtype=torch.int64, device=dev))
    counts = [int(s) for s in sizes]
    most, dim = max(counts), grads.size(1)
    pad_ids = torch.zeros(most, dtype=torch.int64, device=dev)
    pad_ids[:gids.numel()] = gids
    pad_grads = torch.zeros(most, dim, dtype=torch.float32, device=dev)
    pad_grads[:gids.numel()] = grads.to(torch.float32)
    all_ids = [torch.empty(most, dtype=torch.int64, device=dev) for _ in range(world)]
    all_grads = [torch.empty(most, dim, dtype=torch.float32, device=dev) for _ in range(world)]
    dist.all_gather(all_ids, pad_ids)
    dist.all_gather(all_grads, pad_grads)
    ids = torch.cat([t[:n] for t, n in zip(all_ids, counts)]).cpu()
    rows = torch.cat([t[:n] for t, n in zip(all_grads, counts)]).cpu()
    return ids, rows / world


class HandOut:
    """The rows a table handed to the trainer since its last step: ``(global ids, leaf tensor)`` pairs, whose
    ``.grad`` the next :meth:`take` collects (in hand-out order, so every run pushes the same sequence)."""

    def __init__(self, spec: EmbeddingSpec):
        self.spec = spec
        self._items: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._lock = threading.Lock()

    def add(self, gids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` as a new leaf that requires grad, remembered with its ``gids`` until the next step -- or, with
        autograd off (``torch.no_grad()``: inference), as they are and forgotten."""
        if not torch.is_grad_enabled():
            return rows
        leaf = rows.detach().requires_grad_(True)
        with self._lock:
            self._items.append((gids.detach().to("cpu", torch.int64), leaf))
        return leaf

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(ids, gradient rows as float32 on the CPU)`` of the leaves that got a gradient, and forget them all."""
        with self._lock:
            items, self._items = self._items, []
        got = [(g, leaf.grad) for g, leaf in items if leaf.grad is not None]
        if not got:
            return None
        return (torch.cat([g for g, _ in got]),
                torch.cat([grad.detach().to("cpu", torch.float32).reshape(-1, self.spec.dim) for _, grad in got]))


class BatchTable(Protocol):
    """A table as a loader hands its rows out (remote or local)."""

    spec: EmbeddingSpec
    field: str
    handed: HandOut


def hand_out_rows(data, tables: Iterable[BatchTable]):
    """``data`` (a PyG batch of :func:`graphfeed.core.batch.to_pyg`, on any device) with each table's rows -- the
    batch's ``emb`` of its node type -- as a leaf tensor that requires grad, named ``table.field`` (``emb_gid``,
    their global ids, stays).  ValueError when ``field`` would replace an attribute the batch has."""
    hetero = hasattr(data, "node_types")
    for table in tables:
        store = data[table.spec.ntype] if hetero else data
        rows, gids = getattr(store, "emb", None), getattr(store, "emb_gid", None)
        if rows is None or gids is None:
            raise ValueError(f"the batch has no rows of embedding table {table.spec.name!r} ({table.spec.ntype!r}): "
                             f"the loader was not given the table, or the server lost it")
        del store.emb   # emb_gid stays: the rows' global ids (table.rows(gids) reads them again)
        if table.field != "emb" and getattr(store, table.field, None) is not None:
            raise ValueError(f"embedding table {table.spec.name!r}: the {table.spec.ntype!r} nodes already have "
                             f"{table.field!r}; pick another field= for the table's rows")
        setattr(store, table.field, table.handed.add(gids, rows))
    return data


def check_tables(tables, node_types: Iterable[str]) -> list:
    """``tables`` as a list, at most one per node type, each of a type in ``node_types`` (ValueError naming the
    problem)."""
    tables = list(tables or [])
    types = set(node_types)
    seen: dict[str, str] = {}
    for t in tables:
        spec = getattr(t, "spec", None)
        if not isinstance(spec, EmbeddingSpec):
            raise TypeError(f"embeddings= takes tables made by client.embedding(...), got {type(t).__name__}")
        if spec.ntype not in types:
            raise ValueError(f"embedding table {spec.name!r} is of node type {spec.ntype!r}, which the graph does "
                             f"not have ({', '.join(map(repr, sorted(types)))})")
        if spec.ntype in seen:
            raise ValueError(f"embedding tables {seen[spec.ntype]!r} and {spec.name!r} are both of node type "
                             f"{spec.ntype!r}: a loader takes one table per node type")
        seen[spec.ntype] = spec.name
    return tables
