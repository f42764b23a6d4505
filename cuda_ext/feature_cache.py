"""GPU hot-feature cache: the hottest rows of a feature matrix on the GPU, the rest read
from pinned host memory by the GPU itself (unified virtual addressing), in one kernel.

Needs a CUDA build of the op library (``graphfeed.cuda_ext.has_cuda_kernels()``) and a GPU.
"""
from __future__ import annotations

import torch

from graphfeed.cuda_ext import has_cuda_kernels, load_error, load_ops


class GpuFeatureCache:
    """Rows ``hot_ids`` of ``features`` [N, ...] on ``device``; every row readable by :meth:`gather`.

    The full matrix is copied once into pinned host memory (``cold``); cached rows are
    served from device memory, the others straight from host memory over PCIe/NVLink
    without a staging copy.  ``slot[v]`` is row v's index in the device cache, or -1.
    """

    def __init__(self, features: torch.Tensor, hot_ids: torch.Tensor, device: str | torch.device = "cuda"):
        if load_ops() is None:
            raise RuntimeError(f"GpuFeatureCache needs the native op library: {load_error()}")
        if not (torch.cuda.is_available() and has_cuda_kernels()):
            raise RuntimeError("GpuFeatureCache needs a GPU and a CUDA build of graphfeed's op library "
                               "(reinstall with a CUDA torch and the CUDA toolkit present)")
        if features.dim() < 1:
            raise ValueError("features must have a row dimension")
        hot_ids = torch.unique(torch.as_tensor(hot_ids, dtype=torch.int64))
        n = features.size(0)
        if hot_ids.numel() and (int(hot_ids[0]) < 0 or int(hot_ids[-1]) >= n):
            raise ValueError(f"hot_ids must be row ids in 0..{n - 1}")
        self.device = torch.device(device)
        self.cold = features.contiguous().pin_memory()
        self.hot = features.index_select(0, hot_ids).to(self.device)
        slot = torch.full((n,), -1, dtype=torch.int64)
        slot[hot_ids] = torch.arange(hot_ids.numel())
        self.slot = slot.to(self.device)

    @classmethod
    def from_hotness(cls, features: torch.Tensor, hotness: torch.Tensor, budget_bytes: int,
                     device: str | torch.device = "cuda") -> "GpuFeatureCache":
        """Cache the rows with the highest ``hotness`` (e.g. pre-sampling access counts) that fit ``budget_bytes``."""
        row_bytes = features[0].numel() * features.element_size() if features.size(0) else 1
        rows = max(0, min(features.size(0), int(budget_bytes) // max(row_bytes, 1)))
        hot = torch.topk(torch.as_tensor(hotness, dtype=torch.float64), rows).indices if rows else torch.empty(0)
        return cls(features, hot, device)

    @property
    def num_cached(self) -> int:
        return self.hot.size(0)

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (int64, on the cache's device) as a device tensor; raises on an out-of-range id."""
        index = index.to(self.device, torch.int64)
        return load_ops().cache_gather(self.hot, self.cold, self.slot, index)
