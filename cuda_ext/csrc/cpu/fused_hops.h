// Pieces shared by the fused multi-hop CPU kernels (sample_subgraph, sample_typed_subgraph):
// one hop of uniform sampling over a frontier slice, the relabel step over either id map,
// and handing std::vectors to torch.  Everything is deterministic and thread-count
// independent (see select_cpu.h and id_map.h).
#pragma once

#include <ATen/ops/from_blob.h>

#include <cstring>
#include <vector>

#include "id_map.h"
#include "select_cpu.h"

namespace graphfeed {
namespace cpu {

// A vector handed to torch without a copy.
inline at::Tensor to_tensor(std::vector<int64_t>&& v) {
  auto* owner = new std::vector<int64_t>(std::move(v));
  return at::from_blob(owner->data(), {static_cast<int64_t>(owner->size())},
                       [owner](void*) { delete owner; }, at::TensorOptions().dtype(at::kLong));
}

// Concatenation of 1-D int64 tensors with this library's threads (at::cat would start
// torch's OpenMP team, whose spinning threads then compete with ours).
inline at::Tensor concat(const std::vector<at::Tensor>& parts) {
  int64_t total = 0;
  for (const auto& p : parts) total += p.numel();
  at::Tensor out = at::empty({total}, at::kLong);
  constexpr int64_t kPiece = 1 << 15;
  struct Piece {
    const int64_t* src;
    int64_t* dst;
    int64_t len;
  };
  std::vector<Piece> pieces;
  int64_t* dst = out.data_ptr<int64_t>();
  for (const auto& p : parts) {
    const int64_t* src = p.data_ptr<int64_t>();
    for (int64_t b = 0; b < p.numel(); b += kPiece) pieces.push_back({src + b, dst + b, std::min(kPiece, p.numel() - b)});
    dst += p.numel();
  }
  parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].len * sizeof(int64_t));
  });
  return out;
}

// One CSC/CSR: row of node g is g - offset.
struct Topo {
  const int64_t *indptr, *indices, *eid;
  int64_t rows, num_edges, offset;
};

inline Topo topo_of(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid, int64_t offset) {
  return Topo{indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), eid.data_ptr<int64_t>(), indptr.numel() - 1,
              indices.numel(), offset};
}

// A hop's sampled edges: neighbor global id, edge id, and the frontier node's local id.
struct HopEdges {
  at::Tensor nbr, eid, seed_side;
};

// Samples the frontier nodes[fb..fe) (local ids fb..fe-1) with RNG base ``base``.
inline HopEdges sample_hop(const Topo& t, const std::vector<int64_t>& nodes, int64_t fb, int64_t fe, int64_t fanout,
                           bool replace, uint64_t base) {
  const int64_t n = fe - fb;
  const int64_t* nd = nodes.data() + fb;
  std::vector<RowRange> span(n);
  std::vector<int64_t> cnt(n), off(n + 1);
  auto row_of = [&](int64_t i) {
    const int64_t r = nd[i] - t.offset;
    TORCH_CHECK(r >= 0 && r < t.rows, "node ", nd[i], " is not a row of this topology (rows hold nodes ", t.offset,
                "..", t.offset + t.rows - 1, "); the fused sampler needs a graph held in one partition");
    return r;
  };
  count_rows(n, t.indptr, t.rows, t.num_edges, fanout, replace, row_of, span.data(), cnt.data());
  const int64_t total = exclusive_offsets(cnt.data(), n, off.data());
  HopEdges out{at::empty({total}, at::kLong), at::empty({total}, at::kLong), at::empty({total}, at::kLong)};
  int64_t* nb = out.nbr.data_ptr<int64_t>();
  int64_t* eo = out.eid.data_ptr<int64_t>();
  int64_t* ss = out.seed_side.data_ptr<int64_t>();
  parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    fill_uniform(b, e, span.data(), off.data(), t.indices, t.eid, fanout, replace, base,
                 [&](int64_t i) { return nd[i]; }, nb, eo, [&](int64_t q, int64_t i) { ss[q] = fb + i; });
  });
  return out;
}

// Makes room in a hash map for ``room`` keys, re-inserting nodes (local id = position).
inline void ensure_room(ShardedIdMap& map, const std::vector<int64_t>& nodes, int64_t room, bool force) {
  if (map.fits(room) && !force) return;
  for (;; room *= 2) {
    map.reset(room);
    if (map.insert_known(nodes.data(), nullptr, static_cast<int64_t>(nodes.size()), true)) return;
  }
}

// Local ids of ``nbr`` into ``local``; unseen ids are appended to ``nodes`` (first appearance).
inline void relabel_hop(ShardedIdMap& map, std::vector<int64_t>& nodes, const at::Tensor& nbr, at::Tensor& local) {
  const int64_t k = static_cast<int64_t>(nodes.size()), m = nbr.numel();
  for (int64_t room = k + m;; room *= 2) {
    ensure_room(map, nodes, room, false);
    if (map.relabel(nbr.data_ptr<int64_t>(), m, k, local.data_ptr<int64_t>(), nodes, true)) return;
    ensure_room(map, nodes, room * 2, true);
  }
}

inline void relabel_hop(DenseIdMap& map, std::vector<int64_t>& nodes, const at::Tensor& nbr, at::Tensor& local) {
  map.relabel(nbr.data_ptr<int64_t>(), nbr.numel(), static_cast<int64_t>(nodes.size()), local.data_ptr<int64_t>(),
              nodes, true);
}

// Starts a map holding ``nodes`` (the seeds: distinct, else raises); ids lie in [0, bound).
inline void start_map(ShardedIdMap& map, const std::vector<int64_t>& nodes, int64_t /*bound*/) {
  ensure_room(map, nodes, static_cast<int64_t>(nodes.size()), true);
}

inline void start_map(DenseIdMap& map, const std::vector<int64_t>& nodes, int64_t bound) {
  map.reset(bound);
  map.insert_known(nodes.data(), nullptr, static_cast<int64_t>(nodes.size()), true);
}

// Leaves the map ready for the next call (the dense map clears only what was inserted).
inline void finish_map(ShardedIdMap&, const std::vector<int64_t>&) {}
inline void finish_map(DenseIdMap& map, const std::vector<int64_t>& nodes) {
  map.clear(nodes.data(), static_cast<int64_t>(nodes.size()));
}

}  // namespace cpu
}  // namespace graphfeed
