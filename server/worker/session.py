"""One loader of the trainer inside a session worker: its input nodes, epochs and producers.

The session is the loader's :class:`~graphfeed.core.spec.LoaderSpec` plus this part's input
nodes (resolved by :meth:`graphfeed.server.partition.format.store.Partition.input_nodes`).  Each
epoch is an :class:`~graphfeed.core.epoch.EpochPlan` -- the same plan the local and the
remote loaders compute -- and the session produces the entries whose seeds this part owns,
in order, with :func:`produce_batch`.  ``seq`` is the entry's position in the rank's list
(what the trainer pulls).
"""
from __future__ import annotations

import threading
import time
from typing import Sequence

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.core.embedding import rows_dtype
from graphfeed.core.epoch import BatchSpec, EpochPlan, input_positions
from graphfeed.core.feature_cache import drop_cached_rows
from graphfeed.core.spec import LinkInput, LoaderSpec, NodeInput, SeedInput
from graphfeed.server.sampling.adhoc import produce_for_seeds
from graphfeed.server.sampling.budget import timed_batch
from graphfeed.server.sampling.link import LinkSeeds, produce_link_batch
from graphfeed.server.sampling.producer import node_seed_time, produce_batch, sample_nodes
from graphfeed.server.worker.buffer import BatchBuffer
from graphfeed.server.worker.commands import BadRequest, ServedCounts, SessionRow, WorkerError
from graphfeed.server.worker.telemetry import WorkerTelemetry
from graphfeed.transport.pending import Pending


