// Front file of graphfeed::sample_subgraph: schema and argument checks.
#include "sample_subgraph.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_sample_subgraph_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                const at::Tensor& seeds, at::IntArrayRef fanouts) {
  check_topology(indptr, indices, eid);
  check_index_vector(seeds, "seeds");
  check_same_device(indptr, "indptr", seeds, "seeds");
  TORCH_CHECK(!fanouts.empty(), "fanouts is empty: give one fanout per hop, e.g. [15, 10, 5]");
  for (int64_t f : fanouts) check_fanout(f);
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "sample_subgraph(Tensor indptr, Tensor indices, Tensor eid, Tensor seeds, int node_offset, int[] fanouts, "
      "bool replace, int seed, bool direction_in) -> (Tensor nodes, Tensor row, Tensor col, Tensor eids, "
      "Tensor num_sampled_nodes, Tensor num_sampled_edges)");
}

}  // namespace graphfeed
