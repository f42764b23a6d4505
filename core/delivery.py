"""Batches handed to the trainer's GPU: pinned host memory and a copy one batch ahead.

PyG users pass ``pin_memory=True`` and ``device="cuda"`` to their loaders; :class:`Delivery` is
what the remote loader does with them.  With ``pin_memory`` each received batch is copied into
page-locked memory (torch's ``pin_memory``), so the copy to the GPU can be asynchronous; with
``device`` the batch is moved there on a side CUDA stream *one batch ahead*: while the trainer
works on batch ``i``, batch ``i + 1`` is already on its way, and the trainer's stream waits for
that copy only when it gets the batch.  Without a GPU, ``pin_memory=True`` is ignored with one
warning (as torch's ``DataLoader`` does); a CUDA ``device`` is a ValueError at loader creation.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterator

import torch


class Delivery:
    """How a loader hands batches over: pinned (``pin_memory``) and/or on ``device`` (None: as received)."""

    def __init__(self, pin_memory: bool = False, device: str | torch.device | None = None):
        if not isinstance(pin_memory, bool):
            raise ValueError(f"pin_memory must be True or False, got {pin_memory!r}")
        self.device = None if device is None else _check_device(device)
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pin_memory=True is ignored: torch sees no GPU, so there is no pinned memory to use",
                          RuntimeWarning, stacklevel=3)
            pin_memory = False
        self.pin_memory = pin_memory
        on_gpu = self.device is not None and self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if on_gpu else None

    @property
    def active(self) -> bool:
        return self.pin_memory or self.device is not None

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` delivered as asked: each one prepared (pinned, copy started) before the previous is yielded."""
        if not self.active:
            yield from batches
            return
        staged = None
        for data in batches:
            ready = self._start(data)
            if staged is not None:
                yield self._finish(*staged)
            staged = ready
            del data, ready
        if staged is not None:
            yield self._finish(*staged)

    def _start(self, data) -> tuple[Any, Any]:
        """Pin ``data`` and start its copy to the device (on the side stream); ``(batch, copy-done event)``."""
        if self.pin_memory:
            data = data.pin_memory()
        if self.device is None:
            return data, None
        if self._stream is None:    # a CPU device: nothing to overlap
            return data.to(self.device), None
        with torch.cuda.stream(self._stream):
            data = data.to(self.device, non_blocking=self.pin_memory)
            done = torch.cuda.Event()
            done.record(self._stream)
        return data, done

    def _finish(self, data, done):
        """The batch, once the trainer's current stream is ordered after its copy (and its memory is kept
        for that stream's use)."""
        if done is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            data.apply(lambda t: _record(t, current))
        return data


def _record(t: torch.Tensor, stream) -> torch.Tensor:
    if t.is_cuda:
        t.record_stream(stream)
    return t


def _check_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cuda', 'cuda:1' or 'cpu', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no GPU here (torch.cuda.is_available() is False); "
                         f"drop device= or pass device='cpu'")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: torch sees {torch.cuda.device_count()} GPU(s)")
    return dev
