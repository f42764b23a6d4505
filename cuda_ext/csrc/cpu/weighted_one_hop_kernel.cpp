// CPU kernel of graphfeed::weighted_one_hop (scheme documented in weighted_one_hop.h).
#include <torch/library.h>

#include <cmath>
#include <utility>

#include "../weighted_one_hop.h"
#include "select_cpu.h"

namespace graphfeed {
namespace cpu {
namespace {

// Positive-weight neighbors of a row; raises on a negative or NaN weight.
int64_t positive_count(const double* w, int64_t deg) {
  int64_t npos = 0;
  for (int64_t j = 0; j < deg; ++j) {
    TORCH_CHECK(w[j] >= 0.0, "edge weights must be >= 0 and not NaN, got ", w[j]);
    npos += w[j] > 0.0;
  }
  return npos;
}

int64_t weighted_count(int64_t npos, int64_t fanout, bool replace) {
  if (fanout < 0) return npos;
  if (replace) return npos > 0 ? fanout : 0;
  return npos < fanout ? npos : fanout;
}

// k draws by inverse CDF over the running sum (same float64 sums as torch.cumsum).
void draw_with_replacement(const double* w, int64_t deg, int64_t k, uint64_t key, int64_t* out) {
  thread_local std::vector<double> cum;
  cum.resize(deg);
  double acc = 0.0;
  int64_t last = 0;
  for (int64_t j = 0; j < deg; ++j) {
    acc += w[j];
    cum[j] = acc;
    if (w[j] > 0.0) last = j;
  }
  for (int64_t q = 0; q < k; ++q) {
    const double target = rng::unit_closed_open(key, q) * acc;
    const int64_t p = std::upper_bound(cum.begin(), cum.begin() + deg, target) - cum.begin();
    out[q] = p < deg ? p : last;
  }
}

// The k positive-weight positions with the smallest E_j / w_j (ties: lower j), ascending.
void exponential_race(const double* w, int64_t deg, int64_t k, uint64_t key, int64_t* out) {
  thread_local std::vector<std::pair<double, int64_t>> keys;
  keys.clear();
  for (int64_t j = 0; j < deg; ++j) {
    if (w[j] > 0.0) keys.emplace_back(-std::log(rng::unit_open(key, j)) / w[j], j);
  }
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end());
  for (int64_t q = 0; q < k; ++q) out[q] = keys[q].second;
  std::sort(out, out + k);
}

void weighted_positions(const double* w, int64_t deg, int64_t npos, int64_t fanout, bool replace, uint64_t key,
                        int64_t* out) {
  if (fanout < 0 || (!replace && npos <= fanout)) {
    int64_t q = 0;
    for (int64_t j = 0; j < deg; ++j) {
      if (w[j] > 0.0) out[q++] = j;
    }
  } else if (replace) {
    draw_with_replacement(w, deg, fanout, key, out);
  } else {
    exponential_race(w, deg, fanout, key, out);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> weighted_one_hop_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& eid, const at::Tensor& weight,
    const at::Tensor& local_nodes, const at::Tensor& gids, int64_t fanout, bool replace, int64_t seed, int64_t hop) {
  check_weighted_one_hop_args(indptr, indices, eid, weight, local_nodes, gids, fanout, hop);
  const at::Tensor nodes = local_nodes.contiguous(), g = gids.contiguous();
  const int64_t* ip = indptr.data_ptr<int64_t>();
  const int64_t* ind = indices.data_ptr<int64_t>();
  const int64_t* ed = eid.data_ptr<int64_t>();
  const double* wt = weight.data_ptr<double>();
  const int64_t* nd = nodes.data_ptr<int64_t>();
  const int64_t* gd = g.data_ptr<int64_t>();
  const int64_t rows = indptr.numel() - 1, num_edges = indices.numel();
  const uint64_t base = rng::hop_base(seed, hop);

  auto count = [&](int64_t i) {
    const RowRange rr = row_range(ip, rows, num_edges, nd[i]);
    return weighted_count(positive_count(wt + rr.start, rr.deg), fanout, replace);
  };
  auto fill = [&](int64_t i, int64_t* nbr, int64_t* eo) {
    const RowRange rr = row_range(ip, rows, num_edges, nd[i]);
    const int64_t npos = positive_count(wt + rr.start, rr.deg);
    const int64_t c = weighted_count(npos, fanout, replace);
    weighted_positions(wt + rr.start, rr.deg, npos, fanout, replace, rng::node_key(base, gd[i]), eo);
    for (int64_t q = 0; q < c; ++q) {
      const int64_t e = rr.start + eo[q];
      nbr[q] = ind[e];
      eo[q] = ed[e];
    }
  };
  return sample_frontier(nodes.numel(), count, fill);
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) { m.impl("weighted_one_hop", &weighted_one_hop_cpu); }

}  // namespace cpu
}  // namespace graphfeed
