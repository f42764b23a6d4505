// Argument checks shared by the front files.  Every failure raises a Python
// RuntimeError naming the argument and what to pass instead (TORCH_CHECK), never aborts.
#pragma once

#include <ATen/core/Tensor.h>

namespace graphfeed {

constexpr int64_t kMaxFanout = int64_t(1) << 20;  // = graphfeed.server.sampling.types.MAX_FANOUT

inline void check_index_vector(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1, name, " must be a 1-D tensor, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64 (torch.long), got ", t.scalar_type(),
              "; convert it with .long()");
}

inline void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous; call .contiguous() once when loading it");
}

inline void check_same_device(const at::Tensor& a, const char* an, const at::Tensor& b, const char* bn) {
  TORCH_CHECK(a.device() == b.device(), an, " is on ", a.device(), " but ", bn, " is on ", b.device(),
              "; move them to the same device");
}

inline void check_fanout(int64_t fanout) {
  TORCH_CHECK(fanout == -1 || (fanout >= 1 && fanout <= kMaxFanout), "fanout must be -1 (all neighbors) or 1..",
              kMaxFanout, ", got ", fanout);
}

// The CSC/CSR part of a one-hop call: indptr [rows+1], indices [E], eid [E].
inline void check_topology(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid) {
  check_index_vector(indptr, "indptr");
  check_index_vector(indices, "indices");
  check_index_vector(eid, "eid");
  check_contiguous(indptr, "indptr");
  check_contiguous(indices, "indices");
  check_contiguous(eid, "eid");
  TORCH_CHECK(indptr.numel() >= 1, "indptr must have at least one entry (rows + 1)");
  TORCH_CHECK(indices.numel() == eid.numel(), "indices has ", indices.numel(), " entries but eid has ",
              eid.numel(), "; both must hold one entry per edge");
  check_same_device(indptr, "indptr", indices, "indices");
  check_same_device(indptr, "indptr", eid, "eid");
}

// The frontier of a one-hop call: rows into the topology and their global ids.
inline void check_frontier(const at::Tensor& indptr, const at::Tensor& local_nodes, const at::Tensor& gids) {
  check_index_vector(local_nodes, "local_nodes");
  check_index_vector(gids, "gids");
  TORCH_CHECK(local_nodes.numel() == gids.numel(), "local_nodes has ", local_nodes.numel(), " entries but gids has ",
              gids.numel(), "; give one global id per frontier row");
  check_same_device(indptr, "indptr", local_nodes, "local_nodes");
  check_same_device(indptr, "indptr", gids, "gids");
}

inline void check_hop(int64_t hop) { TORCH_CHECK(hop >= 0, "hop must be >= 0, got ", hop); }

}  // namespace graphfeed
