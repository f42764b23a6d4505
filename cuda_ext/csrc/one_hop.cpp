// Front file of graphfeed::one_hop: schema and argument checks (kernels in cpu/ and cuda/).
#include "one_hop.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                        const at::Tensor& local_nodes, const at::Tensor& gids, int64_t fanout, int64_t hop) {
  check_topology(indptr, indices, eid);
  check_frontier(indptr, local_nodes, gids);
  check_fanout(fanout);
  check_hop(hop);
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "one_hop(Tensor indptr, Tensor indices, Tensor eid, Tensor local_nodes, Tensor gids, int fanout, "
      "bool replace, int seed, int hop) -> (Tensor counts, Tensor neighbors, Tensor eids)");
}

}  // namespace graphfeed
