"""The rows of one embedding table that one part owns, their optimizer state, and their files.

A part owns a contiguous range of global ids of each node type (:class:`RangePartitionBook`), so a row's
place is ``gid - start``.  Reads copy rows under the table's lock and updates replace them under it, so a
batch never carries a half-applied step.  A checkpoint is one file per part and tag
(``<dir>/<table>/<tag>/part_<K>.pt``: rows, state, spec, range and push number), written by each owner itself,
in parallel, synced before it replaces the previous one, and read back with ``torch.load(weights_only=True)``
(tensors and plain values only).  A table given an :class:`~.log.UpdateLog` appends every push to it before
acknowledging it; ``seq`` numbers the pushes, so a checkpoint and the log that continues it
(:meth:`PartTable.replay`) give back the table as it was.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import torch

from graphfeed.core.embedding import EmbeddingSpec, SparseUpdate, apply_update, check_name, coalesce
from graphfeed.server.embedding.log import LogRecord, UpdateLog, fsync_dir

FORMAT_VERSION = 1


class PartTable:
    """Rows ``start .. stop - 1`` (global ids of ``spec.ntype``) of table ``spec``, made by
    :meth:`EmbeddingSpec.initial_rows` unless ``rows`` are given."""

    def __init__(self, spec: EmbeddingSpec, part_id: int, start: int, stop: int, rows: torch.Tensor | None = None,
                 state: dict[str, torch.Tensor] | None = None, seq: int = 0):
        self.spec, self.part_id, self.start, self.stop = spec, int(part_id), int(start), int(stop)
        self.rows = rows if rows is not None else spec.initial_rows(self.start, self.stop - self.start)
        self.state: dict[str, torch.Tensor] = dict(state or {})
        self.seq = int(seq)      # pushes applied since the initial rows (a checkpoint keeps it)
        self.duplicates = 0      # pushes acknowledged without applying them again (numbered at or below seq)
        self.lock = threading.Lock()     # the rows and state: reads and the mutation of a push
        self.writes = threading.Lock()   # pushes and checkpoints, one at a time (reads go on meanwhile)
        self.log: UpdateLog | None = None
        self.pushes = 0          # updates applied (one per push that carried rows of this part)
        self.rows_applied = 0    # distinct rows updated, over all pushes
        self.push_seconds = 0.0  # time spent applying them

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size() + sum(t.numel() * t.element_size()
                                                                   for t in self.state.values())

    def local(self, gids: torch.Tensor) -> torch.Tensor:
        """Row positions of ``gids``; ValueError naming an id this part does not own."""
        gids = torch.as_tensor(gids, dtype=torch.int64).reshape(-1)
        outside = (gids < self.start) | (gids >= self.stop)
        if bool(outside.any()):
            bad = int(gids[outside][0])
            raise ValueError(f"embedding table {self.spec.name!r}: {self.spec.ntype!r} node {bad} is not owned by "
                             f"part {self.part_id} (its ids are {self.start}..{self.stop - 1})")
        return gids - self.start

    def read(self, gids: torch.Tensor) -> torch.Tensor:
        """Copies of the rows of ``gids`` (owned here), [n, dim]."""
        local = self.local(gids)
        with self.lock:
            return self.rows.index_select(0, local)

    def apply(self, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate, number: int | None = None) -> int:
        """Apply one step: duplicate ids' gradient rows summed, then ``update`` per distinct row; returns how
        many rows changed.  ValueError for ids not owned here or gradients of the wrong shape.

        ``number``: the push's number in this table's sequence, as its trainer counts (the ``seq`` it had when
        the trainer last heard, plus one per push since).  A push numbered at or below ``seq`` was applied
        already -- it reached this owner (and its update log) but its answer was lost with a re-formed group --
        and is acknowledged without applying it again (0 rows)."""
        grads = torch.as_tensor(grads)
        if grads.dim() != 2 or grads.size(0) != gids.numel() or grads.size(1) != self.spec.dim:
            raise ValueError(f"embedding table {self.spec.name!r}: gradients of shape {list(grads.shape)} for "
                             f"{gids.numel()} ids; expected [{gids.numel()}, {self.spec.dim}]")
        ids, summed = coalesce(gids, grads)
        local = self.local(ids)
        began = time.perf_counter()
        with self.writes:
            if number is not None and number <= self.seq:
                self.duplicates += 1
                return 0
            with self.lock:
                if self.log is not None:
                    self._append(LogRecord(self.seq + 1, ids, summed, update))
                apply_update(self.rows, self.state, local, summed, update)
                self.seq += 1
            if self.log is not None:
                self.log.sync()   # the group commit: one fsync per push, before the answer leaves
            self.pushes += 1
            self.rows_applied += int(local.numel())
            self.push_seconds += time.perf_counter() - began
        return int(local.numel())

    def _append(self, record: LogRecord) -> None:
        """Log ``record``; RuntimeError naming the file and the fixes when it cannot be written (nothing of the
        push is applied or acknowledged then)."""
        assert self.log is not None
        try:
            self.log.append(record)
        except OSError as exc:
            raise RuntimeError(f"embedding table {self.spec.name!r} part {self.part_id}: cannot write its update log "
                               f"{self.log.path} ({exc}); the push was not applied: free space under embedding_dir, "
                               f"or set embedding_log: false to train without one") from exc

    def replay(self, records) -> int:
        """Apply the logged pushes after this table's ``seq`` (a restored checkpoint's): the arithmetic of
        :meth:`apply` on the same inputs, so rows and state come back bit for bit; how many were applied.
        ValueError when the records skip a push."""
        done = 0
        for rec in records:
            if rec.seq <= self.seq:
                continue   # already in the checkpoint
            if rec.seq != self.seq + 1:
                raise ValueError(f"embedding table {self.spec.name!r} part {self.part_id}: the update log jumps "
                                 f"from push {self.seq} to push {rec.seq}; it does not continue this checkpoint")
            with self.lock:
                apply_update(self.rows, self.state, self.local(rec.ids), rec.grads, rec.update)
                self.seq = rec.seq
            done += 1
        return done

    # ---- checkpoints ---------------------------------------------------------------------------

    def save(self, folder: Path, tag: str) -> Path:
        """Write rows, state and ``seq`` to ``folder/<name>/<tag>/part_<K>.pt`` (atomically and synced: a crash
        leaves the previous file, a return means the new one is durable); returns the path."""
        check_name(tag, "checkpoint tag")
        path = folder / self.spec.name / tag / f"part_{self.part_id}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            payload = {"format_version": FORMAT_VERSION, "spec": dataclasses.asdict(self.spec),
                       "start": self.start, "stop": self.stop, "rows": self.rows.clone(),
                       "state": {k: v.clone() for k, v in self.state.items()}, "seq": self.seq}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(payload, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return path

    @classmethod
    def load(cls, folder: Path, name: str, tag: str, part_id: int, spec: EmbeddingSpec | None = None,
             start: int | None = None, stop: int | None = None) -> PartTable:
        """The table saved as ``tag``; FileNotFoundError naming the path when there is none, ValueError when it
        is of another spec (``spec``) or part range (``start``/``stop``) than expected."""
        check_name(name)
        check_name(tag, "checkpoint tag")
        path = folder / name / tag / f"part_{part_id}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"embedding table {name!r} has no checkpoint {tag!r} for part {part_id} "
                                    f"({path} does not exist): save it first (table.save({tag!r}))")
        payload = torch.load(path, weights_only=True)
        if payload.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path} is embedding checkpoint format {payload.get('format_version')}, this "
                             f"graphfeed reads {FORMAT_VERSION}")
        saved = EmbeddingSpec(**payload["spec"])
        if spec is not None and (saved.ntype, saved.dim, saved.dtype) != (spec.ntype, spec.dim, spec.dtype):
            raise ValueError(f"embedding checkpoint {path} holds {saved.ntype!r} rows of dim {saved.dim} "
                             f"({saved.dtype}), the table asks for {spec.ntype!r}, dim {spec.dim} ({spec.dtype})")
        if start is not None and stop is not None and (payload["start"], payload["stop"]) != (start, stop):
            raise ValueError(f"embedding checkpoint {path} holds ids {payload['start']}..{payload['stop'] - 1}, "
                             f"part {part_id} owns {start}..{stop - 1}: it was saved from another partitioning")
        return cls(spec or saved, part_id, payload["start"], payload["stop"], payload["rows"], payload["state"],
                   int(payload.get("seq", 0)))

    def replace_with(self, other: PartTable) -> None:
        """Take ``other``'s rows, state and push number (a checkpoint loaded into a live table)."""
        with self.lock:
            self.rows, self.state, self.seq = other.rows, dict(other.state), other.seq
