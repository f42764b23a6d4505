// Counter-based random numbers shared by every kernel (CPU and CUDA).
//
// The specification is graphfeed/server/sampling/rng.py: every random choice is
//   base   = mix64(seed + GOLDEN * (hop + 1))
//   key_v  = mix64(gid_v ^ base)
//   draw_i = mix64(key_v + GOLDEN * (i + 1)) >> 1        (uint64 wrap-around)
// so a node's sample depends only on (seed, hop, node id), never on the thread or
// the order nodes are visited.  The kernels must give the reference's integers bit
// for bit; change nothing here without changing rng.py the same way.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GF_HD __host__ __device__ __forceinline__
#else
#define GF_HD inline
#endif

namespace graphfeed {
namespace rng {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kM1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kM2 = 0x94D049BB133111EBULL;

// splitmix64 finalizer.
GF_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kM1;
  z = (z ^ (z >> 27)) * kM2;
  return z ^ (z >> 31);
}

// Per-(batch seed, hop) key.  ``seed`` is the batch seed reinterpreted as uint64.
GF_HD uint64_t hop_base(int64_t seed, int64_t hop) {
  return mix64(static_cast<uint64_t>(seed) + kGolden * static_cast<uint64_t>(hop + 1));
}

// Per-node key under a hop's base.
GF_HD uint64_t node_key(uint64_t base, int64_t gid) {
  return mix64(static_cast<uint64_t>(gid) ^ base);
}

// Non-negative 63-bit draw number ``i`` of a node.
GF_HD int64_t draw(uint64_t key, int64_t i) {
  return static_cast<int64_t>(mix64(key + kGolden * static_cast<uint64_t>(i + 1)) >> 1);
}

// Uniform double in (0, 1] from draw ``i`` (53 bits; exact in float64).
GF_HD double unit_open(uint64_t key, int64_t i) {
  return static_cast<double>((draw(key, i) >> 10) + 1) * (1.0 / 9007199254740992.0);
}

// Uniform double in [0, 1) from draw ``i`` (53 bits; exact in float64).
GF_HD double unit_closed_open(uint64_t key, int64_t i) {
  return static_cast<double>(draw(key, i) >> 10) * (1.0 / 9007199254740992.0);
}

}  // namespace rng
}  // namespace graphfeed
