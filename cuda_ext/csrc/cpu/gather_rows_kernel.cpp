// CPU kernel of graphfeed::gather_rows / gather_rows_into: parallel row copies.
#include <torch/library.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <mutex>

#include "../gather_rows.h"
#include "parallel.h"

namespace graphfeed {
namespace cpu {
namespace {

constexpr int64_t kPrefetchAhead = 8;

void gather_into(const at::Tensor& src, const at::Tensor& index, at::Tensor& out) {
  const at::Tensor idx = index.contiguous();
  const int64_t n = idx.numel(), rows = src.size(0);
  const int64_t row_bytes = rows ? static_cast<int64_t>(src.nbytes()) / rows : 0;
  const char* s = static_cast<const char*>(src.const_data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t* ix = idx.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 16) / std::max<int64_t>(row_bytes, 1));
  parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = ix[i];
      TORCH_CHECK(r >= 0 && r < rows, "index ", r, " is out of range for src with ", rows, " rows");
      if (i + kPrefetchAhead < e) {
        const int64_t nr = ix[i + kPrefetchAhead];
        if (nr >= 0 && nr < rows) __builtin_prefetch(s + nr * row_bytes);
      }
      std::memcpy(o + i * row_bytes, s + r * row_bytes, row_bytes);
    }
  });
}

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeFrom = size_t(8) << 20;

// Freed huge-page row blocks kept for the next batch's rows: a block the kernel has already
// faulted in and zeroed is written at copy speed, where a fresh one costs a page fault and a
// 2 MiB clear per huge page (perf of a sampler worker: clear_page 7-12% of its CPU).  Bounded
// (kMaxBlocks, kMaxBytes); a block is reused only for a request of at least half its size.
// Deleters run on whichever thread drops the tensor (TensorPipe's, the trainer's pull), hence
// the mutex.  Deliberately leaked: tensors may be freed during interpreter shutdown.
class RowBlockPool {
 public:
  static RowBlockPool& get() {
    static RowBlockPool* pool = new RowBlockPool();
    return *pool;
  }

  // A block of at least ``bytes`` (and at most twice that) from the pool, or nullptr.
  void* take(size_t bytes, size_t* size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > 2 * bytes) return nullptr;
    void* p = it->second;
    *size = it->first;
    held_ -= it->first;
    free_.erase(it);
    return p;
  }

  void give(void* p, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.size() < kMaxBlocks && held_ + size <= kMaxBytes) {
        free_.emplace(size, p);
        held_ += size;
        return;
      }
    }
    std::free(p);
  }

 private:
  static constexpr size_t kMaxBlocks = 8;
  static constexpr size_t kMaxBytes = size_t(512) << 20;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t held_ = 0;
};

// A block of at least ``bytes`` (its size in ``*size``): a pooled one, else a fresh one on huge pages.
void* take_block(size_t bytes, size_t* size) {
  void* p = RowBlockPool::get().take(bytes, size);
  if (p != nullptr) return p;
  *size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  p = std::aligned_alloc(kHugePage, *size);
  TORCH_CHECK(p != nullptr, "out of memory allocating ", *size, " bytes");
  madvise(p, *size, MADV_HUGEPAGE);  // advisory: ignored where THP is off
  return p;
}

// A fresh multi-MB output costs more in page faults than the gather itself (measured:
// 122 MB of rows, 87 ms fresh vs 20-30 ms into a reused buffer); transparent huge pages
// cut the faults 512-fold, and the pool above avoids them for the next batches.  Small
// outputs use torch's allocator.
at::Tensor empty_rows(const std::vector<int64_t>& sizes, const at::Tensor& like) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * like.element_size();
  if (bytes < kHugeFrom) return at::empty(sizes, like.options());
  size_t size = 0;
  void* p = take_block(bytes, &size);
  return at::from_blob(p, sizes, [size](void* q) { RowBlockPool::get().give(q, size); }, like.options());
}

// The CPU allocator of a session worker (installed by use_block_pool): every allocation of at least
// kHugeFrom bytes -- gathered rows, and the buffers TensorPipe allocates for what a peer worker
// sends, which perf showed zeroed page by page in the kernel (clear_page_erms) at up to 19% of a
// 2-part run's CPU -- comes from the RowBlockPool (huge pages, reused); smaller ones from the
// allocator it replaces.  Its deleter also frees the replaced allocator's blocks, so raw_deleter
// holds for every pointer it hands out.
class BlockPoolAllocator final : public c10::Allocator {
 public:
  explicit BlockPoolAllocator(c10::Allocator* prev) : prev_(prev), prev_delete_(prev->raw_deleter()) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < kHugeFrom) return prev_->allocate(n);
    size_t size = 0;
    void* p = take_block(n, &size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = size;
    }
    return {p, p, &BlockPoolAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &BlockPoolAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static BlockPoolAllocator* installed;

 private:
  static void release(void* p) {
    BlockPoolAllocator* self = installed;
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->sizes_.find(p);
      if (it != self->sizes_.end()) {
        size = it->second;
        self->sizes_.erase(it);
      }
    }
    if (size) {
      RowBlockPool::get().give(p, size);
    } else {
      self->prev_delete_(p);  // a small block of the replaced allocator (raw_deallocate)
    }
  }

  c10::Allocator* prev_;
  c10::DeleterFnPtr prev_delete_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
};

