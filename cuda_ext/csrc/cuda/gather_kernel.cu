// CUDA kernels of graphfeed::gather_rows / gather_rows_into and graphfeed::cache_gather.
// One block per output row (grid-stride), threads over the row in the widest word
// (16, 8, 4 or 1 bytes) that the row size and the pointers' alignment allow.
// cache_gather reads a row from the device cache when cached, else from pinned host
// memory through its device-mapped address (unified virtual addressing).
#include <cuda_runtime.h>
#include <torch/library.h>

#include "../feature_cache.h"
#include "../gather_rows.h"
#include "common.cuh"

namespace graphfeed {
namespace cuda {
namespace {

template <class W>
__global__ void gather_kernel(const W* __restrict__ src, int64_t rows, const W* __restrict__ cold,
                              const int64_t* __restrict__ slot, int64_t hot_rows, const int64_t* __restrict__ index,
                              int64_t n, int64_t words, W* __restrict__ out, int* error) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t r = index[i];
    const W* row = nullptr;
    if (r < 0 || r >= rows) {
      if (threadIdx.x == 0) report(error, kIndexOutOfRange);
      continue;
    }
    if (slot == nullptr) {
      row = src + r * words;
    } else {
      const int64_t s = slot[r];
      if (s >= hot_rows) {
        if (threadIdx.x == 0) report(error, kIndexOutOfRange);
        continue;
      }
      row = s >= 0 ? src + s * words : cold + r * words;
    }
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) out[i * words + w] = row[w];
  }
}

int word_bytes(int64_t row_bytes, std::initializer_list<const void*> ptrs) {
  for (int w : {16, 8, 4}) {
    bool ok = row_bytes % w == 0;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % w == 0;
    if (ok) return w;
  }
  return 1;
}

// rows: rows addressable in ``src`` (hot rows when slot != nullptr, else all);
// ``n_rows`` bounds index (all rows of the feature matrix).
void launch(const void* src, const void* cold, const int64_t* slot, int64_t hot_rows, int64_t n_rows,
            const at::Tensor& index, int64_t row_bytes, void* out, const at::Tensor& error) {
  const int64_t n = index.numel();
  if (n == 0 || row_bytes == 0) return;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int w = word_bytes(row_bytes, {src, cold ? cold : src, out});
  const int64_t words = row_bytes / w;
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (words + 31) / 32 * 32)));
  const int64_t blocks = std::min<int64_t>(n, 65535);
  const int64_t* ix = index.data_ptr<int64_t>();
  int* err = error.data_ptr<int>();
#define GF_LAUNCH(W)                                                                                              \
  gather_kernel<W><<<blocks, threads, 0, stream>>>(static_cast<const W*>(src), n_rows, static_cast<const W*>(cold), \
                                                   slot, hot_rows, ix, n, words, static_cast<W*>(out), err)
  if (w == 16) GF_LAUNCH(int4);
  else if (w == 8) GF_LAUNCH(int2);
  else if (w == 4) GF_LAUNCH(int);
  else GF_LAUNCH(char);
#undef GF_LAUNCH
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int64_t row_bytes_of(const at::Tensor& t) { return t.size(0) ? static_cast<int64_t>(t.nbytes()) / t.size(0) : 0; }

void gather_rows_into_cuda(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out) {
  check_gather_rows_out(src, index, out);
  TORCH_CHECK(src.is_cuda() && index.is_cuda() && out.device() == src.device(),
              "gather_rows on CUDA needs src, index and out on the same GPU");
  const c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor idx = index.contiguous();
  at::Tensor error = error_flag(idx);
  // src rows are addressed directly: ``slot`` is null and ``rows`` bounds the index.
  launch(src.const_data_ptr(), nullptr, nullptr, 0, src.size(0), idx, row_bytes_of(src), out.data_ptr(), error);
  raise_on_error(error, "gather_rows");
}

at::Tensor gather_rows_cuda(const at::Tensor& src, const at::Tensor& index) {
  check_gather_rows_args(src, index);
  auto sizes = src.sizes().vec();
  sizes[0] = index.numel();
  at::Tensor out = at::empty(sizes, src.options());
  gather_rows_into_cuda(src, index, out);
  return out;
}

at::Tensor cache_gather_cuda(const at::Tensor& hot, const at::Tensor& cold, const at::Tensor& slot,
                             const at::Tensor& index) {
  check_cache_gather_args(hot, cold, slot, index);
  const c10::cuda::CUDAGuard guard(hot.device());
  void* cold_dev = nullptr;
  // Pinned host memory is mapped into the device's address space (UVA); ask for the
  // device-side address rather than assuming it equals the host pointer.
  C10_CUDA_CHECK(cudaHostGetDevicePointer(&cold_dev, const_cast<void*>(cold.const_data_ptr()), 0));
  const at::Tensor idx = index.contiguous(), sl = slot.contiguous();
  auto sizes = cold.sizes().vec();
  sizes[0] = idx.numel();
  at::Tensor out = at::empty(sizes, hot.options());
  at::Tensor error = error_flag(idx);
  launch(hot.const_data_ptr(), cold_dev, sl.data_ptr<int64_t>(), hot.size(0), cold.size(0), idx, row_bytes_of(cold),
         out.data_ptr(), error);
  raise_on_error(error, "cache_gather");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CUDA, m) {
  m.impl("gather_rows", &gather_rows_cuda);
  m.impl("gather_rows_into", &gather_rows_into_cuda);
  m.impl("cache_gather", &cache_gather_cuda);
}

}  // namespace cuda
}  // namespace graphfeed
