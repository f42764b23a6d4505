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
#include "parallel.h"

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
  parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) cnt[i] = count(i);
  });
  std::vector<int64_t> off(n + 1);
  const int64_t total = exclusive_offsets(cnt, n, off.data());
  at::Tensor nbr = at::empty({total}, at::kLong);
  at::Tensor eids = at::empty({total}, at::kLong);
  int64_t* nb = nbr.data_ptr<int64_t>();
  int64_t* eo = eids.data_ptr<int64_t>();
  parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
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

constexpr int64_t kRowLookahead = 16;     // count pass: rows whose indptr entry is prefetched ahead
constexpr int64_t kFillLookahead = 6;     // fill pass: nodes whose picks are computed/prefetched ahead
constexpr int64_t kMaxPrefetchPerNode = 16;

// Pass 1 of a uniform hop: each frontier row's span and sample count (parallel; rows
// prefetched ahead because indptr reads are random).  ``row_of(i)`` is node i's row.
template <class RowOf>
void count_rows(int64_t n, const int64_t* indptr, int64_t rows, int64_t num_edges, int64_t fanout, bool replace,
                const RowOf& row_of, RowRange* span, int64_t* cnt) {
  parallel_for(0, n, kNodeGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kRowLookahead < e) {
        const int64_t r = row_of(i + kRowLookahead);
        if (r >= 0 && r < rows) __builtin_prefetch(indptr + r);
      }
      span[i] = row_range(indptr, rows, num_edges, row_of(i));
      cnt[i] = sample_count(span[i].deg, fanout, replace);
    }
  });
}

// Pass 2 of a uniform hop over nodes [b, e), software-pipelined: node i + D's picks are
// drawn into its output slots and their edges prefetched while node i's picks are read.
// ``gid_of(i)`` keys the RNG; ``side(q, i)`` records output slot q's frontier node.
template <class GidOf, class Side>
void fill_uniform(int64_t b, int64_t e, const RowRange* span, const int64_t* off, const int64_t* indices,
                  const int64_t* eid, int64_t fanout, bool replace, uint64_t base, const GidOf& gid_of, int64_t* nbr,
                  int64_t* eo, const Side& side) {
  auto draw_ahead = [&](int64_t i) {
    const int64_t c = off[i + 1] - off[i];
    if (!c) return;
    int64_t* pos = eo + off[i];
    sample_positions(span[i].deg, fanout, replace, rng::node_key(base, gid_of(i)), pos);
    const int64_t s = span[i].start;
    for (int64_t q = 0; q < std::min(c, kMaxPrefetchPerNode); ++q) {
      __builtin_prefetch(indices + s + pos[q]);
      __builtin_prefetch(eid + s + pos[q]);
    }
  };
  for (int64_t i = b; i < std::min(b + kFillLookahead, e); ++i) draw_ahead(i);
  for (int64_t i = b; i < e; ++i) {
    if (i + kFillLookahead < e) draw_ahead(i + kFillLookahead);
    const int64_t s = span[i].start;
    for (int64_t q = off[i]; q < off[i + 1]; ++q) {
      const int64_t edge = s + eo[q];
      nbr[q] = indices[edge];
      eo[q] = eid[edge];
      side(q, i);
    }
  }
}

}  // namespace cpu
}  // namespace graphfeed