BlockPoolAllocator* BlockPoolAllocator::installed = nullptr;

// Make the block pool this process's CPU allocator for large blocks (once; later calls change nothing);
// true when it is the CPU allocator now (false: an allocator registered with a higher priority wins).
// Deliberately leaked, like the pool: tensors outlive any teardown.
bool use_block_pool() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (BlockPoolAllocator::installed != nullptr) return c10::GetCPUAllocator() == BlockPoolAllocator::installed;
  c10::Allocator* prev = c10::GetCPUAllocator();
  TORCH_CHECK(prev->raw_deleter() != nullptr, "the current CPU allocator has no raw deleter; the block pool "
              "cannot stand in front of it");
  BlockPoolAllocator::installed = new BlockPoolAllocator(prev);
  c10::SetCPUAllocator(BlockPoolAllocator::installed, /*priority=*/100);
  return c10::GetCPUAllocator() == BlockPoolAllocator::installed;
}

at::Tensor gather_rows_cpu(const at::Tensor& src, const at::Tensor& index) {
  check_gather_rows_args(src, index);
  auto sizes = src.sizes().vec();
  sizes[0] = index.numel();
  at::Tensor out = empty_rows(sizes, src);
  gather_into(src, index, out);
  return out;
}

void gather_rows_into_cpu(const at::Tensor& src, const at::Tensor& index, const at::Tensor& out) {
  check_gather_rows_out(src, index, out);
  TORCH_CHECK(src.device().is_cpu(), "src must be a CPU tensor for a CPU gather");
  at::Tensor o = out;
  gather_into(src, index, o);
}

at::Tensor empty_rows_cpu(const at::Tensor& like, int64_t rows) {
  TORCH_CHECK(like.dim() >= 1, "like must have at least one dimension (rows first)");
  TORCH_CHECK(rows >= 0, "rows must be >= 0, got ", rows);
  auto sizes = like.sizes().vec();
  sizes[0] = rows;
  return empty_rows(sizes, like);
}

void gather_rows_to_cpu(const at::Tensor& src, const c10::optional<at::Tensor>& index, const at::Tensor& out,
                        const at::Tensor& out_index) {
  check_gather_rows_to_args(src, index, out, out_index);
  TORCH_CHECK(src.device().is_cpu() && out.device().is_cpu() && out_index.device().is_cpu() &&
                  (!index.has_value() || index->device().is_cpu()),
              "gather_rows_to runs on the CPU: give CPU tensors");
  const at::Tensor oix = out_index.contiguous();
  const at::Tensor idx = index.has_value() ? index->contiguous() : at::Tensor();
  const int64_t n = oix.numel(), rows = src.size(0), out_rows = out.size(0);
  const int64_t row_bytes = rows ? static_cast<int64_t>(src.nbytes()) / rows : 0;
  const char* s = static_cast<const char*>(src.const_data_ptr());
  char* o = static_cast<char*>(out.data_ptr());
  const int64_t* ix = idx.defined() ? idx.data_ptr<int64_t>() : nullptr;
  const int64_t* ox = oix.data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(16, (int64_t(1) << 16) / std::max<int64_t>(row_bytes, 1));
  parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = ix ? ix[i] : i, d = ox[i];
      TORCH_CHECK(r >= 0 && r < rows, "index ", r, " is out of range for src with ", rows, " rows");
      TORCH_CHECK(d >= 0 && d < out_rows, "out_index ", d, " is out of range for out with ", out_rows, " rows");
      if (ix && i + kPrefetchAhead < e) {
        const int64_t nr = ix[i + kPrefetchAhead];
        if (nr >= 0 && nr < rows) __builtin_prefetch(s + nr * row_bytes);
      }
      std::memcpy(o + d * row_bytes, s + r * row_bytes, row_bytes);
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(graphfeed, CPU, m) {
  m.impl("gather_rows", &gather_rows_cpu);
  m.impl("gather_rows_into", &gather_rows_into_cpu);
  m.impl("gather_rows_to", &gather_rows_to_cpu);
  m.impl("empty_rows", &empty_rows_cpu);
}

TORCH_LIBRARY_FRAGMENT(graphfeed, m) {
  m.def("use_block_pool() -> bool", &use_block_pool);
}

}  // namespace cpu
}  // namespace graphfeed
