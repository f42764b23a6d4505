// ShardedIdMap: parallel insert and relabel passes (see id_map.h).
#include "id_map.h"

namespace graphfeed {
namespace cpu {

namespace {
constexpr int64_t kGrain = 1 << 14;
}

bool ShardedIdMap::insert_known(const int64_t* keys, const int64_t* vals, int64_t n, bool unique) {
  std::atomic<bool> ok{true};
  std::atomic<int64_t> duplicate{-1}, negative{0};
  at::parallel_for(0, shards_, 1, [&](int64_t sb, int64_t se) {
    for (int64_t shard = sb; shard < se; ++shard) {
      int64_t used = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = keys[i];
        if (k < 0) {
          negative = 1;
          continue;
        }
        const uint64_t h = hash(k);
        if (shard_of(h) != shard) continue;
        bool inserted;
        if (find_or_insert(shard, h, k, vals ? vals[i] : i, &inserted, &used) < 0) {
          ok = false;
          return;
        }
        if (!inserted && unique) duplicate = k;
      }
    }
  });
  TORCH_CHECK(negative == 0, "node ids must be >= 0");
  TORCH_CHECK(duplicate < 0, "seed node ", duplicate.load(), " appears more than once; seeds must be distinct");
  return ok;
}

bool ShardedIdMap::relabel(const int64_t* cand, int64_t n, int64_t num_known, int64_t* local,
                           std::vector<int64_t>& new_ids, bool persist) {
  slot_of_.resize(n);
  rank_.resize(n + 1);
  int64_t* slot_of = slot_of_.data();
  int64_t* rank = rank_.data();
  std::atomic<bool> ok{true};
  std::atomic<int64_t> negative{0};
  // Pass 1 (parallel over shards): find or insert; flag first appearances.
  at::parallel_for(0, shards_, 1, [&](int64_t sb, int64_t se) {
    for (int64_t shard = sb; shard < se; ++shard) {
      int64_t used = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = cand[i];
        if (k < 0) {
          if (shard == 0) negative = 1;
          continue;
        }
        const uint64_t h = hash(k);
        if (shard_of(h) != shard) continue;
        bool inserted;
        const int64_t s = find_or_insert(shard, h, k, -(i + 1), &inserted, &used);
        if (s < 0) {
          ok = false;
          return;
        }
        slot_of[i] = s;
        rank[i] = inserted;
      }
    }
  });
  TORCH_CHECK(negative == 0, "node ids must be >= 0 (a neighbor id is negative: is the topology corrupt?)");
  if (!ok) return false;
  // Pass 2: exclusive scan of the flags -> rank of each first appearance.
  int64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t f = rank[i];
    rank[i] = acc;
    acc += f;
  }
  rank[n] = acc;
  const size_t old = new_ids.size();
  new_ids.resize(old + acc);
  int64_t* out_new = new_ids.data() + old;
  Slot* slots = slots_.data();
  // Pass 3 (parallel over candidates): local ids, and the new ids in order.
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t v = slots[slot_of[i]].val;
      local[i] = v >= 0 ? v : num_known + rank[-(v + 1)];
      if (rank[i + 1] != rank[i]) out_new[rank[i]] = cand[i];
    }
  });
  if (persist) {  // Pass 4: new nodes become known, keyed to their local ids.
    at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        if (rank[i + 1] != rank[i]) slots[slot_of[i]].val = num_known + rank[i];
      }
    });
  }
  return true;
}

}  // namespace cpu
}  // namespace graphfeed
