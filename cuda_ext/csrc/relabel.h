#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

// Hash-based relabel: local ids for ``candidates`` (global ids >= 0).  Known nodes
// (``known_gids[i]`` -> ``known_local[i]``, any order) keep their ids; unseen ones get
// num_known, num_known + 1, ... in order of first appearance.  Returns
// (local [n], new global ids in that order) -- the contract of dispatch.relabel.
void check_relabel_args(const at::Tensor& known_gids, const at::Tensor& known_local, const at::Tensor& candidates,
                        int64_t num_known);

// relabel_map: the same contract with the known nodes held in ``id_map`` (int32 [bound], indexed by
// global id: a local id, or INT32_MIN where the node is unseen) instead of passed each call.  The new
// nodes are written into ``id_map`` (num_known + rank), so one map serves every hop of a batch
// (the driver inserts its seeds once) and no call re-inserts what earlier hops saw.
void check_relabel_map_args(const at::Tensor& id_map, const at::Tensor& candidates, int64_t num_known);

}  // namespace graphfeed
