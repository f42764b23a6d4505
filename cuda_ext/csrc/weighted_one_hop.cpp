// Front file of graphfeed::weighted_one_hop: schema and argument checks.
#include "weighted_one_hop.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_weighted_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                 const at::Tensor& weight, const at::Tensor& local_nodes, const at::Tensor& gids,
                                 int64_t fanout, int64_t hop) {
  check_topology(indptr, indices, eid);
  check_frontier(indptr, local_nodes, gids);
  check_fanout(fanout);
  check_hop(hop);
  TORCH_CHECK(weight.dim() == 1 && weight.numel() == indices.numel(), "weight must be 1-D with one entry per edge (",
              indices.numel(), "), got shape ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kDouble, "weight must be float64, got ", weight.scalar_type(),
              "; convert it once with .double()");
  check_contiguous(weight, "weight");
  check_same_device(indptr, "indptr", weight, "weight");
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "weighted_one_hop(Tensor indptr, Tensor indices, Tensor eid, Tensor weight, Tensor local_nodes, "
      "Tensor gids, int fanout, bool replace, int seed, int hop) -> (Tensor counts, Tensor neighbors, Tensor eids)");
}

}  // namespace graphfeed
