// CUDA kernel of graphfeed::one_hop: one thread per frontier node, two passes (counts,
// then fill at the scanned offsets), the same selection rule and RNG as the CPU (select.h).
#include <ATen/ops/cumsum.h>
#include <torch/library.h>

#include "../one_hop.h"
#include "../select.h"
#include "common.cuh"

namespace graphfeed {
namespace cuda {
namespace {

__global__ void count_kernel(const int64_t* __restrict__ indptr, int64_t rows, int64_t num_edges,
                             const int64_t* __restrict__ nodes, int64_t n, int64_t fanout, bool replace,
                             int64_t* __restrict__ counts, int* error) {
  GF_KERNEL_LOOP(i, n) {
    const int64_t r = nodes[i];
    counts[i] = 0;
    if (r < 0 || r >= rows) {
      report(error, kRowOutOfRange);
      continue;
    }
    const int64_t s = indptr[r], t = indptr[r + 1];
    if (s < 0 || s > t || t > num_edges) {
      report(error, kCorruptIndptr);
      continue;
    }
    counts[i] = sample_count(t - s, fanout, replace);
  }
}

// ``ends`` is the inclusive scan of the counts.  Picks are drawn into the eid output
// (scratch), then replaced by the edge ids; Floyd's membership test scans them (O(k^2)).
__global__ void fill_kernel(const int64_t* __restrict__ indptr, const int64_t* __restrict__ indices,
                            const int64_t* __restrict__ eid, const int64_t* __restrict__ nodes,
                            const int64_t* __restrict__ gids, int64_t n, int64_t fanout, bool replace, uint64_t base,
                            const int64_t* __restrict__ ends, int64_t* __restrict__ nbr, int64_t* __restrict__ eo) {
  GF_KERNEL_LOOP(i, n) {
    const int64_t begin = i ? ends[i - 1] : 0, c = ends[i] - begin;
    if (c == 0) continue;
    const int64_t r = nodes[i], s = indptr[r], deg = indptr[r + 1] - s;
    int64_t* pos = eo + begin;
    sample_positions_small(deg, fanout, replace, rng::node_key(base, gids[i]), pos);
    for (int64_t q = 0; q < c; ++q) {
      const int64_t e = s + pos[q];
      nbr[begin + q] = indices[e];
      pos[q] = eid[e];
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> one_hop_cuda(const at::Tensor& indptr, const at::Tensor& indices,
                                                            const at::Tensor& eid, const at::Tensor& local_nodes,
                                                            const at::Tensor& gids, int64_t fanout, bool replace,
                                                            int64_t seed, int64_t hop) {
  check_one_hop_args(indptr, indices, eid, local_nodes, gids, fanout, hop);
  const c10::cuda::CUDAGuard guard(indptr.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor nodes = local_nodes.contiguous(), g = gids.contiguous();
  const int64_t n = nodes.numel();
  at::Tensor counts = at::empty({n}, indptr.options());
  at::Tensor error = error_flag(indptr);
  if (n > 0) {
    count_kernel<<<blocks_for(n), kThreads, 0, stream>>>(indptr.data_ptr<int64_t>(), indptr.numel() - 1,
                                                        indices.numel(), nodes.data_ptr<int64_t>(), n, fanout,
                                                        replace, counts.data_ptr<int64_t>(), error.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  raise_on_error(error, "one_hop");
  const at::Tensor ends = at::cumsum(counts, 0);
  const int64_t total = n ? ends[n - 1].item<int64_t>() : 0;
  at::Tensor nbr = at::empty({total}, indptr.options()), eo = at::empty({total}, indptr.options());
  if (total > 0) {
    fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), eid.data_ptr<int64_t>(), nodes.data_ptr<int64_t>(),
        g.data_ptr<int64_t>(), n, fanout, replace, rng::hop_base(seed, hop), ends.data_ptr<int64_t>(),
        nbr.data_ptr<int64_t>(), eo.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {counts, nbr, eo};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CUDA, m) { m.impl("one_hop", &one_hop_cuda); }

}  // namespace cuda
}  // namespace graphfeed
