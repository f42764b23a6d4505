"""Seeds derived from (seed, epoch, ...) with the splitmix64 finalizer.

The same integers are computed by the sampler's counter-based RNG
(``graphfeed.server.sampling.rng``), which imports them from here.
"""
from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def mix64_int(z: int) -> int:
    """splitmix64 finalizer on a Python int (the specification of every derived seed)."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """Sampling seed of the ``index``-th batch of ``epoch`` (non-negative, 63 bits)."""
    return mix64_int(mix64_int(seed + GOLDEN * (epoch + 1)) + index) >> 1


def stream_seed(seed: int, epoch: int, stream: int) -> int:
    """Seed for a ``torch.Generator`` shuffling one stream (a partition, or -1 for the batch order)."""
    return mix64_int(mix64_int(seed ^ (GOLDEN * (epoch + 7))) + (stream & MASK64)) >> 1