def part_input_seeds(part, seed_input: SeedInput) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Part ``part``'s (a :class:`Partition`) seeds of a loader's input: ``(inputs, positions, ends)`` --
    :meth:`Partition.input_nodes`, :meth:`Partition.input_positions` (None: they follow from the counts) and,
    for seed edges the parts list (a link split, every edge of a type), their global endpoints ``[2, k]``
    (None otherwise)."""
    if isinstance(seed_input, LinkInput) and seed_input.index is None:   # a link split or every edge of a type
        positions, src, dst = part.stored_link_seeds(seed_input)   # listed once (every edge: a pass over edges)
        return positions, positions, torch.stack([src, dst])
    return part.input_nodes(seed_input), part.input_positions(seed_input), None


class EpochSuperseded(RuntimeError):
    """Raised into pulls of an epoch that a newer start_epoch (or close) replaced."""


class EpochRun:
    """The batches this part produces for one epoch of one session.  ``orders[p]``: part ``p``'s input in the
    epoch's order (this part's, and every part a packed batch of this part takes seeds of);
    ``position_orders[p]``: their input positions (``input_id``)."""

    def __init__(self, epoch: int, entries: list[tuple[int, BatchSpec]], orders: dict[int, torch.Tensor],
                 position_orders: dict[int, torch.Tensor], buffer: BatchBuffer):
        self.epoch, self.entries, self.orders, self.buffer = epoch, entries, orders, buffer
        self.position_orders = position_orders
        self.seqs = {seq for seq, _ in entries}
        self._next = 0
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def claim(self) -> tuple[int, BatchSpec] | None:
        with self._lock:
            if self._next >= len(self.entries):
                return None
            self._next += 1
            return self.entries[self._next - 1]


class Session:
    """``spec`` is the loader; ``inputs`` the global ids of this part's input nodes, in input order
    (for a link loader: the positions of the seed edges whose source this part owns);
    ``positions`` their positions in the loader's input ids, or None for a split or every node
    (:func:`graphfeed.core.epoch.input_positions`).  The seeds are of the input's node type
    (``spec.input.node_type``, else the graph's label type)."""

    def __init__(self, session_id: str, spec: LoaderSpec, inputs: torch.Tensor, graph, part_id: int,
                 num_parts: int, *, num_producers: int, buffer_batches: int, buffer_bytes: int,
                 telemetry: WorkerTelemetry | None = None, positions: torch.Tensor | None = None):
        self.session_id, self.spec, self.inputs, self.positions = session_id, spec, inputs, positions
        self.input_type = spec.input.type_or(graph.label_type)
        self.graph, self.part_id, self.num_parts = graph, part_id, num_parts
        self.telemetry = telemetry if telemetry is not None else WorkerTelemetry()
        self.num_producers = max(1, int(num_producers))
        self.buffer_batches, self.buffer_bytes = buffer_batches, buffer_bytes
        self.run: EpochRun | None = None
        self._lock = threading.Lock()
        self.totals = {"produced": 0, "served": 0, "bytes_served": 0}
        self._link_seeds: LinkSeeds | None = None
        self._whole_input: torch.Tensor | None = None   # an ordered loader's input, global ids in order
        self._peer_inputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}   # packed batches' other parts
        self.last_used = time.monotonic()   # the last start_epoch / pull / sample (idle sessions expire)
        self.embeddings = None   # the group's EmbeddingStore, once the loader attaches tables (attach_embeddings)
        self.embedding_tables: dict[str, str] = {}   # node type -> the table whose rows its batch nodes carry

    def _resolve_link_seeds(self) -> None:
        """A link loader's seed edges in global ids (their destinations may be any part's: asked of every
        peer, once, when the first epoch starts, since the peers are reachable only by then)."""
        if not self.spec.is_link or self._link_seeds is not None:
            return
        try:
            self._link_seeds = LinkSeeds(self.spec.input).resolve(self.graph, self.inputs)  # type: ignore[arg-type]
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _resolve_whole_input(self) -> None:
        """An ordered loader's whole input in global ids, in input order (its batches may take seeds of any
        part): asked of every peer once, when the first epoch starts (see :meth:`_resolve_link_seeds`)."""
        if not self.spec.ordered or self._whole_input is not None:
            return
        if self.input_type != self.graph.label_type:
            raise BadRequest(f"ordered=True serves nodes of the label type {self.graph.label_type!r} so far, not "
                             f"{self.input_type!r}: use ordered=False and place rows by batch.input_id")
        ids = self.spec.ordered_ids
        gids = self.graph.to_global(ids)
        if bool((gids < 0).any()):
            raise BadRequest(f"input node id {int(ids[gids < 0][0])} is not in the graph")
        self._whole_input = gids

    @property
    def local_input_nodes(self) -> int:
        return int(self.inputs.numel())

    def start_epoch(self, epoch: int, counts: Sequence[int] | None, start: int = 0) -> int:
        """Plan ``epoch`` and start producing this part's batches at positions ``>= start`` of the
        rank's list (a resumed epoch); returns how many this part produces.

        :class:`BadRequest` when ``counts`` disagree with this part, the loader's arguments
        leave no valid plan for them (e.g. fewer input nodes than ranks), or ``start`` is not
        in ``0..len(plan)``.
        """
        self.last_used = time.monotonic()
        counts = self._check_counts(counts)
        self._resolve_link_seeds()
        self._resolve_whole_input()
        try:
            plan = EpochPlan(self.spec, counts, epoch)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None  # the plan's own message names the fix
        if not 0 <= start <= len(plan):
            raise BadRequest(f"start_seq = {start} is outside epoch {epoch}'s {len(plan)} batches for rank "
                             f"{self.spec.rank}: give 0..{len(plan)}")
        mine = [(seq, e) for seq, e in plan.owned_by(self.part_id) if seq >= start]
        parts = {self.part_id} | {p for _, e in mine for p, _, _ in e.pieces}
        orders, positions = {}, {}
        for p in sorted(parts):
            if self._whole_input is not None:   # ordered: every batch slices the whole input
                orders[p], positions[p] = self._whole_input, torch.arange(self._whole_input.numel())
                continue
            inputs, given = (self.inputs, self.positions) if p == self.part_id else self._peer_input(p)
            orders[p] = plan.order(p, inputs)
            positions[p] = plan.order(p, input_positions(counts, p, given))
        run = EpochRun(plan.epoch, mine, orders, positions, BatchBuffer(self.buffer_batches, self.buffer_bytes))
        with self._lock:
            old, self.run = self.run, run
        if old is not None:
            self._retire(old, EpochSuperseded(f"epoch {old.epoch} of session {self.session_id} was replaced by "
                                              f"epoch {epoch}"))
        for i in range(min(self.num_producers, len(mine))):
            t = threading.Thread(target=self._produce, args=(run,), name=f"producer-{self.session_id[:8]}-{i}",
                                 daemon=True)
            run.threads.append(t)
            t.start()
        return len(mine)

    def _peer_input(self, part: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Part ``part``'s input nodes and positions (as this part's ``inputs`` and ``positions``), for the
        packed batches (``drop_last``, ``pack_partial``) this part produces with seeds of that part: read in
        this process when its files are (colocated), else asked of its worker once per session
        (``rpc_api.input_seeds``); a link split's seed edges join this session's :class:`LinkSeeds`."""
        if part not in self._peer_inputs:
            source = self.graph.sources[part]
            held = source.held()
            try:
                if held is not None:
                    inputs, given, ends = part_input_seeds(held.part, self.spec.input)
                else:
                    inputs, given, ends = source.calls.call_sync(part, "input_seeds", (self.spec.input,),
                                                                 source.rpc_timeout)
            except ValueError as exc:   # the loader's input itself is refused
                raise BadRequest(f"part {part}'s input for this loader's packed batches could not be "
                                 f"read: {exc}") from None
            except Exception as exc:  # noqa: BLE001 -- a lost or silent peer: the epoch cannot start (internal)
                raise WorkerError(f"reading this loader's input on peer worker part{part} (for the packed batches "
                                  f"that take its seeds) failed: {type(exc).__name__}: {exc}") from None
            if self._link_seeds is not None and ends is not None:
                self._link_seeds.add(inputs, ends)
            elif self._link_seeds is not None:
                self._link_seeds.resolve(self.graph, inputs)
            self._peer_inputs[part] = (inputs, given)
        return self._peer_inputs[part]

    def _check_counts(self, counts) -> list[int]:
        own = self.local_input_nodes
        if counts is None or len(counts) == 0:
            if self.num_parts == 1:
                return [own]
            raise BadRequest(f"start_epoch needs part_input_counts (every part's local_input_nodes, "
                             f"{self.num_parts} values) to plan the epoch")
        counts = [int(c) for c in counts]
        if len(counts) != self.num_parts:
            raise BadRequest(f"part_input_counts has {len(counts)} values, the graph has {self.num_parts} parts")
        if counts[self.part_id] != own or min(counts) < 0:
            raise BadRequest(f"part_input_counts {counts} disagree with this part: part {self.part_id} has {own} "
                             f"input nodes for session {self.session_id}")
        return counts

    def _produce(self, run: EpochRun) -> None:
        while run.buffer.reserve():
            item = run.claim()
            if item is None:
                run.buffer.unreserve()
                return
            seq, entry = item
            tel = self.telemetry
            try:
                seeds = EpochPlan.batch_seeds(run.orders, entry)
                with tel.stage("batch"), timed_batch():
                    if self._link_seeds is not None:
                        batch = produce_link_batch(self.graph, self._link_seeds, seeds, self.spec.sampling, entry,
                                                   run.epoch, seq, feature_dtype=self.spec.feature_torch_dtype,
                                                   stage=tel.stage)
                    else:
                        input_id = EpochPlan.batch_seeds(run.position_orders, entry)
                        sampling = self.spec.sampling
                        batch = produce_batch(self.graph, seeds, sampling, entry, run.epoch, seq,
                                              input_type=self.input_type, input_id=input_id, stage=tel.stage,
                                              feature_dtype=self.spec.feature_torch_dtype,
                                              seed_time=node_seed_time(self.graph, self.spec.input, sampling,
                                                                       self.input_type, seeds, input_id),
                                              node_extra=self._embedding_rows if self.embedding_tables else None)
                self._check_bytes(batch)
            except BaseException as exc:  # noqa: BLE001 -- every failure must reach the trainer's pull
                tel.count_error("produce")
                run.buffer.close(RuntimeError(f"producing batch {seq} (epoch {run.epoch}) on part {self.part_id} "
                                              f"failed: {type(exc).__name__}: {exc}"))
                return
            run.buffer.put(seq, drop_cached_rows(batch, self.spec.feature_cache))

    def attach_embeddings(self, store, tables: dict[str, str]) -> None:
        """Batches produced from now on carry, per node type, the rows of table ``tables[type]`` of ``store``
        (an :class:`~graphfeed.server.embedding.EmbeddingStore`); an empty mapping stops it."""
        if self.spec.is_link and tables:
            raise ValueError("embedding tables ride node loaders' batches so far, not link loaders'")
        self.embeddings, self.embedding_tables = store, dict(tables)

    def _embedding_rows(self, ntype: str, gids: torch.Tensor) -> dict[str, torch.Tensor]:
        name = self.embedding_tables.get(ntype)
        if name is None or self.embeddings is None:
            return {}
        gids = gids.cpu()
        dtype = rows_dtype(self.embeddings.table(name).spec, self.spec.feature_torch_dtype)
        return {"emb": self.embeddings.rows(name, gids, dtype), "emb_gid": gids}

    def _check_bytes(self, batch: dict[str, torch.Tensor]) -> None:
        """A batch over the worker's ``max_batch_bytes`` is not buffered (BudgetExceeded names the setting)."""
        budget = getattr(self.graph, "budget", None)
        if budget is not None:
            budget.check_bytes(batch_codec.nbytes(batch))

    def sample(self, node_ids, seed: int) -> dict[str, torch.Tensor]:
        """One online batch (wire form) for original ids ``node_ids`` with this session's sampling options
        and feature dtype, outside any epoch (:func:`sample_nodes`); ValueError for bad ids (and for a
        sample over the worker's work caps)."""
        self.last_used = time.monotonic()
        with self.telemetry.stage("batch"), timed_batch():
            batch = sample_nodes(self.graph, node_ids, self.spec.sampling, seed, stage=self.telemetry.stage,
                                 feature_dtype=self.spec.feature_torch_dtype)
        self._check_bytes(batch)
        return batch

    def sample_seeds(self, seeds: NodeInput | LinkInput, positions: torch.Tensor, batch_seed: int
                     ) -> dict[str, torch.Tensor]:
        """One batch (wire form) for a seed record at input ``positions`` with batch seed ``batch_seed`` and
        this session's sampling options and feature dtype (:func:`produce_for_seeds`); ValueError for bad
        seeds (and for a sample over the worker's work caps)."""
        self.last_used = time.monotonic()
        with self.telemetry.stage("batch"), timed_batch():
            batch = produce_for_seeds(self.graph, seeds, positions, self.spec.sampling, batch_seed,
                                      stage=self.telemetry.stage, feature_dtype=self.spec.feature_torch_dtype)
        self._check_bytes(batch)
        return batch

    def pull(self, epoch: int, seq: int) -> Pending:
        self.last_used = time.monotonic()
        run = self.run
        if run is None or epoch != run.epoch:
            now = "no epoch started" if run is None else f"the current epoch is {run.epoch}"
            raise ValueError(f"session {self.session_id}: epoch {epoch} is not being served ({now}); "
                             f"call StartEpoch first")
        if seq not in run.seqs:
            raise ValueError(f"session {self.session_id}: batch {seq} of epoch {epoch} is not produced by "
                             f"part {self.part_id} for rank {self.spec.rank}")
        return run.buffer.take(seq)

    def close(self) -> None:
        with self._lock:
            old, self.run = self.run, None
        if old is not None:
            self._retire(old, EpochSuperseded(f"session {self.session_id} was closed"))

    def _retire(self, run: EpochRun, error: BaseException) -> None:
        run.buffer.close(error)
        s = run.buffer.stats
        self.totals["produced"] += s.produced
        self.totals["served"] += s.served
        self.totals["bytes_served"] += s.bytes_served

    def stats(self, group_id: str = "") -> SessionRow:
        run = self.run
        s = run.buffer.stats if run is not None else None
        counts = ServedCounts(
            batches_produced=self.totals["produced"] + (s.produced if s else 0),
            batches_served=self.totals["served"] + (s.served if s else 0),
            bytes_served=self.totals["bytes_served"] + (s.bytes_served if s else 0),
            buffered_batches=s.buffered_batches if s else 0,
            buffered_bytes=s.buffered_bytes if s else 0)
        return SessionRow(self.session_id, group_id, self.spec.kind, run.epoch if run is not None else -1, counts,
                          idle_seconds=time.monotonic() - self.last_used)

