"""One part sampled on a GPU: its topology in device memory, its features behind a
:class:`~graphfeed.cuda_ext.feature_cache.GpuFeatureCache`.

The multi-hop driver (:func:`graphfeed.server.sampling.neighbor.sample_subgraph`) is device
agnostic: its tensors follow the seeds' device, and :mod:`.dispatch` sends CUDA tensors to the
CUDA kernels (``one_hop``, ``relabel``).  So a GPU sample is the driver over a topology whose
arrays live on the GPU; with the same RNG, it gives the CPU sample's nodes and edges (the CUDA
one-hop kernel draws with the same counter-based generator; ``tests/test_native_ops.py`` and
``tests/test_native_typed.py`` check the equality on a GPU).

Only a one-part (whole graph) homogeneous partition, for now: what ``graphfeed bench sample
--device cuda`` measures.  Serving batches from a GPU (a daemon with ``device: cuda``) is not
built yet.
"""
from __future__ import annotations

import torch

from graphfeed.core.spec import SamplingSpec
from graphfeed.server.partition.store import Partition, Topology
from graphfeed.server.sampling import dispatch
from graphfeed.server.sampling.neighbor import sample_subgraph
from graphfeed.server.sampling.types import OneHop, SampledSubgraph


def cuda_unavailable_reason() -> str | None:
    """Why GPU sampling cannot run here (None when it can)."""
    from graphfeed import cuda_ext

    if not torch.cuda.is_available():
        return "torch sees no GPU (torch.cuda.is_available() is False)"
    if cuda_ext.load_ops() is None:
        return f"the native op library is not loaded: {cuda_ext.load_error()}"
    if not cuda_ext.has_cuda_kernels():
        return ("the native op library has no CUDA kernels: rebuild it with a CUDA torch and the CUDA toolkit "
                "present (`python cuda_ext/build.py` or `graphfeed build-native --force`)")
    return None


class GpuPart:
    """A whole homogeneous graph (a one-part partition) on ``device`` for sampling and feature reads.

    ``cache_bytes`` bounds the feature rows kept in device memory: the rows of the highest-degree
    nodes (in the sampled direction) that fit; the other rows are read by the GPU from pinned host
    memory.  Labels and original ids are small and go to the device whole.
    """

    def __init__(self, part: Partition, spec: SamplingSpec, cache_bytes: int, device: str = "cuda"):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"GPU sampling needs a GPU and graphfeed's CUDA kernels: {reason}")
        if part.meta.num_parts != 1 or not part.meta.is_homogeneous:
            raise ValueError("GPU sampling takes a one-part homogeneous partition (partition the graph with "
                             "--num-parts 1)")
        from graphfeed.cuda_ext.feature_cache import GpuFeatureCache

        self.device = torch.device(device)
        self.spec = spec
        topo = part.topology(spec.topology)
        self.topo = Topology(*(t.to(self.device) for t in (topo.indptr, topo.indices, topo.eid)))
        self.offset = part.nodes(part.ntype).start
        degree = (topo.indptr[1:] - topo.indptr[:-1]).to(torch.float64)
        x = part.x
        self.cache = None if x is None else GpuFeatureCache.from_hotness(x, degree, cache_bytes, self.device)
        self.y = None if part.y is None else part.y.to(self.device)
        self.orig_id = part.orig_id.to(self.device)

    @property
    def cached_rows(self) -> int:
        return 0 if self.cache is None else self.cache.num_cached

    def sample(self, seeds: torch.Tensor, seed: int) -> SampledSubgraph:
        """The driver's multi-hop sample of ``seeds`` (global ids; moved to the device) with batch seed ``seed``."""
        topo, offset, replace = self.topo, self.offset, self.spec.replace

        def hop(gids: torch.Tensor, fanout: int, rng_hop: int) -> OneHop:
            return dispatch.one_hop(topo, gids - offset, gids, fanout, replace, seed, rng_hop)

        return sample_subgraph(seeds.to(self.device), self.spec, hop)

    def gather(self, gids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """``(x, y, original ids)`` of nodes ``gids`` (device tensors)."""
        rows = gids.to(self.device) - self.offset
        x = None if self.cache is None else self.cache.gather(rows)
        y = None if self.y is None else self.y.index_select(0, rows)
        return x, y, self.orig_id.index_select(0, rows)
