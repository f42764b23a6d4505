// CPU kernel of graphfeed::relabel: hash-based, parallel (see id_map.h).
#include <torch/library.h>

#include "../relabel.h"
#include "id_map.h"

namespace graphfeed {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> relabel_cpu(const at::Tensor& known_gids, const at::Tensor& known_local,
                                               const at::Tensor& candidates, int64_t num_known) {
  check_relabel_args(known_gids, known_local, candidates, num_known);
  const at::Tensor kg = known_gids.contiguous(), kl = known_local.contiguous(), cand = candidates.contiguous();
  const int64_t k = kg.numel(), n = cand.numel();
  thread_local ShardedIdMap map;
  at::Tensor local = at::empty({n}, at::kLong);
  std::vector<int64_t> new_ids;
  for (int64_t room = k + n;; room *= 2) {
    map.reset(room);
    if (!map.insert_known(kg.data_ptr<int64_t>(), kl.data_ptr<int64_t>(), k, false)) continue;
    new_ids.clear();
    if (map.relabel(cand.data_ptr<int64_t>(), n, num_known, local.data_ptr<int64_t>(), new_ids, false)) break;
  }
  at::Tensor out_new = at::empty({static_cast<int64_t>(new_ids.size())}, at::kLong);
  std::copy(new_ids.begin(), new_ids.end(), out_new.data_ptr<int64_t>());
  return {local, out_new};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("relabel", &relabel_cpu); }

}  // namespace cpu
}  // namespace graphfeed
