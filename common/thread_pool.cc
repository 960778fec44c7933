#include "common/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace moeshard {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) {
    const char* env = std::getenv("MOESHARD_THREADS");
    num_threads = env ? std::atoi(env) : 0;
    if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = new ThreadPool(0);
  return *pool;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = std::max<int64_t>(1, n / grain);
  int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(size()) * 4);
  std::unique_lock<std::mutex> owner(call_mu_, std::try_to_lock);
  if (chunks <= 1 || workers_.empty() || !owner.owns_lock()) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  cv_.notify_all();
  // The calling thread works too.
  for (;;) {
    int64_t c;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (next_chunk_ >= job_chunks_) break;
      c = next_chunk_++;
    }
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    std::lock_guard<std::mutex> l(mu_);
    if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
  }
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return chunks_done_ == job_chunks_; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (job_ != nullptr && next_chunk_ < job_chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, chunk = job_chunk_;
      l.unlock();
      (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
      l.lock();
      if (++chunks_done_ == job_chunks_) done_cv_.notify_all();
    }
  }
}

}  // namespace moeshard
