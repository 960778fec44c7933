#include "kernels/cuda/probe.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_check.h"

namespace moeshard::gpu {
namespace {

struct ProbeState {
  std::mutex mu;
  std::vector<ProbeSetter> units;
  void* buffer = nullptr;
  uint32_t capacity = 0;
};
ProbeState& State() {
  static ProbeState* s = new ProbeState;  // used from static initializers: never destroyed
  return *s;
}

absl::Status PointUnits(void* p) {
  for (ProbeSetter set : State().units) MOESHARD_CUDA_RETURN_IF_ERROR(set(p));
  return absl::OkStatus();
}

}  // namespace

bool RegisterProbeUnit(ProbeSetter set) {
  std::lock_guard<std::mutex> l(State().mu);
  State().units.push_back(set);
  return true;
}

bool ProbeCompiledIn() {
  std::lock_guard<std::mutex> l(State().mu);
  return !State().units.empty();
}

absl::Status ProbeArm(uint32_t capacity) {
  ProbeState& s = State();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.units.empty()) return absl::FailedPreconditionError("this build has no probe (configure with -DMOESHARD_PROBE=ON)");
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  if (capacity > s.capacity) {
    if (s.buffer) MOESHARD_CUDA_RETURN_IF_ERROR(cudaFree(s.buffer));
    s.buffer = nullptr;
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaMalloc(&s.buffer, sizeof(ProbeHeader) + size_t{capacity} * sizeof(ProbeRecord)));
    s.capacity = capacity;
  }
  const ProbeHeader h{0, s.capacity, 0};
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.buffer, &h, sizeof(h), cudaMemcpyHostToDevice));
  return PointUnits(s.buffer);
}

absl::Status ProbeDisarm() {
  std::lock_guard<std::mutex> l(State().mu);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return PointUnits(nullptr);
}

absl::StatusOr<std::vector<ProbeRecord>> ProbeCollect(uint32_t* dropped) {
  ProbeState& s = State();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.buffer) return absl::FailedPreconditionError("the probe is not armed");
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  ProbeHeader h;
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpy(&h, s.buffer, sizeof(h), cudaMemcpyDeviceToHost));
  const uint32_t n = std::min(h.count, s.capacity);
  if (dropped) *dropped = h.count - n;
  std::vector<ProbeRecord> r(n);
  if (n > 0) {
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpy(r.data(), static_cast<char*>(s.buffer) + sizeof(ProbeHeader),
                                             n * sizeof(ProbeRecord), cudaMemcpyDeviceToHost));
  }
  const ProbeHeader zero{0, s.capacity, 0};
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpy(s.buffer, &zero, sizeof(zero), cudaMemcpyHostToDevice));
  return r;
}

