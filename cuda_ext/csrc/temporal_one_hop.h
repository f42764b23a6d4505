#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Temporal one-hop sampling: only edges with ``edge_time[e] <= seed_time[i]`` are
// candidates for frontier row i (pass ``node_time[indices]`` as edge_time for
// node-time semantics); among them the uniform rule applies, with positions counted
// in the list of eligible edges.  Reference: server/sampling/reference_ext.py.
void check_temporal_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                 const at::Tensor& edge_time, const at::Tensor& local_nodes, const at::Tensor& gids,
                                 const at::Tensor& seed_time, int64_t fanout, int64_t hop);

}  // namespace graphfeed
