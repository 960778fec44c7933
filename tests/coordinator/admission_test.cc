#include "coordinator/admission.h"

#include "gtest/gtest.h"

namespace moeshard {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = AdmissionControl::Clock;

AdmissionConfig Config(int64_t requests, int64_t tokens, int64_t queue_time_s) {
  AdmissionConfig c;
  c.max_queued_requests = requests;
  c.max_queued_tokens = tokens;
  c.max_queue_time = seconds(queue_time_s);
  c.rate_window = seconds(10);
  return c;
}

TEST(AdmissionTest, ValidateRefusesNonPositiveBounds) {
  EXPECT_TRUE(Config(1, 1, 1).Validate().ok());
  EXPECT_FALSE(Config(0, 1, 1).Validate().ok());
  EXPECT_FALSE(Config(1, 0, 1).Validate().ok());
  EXPECT_FALSE(Config(1, 1, 0).Validate().ok());
}

TEST(AdmissionTest, RequestBoundIsInclusive) {
  AdmissionControl a(Config(3, 1000, 60));
  const Clock::time_point t{};
  EXPECT_TRUE(a.Admit(2, 20, 10, t).admitted());
  AdmissionDecision d = a.Admit(3, 30, 10, t);
  EXPECT_EQ(d.reason, RejectReason::kQueueFull);
  EXPECT_STREQ(RejectReasonName(d.reason), "queue_full");
  EXPECT_NE(d.message.find("--max-queued-requests 3"), std::string::npos) << d.message;
}

TEST(AdmissionTest, TokenBoundCountsTheNewPrompt) {
  AdmissionControl a(Config(100, 100, 60));
  const Clock::time_point t{};
  EXPECT_TRUE(a.Admit(1, 60, 40, t).admitted());  // exactly 100
  EXPECT_EQ(a.Admit(1, 60, 41, t).reason, RejectReason::kQueueTokens);
  // An empty queue takes a prompt larger than the whole bound (the scheduler bounds prompts).
  EXPECT_TRUE(a.Admit(0, 0, 101, t).admitted());
}

TEST(AdmissionTest, ExpectedWaitUsesTheMeasuredDequeueRate) {
  AdmissionControl a(Config(1000, 1 << 20, 5));
  Clock::time_point t{};
  // No request has left the queue yet: the wait is unknown, only the bounds apply.
  EXPECT_TRUE(a.Admit(500, 500, 1, t).admitted());
  // 20 requests leave within the 10 s window: 2 per second.
  for (int i = 0; i < 20; ++i) a.OnDequeued(t + milliseconds(i * 100));
  t += seconds(2);
  EXPECT_DOUBLE_EQ(a.DequeueRate(t), 2.0);
  EXPECT_TRUE(a.Admit(10, 10, 1, t).admitted());  // 5 s: at the limit
  AdmissionDecision d = a.Admit(11, 11, 1, t);    // 5.5 s
  EXPECT_EQ(d.reason, RejectReason::kQueueTime);
  EXPECT_NE(d.message.find("--max-queue-time-s 5"), std::string::npos) << d.message;
  // Once the window has passed without dequeues the rate is unknown again.
  t += seconds(11);
  EXPECT_DOUBLE_EQ(a.DequeueRate(t), 0.0);
  EXPECT_TRUE(a.Admit(11, 11, 1, t).admitted());
}

TEST(AdmissionTest, HasRoomIsWhatAdmitWouldAcceptForAnAverageRequest) {
  AdmissionControl a(Config(4, 100, 60));
  EXPECT_TRUE(a.HasRoom(0, 0));
  EXPECT_TRUE(a.HasRoom(3, 60));   // average 20, 80 <= 100
  EXPECT_FALSE(a.HasRoom(4, 40));  // request bound
  EXPECT_FALSE(a.HasRoom(2, 90));  // average 45, 135 > 100
}

}  // namespace
}  // namespace moeshard
