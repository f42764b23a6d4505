// Front file of graphfeed::cache_gather: schema and argument checks (kernel in cuda/).
#include "feature_cache.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_cache_gather_args(const at::Tensor& hot, const at::Tensor& cold, const at::Tensor& slot,
                             const at::Tensor& index) {
  TORCH_CHECK(hot.is_cuda() && slot.is_cuda() && index.is_cuda(), "hot, slot and index must be CUDA tensors");
  TORCH_CHECK(!cold.is_cuda() && cold.is_pinned(), "cold must be a pinned CPU tensor (tensor.pin_memory())");
  check_contiguous(hot, "hot");
  check_contiguous(cold, "cold");
  check_index_vector(slot, "slot");
  check_index_vector(index, "index");
  TORCH_CHECK(hot.dim() >= 1 && cold.dim() == hot.dim(), "hot and cold must have the same number of dimensions");
  TORCH_CHECK(hot.scalar_type() == cold.scalar_type(), "hot is ", hot.scalar_type(), " but cold is ",
              cold.scalar_type());
  TORCH_CHECK(hot.sizes().slice(1) == cold.sizes().slice(1), "hot rows ", hot.sizes().slice(1),
              " and cold rows ", cold.sizes().slice(1), " differ");
  TORCH_CHECK(slot.numel() == cold.size(0), "slot needs one entry per node (", cold.size(0), "), got ", slot.numel());
  check_same_device(hot, "hot", slot, "slot");
  check_same_device(hot, "hot", index, "index");
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def("cache_gather(Tensor hot, Tensor cold, Tensor slot, Tensor index) -> Tensor");
}

}  // namespace graphfeed
