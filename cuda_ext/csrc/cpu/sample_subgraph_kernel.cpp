// CPU kernel of graphfeed::sample_subgraph: all hops and the relabelling in one call.
#include <torch/library.h>

#include "../sample_subgraph.h"
#include "fused_hops.h"

namespace graphfeed {
namespace cpu {
namespace {

template <class Map>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_hops(
    Map& map, const Topo& t, const at::Tensor& seeds, at::IntArrayRef fanouts, bool replace, int64_t seed,
    bool direction_in) {
  const int64_t batch = seeds.numel();
  std::vector<int64_t> nodes(seeds.data_ptr<int64_t>(), seeds.data_ptr<int64_t>() + batch);
  start_map(map, nodes, t.offset + t.rows);
  std::vector<at::Tensor> rows, cols, eids;
  std::vector<int64_t> num_nodes{batch}, num_edges;
  int64_t fb = 0;
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    const int64_t fe = static_cast<int64_t>(nodes.size());
    HopEdges h = sample_hop(t, nodes, fb, fe, fanouts[hop], replace, rng::hop_base(seed, hop));
    at::Tensor local = at::empty({h.nbr.numel()}, at::kLong);
    relabel_hop(map, nodes, h.nbr, local);
    rows.push_back(direction_in ? local : h.seed_side);
    cols.push_back(direction_in ? h.seed_side : local);
    eids.push_back(h.eid);
    num_nodes.push_back(static_cast<int64_t>(nodes.size()) - fe);
    num_edges.push_back(h.nbr.numel());
    fb = fe;
  }
  finish_map(map, nodes);
  return {to_tensor(std::move(nodes)), concat(rows), concat(cols), concat(eids), to_tensor(std::move(num_nodes)),
          to_tensor(std::move(num_edges))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_subgraph_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid, const at::Tensor& seeds,
    int64_t node_offset, at::IntArrayRef fanouts, bool replace, int64_t seed, bool direction_in) {
  check_sample_subgraph_args(indptr, indices, eid, seeds, fanouts);
  const at::Tensor sd = seeds.contiguous();
  const Topo t = topo_of(indptr, indices, eid, node_offset);
  // Node ids of a one-partition graph lie in [0, offset + rows): a dense map when that fits.
  if (node_offset >= 0 && node_offset + t.rows <= DenseIdMap::kMaxIds) {
    thread_local DenseIdMap dense;
    return run_hops(dense, t, sd, fanouts, replace, seed, direction_in);
  }
  thread_local ShardedIdMap hashed;
  return run_hops(hashed, t, sd, fanouts, replace, seed, direction_in);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("sample_subgraph", &sample_subgraph_cpu); }

}  // namespace cpu
}  // namespace graphfeed
