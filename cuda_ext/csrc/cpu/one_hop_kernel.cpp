// CPU kernel of graphfeed::one_hop: parallel over frontier nodes, two passes.
#include <torch/library.h>

#include "../one_hop.h"
#include "select_cpu.h"

namespace graphfeed {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> one_hop_cpu(const at::Tensor& indptr, const at::Tensor& indices,
                                                           const at::Tensor& eid, const at::Tensor& local_nodes,
                                                           const at::Tensor& gids, int64_t fanout, bool replace,
                                                           int64_t seed, int64_t hop) {
  check_one_hop_args(indptr, indices, eid, local_nodes, gids, fanout, hop);
  const at::Tensor nodes = local_nodes.contiguous(), g = gids.contiguous();
  const int64_t* ip = indptr.data_ptr<int64_t>();
  const int64_t* ind = indices.data_ptr<int64_t>();
  const int64_t* ed = eid.data_ptr<int64_t>();
  const int64_t* nd = nodes.data_ptr<int64_t>();
  const int64_t* gd = g.data_ptr<int64_t>();
  const int64_t rows = indptr.numel() - 1, num_edges = indices.numel();
  const uint64_t base = rng::hop_base(seed, hop);

  const int64_t n = nodes.numel();
  std::vector<RowRange> span(n);
  at::Tensor counts = at::empty({n}, at::kLong);
  int64_t* cnt = counts.data_ptr<int64_t>();
  count_rows(n, ip, rows, num_edges, fanout, replace, [&](int64_t i) { return nd[i]; }, span.data(), cnt);
  std::vector<int64_t> off(n + 1);
  const int64_t total = exclusive_offsets(cnt, n, off.data());
  at::Tensor nbr = at::empty({total}, at::kLong), out_eid = at::empty({total}, at::kLong);
  int64_t* nb = nbr.data_ptr<int64_t>();
  int64_t* eo = out_eid.data_ptr<int64_t>();
  parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    fill_uniform(b, e, span.data(), off.data(), ind, ed, fanout, replace, base, [&](int64_t i) { return gd[i]; },
                 nb, eo, [](int64_t, int64_t) {});
  });
  return {counts, nbr, out_eid};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("one_hop", &one_hop_cpu); }

}  // namespace cpu
}  // namespace graphfeed
