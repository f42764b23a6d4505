#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Fused multi-hop uniform sampling over ONE topology that holds every node it can
// reach (a single-partition graph): hop h samples the previous hop's new nodes with
// fanouts[h], relabels the neighbors (hash map, first-appearance order) and appends
// the new ones.  Row of node g is g - node_offset.  Returns, as
// neighbor.sample_subgraph does: (nodes, row, col, eids, num_sampled_nodes [hops+1],
// num_sampled_edges [hops]); direction_in puts the sampled neighbor in ``row``.
void check_sample_subgraph_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                const at::Tensor& seeds, at::IntArrayRef fanouts);

}  // namespace graphfeed
