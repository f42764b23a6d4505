// Front file of graphfeed::sample_typed_subgraph: schema and argument checks.
#include "sample_typed_subgraph.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {
namespace {

// Runs a check, prefixing its message with what it was checking (e.g. "edge type 2").
template <class F>
void checked(const char* what, int64_t index, const F& check) {
  try {
    check();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, what, " ", index, ": ", e.what_without_backtrace());
  }
}

void check_lengths(size_t k, at::TensorList indices, at::TensorList eid, at::IntArrayRef src_type,
                   at::IntArrayRef dst_type, size_t t, at::IntArrayRef node_offset, at::IntArrayRef node_bound) {
  TORCH_CHECK(k >= 1, "no edge types: give one topology (indptr, indices, eid) per edge type");
  TORCH_CHECK(indices.size() == k && eid.size() == k && src_type.size() == k && dst_type.size() == k,
              "indptr, indices, eid, src_type and dst_type must each have one entry per edge type, got ", k, ", ",
              indices.size(), ", ", eid.size(), ", ", src_type.size(), ", ", dst_type.size());
  TORCH_CHECK(t >= 1, "no node types: give one seeds tensor per node type (empty for unseeded types)");
  TORCH_CHECK(node_offset.size() == t && node_bound.size() == t, "seeds, node_offset and node_bound must each have ",
              "one entry per node type, got ", t, ", ", node_offset.size(), ", ", node_bound.size());
}

}  // namespace

void check_sample_typed_subgraph_args(at::TensorList indptr, at::TensorList indices, at::TensorList eid,
                                      at::IntArrayRef src_type, at::IntArrayRef dst_type, at::TensorList seeds,
                                      at::IntArrayRef node_offset, at::IntArrayRef node_bound,
                                      at::IntArrayRef fanouts) {
  const size_t k = indptr.size(), t = seeds.size();
  check_lengths(k, indices, eid, src_type, dst_type, t, node_offset, node_bound);
  for (size_t e = 0; e < k; ++e) {
    checked("edge type", e, [&] { check_topology(indptr[e], indices[e], eid[e]); });
    TORCH_CHECK(indptr[e].device().is_cpu(), "edge type ", e, ": the fused typed sampler runs on the CPU, got a ",
                "topology on ", indptr[e].device(), "; use the multi-hop driver for device topologies");
    for (int64_t type : {src_type[e], dst_type[e]}) {
      TORCH_CHECK(type >= 0 && type < static_cast<int64_t>(t), "edge type ", e, " names node type ", type,
                  ", outside 0..", t - 1);
    }
  }
  for (size_t n = 0; n < t; ++n) {
    checked("seeds of node type", n, [&] { check_index_vector(seeds[n], "seeds"); });
    checked("seeds of node type", n, [&] { check_same_device(indptr[0], "indptr", seeds[n], "seeds"); });
  }
  TORCH_CHECK(!fanouts.empty() && fanouts.size() % k == 0, "fanouts must hold hops x edge types entries (hop-major), ",
              "got ", fanouts.size(), " for ", k, " edge types");
  for (int64_t f : fanouts) {
    if (f != 0) check_fanout(f);  // 0 = skip the edge type at that hop
  }
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "sample_typed_subgraph(Tensor[] indptr, Tensor[] indices, Tensor[] eid, int[] src_type, int[] dst_type, "
      "Tensor[] seeds, int[] node_offset, int[] node_bound, int[] fanouts, bool replace, int seed, "
      "bool direction_in) -> (Tensor[] nodes, Tensor[] num_sampled_nodes, Tensor[] row, Tensor[] col, "
      "Tensor[] eids, Tensor[] num_sampled_edges)");
}

}  // namespace graphfeed
