// The uniform selection rule (graphfeed/server/sampling/reference.py), written once
// for the CPU and CUDA kernels:
//   * fanout -1, or no replacement and deg <= fanout: every position, in list order;
//   * no replacement, deg > k: Robert Floyd's algorithm -- for i in 0..k-1,
//     j = deg - k + i, t = draw(i) mod (j + 1); take t unless taken, else j --
//     then the k positions in ascending order;
//   * with replacement: k positions draw(i) mod deg in draw order (none if deg = 0).
#pragma once

#include "rng.h"

namespace graphfeed {

// Number of neighbors sampled from a list of ``deg``.
GF_HD int64_t sample_count(int64_t deg, int64_t fanout, bool replace) {
  if (fanout < 0) return deg;
  if (replace) return deg > 0 ? fanout : 0;
  return deg < fanout ? deg : fanout;
}

GF_HD void insertion_sort(int64_t* a, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    int64_t v = a[i];
    int64_t j = i - 1;
    while (j >= 0 && a[j] > v) {
      a[j + 1] = a[j];
      --j;
    }
    a[j + 1] = v;
  }
}

// Floyd's algorithm with a linear membership scan (O(k^2)): fine for the small
// fanouts of GNN sampling; the CPU kernel switches to a bitmap for large k.
// Writes k distinct positions in [0, deg) to ``out`` in draw order (unsorted).
GF_HD void floyd_linear(int64_t deg, int64_t k, uint64_t key, int64_t* out) {
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = deg - k + i;
    const int64_t t = rng::draw(key, i) % (j + 1);
    bool taken = false;
    for (int64_t q = 0; q < i; ++q) taken |= (out[q] == t);
    out[i] = taken ? j : t;
  }
}

// True when the selection is "every position in list order".
GF_HD bool takes_all(int64_t deg, int64_t fanout, bool replace) {
  return fanout < 0 || (!replace && deg <= fanout);
}

// Positions for a node whose selection is small enough for floyd_linear; ``out``
// holds sample_count(deg, fanout, replace) entries.
GF_HD void sample_positions_small(int64_t deg, int64_t fanout, bool replace, uint64_t key, int64_t* out) {
  if (takes_all(deg, fanout, replace)) {
    for (int64_t i = 0; i < deg; ++i) out[i] = i;
  } else if (replace) {
    for (int64_t i = 0; i < fanout; ++i) out[i] = rng::draw(key, i) % deg;
  } else {
    floyd_linear(deg, fanout, key, out);
    insertion_sort(out, fanout);
  }
}

}  // namespace graphfeed
