// Hash map from global node id to local id, sharded so that relabelling runs in
// parallel without atomics and still numbers new nodes in order of first appearance.
//
// Each shard is an open-addressing table (linear probing) owned by one thread during
// an insert pass; a key's shard comes from the high bits of its hash.  A shard's
// thread scans the candidates in order, so the first insertion of a key IS its first
// appearance.  New keys are stored with val = -(first position + 1); an exclusive
// scan over "first appearance" flags then gives each new node its rank.  The output
// never depends on the number of shards or threads.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "../rng.h"
#include "parallel.h"

namespace graphfeed {
namespace cpu {

class ShardedIdMap {
 public:
  struct Slot {
    int64_t key;  // -1 = empty
    int64_t val;  // >= 0: local id; < 0: new node first seen at candidate -(val + 1)
  };

  // Empties the map and sizes it for up to ``max_keys`` keys.
  void reset(int64_t max_keys) {
    shards_ = std::max<int64_t>(1, num_threads());
    int64_t per = std::max<int64_t>(64, (2 * max_keys + shards_ - 1) / shards_);
    cap_ = 64;
    while (cap_ < per) cap_ <<= 1;
    max_keys_ = max_keys;
    const int64_t total = cap_ * shards_;
    if (static_cast<int64_t>(slots_.size()) < total) slots_.resize(total);
    Slot* s = slots_.data();
    parallel_for(0, total, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) s[i] = Slot{-1, 0};
    });
  }

  bool fits(int64_t max_keys) const { return cap_ > 0 && max_keys <= max_keys_; }
  int64_t shards() const { return shards_; }
  Slot* slots() { return slots_.data(); }

  static uint64_t hash(int64_t key) { return rng::mix64(static_cast<uint64_t>(key)); }
  int64_t shard_of(uint64_t h) const { return static_cast<int64_t>(((h >> 32) * static_cast<uint64_t>(shards_)) >> 32); }

  // Slot of ``key`` in ``shard`` (whose caller owns it), inserting {key, val} when absent.
  // Returns -1 when the shard is too full: the caller resets with more room and retries.
  int64_t find_or_insert(int64_t shard, uint64_t h, int64_t key, int64_t val, bool* inserted, int64_t* used) {
    Slot* base = slots_.data() + shard * cap_;
    const int64_t mask = cap_ - 1;
    for (int64_t p = static_cast<int64_t>(h) & mask;; p = (p + 1) & mask) {
      if (base[p].key == key) {
        *inserted = false;
        return shard * cap_ + p;
      }
      if (base[p].key == -1) {
        if (++*used > cap_ - cap_ / 8) return -1;
        base[p] = Slot{key, val};
        *inserted = true;
        return shard * cap_ + p;
      }
    }
  }

  // Slot of a key known to be present.
  int64_t find(int64_t key) const {
    const uint64_t h = hash(key);
    const int64_t shard = shard_of(h);
    const Slot* base = slots_.data() + shard * cap_;
    const int64_t mask = cap_ - 1;
    int64_t p = static_cast<int64_t>(h) & mask;
    while (base[p].key != key) p = (p + 1) & mask;
    return shard * cap_ + p;
  }

  // Inserts keys[i] -> vals[i] (vals == nullptr: i).  Returns false when a shard overflowed;
  // raises on a negative key, or on a repeated key when ``unique`` is set.
  bool insert_known(const int64_t* keys, const int64_t* vals, int64_t n, bool unique);

  // One relabel round for candidates[0..n) (>= 0) against the map's keys, whose values
  // are local ids.  Writes local[n], appends the new ids (first-appearance order) to
  // ``new_ids``; with ``persist`` the new nodes stay in the map as num_known + rank.
  // Returns false (outputs undefined, map polluted) when a shard overflowed.
  bool relabel(const int64_t* cand, int64_t n, int64_t num_known, int64_t* local, std::vector<int64_t>& new_ids,
               bool persist);

 private:
  std::vector<Slot> slots_;
  std::vector<int64_t> slot_of_, rank_;
  int64_t shards_ = 0, cap_ = 0, max_keys_ = -1;
};

// The same contract over a dense array indexed by node id (ids in [0, bound)): no hashing
// and no probing, and at 4 bytes per id the array of a graph of a few million nodes stays
// in the last-level cache, where a hash table sized for a batch does not.  Relabel is one
// serial pass (see id_map.cpp).  Only the entries a call touched are cleared afterwards (``clear``); a call
// that raised leaves the map dirty and the next ``reset`` refills it.
class DenseIdMap {
 public:
  static constexpr int32_t kEmpty = INT32_MIN;
  static constexpr int64_t kMaxIds = int64_t(1) << 26;   // 256 MiB of map at most; larger graphs hash

  // Ids must lie in [0, bound); raises when bound or the batch exceed int32 ranges.
  void reset(int64_t bound);
  bool fits(int64_t) const { return true; }
  bool insert_known(const int64_t* keys, const int64_t* vals, int64_t n, bool unique);
  bool relabel(const int64_t* cand, int64_t n, int64_t num_known, int64_t* local, std::vector<int64_t>& new_ids,
               bool persist);
  // Empties the entries of ``ids`` (every id the call inserted) and marks the map clean.
  void clear(const int64_t* ids, int64_t n);

 private:
  std::vector<int32_t> map_;
  int64_t bound_ = 0;
  bool dirty_ = true;
};

}  // namespace cpu
}  // namespace graphfeed
