"""A trainer group's embedding tables on one server, and every part's rows of a table in one process.

:class:`EmbeddingStore` lives in the group's session worker (the process that already holds the group's
sessions and data path): tables made by this group only -- another job's table of the same name is in its
own worker -- freed with the group or by ``close``, kept by name on disk (``embedding_dir``) when saved.
Rows of nodes another part owns are read from that part's worker of the same group (``emb_rows``), the
way peer features are.  :class:`LocalEmbedding` is the same table for the in-process loader.

Durable pushes: with ``embedding_dir`` set (and ``embedding_log`` on), every push a table applies is in its
update log (:mod:`.log`) before it is acknowledged.  A log belongs to one replica of a table (the trainer's
table object: each DDP rank's is its own) and continues one base -- the table's initial rows
(``<dir>/<table>/.initial/``) or the checkpoint last saved or loaded (``<dir>/<table>/<tag>/``) -- as
``part_<K>.<replica>.log`` beside that base's ``part_<K>.pt``.  A save or a load starts a new log for its
tag; the log before is kept one switch longer (a save that failed on another part leaves the trainer
restoring the previous tag) and older ones are deleted.  After a restart the trainer makes the table again
(its replica restores the ``.initial`` log, if any) and loads its last tag: that first load of a new
worker's table, before any push, replays the replica's log of the tag and continues it -- a restore;
every later load is the trainer going back to a checkpoint, and starts a new log.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from graphfeed.core.embedding import EmbeddingSpec, HandOut, SparseUpdate, check_name, check_rows_dtype
from graphfeed.server.embedding.log import LogReader, UpdateLog
from graphfeed.server.embedding.table import PartTable
from graphfeed.server.partition.format.book import RangePartitionBook
from graphfeed.server.partition.format.layout import of_node_type

#: ``call(part, function name, args)`` -> a pending answer with ``result(timeout)`` (the worker's DataCalls)
PeerCall = Callable[[int, str, tuple], Any]
#: the log base of a table not yet saved or loaded: its initial rows (not a tag: tags do not start with '.')
INITIAL = ".initial"
log = logging.getLogger("graphfeed.embedding")


class EmbeddingStore:
    """The tables of part ``part_id`` for one trainer group.

    ``books``: node type -> its :class:`RangePartitionBook`; ``peer``: how to reach the group's other workers;
    ``save_dir``: where tables are saved by name ("" = saving refused); ``budget_bytes``: what all tables of
    the group may hold here, rows and optimizer state (0 = no limit); ``log_updates``: keep an update log of
    each table whose trainer names a replica (needs ``save_dir``)."""

    def __init__(self, part_id: int, books: Mapping[str, RangePartitionBook], peer: PeerCall | None = None, *,
                 timeout: float = 60.0, save_dir: str = "", budget_bytes: int = 0, log_updates: bool = True):
        self.part_id, self.books, self.peer, self.timeout = part_id, dict(books), peer, float(timeout)
        self.save_dir, self.budget_bytes, self.log_updates = save_dir, int(budget_bytes), bool(log_updates)
        self.tables: dict[str, PartTable] = {}
        self.replicas: dict[str, str] = {}   # table -> the replica whose log it keeps
        self.fresh: set[str] = set()         # tables made here, not yet pushed to or loaded
        self.lock = threading.Lock()

    def create(self, spec: EmbeddingSpec, replica: str = "") -> tuple[int, int, bool, int]:
        """Make this part's rows of ``spec`` (nothing when the same table exists: a retry); ``(start, stop)`` of
        the ids it owns, whether it made them and the table's push sequence number (after a replayed log: the
        pushes it holds).  ``replica`` (a name; "" = no log) names the trainer's table
        whose update log this table keeps: a log of it at the initial rows (a restarted owner) is replayed.
        ValueError for an unknown node type, a table of that name with another spec, or a table over the
        budget (one line naming the part, the limit, ``embedding_bytes`` and the fixes)."""
        book = self._book(spec.ntype)
        start, stop = book.range(self.part_id)
        if replica:
            check_name(replica, "table replica id")
        with self.lock:
            have = self.tables.get(spec.name)
            if have is not None:
                if have.spec != spec:
                    raise ValueError(f"embedding table {spec.name!r} already exists in this job with another spec "
                                     f"({have.spec}); close it first or pick another name")
                return start, stop, False, have.seq
            self._check_budget(spec, stop - start)
            table = self.tables[spec.name] = PartTable(spec, self.part_id, start, stop)
            self.replicas[spec.name] = replica
            self.fresh.add(spec.name)
        if self._logged(spec.name):
            with table.writes:
                self._continue_log(table, INITIAL)
        return start, stop, True, table.seq

    # ---- update logs -----------------------------------------------------------------------------

    def _logged(self, name: str) -> bool:
        return self.log_updates and bool(self.save_dir) and bool(self.replicas.get(name))

    def _log_path(self, name: str, base: str) -> Path:
        return Path(self.save_dir) / name / base / f"part_{self.part_id}.{self.replicas[name]}.log"

    def _continue_log(self, table: PartTable, base: str) -> None:
        """Replay this replica's log of ``base`` into ``table`` (at that base) and append to it from now on; a
        new log when there is none.  The log before is kept (see the module docstring)."""
        path = self._log_path(table.spec.name, base)
        if not path.is_file():   # nothing to restore; the replica's other logs stay (a restore deletes nothing)
            self._set_log(table, UpdateLog.start(path), prune=False)
            return
        reader = LogReader(path)
        replayed = table.replay(reader)
        if reader.torn:
            log.warning("embedding table %r part %d: dropped the torn last record of %s (a push cut short by a crash, "
                        "never acknowledged)", table.spec.name, self.part_id, path)
        log.info("embedding table %r part %d: replayed %d pushes of %s", table.spec.name, self.part_id, replayed,
                 path)
        self._set_log(table, UpdateLog.resume(path, reader.size), prune=False)

    def _switch_log(self, table: PartTable, base: str) -> None:
        """A new empty log continuing ``table`` as it is now (just saved as or loaded from ``base``)."""
        self._set_log(table, UpdateLog.start(self._log_path(table.spec.name, base)), prune=True)

    def _set_log(self, table: PartTable, new: UpdateLog, prune: bool) -> None:
        """Make ``new`` the table's log; the one before is closed and kept, and with ``prune`` (a save or a load
        going back) the replica's older ones are deleted."""
        old, table.log = table.log, new
        keep = {new.path} | ({old.path} if old is not None else set())
        if old is not None:
            old.close()
        for path in self._replica_logs(table.spec.name) if prune else ():
            if path not in keep:
                path.unlink(missing_ok=True)

    def _replica_logs(self, name: str) -> list[Path]:
        return sorted((Path(self.save_dir) / name).glob(f"*/part_{self.part_id}.{self.replicas[name]}.log"))

    def _book(self, ntype: str) -> RangePartitionBook:
        return of_node_type(self.books, ntype)

    def _check_budget(self, spec: EmbeddingSpec, rows: int) -> None:
        need = spec.nbytes(rows)
        held = sum(t.spec.nbytes(t.num_rows) for t in self.tables.values())
        if self.budget_bytes and held + need > self.budget_bytes:
            raise ValueError(f"embedding table {spec.name!r} needs {_mib(need)} on part {self.part_id} ({rows:,} rows "
                             f"x {spec.dim} {spec.dtype} with Adam state), the job's tables already hold "
                             f"{_mib(held)} of the server's embedding budget {_mib(self.budget_bytes)} "
                             f"(embedding_bytes): raise embedding_bytes, use a smaller dim or dtype, or more parts")

    def table(self, name: str) -> PartTable:
        table = self.tables.get(name)
        if table is None:
            have = ", ".join(map(repr, sorted(self.tables))) or "none"
            raise LookupError(f"no embedding table {name!r} in this job on part {self.part_id} (tables: {have}); "
                              f"create it with client.embedding(...)")
        return table

    def close(self, name: str) -> bool:
        """Free the table and delete its replica's update logs (its saved checkpoints stay); whether it existed."""
        with self.lock:
            table = self.tables.pop(name, None)
            self.fresh.discard(name)
        if table is None:
            return False
        with table.writes:
            if table.log is not None:
                table.log.remove()
                table.log = None
                for path in self._replica_logs(name):
                    path.unlink(missing_ok=True)
        self.replicas.pop(name, None)
        return True

    def rows(self, name: str, gids: torch.Tensor, dtype: str | None = None) -> torch.Tensor:
        """Rows of any ``gids`` of the table's type, in ``dtype`` (a table dtype name; None: the table's): this
        part's read here, the others' asked of their workers (all at once, in ``dtype``: narrow rows travel
        narrow).  LookupError for an unknown table; ValueError for ids outside the graph or a bad dtype."""
        table = self.table(name)
        gids = table.spec.checked_ids(gids, self._book(table.spec.ntype).num_nodes)
        want = check_rows_dtype(dtype) or table.spec.torch_dtype
        out = torch.empty(gids.numel(), table.spec.dim, dtype=want)
        asked = []
        extra = () if dtype is None else (dtype,)
        for part, pos in self._book(table.spec.ntype).split(gids):
            if part == self.part_id:
                out[pos] = table.read(gids[pos]).to(want)
            elif self.peer is None:
                raise RuntimeError(f"embedding rows of part {part} are not reachable from part {self.part_id}")
            else:
                asked.append((pos, self.peer(part, "emb_rows", (name, gids[pos], *extra))))
        for pos, pending in asked:
            out[pos] = torch.as_tensor(pending.result(self.timeout)).to(out.dtype)
        return out

    def push(self, name: str, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate,
             number: int | None = None) -> int:
        """Apply one step's gradients of rows owned here, in the update log first when the table keeps one (one
        sync per call); how many rows changed (0 for a push ``number`` applied already: :meth:`PartTable.apply`)."""
        table = self.table(name)
        self.fresh.discard(name)
        return table.apply(torch.as_tensor(gids, dtype=torch.int64).reshape(-1), grads, update, number)

    def save(self, name: str, tag: str) -> str:
        """Write this part's rows and state of table ``name`` as checkpoint ``tag`` (durable on return), and
        start its new update log there; the checkpoint's path.  Pushes wait meanwhile, reads do not."""
        table = self.table(name)
        with table.writes:
            path = table.save(self._folder(), tag)
            if self._logged(name):
                self._switch_log(table, tag)
        self.fresh.discard(name)
        return str(path)

    def load(self, name: str, tag: str) -> int:
        """Replace the live table's rows and state with checkpoint ``tag`` (FileNotFoundError naming the file);
        the table's push sequence number after it.  A table's first load after it was made here, before any push,
        is a restore: it replays the replica's log of ``tag``; any other load starts a new log."""
        table = self.table(name)
        loaded = PartTable.load(self._folder(), name, tag, self.part_id, table.spec, table.start, table.stop)
        with table.writes:
            table.replace_with(loaded)
            if self._logged(name):
                (self._continue_log if name in self.fresh else self._switch_log)(table, tag)
        self.fresh.discard(name)
        return table.seq

    def _folder(self) -> Path:
        if not self.save_dir:
            raise ValueError("this server keeps no embedding checkpoints: set embedding_dir in its config (or "
                             "GRAPHFEED_EMBEDDING_DIR) to a folder it may write")
        return Path(self.save_dir)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per table: rows, bytes (rows + state), pushes applied, rows applied, seconds applying."""
        return {name: {"rows": t.num_rows, "bytes": t.nbytes, "pushes": t.pushes, "rows_applied": t.rows_applied,
                       "push_seconds": t.push_seconds} for name, t in list(self.tables.items())}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


class LocalEmbedding:
    """Every part's rows of table ``spec`` in this process (the local loader's tables): the same rows, updates
    and checkpoints as the servers' (``save``/``load`` write one file per part under ``folder``), and what a
    sparse optimizer needs (:class:`graphfeed.core.embedding.EmbeddingTable`).  ``field``: the batch attribute
    the rows appear as (``"emb"``; ``"x"`` for a featureless type suits ``to_hetero`` models)."""

    def __init__(self, spec: EmbeddingSpec, book: RangePartitionBook, *, field: str = "emb"):
        self.spec, self.field = spec, field
        self.book = book
        self.parts = [PartTable(spec, p, *book.range(p)) for p in range(book.num_parts)]
        self.handed = HandOut(spec)

    def rows(self, gids: torch.Tensor, dtype: str | None = None) -> torch.Tensor:
        """Copies of the rows of global ids ``gids`` ([n, dim]) in ``dtype`` (None: the table's); ValueError for
        ids outside the type."""
        gids = self.spec.checked_ids(gids, self.book.num_nodes)
        out = torch.empty(gids.numel(), self.spec.dim, dtype=check_rows_dtype(dtype) or self.spec.torch_dtype)
        for part, pos in self.book.split(gids):
            out[pos] = self.parts[part].read(gids[pos]).to(out.dtype)
        return out

    def take_grads(self):
        return self.handed.take()

    def push(self, gids: torch.Tensor, grads: torch.Tensor, update: SparseUpdate) -> None:
        for part, pos in self.book.split(gids):
            self.parts[part].apply(gids[pos], grads[pos], update)

    def save(self, folder, tag: str) -> None:
        for t in self.parts:
            t.save(Path(folder), tag)

    def load(self, folder, tag: str) -> None:
        for t in self.parts:
            t.replace_with(PartTable.load(Path(folder), self.spec.name, tag, t.part_id, self.spec, t.start, t.stop))
