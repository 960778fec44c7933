// Where a GPU step's time goes: CUDA event pairs around the regions of the forward pass
// (attention, expert step, dense projections, LM head, the rest), summed per category
// once the stream has been synchronized. Off unless RunnerOptions::profile; events come
// from a pool made at start, so profiling allocates nothing per step. One stream, one thread.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

namespace moeshard::gpu {

class StepProfiler {
 public:
  ~StepProfiler();
  void Enable(int max_regions_per_step);
  // Regions are timed only while active (Enable activates); off, a Scope costs a branch.
  void SetActive(bool on) { active_ = on && !events_.empty(); }
  bool enabled() const { return active_; }

  class Scope {
   public:
    Scope(StepProfiler* p, const char* category, cudaStream_t s);
    ~Scope();
   private:
    StepProfiler* p_;
    cudaStream_t s_;
    int idx_ = -1;
  };
  Scope Region(const char* category, cudaStream_t s) { return Scope(this, category, s); }

  // After the stream has been synchronized: adds this step's regions to the totals.
  void Collect();
  void Reset();
  std::string Report() const;  // "category: ms (share)" lines, largest first

 private:
  std::vector<cudaEvent_t> events_;   // pairs
  std::vector<const char*> pending_;  // category of each recorded pair
  std::map<std::string, double> total_ms_;
  int steps_ = 0;
  bool active_ = false;
};

}  // namespace moeshard::gpu
