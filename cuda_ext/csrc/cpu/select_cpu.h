// CPU helpers shared by the sampling kernels: the uniform selection rule for any k,
// frontier offsets, and a two-pass (count, then fill) driver parallel over nodes.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "../select.h"

namespace graphfeed {
namespace cpu {

constexpr int64_t kNodeGrain = 256;    // frontier nodes per parallel task
constexpr int64_t kLinearFloyd = 64;   // above this k, Floyd tracks taken positions in a bitmap

// Floyd's algorithm for large k: same integers as floyd_linear, O(k) with a bitmap.
inline void floyd_bitmap(int64_t deg, int64_t k, uint64_t key, int64_t* out) {
  thread_local std::vector<uint64_t> bits;
  const size_t words = static_cast<size_t>((deg + 63) / 64);
  if (bits.size() < words) bits.assign(words, 0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = deg - k + i;
    const int64_t t = rng::draw(key, i) % (j + 1);
    const bool taken = (bits[t >> 6] >> (t & 63)) & 1;
    const int64_t v = taken ? j : t;
    bits[v >> 6] |= uint64_t(1) << (v & 63);
    out[i] = v;
  }
  for (int64_t i = 0; i < k; ++i) bits[out[i] >> 6] = 0;
}

// The uniform rule (select.h) for any fanout: writes sample_count(...) positions.
inline void sample_positions(int64_t deg, int64_t fanout, bool replace, uint64_t key, int64_t* out) {
  if (takes_all(deg, fanout, replace) || replace || fanout <= kLinearFloyd) {
    sample_positions_small(deg, fanout, replace, key, out);
    return;
  }
  floyd_bitmap(deg, fanout, key, out);
  std::sort(out, out + fanout);
}

// Exclusive prefix sum of counts[0..n) into offsets[0..n]; returns the total.
inline int64_t exclusive_offsets(const int64_t* counts, int64_t n, int64_t* offsets) {
  int64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    offsets[i] = acc;
    acc += counts[i];
  }
  offsets[n] = acc;
  return acc;
}

// Two passes over a frontier of n nodes, parallel and thread-count independent:
// count(i) -> how many neighbors node i gets; fill(i, nbr, eid) writes them.
template <class CountFn, class FillFn>
std::tuple<at::Tensor, at::Tensor, at::Tensor> sample_frontier(int64_t n, const CountFn& count, const FillFn& fill) {
  at::Tensor counts = at::empty({n}, at::kLong);
  int64_t* cnt = counts.data_ptr<int64_t>();
  at::parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) cnt[i] = count(i);
  });
  std::vector<int64_t> off(n + 1);
  const int64_t total = exclusive_offsets(cnt, n, off.data());
  at::Tensor nbr = at::empty({total}, at::kLong);
  at::Tensor eids = at::empty({total}, at::kLong);
  int64_t* nb = nbr.data_ptr<int64_t>();
  int64_t* eo = eids.data_ptr<int64_t>();
  at::parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (cnt[i]) fill(i, nb + off[i], eo + off[i]);
    }
  });
  return {counts, nbr, eids};
}

// Start and degree of row ``r``, checked against the topology.
struct RowRange {
  int64_t start, deg;
};

inline RowRange row_range(const int64_t* indptr, int64_t rows, int64_t num_edges, int64_t r) {
  TORCH_CHECK(r >= 0 && r < rows, "frontier row ", r, " is outside the topology (", rows,
              " rows); local_nodes must index indptr's rows");
  const int64_t s = indptr[r], t = indptr[r + 1];
  TORCH_CHECK(0 <= s && s <= t && t <= num_edges, "indptr is corrupt at row ", r, " (", s, "..", t, " with ",
              num_edges, " edges)");
  return {s, t - s};
}

}  // namespace cpu
}  // namespace graphfeed
