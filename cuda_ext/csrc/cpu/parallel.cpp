// Worker pool behind graphfeed::cpu::parallel_for (see parallel.h).
#include "parallel.h"

#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace graphfeed {
namespace cpu {
namespace {

thread_local bool in_pool_task = false;
constexpr int64_t kChunksPerThread = 8;

struct Job {
  const std::function<void(int64_t)>* task;
  int64_t tasks;
  std::atomic<int64_t> next{0}, remaining{0};
  std::mutex error_mutex;
  std::exception_ptr error;
};

class Pool {
 public:
  // Never destroyed: its detached workers may outlive static destruction at exit.
  static Pool*& instance() {
    static Pool* pool = new Pool();
    return pool;
  }

  bool try_run(int64_t tasks, const std::function<void(int64_t)>& task) {
    std::unique_lock<std::mutex> busy(submit_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    ensure_workers(std::min(tasks, num_threads()) - 1);
    auto job = std::make_shared<Job>();
    job->task = &task;
    job->tasks = tasks;
    job->remaining = tasks;
    {
      std::lock_guard<std::mutex> lk(mutex_);
      current_ = job;
      ++generation_;
    }
    wake_.notify_all();
    drain(*job);
    for (int spin = 0; spin < 2000 && job->remaining.load(std::memory_order_acquire) > 0; ++spin) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lk(mutex_);
      done_.wait(lk, [&] { return job->remaining.load() == 0; });
      current_.reset();
    }
    if (job->error) std::rethrow_exception(job->error);
    return true;
  }

 private:
  void ensure_workers(int64_t count) {
    while (static_cast<int64_t>(started_) < count) {
      std::thread([this] { worker_loop(); }).detach();
      ++started_;
    }
  }

  void worker_loop() {
    in_pool_task = true;
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(mutex_);
        wake_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        job = current_;
      }
      if (job) drain(*job);
    }
  }

  void drain(Job& job) {
    const bool was = in_pool_task;
    in_pool_task = true;
    for (int64_t t; (t = job.next.fetch_add(1)) < job.tasks;) {
      try {
        (*job.task)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(job.error_mutex);
        if (!job.error) job.error = std::current_exception();
      }
      if (job.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mutex_);
        done_.notify_all();
      }
    }
    in_pool_task = was;
  }

  std::mutex submit_, mutex_;
  std::condition_variable wake_, done_;
  std::shared_ptr<Job> current_;
  uint64_t generation_ = 0;
  size_t started_ = 0;
};

// A forked child has none of the parent's threads: give it a fresh pool (the old one leaks).
void reset_pool_in_child() { Pool::instance() = new Pool(); }
[[maybe_unused]] const int atfork_registered = pthread_atfork(nullptr, nullptr, reset_pool_in_child);

}  // namespace

int64_t num_threads() { return std::max<int64_t>(1, at::get_num_threads()); }

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  const int64_t g = std::max<int64_t>(grain, 1), threads = num_threads();
  // Several chunks per thread, taken from a shared counter: a thread the OS deschedules
  // (busy machine) delays one small chunk, and the others take the rest.
  const int64_t tasks = (in_pool_task || threads == 1) ? 1 : std::min(threads * kChunksPerThread, (n + g - 1) / g);
  if (tasks <= 1) {
    f(begin, end);
    return;
  }
  const int64_t chunk = (n + tasks - 1) / tasks;
  const std::function<void(int64_t)> task = [&](int64_t t) {
    const int64_t b = begin + t * chunk;
    if (b < end) f(b, std::min(end, b + chunk));
  };
  if (!Pool::instance()->try_run(tasks, task)) f(begin, end);
}

}  // namespace cpu
}  // namespace graphfeed
