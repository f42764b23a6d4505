"""Fingerprints of a loader and the check that every DDP rank built the same one.

graphfeed splits an epoch over ranks itself (:mod:`graphfeed.core.epoch`), so every rank
must give a loader the *same* input set and settings; only ``rank`` differs.  A rank that
splits ``input_nodes`` by hand (as PyG's DDP examples do) or passes other settings would
silently see a fraction of the seeds, or get another ``len(loader)`` and hang DDP.

* :func:`settings_fingerprint` -- the spec without ``rank`` and the metrics label.
* :func:`inputs_fingerprint` -- the input set (split name or the ids themselves, node
  type) and every part's input count.
* :func:`check_ranks_agree` -- when ``torch.distributed`` is initialized and the loader is
  sharded over its default group, one ``all_gather`` of a small int64 tensor per call
  (loader creation, each epoch start); a mismatch raises on every rank at once.

Both fingerprints are signed 63-bit integers (they travel in an int64 tensor and in a
``state_dict``), stable across processes and hosts (blake2b, not ``hash()``).
"""
from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta
from typing import Sequence

import torch

from graphfeed.core.spec import LoaderSpec

AGREE_TIMEOUT = 300.0   # seconds a rank waits for the other ranks to compare loader fingerprints
_NOT_HASHED = ("rank", "kind", "feature_cache")   # LoaderSpec fields that may differ between ranks (the cache
#                                                  changes no batch, so checkpoints load with or without it)


def _feed(h, value) -> None:
    """Feed ``value`` into hash ``h``: tensors by dtype/shape/bytes, records field by field."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor:{t.dtype}:{tuple(t.shape)}:".encode())
        h.update(t.numpy().tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        h.update(f"{type(value).__name__}(".encode())
        for f in dataclasses.fields(value):
            h.update(f"{f.name}=".encode())
            _feed(h, getattr(value, f.name))
        h.update(b")")
    elif isinstance(value, (tuple, list)):
        h.update(b"[")
        for v in value:
            _feed(h, v)
            h.update(b",")
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def _fingerprint(*values) -> int:
    h = hashlib.blake2b(digest_size=8)
    for v in values:
        _feed(h, v)
    return int.from_bytes(h.digest(), "little", signed=True) >> 1   # 63 bits: fits an int64 everywhere


def settings_fingerprint(spec: LoaderSpec) -> int:
    """The loader's settings (sampling, batch size, shuffle, drop_last, seed, world size, ...)
    without its input set, ``rank`` and metrics label."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
              if f.name not in _NOT_HASHED and f.name != "input"}
    for name in ("ordered", "pack_partial"):
        if not fields[name]:   # left out when off, so checkpoints from before the field still load
            del fields[name]
    return _fingerprint(sorted(fields.items()))


def inputs_fingerprint(spec: LoaderSpec, counts: Sequence[int]) -> int:
    """The loader's input set (as given: split name or ids, node type) and each part's input count."""
    return _fingerprint(spec.input, [int(c) for c in counts])


def sharded_over_default_group(spec: LoaderSpec) -> bool:
    """True when ``torch.distributed`` is initialized and ``spec`` is sharded over its default group
    (same world size; a loader one rank makes alone passes ``rank=0, world_size=1`` and is not)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    return spec.world_size > 1 and spec.world_size == dist.get_world_size()


def check_ranks_agree(spec: LoaderSpec, counts: Sequence[int], *, epoch: int | None = None,
                      timeout: float = AGREE_TIMEOUT) -> None:
    """Raise ValueError on every rank unless all ranks of the default group have the same loader
    settings, input set and (when given) ``epoch``.  A no-op unless :func:`sharded_over_default_group`.

    Collective: every rank must call it (loader creation and ``iter()`` are collective under DDP).
    RuntimeError when the other ranks do not join within ``timeout`` seconds.
    """
    if not sharded_over_default_group(spec):
        return
    import torch.distributed as dist

    mine = torch.tensor([settings_fingerprint(spec), inputs_fingerprint(spec, counts),
                         -1 if epoch is None else int(epoch), spec.rank], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        mine = mine.cuda()
    gathered = [torch.empty_like(mine) for _ in range(spec.world_size)]
    work = dist.all_gather(gathered, mine, async_op=True)
    when = "at loader creation" if epoch is None else f"at the start of epoch {epoch}"
    try:
        work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise RuntimeError(f"rank {spec.rank}: the other ranks did not compare graphfeed loader settings "
                           f"{when} within {timeout:g} s; create every sharded loader and start every epoch "
                           f"on all ranks (pass rank=0, world_size=1 for a loader only one rank uses); "
                           f"cause: {exc}") from None
    rows = torch.stack(gathered).cpu().tolist()
    _raise_on_mismatch(rows, when)


def _raise_on_mismatch(rows: list[list[int]], when: str) -> None:
    """``rows[r]`` = rank r's (settings, inputs, epoch, rank); ValueError naming what differs."""
    first = rows[0]
    for r, row in enumerate(rows):
        if row[1] != first[1]:
            raise ValueError(f"graphfeed loader {when}: rank {r}'s input set differs from rank 0's. Pass the same "
                             f"input_nodes on every rank: graphfeed splits the seeds by rank itself (do not split "
                             f"them by hand as PyG's DDP examples do)")
        if row[0] != first[0]:
            raise ValueError(f"graphfeed loader {when}: rank {r}'s settings (num_neighbors, batch_size, shuffle, "
                             f"drop_last, seed, ...) differ from rank 0's; pass the same loader arguments on "
                             f"every rank (only rank may differ)")
        if row[2] != first[2]:
            raise ValueError(f"graphfeed loader {when}: rank {r} starts epoch {row[2]}, rank 0 epoch {first[2]}; "
                             f"call set_epoch with the same value on every rank")
    ranks = sorted(row[3] for row in rows)
    if ranks != list(range(len(rows))):
        raise ValueError(f"graphfeed loader {when}: the ranks' loaders claim ranks {ranks}; each rank must pass "
                         f"its own rank (or leave rank=None to take torch.distributed's)")
