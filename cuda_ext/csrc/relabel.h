#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Hash-based relabel: local ids for ``candidates`` (global ids >= 0).  Known nodes
// (``known_gids[i]`` -> ``known_local[i]``, any order) keep their ids; unseen ones get
// num_known, num_known + 1, ... in order of first appearance.  Returns
// (local [n], new global ids in that order) -- the contract of dispatch.relabel.
void check_relabel_args(const at::Tensor& known_gids, const at::Tensor& known_local, const at::Tensor& candidates,
                        int64_t num_known);

}  // namespace graphfeed
