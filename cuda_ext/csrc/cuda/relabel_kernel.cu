// CUDA kernel of graphfeed::relabel: a global open-addressing table built with atomicCAS;
// each key keeps its first appearance with atomicMin, and a scan over "is first
// appearance" flags numbers the new nodes, so the output equals the CPU's exactly.
#include <ATen/ops/cumsum.h>
#include <ATen/ops/full.h>
#include <torch/library.h>

#include "../relabel.h"
#include "../rng.h"
#include "common.cuh"

namespace graphfeed {
namespace cuda {
namespace {

constexpr unsigned long long kEmpty = ~0ULL;

__device__ __forceinline__ int64_t find_or_insert(unsigned long long* keys, int64_t mask, int64_t key) {
  int64_t p = static_cast<int64_t>(rng::mix64(static_cast<uint64_t>(key))) & mask;
  for (;;) {
    const unsigned long long prev = atomicCAS(keys + p, kEmpty, static_cast<unsigned long long>(key));
    if (prev == kEmpty || prev == static_cast<unsigned long long>(key)) return p;
    p = (p + 1) & mask;
  }
}

__global__ void insert_known(unsigned long long* keys, int64_t mask, const int64_t* __restrict__ known,
                             const int64_t* __restrict__ known_local, int64_t k, int64_t* known_val, int* error) {
  GF_KERNEL_LOOP(i, k) {
    if (known[i] < 0) {
      report(error, kNegativeId);
      continue;
    }
    known_val[find_or_insert(keys, mask, known[i])] = known_local[i];
  }
}

__global__ void insert_candidates(unsigned long long* keys, int64_t mask, const int64_t* __restrict__ cand, int64_t n,
                                  long long* first, int64_t* slot_of, int* error) {
  GF_KERNEL_LOOP(i, n) {
    if (cand[i] < 0) {
      report(error, kNegativeId);
      slot_of[i] = 0;
      continue;
    }
    const int64_t p = find_or_insert(keys, mask, cand[i]);
    slot_of[i] = p;
    atomicMin(first + p, static_cast<long long>(i));
  }
}

__global__ void flag_first(const int64_t* __restrict__ slot_of, const int64_t* __restrict__ known_val,
                           const long long* __restrict__ first, int64_t n, int64_t* flag) {
  GF_KERNEL_LOOP(i, n) {
    const int64_t p = slot_of[i];
    flag[i] = known_val[p] < 0 && first[p] == i;
  }
}

// ``incl`` is the inclusive scan of the flags: a new node's rank is incl[first] - 1.
__global__ void assign(const int64_t* __restrict__ cand, const int64_t* __restrict__ slot_of,
                       const int64_t* __restrict__ known_val, const long long* __restrict__ first,
                       const int64_t* __restrict__ flag, const int64_t* __restrict__ incl, int64_t n,
                       int64_t num_known, int64_t* local, int64_t* new_ids) {
  GF_KERNEL_LOOP(i, n) {
    const int64_t p = slot_of[i], kv = known_val[p];
    local[i] = kv >= 0 ? kv : num_known + incl[first[p]] - 1;
    if (flag[i]) new_ids[incl[i] - 1] = cand[i];
  }
}

std::tuple<at::Tensor, at::Tensor> relabel_cuda(const at::Tensor& known_gids, const at::Tensor& known_local,
                                                const at::Tensor& candidates, int64_t num_known) {
  check_relabel_args(known_gids, known_local, candidates, num_known);
  const c10::cuda::CUDAGuard guard(candidates.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor kg = known_gids.contiguous(), kl = known_local.contiguous(), cand = candidates.contiguous();
  const int64_t k = kg.numel(), n = cand.numel();
  const auto opts = cand.options();
  int64_t cap = 1024;
  while (cap < 2 * (k + n)) cap <<= 1;
  at::Tensor keys = at::full({cap}, -1, opts);               // all bits set = kEmpty
  at::Tensor known_val = at::full({cap}, -1, opts);
  at::Tensor first = at::full({cap}, INT64_MAX, opts);
  at::Tensor slot_of = at::empty({n}, opts), flag = at::empty({n}, opts), local = at::empty({n}, opts);
  at::Tensor error = error_flag(cand);
  auto* kp = reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>());
  auto* fp = reinterpret_cast<long long*>(first.data_ptr<int64_t>());
  if (k > 0) {
    insert_known<<<blocks_for(k), kThreads, 0, stream>>>(kp, cap - 1, kg.data_ptr<int64_t>(), kl.data_ptr<int64_t>(),
                                                        k, known_val.data_ptr<int64_t>(), error.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (n > 0) {
    insert_candidates<<<blocks_for(n), kThreads, 0, stream>>>(kp, cap - 1, cand.data_ptr<int64_t>(), n, fp,
                                                             slot_of.data_ptr<int64_t>(), error.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  raise_on_error(error, "relabel");
  if (n == 0) return {local, at::empty({0}, opts)};
  flag_first<<<blocks_for(n), kThreads, 0, stream>>>(slot_of.data_ptr<int64_t>(), known_val.data_ptr<int64_t>(), fp,
                                                    n, flag.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor incl = at::cumsum(flag, 0);
  at::Tensor new_ids = at::empty({incl[n - 1].item<int64_t>()}, opts);
  assign<<<blocks_for(n), kThreads, 0, stream>>>(cand.data_ptr<int64_t>(), slot_of.data_ptr<int64_t>(),
                                                known_val.data_ptr<int64_t>(), fp, flag.data_ptr<int64_t>(),
                                                incl.data_ptr<int64_t>(), n, num_known, local.data_ptr<int64_t>(),
                                                new_ids.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {local, new_ids};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CUDA, m) { m.impl("relabel", &relabel_cuda); }

}  // namespace cuda
}  // namespace graphfeed
