#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Fused multi-hop uniform sampling of a TYPED graph whose every node lives in one
// topology set (one partition).  The native twin of neighbor.sample_typed over one_hop:
//
//   * K edge types, given in the driver's (sorted) order: edge type k has endpoints
//     (src_type[k], dst_type[k]) (indices into the T node types) and one CSC (direction_in:
//     rows = dst nodes, indices = src global ids) or CSR (rows = src nodes, indices = dst ids).
//     The row of a node g of type t is g - node_offset[t].
//   * fanouts is hop-major, [hops * K]: fanouts[h * K + k] (0 = skip edge type k at hop h,
//     -1 = all neighbors).  Edge type k at hop h draws with rng hop h * K + k.
//   * The frontier of type t at hop h is its nodes first seen at hop h - 1 (its seeds at hop 0).
//     Sampled neighbors are relabelled per node type (first-appearance order, over the edge
//     types in order); node_bound[t] (> every global id of type t, or -1 when unknown) lets
//     a type use a dense id map instead of a hash map.  Same result either way.
//
// Returns (nodes [T], num_sampled_nodes [T] (hops + 1 each), row [K], col [K], eids [K],
// num_sampled_edges [K] (hops each)); row indexes nodes[src_type], col nodes[dst_type].
// Raises (RuntimeError) on inconsistent list lengths, bad fanouts, repeated seeds, or a
// node that is not a row of its topology.
void check_sample_typed_subgraph_args(at::TensorList indptr, at::TensorList indices, at::TensorList eid,
                                      at::IntArrayRef src_type, at::IntArrayRef dst_type, at::TensorList seeds,
                                      at::IntArrayRef node_offset, at::IntArrayRef node_bound,
                                      at::IntArrayRef fanouts);

}  // namespace graphfeed
