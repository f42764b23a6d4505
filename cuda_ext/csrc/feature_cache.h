#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// GPU hot-feature cache lookup (CUDA only): out[i] = hot[slot[index[i]]] when the row
// is cached (slot >= 0), else cold[index[i]] read from pinned host memory through
// unified virtual addressing.  hot [H, F] and out live on the GPU, cold [N, F] is a
// pinned CPU tensor, slot [N] int64 on the GPU.
void check_cache_gather_args(const at::Tensor& hot, const at::Tensor& cold, const at::Tensor& slot,
                             const at::Tensor& index);

}  // namespace graphfeed
