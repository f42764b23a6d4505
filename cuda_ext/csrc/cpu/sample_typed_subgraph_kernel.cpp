// CPU kernel of graphfeed::sample_typed_subgraph: every hop of every edge type and the
// per-type relabelling in one call (the contract is in ../sample_typed_subgraph.h).
#include <torch/library.h>

#include "../sample_typed_subgraph.h"
#include "fused_hops.h"

namespace graphfeed {
namespace cpu {
namespace {

// One node type's id map: dense when the type's id bound is known and small, else hashed.
class TypeIdMap {
 public:
  void start(const std::vector<int64_t>& nodes, int64_t bound) {
    dense_ = bound >= 0 && bound <= DenseIdMap::kMaxIds;
    if (dense_) {
      start_map(dense_map_, nodes, bound);
    } else {
      start_map(hashed_, nodes, bound);
    }
  }

  void relabel(std::vector<int64_t>& nodes, const at::Tensor& nbr, at::Tensor& local) {
    if (dense_) {
      relabel_hop(dense_map_, nodes, nbr, local);
    } else {
      relabel_hop(hashed_, nodes, nbr, local);
    }
  }

  void finish(const std::vector<int64_t>& nodes) {
    if (dense_) finish_map(dense_map_, nodes);
  }

 private:
  bool dense_ = false;
  DenseIdMap dense_map_;
  ShardedIdMap hashed_;
};

struct TypedArgs {
  std::vector<Topo> topos;              // per edge type; offset = its center type's node offset
  std::vector<int64_t> center, other;   // per edge type: the frontier's type and the neighbors' type
  at::IntArrayRef fanouts;              // hop-major
  bool replace, direction_in;
  int64_t seed;
};

using Lists = std::vector<at::Tensor>;
using Result = std::tuple<Lists, Lists, Lists, Lists, Lists, Lists>;

// Per node type: the nodes (seeds, then each hop's new nodes) and the per-hop counts.
struct TypeState {
  std::vector<int64_t> nodes, counts;
  int64_t fb = 0, fe = 0;   // the frontier of the current hop: local ids [fb, fe)
};

// Per edge type: the sampled edges, hop by hop.
struct EdgeState {
  std::vector<at::Tensor> rows, cols, eids;
  std::vector<int64_t> counts;
};

void sample_edge_type(const TypedArgs& a, size_t k, int64_t hop, std::vector<TypeState>& types,
                      std::vector<TypeIdMap>& maps, EdgeState& out) {
  const int64_t num_etypes = static_cast<int64_t>(a.topos.size());
  const int64_t fanout = a.fanouts[hop * num_etypes + k];
  TypeState& c = types[a.center[k]];
  if (fanout == 0 || c.fe == c.fb) {
    out.counts.push_back(0);
    return;
  }
  const uint64_t base = rng::hop_base(a.seed, hop * num_etypes + static_cast<int64_t>(k));
  HopEdges h = sample_hop(a.topos[k], c.nodes, c.fb, c.fe, fanout, a.replace, base);
  at::Tensor local = at::empty({h.nbr.numel()}, at::kLong);
  maps[a.other[k]].relabel(types[a.other[k]].nodes, h.nbr, local);
  out.rows.push_back(a.direction_in ? local : h.seed_side);
  out.cols.push_back(a.direction_in ? h.seed_side : local);
  out.eids.push_back(h.eid);
  out.counts.push_back(h.nbr.numel());
}

Result run_typed_hops(const TypedArgs& a, at::TensorList seeds, at::IntArrayRef node_bound,
                      std::vector<TypeIdMap>& maps) {
  const size_t num_types = seeds.size(), num_etypes = a.topos.size();
  std::vector<TypeState> types(num_types);
  for (size_t t = 0; t < num_types; ++t) {
    const at::Tensor s = seeds[t].contiguous();
    types[t].nodes.assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
    types[t].counts.push_back(s.numel());
    maps[t].start(types[t].nodes, node_bound[t]);
  }
  std::vector<EdgeState> edges(num_etypes);
  const int64_t hops = static_cast<int64_t>(a.fanouts.size() / num_etypes);
  for (int64_t hop = 0; hop < hops; ++hop) {
    for (auto& ts : types) ts.fe = static_cast<int64_t>(ts.nodes.size());
    for (size_t k = 0; k < num_etypes; ++k) sample_edge_type(a, k, hop, types, maps, edges[k]);
    for (auto& ts : types) {
      ts.counts.push_back(static_cast<int64_t>(ts.nodes.size()) - ts.fe);
      ts.fb = ts.fe;
    }
  }
  Result out;
  for (size_t t = 0; t < num_types; ++t) {
    maps[t].finish(types[t].nodes);
    std::get<0>(out).push_back(to_tensor(std::move(types[t].nodes)));
    std::get<1>(out).push_back(to_tensor(std::move(types[t].counts)));
  }
  for (auto& e : edges) {
    std::get<2>(out).push_back(concat(e.rows));
    std::get<3>(out).push_back(concat(e.cols));
    std::get<4>(out).push_back(concat(e.eids));
    std::get<5>(out).push_back(to_tensor(std::move(e.counts)));
  }
  return out;
}

Result sample_typed_subgraph_cpu(at::TensorList indptr, at::TensorList indices, at::TensorList eid,
                                 at::IntArrayRef src_type, at::IntArrayRef dst_type, at::TensorList seeds,
                                 at::IntArrayRef node_offset, at::IntArrayRef node_bound, at::IntArrayRef fanouts,
                                 bool replace, int64_t seed, bool direction_in) {
  check_sample_typed_subgraph_args(indptr, indices, eid, src_type, dst_type, seeds, node_offset, node_bound, fanouts);
  TypedArgs a{{}, {}, {}, fanouts, replace, direction_in, seed};
  for (size_t k = 0; k < indptr.size(); ++k) {
    const int64_t center = direction_in ? dst_type[k] : src_type[k];
    a.center.push_back(center);
    a.other.push_back(direction_in ? src_type[k] : dst_type[k]);
    a.topos.push_back(topo_of(indptr[k], indices[k], eid[k], node_offset[center]));
  }
  thread_local std::vector<TypeIdMap> maps;   // reused across calls: a dense map is allocated once
  if (maps.size() < seeds.size()) maps.resize(seeds.size());
  return run_typed_hops(a, seeds, node_bound, maps);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("sample_typed_subgraph", &sample_typed_subgraph_cpu); }

}  // namespace cpu
}  // namespace graphfeed
