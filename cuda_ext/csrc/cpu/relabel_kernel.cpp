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

// One serial pass in candidate order (as DenseIdMap::relabel: the map of a graph of a few million
// nodes stays in cache, and the pass is memory-bound).
std::tuple<at::Tensor, at::Tensor> relabel_map_cpu(at::Tensor id_map, const at::Tensor& candidates,
                                                   int64_t num_known) {
  check_relabel_map_args(id_map, candidates, num_known);
  const at::Tensor cand = candidates.contiguous();
  const int64_t n = cand.numel(), bound = id_map.numel();
  TORCH_CHECK(num_known + n < INT32_MAX, "too many nodes for one batch (", num_known + n, ")");
  at::Tensor local = at::empty({n}, at::kLong);
  std::vector<int64_t> new_ids;
  int32_t* m = id_map.data_ptr<int32_t>();
  const int64_t* c = cand.data_ptr<int64_t>();
  int64_t* out = local.data_ptr<int64_t>();
  int64_t next = num_known;
  constexpr int64_t kAhead = 16;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const int64_t a = c[i + kAhead];
      if (a >= 0 && a < bound) __builtin_prefetch(m + a);
    }
    const int64_t k = c[i];
    TORCH_CHECK(k >= 0 && k < bound, "node id ", k, " is outside the id map's ids 0..", bound - 1);
    const int32_t v = m[k];
    if (v >= 0) {
      out[i] = v;
    } else {
      out[i] = next;
      m[k] = static_cast<int32_t>(next++);
      new_ids.push_back(k);
    }
  }
  at::Tensor out_new = at::empty({static_cast<int64_t>(new_ids.size())}, at::kLong);
  std::copy(new_ids.begin(), new_ids.end(), out_new.data_ptr<int64_t>());
  return {local, out_new};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) {
  m.impl("relabel", &relabel_cpu);
  m.impl("relabel_map", &relabel_map_cpu);
}

}  // namespace cpu
}  // namespace graphfeed
