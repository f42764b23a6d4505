#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace graphfeed {

// Uniform one-hop neighbor sampling.  Returns (counts [n], neighbors [sum], eids [sum]):
// the neighbors (global ids from ``indices``) and edge ids sampled for each frontier row
// ``local_nodes[i]`` (global id ``gids[i]``), grouped per row in frontier order.
void check_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                        const at::Tensor& local_nodes, const at::Tensor& gids, int64_t fanout, int64_t hop);

}  // namespace graphfeed
