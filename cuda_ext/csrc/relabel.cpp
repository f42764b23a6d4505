// Front file of graphfeed::relabel: schema and argument checks.
#include "relabel.h"

#include <torch/library.h>

#include "checks.h"

namespace graphfeed {

void check_relabel_args(const at::Tensor& known_gids, const at::Tensor& known_local, const at::Tensor& candidates,
                        int64_t num_known) {
  check_index_vector(known_gids, "known_gids");
  check_index_vector(known_local, "known_local");
  check_index_vector(candidates, "candidates");
  TORCH_CHECK(known_gids.numel() == known_local.numel(), "known_gids has ", known_gids.numel(),
              " entries but known_local has ", known_local.numel(), "; give one local id per known node");
  TORCH_CHECK(num_known >= 0, "num_known must be >= 0, got ", num_known);
  check_same_device(candidates, "candidates", known_gids, "known_gids");
  check_same_device(candidates, "candidates", known_local, "known_local");
}

void check_relabel_map_args(const at::Tensor& id_map, const at::Tensor& candidates, int64_t num_known) {
  TORCH_CHECK(id_map.dim() == 1 && id_map.scalar_type() == at::kInt, "id_map must be a 1-D int32 tensor, got ",
              id_map.scalar_type(), " of shape ", id_map.sizes(), "; make it with torch.full((num_nodes,), ",
              "-2**31, dtype=torch.int32)");
  check_contiguous(id_map, "id_map");
  check_index_vector(candidates, "candidates");
  TORCH_CHECK(num_known >= 0, "num_known must be >= 0, got ", num_known);
  check_same_device(candidates, "candidates", id_map, "id_map");
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "relabel(Tensor known_gids, Tensor known_local, Tensor candidates, int num_known) "
      "-> (Tensor local, Tensor new_gids)");
  m.def("relabel_map(Tensor(a!) id_map, Tensor candidates, int num_known) -> (Tensor local, Tensor new_gids)");
}

}  // namespace graphfeed
