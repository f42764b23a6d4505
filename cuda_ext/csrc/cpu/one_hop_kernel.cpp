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

  auto count = [&](int64_t i) {
    return sample_count(row_range(ip, rows, num_edges, nd[i]).deg, fanout, replace);
  };
  auto fill = [&](int64_t i, int64_t* nbr, int64_t* eo) {
    const RowRange rr = row_range(ip, rows, num_edges, nd[i]);
    const int64_t c = sample_count(rr.deg, fanout, replace);
    sample_positions(rr.deg, fanout, replace, rng::node_key(base, gd[i]), eo);  // positions, then replaced
    for (int64_t q = 0; q < c; ++q) {
      const int64_t e = rr.start + eo[q];
      nbr[q] = ind[e];
      eo[q] = ed[e];
    }
  };
  return sample_frontier(nodes.numel(), count, fill);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("one_hop", &one_hop_cpu); }

}  // namespace cpu
}  // namespace graphfeed
