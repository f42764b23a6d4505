// CPU kernel of graphfeed::temporal_one_hop: the uniform rule over each row's eligible
// edges (edge_time <= seed_time), positions counted in the eligible list.
#include <torch/library.h>

#include "../temporal_one_hop.h"
#include "select_cpu.h"

namespace graphfeed {
namespace cpu {
namespace {

int64_t eligible_count(const int64_t* et, int64_t deg, int64_t t) {
  int64_t c = 0;
  for (int64_t j = 0; j < deg; ++j) c += et[j] <= t;
  return c;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> temporal_one_hop_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid, const at::Tensor& edge_time,
    const at::Tensor& local_nodes, const at::Tensor& gids, const at::Tensor& seed_time, int64_t fanout, bool replace,
    int64_t seed, int64_t hop) {
  check_temporal_one_hop_args(indptr, indices, eid, edge_time, local_nodes, gids, seed_time, fanout, hop);
  const at::Tensor nodes = local_nodes.contiguous(), g = gids.contiguous(), st = seed_time.contiguous();
  const int64_t* ip = indptr.data_ptr<int64_t>();
  const int64_t* ind = indices.data_ptr<int64_t>();
  const int64_t* ed = eid.data_ptr<int64_t>();
  const int64_t* et = edge_time.data_ptr<int64_t>();
  const int64_t* nd = nodes.data_ptr<int64_t>();
  const int64_t* gd = g.data_ptr<int64_t>();
  const int64_t* sd = st.data_ptr<int64_t>();
  const int64_t rows = indptr.numel() - 1, num_edges = indices.numel();
  const uint64_t base = rng::hop_base(seed, hop);

  auto count = [&](int64_t i) {
    const RowRange rr = row_range(ip, rows, num_edges, nd[i]);
    return sample_count(eligible_count(et + rr.start, rr.deg, sd[i]), fanout, replace);
  };
  auto fill = [&](int64_t i, int64_t* nbr, int64_t* eo) {
    thread_local std::vector<int64_t> eligible;
    const RowRange rr = row_range(ip, rows, num_edges, nd[i]);
    eligible.clear();
    for (int64_t j = 0; j < rr.deg; ++j) {
      if (et[rr.start + j] <= sd[i]) eligible.push_back(rr.start + j);
    }
    const int64_t d = static_cast<int64_t>(eligible.size());
    const int64_t c = sample_count(d, fanout, replace);
    sample_positions(d, fanout, replace, rng::node_key(base, gd[i]), eo);
    for (int64_t q = 0; q < c; ++q) {
      const int64_t e = eligible[eo[q]];
      nbr[q] = ind[e];
      eo[q] = ed[e];
    }
  };
  return sample_frontier(nodes.numel(), count, fill);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("temporal_one_hop", &temporal_one_hop_cpu); }

}  // namespace cpu
}  // namespace graphfeed
