// The decode-chain probe's host side (kernels/cuda/probe.h), no device needed: a build without
// MOESHARD_PROBE has no probed units and refuses to arm; ProbeTimeline turns records of a known
// chain into each launch shape's share of it, its blocks' waits, the late starts and the marks.
#include "kernels/cuda/probe.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

using gpu::ProbeRecord;

ProbeRecord Rec(uint64_t grid, uint32_t gx, uint32_t block, uint64_t start_ns, uint64_t wait_ns) {
  ProbeRecord r{};
  r.grid = grid;
  r.grid_x = gx;
  r.grid_y = 1;
  r.grid_z = 1;
  r.threads = 256;
  r.block = block;
  r.t_start = start_ns;
  r.t_wait = wait_ns;
  return r;
}

// The test build is a plain one (MOESHARD_PROBE off): nothing registered, arming refused.
TEST(ProbeTest, PlainBuildHasNoProbe) {
  EXPECT_FALSE(gpu::ProbeCompiledIn());
  EXPECT_EQ(gpu::ProbeArm(16).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu::ProbeTimeline({}), "probe: fewer than two launches recorded\n");
}

// Two layers of a two-kernel chain: A (1 block) released at 0 and 10 us, B (2 blocks) at 4 and
// 14 us, then a closing launch at 20 us. A's share: 4 us each time; B's: 6 us. B's first block
// waited 3 us before its release, its second started 1 us after it; B's mark 0 comes 2 us after
// its release on average (1 and 3 us).
TEST(ProbeTest, TimelineSharesWaitsAndMarks) {
  std::vector<ProbeRecord> r;
  const uint64_t us = 1000, base = 1000000;
  for (int layer = 0; layer < 2; ++layer) {
    const uint64_t t0 = base + layer * 10 * us;
    const uint64_t ga = 100 + 2 * layer, gb = ga + 1;
    r.push_back(Rec(ga, 1, 0, t0 - 2 * us, t0));
    ProbeRecord b0 = Rec(gb, 2, 0, t0 + 1 * us, t0 + 4 * us), b1 = Rec(gb, 2, 1, t0 + 5 * us, t0 + 5 * us);
    b0.marks[0] = t0 + 5 * us;
    b1.marks[0] = t0 + 7 * us;
    r.push_back(b0);
    r.push_back(b1);
  }
  r.push_back(Rec(200, 7, 0, base + 19 * us, base + 20 * us));
  const std::string t = gpu::ProbeTimeline(r);
  EXPECT_NE(t.find("probe: 5 launches, 20.0 us"), std::string::npos) << t;
  EXPECT_NE(t.find("| 1x1x1/256 | 2 | 1 (1) | 4.00 | 2.00 | 0.00 | 0.00 | 40.0% |"), std::string::npos) << t;
  EXPECT_NE(t.find("| 2x1x1/256 | 2 | 2 (2) | 6.00 | 3.00 | 1.00 | 1.00 | 60.0% |"), std::string::npos) << t;
  EXPECT_NE(t.find("2x1x1/256 (us after its first release): mark 0: mean 2.00, last 3.00;"), std::string::npos) << t;
}

}  // namespace
}  // namespace moeshard
