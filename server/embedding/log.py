"""The update log of one part of one embedding table: every applied push, durable before it is acknowledged.

An owner appends each push it applies (the coalesced ids, their summed float32 gradient rows, the update rule
and the table's push sequence number) as one record, and syncs the file once per push call (a group commit:
one ``fsync`` for the whole step, whatever its rows).  A restarted owner restores the checkpoint the log
continues and applies the records after the checkpoint's sequence number (:meth:`PartTable.replay`), the same
arithmetic on the same inputs, so the rows and optimizer state come back bit for bit.

File: ``MAGIC`` then records, each ``<length u32><crc32 u32><payload>``.  A record cut short by a
``kill -9`` during its write (a length past the end, a checksum that fails on the last record) is a torn
tail: it was never acknowledged, so it is dropped and the file cut back to the last whole record.  A bad
record with whole records after it is damage, not a torn write: a ValueError naming the file.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from graphfeed.core.embedding import RULES, SparseUpdate

MAGIC = b"GFEMBLOG1\n"
_FRAME = struct.Struct("<II")           # payload length, crc32 of the payload
_FIXED = struct.Struct("<QBddddQI")      # seq, rule, lr, beta1, beta2, eps, rows, dim


@dataclass(frozen=True)
class LogRecord:
    """One applied push: the table's push number ``seq`` (1 after the initial rows), distinct ascending global
    ``ids``, their summed float32 gradient ``grads`` ([n, dim]) and the ``update`` applied."""

    seq: int
    ids: torch.Tensor
    grads: torch.Tensor
    update: SparseUpdate

    def pieces(self) -> list[bytes | memoryview]:
        """The payload as buffers (the tensors' memory, not copies)."""
        u = self.update
        ids = np.ascontiguousarray(self.ids.numpy(), dtype="<i8")
        grads = np.ascontiguousarray(self.grads.numpy(), dtype="<f4")
        fixed = _FIXED.pack(self.seq, RULES.index(u.rule), float(u.lr), u.betas[0], u.betas[1], float(u.eps),
                            ids.size, grads.shape[1] if grads.ndim == 2 else 0)
        return [fixed, ids.data.cast("B"), grads.data.cast("B")]

    @classmethod
    def parse(cls, payload: bytes) -> LogRecord:
        seq, rule, lr, b1, b2, eps, n, dim = _FIXED.unpack_from(payload)
        at = _FIXED.size
        ids = torch.from_numpy(np.frombuffer(payload, dtype="<i8", count=n, offset=at).astype(np.int64))
        grads = np.frombuffer(payload, dtype="<f4", count=n * dim, offset=at + 8 * n).astype(np.float32)
        update = SparseUpdate(RULES[rule], lr, (b1, b2), eps)
        return cls(seq, ids, torch.from_numpy(grads.reshape(n, dim)), update)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UpdateLog:
    """An open log, appended to by one owner (:meth:`start` a new one, :meth:`resume` one to continue)."""

    def __init__(self, path: Path, fd: int, size: int):
        self.path, self.fd, self.size = path, fd, size

    @classmethod
    def start(cls, path: Path) -> UpdateLog:
        """A new empty log at ``path``, replacing any there atomically (a crash leaves the old or the new)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return cls(path, os.open(path, os.O_WRONLY | os.O_APPEND), len(MAGIC))

    @classmethod
    def resume(cls, path: Path, size: int) -> UpdateLog:
        """Continue the log at ``path`` after its last whole record at byte ``size`` (a torn tail cut off)."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
            os.fsync(fd)
        return cls(path, fd, size)

    def append(self, record: LogRecord) -> None:
        """Write ``record`` (not yet synced: :meth:`sync`).  OSError (a full disk) leaves the file as it was."""
        pieces = record.pieces()
        crc, length = 0, 0
        for p in pieces:
            crc, length = zlib.crc32(p, crc), length + len(p)
        try:
            _write_all(self.fd, [_FRAME.pack(length, crc), *pieces])
        except OSError:
            os.ftruncate(self.fd, self.size)   # no half record for the next append to follow
            raise
        self.size += _FRAME.size + length

    def sync(self) -> None:
        """Make every appended record durable (one ``fsync`` for all appended since the last)."""
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _write_all(fd: int, pieces: list) -> None:
    views = [memoryview(p).cast("B") for p in pieces]
    while views:
        done = os.writev(fd, views)
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if views and done:
            views[0] = views[0][done:]


class LogReader:
    """The whole records of the log at ``path``, in order; after iterating, ``size`` is the byte offset after
    the last whole one and ``torn`` whether a torn tail followed it.  ValueError for a file that is not a
    log or one with a bad record that is not the last (damage: acknowledged pushes would be lost)."""

    def __init__(self, path: Path):
        self.path, self.size, self.torn = path, 0, False

    def __iter__(self) -> Iterator[LogRecord]:
        with open(self.path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise ValueError(f"{self.path} is not an embedding update log (it does not start with {MAGIC!r})")
            end = os.fstat(f.fileno()).st_size
            self.size = len(MAGIC)
            while self.size < end:
                payload = self._next(f, end)
                if payload is None:
                    self.torn = True
                    return
                self.size += _FRAME.size + len(payload)
                yield LogRecord.parse(payload)

    def _next(self, f, end: int) -> bytes | None:
        """The next record's payload; None for a torn tail."""
        head = f.read(_FRAME.size)
        if len(head) < _FRAME.size:
            return None
        length, crc = _FRAME.unpack(head)
        stop = self.size + _FRAME.size + length
        if stop > end:
            return None
        payload = f.read(length)
        if zlib.crc32(payload) == crc and len(payload) >= _FIXED.size:
            return payload
        if stop < end:
            raise ValueError(f"embedding update log {self.path}: the record at byte {self.size} fails its checksum "
                             f"and {end - stop} bytes follow it: the file is damaged (not a torn last write); "
                             f"load an earlier checkpoint")
        return None
