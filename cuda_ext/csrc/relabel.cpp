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

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def(
      "relabel(Tensor known_gids, Tensor known_local, Tensor candidates, int num_known) "
      "-> (Tensor local, Tensor new_gids)");
}

}  // namespace graphfeed
