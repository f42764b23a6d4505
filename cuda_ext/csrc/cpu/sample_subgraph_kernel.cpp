// CPU kernel of graphfeed::sample_subgraph: all hops and the relabelling in one call.
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <torch/library.h>

#include "../sample_subgraph.h"
#include "id_map.h"
#include "select_cpu.h"

namespace graphfeed {
namespace cpu {
namespace {

// A vector handed to torch without a copy.
at::Tensor to_tensor(std::vector<int64_t>&& v) {
  auto* owner = new std::vector<int64_t>(std::move(v));
  return at::from_blob(owner->data(), {static_cast<int64_t>(owner->size())},
                       [owner](void*) { delete owner; }, at::TensorOptions().dtype(at::kLong));
}

struct Topo {
  const int64_t *indptr, *indices, *eid;
  int64_t rows, num_edges, offset;
};

RowRange frontier_row(const Topo& t, int64_t gid) {
  const int64_t r = gid - t.offset;
  TORCH_CHECK(r >= 0 && r < t.rows, "node ", gid, " is not a row of this topology (rows hold nodes ", t.offset, "..",
              t.offset + t.rows - 1, "); the fused sampler needs a graph held in one partition");
  return row_range(t.indptr, t.rows, t.num_edges, r);
}

// Samples the frontier nodes[fb..fe); appends to the per-hop edge arrays.
struct HopEdges {
  at::Tensor nbr, eid, seed_side;
};

HopEdges sample_hop(const Topo& t, const std::vector<int64_t>& nodes, int64_t fb, int64_t fe, int64_t fanout,
                    bool replace, uint64_t base) {
  const int64_t n = fe - fb;
  const int64_t* nd = nodes.data() + fb;
  std::vector<int64_t> cnt(n), off(n + 1);
  at::parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) cnt[i] = sample_count(frontier_row(t, nd[i]).deg, fanout, replace);
  });
  const int64_t total = exclusive_offsets(cnt.data(), n, off.data());
  HopEdges out{at::empty({total}, at::kLong), at::empty({total}, at::kLong), at::empty({total}, at::kLong)};
  int64_t* nb = out.nbr.data_ptr<int64_t>();
  int64_t* eo = out.eid.data_ptr<int64_t>();
  int64_t* ss = out.seed_side.data_ptr<int64_t>();
  at::parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = cnt[i], o = off[i];
      if (!c) continue;
      const RowRange rr = frontier_row(t, nd[i]);
      sample_positions(rr.deg, fanout, replace, rng::node_key(base, nd[i]), eo + o);
      for (int64_t q = 0; q < c; ++q) {
        const int64_t edge = rr.start + eo[o + q];
        nb[o + q] = t.indices[edge];
        eo[o + q] = t.eid[edge];
        ss[o + q] = fb + i;
      }
    }
  });
  return out;
}

// Makes room in ``map`` for ``room`` keys, re-inserting nodes[0..k) (local id = position).
void ensure_room(ShardedIdMap& map, const std::vector<int64_t>& nodes, int64_t room, bool first) {
  if (map.fits(room) && !first) return;
  for (;; room *= 2) {
    map.reset(room);
    if (map.insert_known(nodes.data(), nullptr, static_cast<int64_t>(nodes.size()), true)) return;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_subgraph_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid, const at::Tensor& seeds,
    int64_t node_offset, at::IntArrayRef fanouts, bool replace, int64_t seed, bool direction_in) {
  check_sample_subgraph_args(indptr, indices, eid, seeds, fanouts);
  const at::Tensor sd = seeds.contiguous();
  const Topo t{indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), eid.data_ptr<int64_t>(),
               indptr.numel() - 1, indices.numel(), node_offset};
  const int64_t batch = sd.numel();
  std::vector<int64_t> nodes(sd.data_ptr<int64_t>(), sd.data_ptr<int64_t>() + batch);
  thread_local ShardedIdMap map;
  ensure_room(map, nodes, batch, true);
  std::vector<at::Tensor> rows, cols, eids;
  std::vector<int64_t> num_nodes{batch}, num_edges;
  int64_t fb = 0;
  for (size_t hop = 0; hop < fanouts.size(); ++hop) {
    const int64_t fe = static_cast<int64_t>(nodes.size());
    HopEdges h = sample_hop(t, nodes, fb, fe, fanouts[hop], replace, rng::hop_base(seed, hop));
    const int64_t m = h.nbr.numel();
    at::Tensor local = at::empty({m}, at::kLong);
    for (int64_t room = fe + m;; room *= 2) {
      ensure_room(map, nodes, room, false);
      if (map.relabel(h.nbr.data_ptr<int64_t>(), m, fe, local.data_ptr<int64_t>(), nodes, true)) break;
      nodes.resize(fe);
      ensure_room(map, nodes, room * 2, true);
    }
    rows.push_back(direction_in ? local : h.seed_side);
    cols.push_back(direction_in ? h.seed_side : local);
    eids.push_back(h.eid);
    num_nodes.push_back(static_cast<int64_t>(nodes.size()) - fe);
    num_edges.push_back(m);
    fb = fe;
  }
  return {to_tensor(std::move(nodes)), at::cat(rows), at::cat(cols), at::cat(eids), to_tensor(std::move(num_nodes)),
          to_tensor(std::move(num_edges))};
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("sample_subgraph", &sample_subgraph_cpu); }

}  // namespace cpu
}  // namespace graphfeed