std::string ProbeTimeline(const std::vector<ProbeRecord>& records) {
  struct Launch {
    std::string shape;
    uint32_t blocks = 0, seen = 0;
    uint64_t first_start = UINT64_MAX, last_start = 0, first_wait = UINT64_MAX, last_wait = 0;
    double mark_sum[kProbeMarks] = {};  // each mark's time after the launch's first release, summed
    uint64_t mark_max[kProbeMarks] = {};
    int mark_n[kProbeMarks] = {};
  };
  std::map<uint64_t, Launch> by_grid;
  uint64_t tick = UINT64_MAX;  // the smallest nonzero step between two recorded times
  std::vector<uint64_t> times;
  for (const ProbeRecord& r : records) {
    Launch& l = by_grid[r.grid];
    if (l.seen == 0) {
      l.shape = absl::StrFormat("%ux%ux%u/%u", r.grid_x, r.grid_y, r.grid_z, r.threads);
      l.blocks = r.grid_x * r.grid_y * r.grid_z;
    }
    ++l.seen;
    l.first_start = std::min(l.first_start, r.t_start);
    l.last_start = std::max(l.last_start, r.t_start);
    l.first_wait = std::min(l.first_wait, r.t_wait);
    l.last_wait = std::max(l.last_wait, r.t_wait);
    times.push_back(r.t_wait);
  }
  for (const ProbeRecord& r : records) {
    Launch& l = by_grid[r.grid];
    for (int k = 0; k < kProbeMarks; ++k) {
      if (r.marks[k] == 0) continue;
      l.mark_sum[k] += (static_cast<double>(r.marks[k]) - static_cast<double>(l.first_wait)) * 1e-3;
      l.mark_max[k] = std::max(l.mark_max[k], r.marks[k]);
      ++l.mark_n[k];
    }
  }
  std::sort(times.begin(), times.end());
  for (size_t i = 1; i < times.size(); ++i) {
    if (times[i] > times[i - 1]) tick = std::min(tick, times[i] - times[i - 1]);
  }
  std::vector<Launch> seq;
  for (auto& [g, l] : by_grid) seq.push_back(l);
  std::sort(seq.begin(), seq.end(), [](const Launch& a, const Launch& b) { return a.first_wait < b.first_wait; });
  if (seq.size() < 2) return "probe: fewer than two launches recorded\n";
  // Per shape, in order of first appearance: the chain share (the next launch's first release
  // minus this one's), how long its first block waited (launched early by PDL), how long after
  // the release its last block started (no room on the SMs before), and the release spread.
  struct Agg {
    int n = 0;
    double chain = 0, lead = 0, late = 0, spread = 0;
    uint32_t blocks = 0, seen = 0;
    double mark_mean[kProbeMarks] = {}, mark_last[kProbeMarks] = {};  // summed over launches
    int mark_launches[kProbeMarks] = {};
  };
  std::vector<std::string> order;
  std::map<std::string, Agg> agg;
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    const Launch& l = seq[i];
    auto [it, fresh] = agg.try_emplace(l.shape);
    if (fresh) order.push_back(l.shape);
    Agg& a = it->second;
    ++a.n;
    a.chain += (seq[i + 1].first_wait - l.first_wait) * 1e-3;
    a.lead += (static_cast<double>(l.first_wait) - static_cast<double>(l.first_start)) * 1e-3;
    a.late += std::max(0.0, static_cast<double>(l.last_start) - static_cast<double>(l.first_wait)) * 1e-3;
    a.spread += (l.last_wait - l.first_wait) * 1e-3;
    a.blocks = l.blocks;
    a.seen = l.seen;
    for (int k = 0; k < kProbeMarks; ++k) {
      if (l.mark_n[k] == 0) continue;
      a.mark_mean[k] += l.mark_sum[k] / l.mark_n[k];
      a.mark_last[k] += (static_cast<double>(l.mark_max[k]) - static_cast<double>(l.first_wait)) * 1e-3;
      ++a.mark_launches[k];
    }
  }
  const double span = (seq.back().first_wait - seq.front().first_wait) * 1e-3;
  std::string out = absl::StrFormat(
      "probe: %d launches, %.1f us from the first release to the last (timer step %s ns); per launch shape "
      "(grid/threads), means in us:\n"
      "| shape | launches | blocks (recorded) | chain share | first block's wait | last block's start after release | "
      "release spread | share of span |\n|---|---|---|---|---|---|---|---|\n",
      static_cast<int>(seq.size()), span, tick == UINT64_MAX ? "?" : absl::StrCat(tick));
  for (const std::string& s : order) {
    const Agg& a = agg[s];
    absl::StrAppend(&out, absl::StrFormat("| %s | %d | %u (%u) | %.2f | %.2f | %.2f | %.2f | %.1f%% |\n", s, a.n, a.blocks,
                                          a.seen, a.chain / a.n, a.lead / a.n, a.late / a.n, a.spread / a.n,
                                          span > 0 ? 100.0 * a.chain / span : 0.0));
  }
  // The kernels' own marks: mean over blocks and the last block, after the launch's first release.
  for (const std::string& s : order) {
    const Agg& a = agg[s];
    std::string marks;
    for (int k = 0; k < kProbeMarks; ++k) {
      if (a.mark_launches[k] == 0) continue;
      absl::StrAppend(&marks, absl::StrFormat(" mark %d: mean %.2f, last %.2f;", k, a.mark_mean[k] / a.mark_launches[k],
                                              a.mark_last[k] / a.mark_launches[k]));
    }
    if (!marks.empty()) absl::StrAppend(&out, "  ", s, " (us after its first release):", marks, "\n");
  }
  // One middle layer's sequence as it ran (launches 8·k.. of a 48-layer step are alike).
  const size_t from = seq.size() / 2, to = std::min(seq.size() - 1, from + 12);
  absl::StrAppend(&out, "launches ", from, "..", to - 1, " (us from the first release: start of first block, release, next release):\n");
  for (size_t i = from; i < to; ++i) {
    const double z = seq.front().first_wait;
    absl::StrAppend(&out, absl::StrFormat("  %-18s start %9.2f  release %9.2f  next %9.2f\n", seq[i].shape,
                                          (seq[i].first_start - z) * 1e-3, (seq[i].first_wait - z) * 1e-3,
                                          (seq[i + 1].first_wait - z) * 1e-3));
  }
  return out;
}

}  // namespace moeshard::gpu
