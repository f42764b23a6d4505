"""Counter-based random numbers for sampling.

Every random choice is a pure function of ``(batch seed, hop, node global id, draw index)``
through the splitmix64 finalizer, not of a generator's position.  So results do not
depend on the order nodes are visited, on how the frontier is split across partitions
or threads, or on which implementation (this reference, the C++ or CUDA kernels) runs:
the native kernels compute the same integers (see ``cuda_ext/csrc/rng.h``).

All arithmetic is on int64 tensors with two's-complement wrap-around, which equals
uint64 arithmetic bit for bit; logical right shifts are emulated with a mask.
"""
from __future__ import annotations

import torch

from graphfeed.core.seeding import GOLDEN, M1, M2, MASK64, mix64_int


def _signed(v: int) -> int:
    v &= MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


_GOLDEN_S, _M1_S, _M2_S = _signed(GOLDEN), _signed(M1), _signed(M2)


def _xor_lshr_(z: torch.Tensor, s: int, tmp: torch.Tensor) -> None:
    """``z ^= z >>> s`` in place (``tmp``: scratch of z's shape)."""
    torch.bitwise_right_shift(z, s, out=tmp)
    tmp &= (1 << (64 - s)) - 1
    z ^= tmp


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer on an int64 tensor (bitwise equal to :func:`mix64_int`).

    Works in place on one copy of ``z`` plus one scratch tensor: fresh multi-MB
    temporaries per operation cost more in page faults than the arithmetic.
    """
    return mix64_(z.clone(memory_format=torch.contiguous_format))


def mix64_(z: torch.Tensor) -> torch.Tensor:
    """:func:`mix64` in place on ``z`` (which the caller owns); returns ``z``."""
    tmp = torch.empty_like(z)
    _xor_lshr_(z, 30, tmp)
    z *= _M1_S
    _xor_lshr_(z, 27, tmp)
    z *= _M2_S
    _xor_lshr_(z, 31, tmp)
    return z


def hop_base(seed: int, hop: int) -> int:
    """Per-(batch, hop) key, as a signed int64 value."""
    return _signed(mix64_int(seed + GOLDEN * (hop + 1)))


def node_keys(base: int, gids: torch.Tensor) -> torch.Tensor:
    """Per-node key for the nodes ``gids`` (global ids) under a hop's ``base``."""
    return mix64_(gids ^ base)


def draws(keys: torch.Tensor, index: torch.Tensor | int) -> torch.Tensor:
    """Non-negative 63-bit draw number ``index`` for each key."""
    z = mix64_(keys + (torch.as_tensor(index, dtype=torch.int64) + 1) * _GOLDEN_S)
    z >>= 1
    z &= (1 << 63) - 1
    return z
