#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Weighted one-hop sampling: ``weight`` (float64 [E], >= 0, aligned with ``indices``).
// Without replacement: the k positive-weight neighbors with the smallest keys
// E_j / w_j, E_j = -log(u_j), u_j = unit_open(key, j) (exponential race; the
// Efraimidis-Spirakis scheme), ties to the lower position, returned in list order.
// With replacement: k draws by inverse CDF over the row's running sum of weights.
// Zero-weight neighbors are never sampled.  Reference: server/sampling/reference_ext.py.
void check_weighted_one_hop_args(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid,
                                 const at::Tensor& weight, const at::Tensor& local_nodes, const at::Tensor& gids,
                                 int64_t fanout, int64_t hop);

}  // namespace graphfeed
