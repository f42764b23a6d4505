// CPU kernel of graphfeed::gather_rows / gather_rows_into: parallel row copies.
#include <torch/library.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstring>

#include "../gather_rows.h"
#include "parallel.h"

namespace graphfeed {
namespace cpu {
namespace {

constexpr int64_t kPrefetchAhead = 8;

void gather_into(const at::Tensor& src, const at::Tensor& index, at::Tensor& out) {
  const at::Tensor idx = index.contiguous();
  const int64_t n = idx.numel(), rows = src.size(0);
  const int64_t row_bytes = rows ? static_cast<int64_t>(src.nbytes()) / rows : 0;
  const char* s = static_cast<const char*>(src.const_data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t* ix = idx.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 16) / std::max<int64_t>(row_bytes, 1));
  parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = ix[i];
      TORCH_CHECK(r >= 0 && r < rows, "index ", r, " is out of range for src with ", rows, " rows");
      if (i + kPrefetchAhead < e) {
        const int64_t nr = ix[i + kPrefetchAhead];
        if (nr >= 0 && nr < rows) __builtin_prefetch(s + nr * row_bytes);
      }
      std::memcpy(o + i * row_bytes, s + r * row_bytes, row_bytes);
    }
  });
}

at::Tensor gather_rows_cpu(const at::Tensor& src, const at::Tensor& index) {
  check_gather_rows_args(src, index);
  auto sizes = src.sizes().vec();
  sizes[0] = index.numel();
  at::Tensor out = at::empty(sizes, src.options());
  gather_into(src, index, out);
  return out;
}

void gather_rows_into_cpu(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out) {
  check_gather_rows_out(src, index, out);
  TORCH_CHECK(src.device().is_cpu(), "src must be a CPU tensor for a CPU gather");
  at::Tensor o = out;
  gather_into(src, index, o);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) {
  m.impl("gather_rows", &gather_rows_cpu);
  m.impl("gather_rows_into", &gather_rows_into_cpu);
}

}  // namespace cpu
}  // namespace graphfeed
