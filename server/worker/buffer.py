"""Finished batches of one epoch waiting for the trainer's pulls.

Bounded in batches *and* bytes: a producer reserves a slot before it starts a batch
(:meth:`BatchBuffer.reserve`) and the slot is freed when the trainer takes the batch.
Producers claim sequence numbers in order after reserving, so the lowest missing batch
is always being produced and a trainer pulling in order can never deadlock the buffer.

A pull is a :class:`graphfeed.transport.pending.Pending` completed when its batch is put
(or at once if it is already there): no polling, no thread parked per request.  Errors go
into the pending pulls, never into a log only.  The transport adapts it at its edge (torch
RPC: ``graphfeed.server.worker.rpc_api.pull``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from graphfeed.core import batch as batch_codec
from graphfeed.transport.pending import Pending


@dataclass
class BufferStats:
    produced: int = 0
    served: int = 0
    bytes_served: int = 0
    buffered_batches: int = 0
    buffered_bytes: int = 0


class BatchBuffer:
    """Batches keyed by sequence number; ``max_batches`` >= 1 slots and ``max_bytes`` soft cap.

    The byte cap is soft by one batch: a producer may start when the buffer is below the
    cap (or empty), so a single batch larger than the cap still flows.
    """

    def __init__(self, max_batches: int, max_bytes: int):
        if max_batches < 1 or max_bytes < 1:
            raise ValueError(f"buffer bounds must be positive, got {max_batches} batches, {max_bytes} bytes")
        self.max_batches, self.max_bytes = int(max_batches), int(max_bytes)
        self._cond = threading.Condition()
        self._ready: dict[int, dict[str, torch.Tensor]] = {}
        self._sizes: dict[int, int] = {}
        self._waiting: dict[int, Pending] = {}
        self._taken: set[int] = set()
        self._reserved = 0
        self._error: BaseException | None = None
        self.stats = BufferStats()

    # ---- producer side --------------------------------------------------------------------------

    def reserve(self, timeout: float | None = None) -> bool:
        """Wait for room for one more batch; False if the buffer was closed (or on timeout)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._error is not None or self._has_room(), timeout)
            if not ok or self._error is not None:
                return False
            self._reserved += 1
            return True

    def _has_room(self) -> bool:
        return self._reserved < self.max_batches and (self.stats.buffered_bytes < self.max_bytes or not self._ready)

    def unreserve(self) -> None:
        """Give back a slot reserved for a batch that will not be produced."""
        with self._cond:
            self._reserved -= 1
            self._cond.notify_all()

    def put(self, seq: int, batch: dict[str, torch.Tensor]) -> None:
        """Store batch ``seq`` (its slot was reserved) or hand it to the pull waiting for it."""
        size = batch_codec.nbytes(batch)
        with self._cond:
            self.stats.produced += 1
            if self._error is not None:
                self._reserved -= 1
                return
            pending = self._waiting.pop(seq, None)
            if pending is None:
                self._ready[seq] = batch
                self._sizes[seq] = size
                self.stats.buffered_batches += 1
                self.stats.buffered_bytes += size
                return
            self._served(seq, size)
        pending.set_result(batch)  # outside the lock: the transport serializes and sends in this call

    def _served(self, seq: int, size: int) -> None:
        self._taken.add(seq)
        self._reserved -= 1
        self.stats.served += 1
        self.stats.bytes_served += size
        self._cond.notify_all()

    # ---- trainer side ---------------------------------------------------------------------------

    def take(self, seq: int) -> Pending:
        """Batch ``seq``, pending until it is put; ValueError if it was already taken or is already awaited."""
        pending = Pending()
        with self._cond:
            if seq in self._taken or seq in self._waiting:
                raise ValueError(f"batch {seq} was already requested; each batch of an epoch is served once")
            if self._error is not None:
                error = self._error
            elif seq in self._ready:
                batch, size = self._ready.pop(seq), self._sizes.pop(seq)
                self.stats.buffered_batches -= 1
                self.stats.buffered_bytes -= size
                self._served(seq, size)
                error = None
            else:
                self._waiting[seq] = pending
                return pending
        if error is not None:
            pending.set_exception(error)
        else:
            pending.set_result(batch)
        return pending

    # ---- teardown / failure ---------------------------------------------------------------------

    def close(self, error: BaseException) -> None:
        """Fail every waiting and future pull with ``error``, drop stored batches, release producers."""
        with self._cond:
            if self._error is None:
                self._error = error
            waiting, self._waiting = self._waiting, {}
            self._ready.clear()
            self._sizes.clear()
            self.stats.buffered_batches = self.stats.buffered_bytes = 0
            self._cond.notify_all()
        for pending in waiting.values():
            pending.set_exception(error)

    @property
    def closed(self) -> bool:
        return self._error is not None
