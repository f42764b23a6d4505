// Shared bits of the CUDA kernels: launch geometry and the error flag that lets a
// kernel report bad input so the host raises (TORCH_CHECK) instead of aborting.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

namespace graphfeed {
namespace cuda {

constexpr int kThreads = 256;

inline int64_t blocks_for(int64_t n, int threads = kThreads) {
  return std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, int64_t(1) << 20));
}

// Grid-stride loop over [0, n).
#define GF_KERNEL_LOOP(i, n)                                                     \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(blockDim.x) * gridDim.x)

// Error codes written by kernels (first one wins); 0 = fine.
enum ErrorCode : int { kOk = 0, kRowOutOfRange = 1, kCorruptIndptr = 2, kNegativeId = 3, kIndexOutOfRange = 4 };

inline at::Tensor error_flag(const at::Tensor& like) { return at::zeros({1}, like.options().dtype(at::kInt)); }

__device__ __forceinline__ void report(int* flag, int code) { atomicCAS(flag, 0, code); }

// Reads the flag (synchronizes the stream) and raises on an error.
inline void raise_on_error(const at::Tensor& flag, const char* what) {
  const int code = flag.item<int>();
  TORCH_CHECK(code != kRowOutOfRange, what, ": a frontier row is outside the topology");
  TORCH_CHECK(code != kCorruptIndptr, what, ": indptr is corrupt (decreasing or past the edge count)");
  TORCH_CHECK(code != kNegativeId, what, ": node ids must be >= 0");
  TORCH_CHECK(code != kIndexOutOfRange, what, ": an index is out of range");
}

}  // namespace cuda
}  // namespace graphfeed
