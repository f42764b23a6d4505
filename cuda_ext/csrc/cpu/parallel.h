// A small worker pool for the CPU kernels, used instead of at::parallel_for.
//
// Why not OpenMP: torch's OpenMP threads spin between parallel regions.  A fused
// multi-hop call has ~15 short regions, and on a machine with more runnable threads
// than cores (a sampler server runs several workers; CI shares its cores) the spinning
// thread takes the core its partner needs: measured here, 2 threads ran at 0.3-0.6x of
// 1 thread with OpenMP's default wait policy, 1.2x+ with a passive one.  These workers
// sleep on a condition variable when idle.  The thread count follows
// torch.get_num_threads().  Results never depend on it: kernels write by index.
#pragma once

#include <cstdint>
#include <functional>

namespace graphfeed {
namespace cpu {

// Threads a kernel may use now (torch.get_num_threads()).
int64_t num_threads();

// Calls f(b, e) on disjoint chunks covering [begin, end) (at least ``grain`` items each, a
// few per thread) on up to num_threads() threads; rethrows the first exception a chunk raised.
// Runs inline when nested, when one chunk suffices, or when another call holds the pool.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

}  // namespace cpu
}  // namespace graphfeed
