// Front file of graphfeed::temporal_one_hop: schema and argument checks.
#include "temporal_one_hop.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_temporal_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                 const at::Tensor& edge_time, const at::Tensor& local_nodes, const at::Tensor& gids,
                                 const at::Tensor& seed_time, int64_t fanout, int64_t hop) {
  check_topology(indptr, indices, eid);
  check_frontier(indptr, local_nodes, gids);
  check_fanout(fanout);
  check_hop(hop);
  check_index_vector(edge_time, "edge_time");
  check_index_vector(seed_time, "seed_time");
  check_contiguous(edge_time, "edge_time");
  TORCH_CHECK(edge_time.numel() == indices.numel(), "edge_time has ", edge_time.numel(),
              " entries; it needs one per edge (", indices.numel(), ")");
  TORCH_CHECK(seed_time.numel() == local_nodes.numel(), "seed_time has ", seed_time.numel(),
              " entries; it needs one per frontier node (", local_nodes.numel(), ")");
  check_same_device(indptr, "indptr", edge_time, "edge_time");
  check_same_device(indptr, "indptr", seed_time, "seed_time");
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "temporal_one_hop(Tensor indptr, Tensor indices, Tensor eid, Tensor edge_time, Tensor local_nodes, "
      "Tensor gids, Tensor seed_time, int fanout, bool replace, int seed, int hop) "
      "-> (Tensor counts, Tensor neighbors, Tensor eids)");
}

}  // namespace graphfeed
