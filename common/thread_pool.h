// A fixed pool of worker threads for data-parallel loops (the CPU backend's matrix products).
// ParallelFor may be called from any thread; while one caller uses the workers, other
// callers run their loop inline. It blocks until all chunks ran.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moeshard {

class ThreadPool {
 public:
  // num_threads <= 0 picks the number of hardware threads (MOESHARD_THREADS overrides).
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool used by the CPU kernels.
  static ThreadPool& Default();

 private:
  void WorkerLoop(int idx);
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // held by the caller that owns the workers
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0, job_chunks_ = 0;
  int64_t next_chunk_ = 0, chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace moeshard
