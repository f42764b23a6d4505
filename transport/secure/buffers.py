"""The memory a secure connection receives frame bodies into (:class:`ReceiveBuffers`)."""
from __future__ import annotations

import sys

import numpy as np
import torch

POOLED_BODY = 1 << 20         # bodies of at least this many bytes are received into reused buffers
POOL_BUFFERS = 6              # reused receive buffers per connection (about the batches in flight and in use)
POOL_HEADROOM = 1 / 16        # a pooled buffer's spare room beyond the body it was made for (batches vary by ~1%)


class ReceiveBuffers:
    """The memory a connection receives frame bodies into: a large body (:data:`POOLED_BODY` bytes or more)
    goes into a buffer of an earlier frame once no tensor decoded from that frame is alive, so its pages are
    not faulted in (and zeroed by the kernel) again for every batch.

    A buffer is a numpy array; the tensors viewing it share one storage, which holds one reference to the
    array until the last of them is freed -- the array's reference count says whether it is in use.  At most
    ``keep`` buffers are kept; a body that finds none free (or none of a fitting size) gets fresh memory, with
    :data:`POOL_HEADROOM` to spare, so the next batches -- a little larger or smaller each -- fit in it.
    """

    def __init__(self, keep: int = POOL_BUFFERS):
        self.keep = keep
        self._owned: list[np.ndarray] = []
        self.reused = 0

    def take(self, n: int) -> torch.Tensor:
        """An uninitialised uint8 tensor of ``n`` bytes (one reader thread calls this)."""
        if n < POOLED_BODY:
            return torch.empty(n, dtype=torch.uint8)
        for buf in self._owned:
            # references: the list, the loop variable and the argument -- no storage of a live tensor
            if n <= buf.nbytes <= 2 * n and sys.getrefcount(buf) == 3:
                self.reused += 1
                return torch.from_numpy(buf)[:n]
        if len(self._owned) >= self.keep:   # replace a free buffer of the wrong size, if there is one
            free = [k for k in range(len(self._owned)) if sys.getrefcount(self._owned[k]) == 2]   # list, argument
            if not free:
                return torch.empty(n, dtype=torch.uint8)   # every kept buffer in use: this one is not kept
            del self._owned[free[0]]   # by position: list.remove would compare arrays elementwise
        fresh = np.empty(_with_headroom(n), dtype=np.uint8)
        self._owned.append(fresh)
        return torch.from_numpy(fresh)[:n]


def _with_headroom(n: int) -> int:
    """Bytes of a fresh pooled buffer for an ``n``-byte body: :data:`POOL_HEADROOM` more, in whole MiB."""
    return -(-int(n * (1 + POOL_HEADROOM)) // (1 << 20)) << 20
