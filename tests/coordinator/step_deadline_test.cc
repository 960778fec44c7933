#include "coordinator/step_deadline.h"

#include "gtest/gtest.h"

namespace moeshard {
namespace {

using std::chrono::milliseconds;
using Secs = std::chrono::duration<double>;

StepDeadlineConfig DeadlineConfig() {
  StepDeadlineConfig c;
  c.floor = milliseconds(500);
  c.ceiling = milliseconds(60000);
  c.factor = 4.0;
  c.window = 3;
  return c;
}

TEST(StepDeadlineTest, CeilingUntilAStepWasMeasured) {
  StepDeadline d(DeadlineConfig());
  EXPECT_EQ(d.For(1), milliseconds(60000));
  EXPECT_EQ(d.For(512), milliseconds(60000));
}

TEST(StepDeadlineTest, FactorTimesTheSlowestComparableStepWithinFloorAndCeiling) {
  StepDeadline d(DeadlineConfig());
  d.Observe(1, Secs(0.05));  // a decode step: 4 x 50 ms = 200 ms, below the floor
  EXPECT_EQ(d.For(1), milliseconds(500));
  d.Observe(1, Secs(0.3));  // 4 x 300 ms
  EXPECT_EQ(d.For(1), milliseconds(1200));
  // A prefill of 100 tokens scales from each observation: 0.3 s x 100 = 30 s, x 4 = ceiling.
  EXPECT_EQ(d.For(100), milliseconds(60000));
}

TEST(StepDeadlineTest, ScalesEveryObservationByTokens) {
  StepDeadline d(DeadlineConfig());
  d.Observe(64, Secs(0.64));  // 10 ms a token
  d.Observe(1, Secs(0.02));
  EXPECT_EQ(d.For(128), milliseconds(10240));  // 4 x (0.02 x 128): the decode step scales too
  EXPECT_EQ(d.For(8), milliseconds(2560));     // never below an observed step: 4 x 0.64
}

TEST(StepDeadlineTest, OnlyTheLastWindowCounts) {
  StepDeadline d(DeadlineConfig());
  d.Observe(1, Secs(2.0));
  for (int i = 0; i < 3; ++i) d.Observe(1, Secs(0.25));
  EXPECT_EQ(d.num_observed(), 3u);
  EXPECT_EQ(d.For(1), milliseconds(1000));  // the 2 s step fell out of the window
}

TEST(StepDeadlineTest, ValidateRefusesAFloorAboveTheCeiling) {
  StepDeadlineConfig c = DeadlineConfig();
  EXPECT_TRUE(c.Validate().ok());
  c.floor = milliseconds(70000);
  EXPECT_FALSE(c.Validate().ok());
  c = DeadlineConfig();
  c.factor = 0.5;
  EXPECT_FALSE(c.Validate().ok());
}

}  // namespace
}  // namespace moeshard
