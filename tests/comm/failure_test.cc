// Deadlines and abort, on both implementations; then what only the Gloo communicator has
// (rendezvous through the KvStore, a group of one without network); then InMemoryKvStore.
#include <future>

#include "tests/comm/comm_test_util.h"

namespace moeshard::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kShortTimeout{300};

class FailureTest : public ::testing::TestWithParam<Impl> {};

TEST_P(FailureTest, CollectiveTimesOutWhenRankNeverJoins) {
  auto comms = MakeGroup(GetParam(), 2, kShortTimeout);
  ASSERT_EQ(comms.size(), 2u);
  std::promise<void> rank0_done;
  RunRanks(2, [&](int r) {
    if (r == 1) {  // Never joins; tries a call only after rank 0 has given up.
      rank0_done.get_future().wait();
      float x = 1;
      const Clock::time_point start = Clock::now();
      EXPECT_FALSE(comms[1]->AllReduceSum(&x, 1).ok());
      EXPECT_LT(MsSince(start), 2 * kShortTimeout.count());
      return;
    }
    std::vector<float> data(7, 1.f);
    const Clock::time_point start = Clock::now();
    absl::Status status = comms[0]->AllReduceSum(data.data(), data.size());
    const double elapsed_ms = MsSince(start);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_GE(elapsed_ms, kShortTimeout.count() - 20);
    EXPECT_LT(elapsed_ms, 2 * kShortTimeout.count());
    EXPECT_TRUE(absl::StrContains(status.message(), "rank 0")) << status;
    if (GetParam() == Impl::kGloo) {
      EXPECT_TRUE(absl::StrContains(status.message(), "AllReduceSum")) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), "rank 1")) << status;
    }
    // The communicator is now aborted: the next call fails at once.
    const Clock::time_point again = Clock::now();
    EXPECT_FALSE(comms[0]->Barrier().ok());
    EXPECT_LT(MsSince(again), 50);
    rank0_done.set_value();
  });
}

TEST_P(FailureTest, RecvTimesOutWhenPeerNeverSends) {
  auto comms = MakeGroup(GetParam(), 2, kShortTimeout);
  ASSERT_EQ(comms.size(), 2u);
  char buf[16];
  const Clock::time_point start = Clock::now();
  absl::Status status = comms[0]->Recv(buf, sizeof(buf), 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(MsSince(start), 2 * kShortTimeout.count());
  if (GetParam() == Impl::kGloo) {
    EXPECT_TRUE(absl::StrContains(status.message(), "Recv")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "bytes from rank 1")) << status;
  }
}

// Abort from another thread ends a pending call at once and every later one; the peer
// blocked on the aborted rank fails long before its own 10 s deadline.
void CheckAbortEndsPendingCall(Impl impl, bool pending_collective) {
  auto comms = MakeGroup(impl, 2, std::chrono::seconds(10));
  ASSERT_EQ(comms.size(), 2u);
  std::promise<void> rank0_failed;
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    comms[0]->Abort();
  });
  RunRanks(2, [&](int r) {
    float x[4] = {1, 2, 3, 4};
    if (r == 0) {
      const Clock::time_point start = Clock::now();
      absl::Status status =
          pending_collective ? comms[0]->AllReduceSum(x, 4) : comms[0]->Recv(x, sizeof(x), 1);
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
      EXPECT_LT(MsSince(start), 1000);
      EXPECT_EQ(comms[0]->AllGather(x, 1, x).code(), absl::StatusCode::kAborted);
      EXPECT_EQ(comms[0]->Send(x, 4, 1).code(), absl::StatusCode::kAborted);
      rank0_failed.set_value();
      return;
    }
    // Rank 1 enters a collective that rank 0 never joins (or joins only after aborting).
    if (pending_collective) rank0_failed.get_future().wait();
    const Clock::time_point start = Clock::now();
    EXPECT_FALSE(comms[1]->AllReduceSum(x, 4).ok());
    EXPECT_LT(MsSince(start), 2000);
  });
  aborter.join();
}

TEST_P(FailureTest, AbortEndsPendingRecv) { CheckAbortEndsPendingCall(GetParam(), false); }
TEST_P(FailureTest, AbortEndsPendingCollective) { CheckAbortEndsPendingCall(GetParam(), true); }

// Ranks that disagree on a size get an error, not a crash (Gloo would otherwise terminate
// the process from its event loop when a message is longer than the posted recv).
TEST_P(FailureTest, MismatchedSizesFailInsteadOfCrashing) {
  {
    auto comms = MakeGroup(GetParam(), 2, kShortTimeout);
    ASSERT_EQ(comms.size(), 2u);
    absl::Status recv_status;
    RunRanks(2, [&](int r) {
      char buf[8] = {};
      if (r == 0) (void)comms[0]->Send(buf, 8, 1);
      if (r == 1) recv_status = comms[1]->Recv(buf, 4, 0);
    });
    EXPECT_FALSE(recv_status.ok());
  }
  for (size_t count : {size_t{7}, size_t{100000}}) {  // the small and the ring all-reduce
    auto comms = MakeGroup(GetParam(), 2, kShortTimeout);
    ASSERT_EQ(comms.size(), 2u);
    std::vector<absl::Status> status(2);
    RunRanks(2, [&](int r) {
      std::vector<float> data(count + r * 2, 1.f);
      const Clock::time_point start = Clock::now();
      status[r] = comms[r]->AllReduceSum(data.data(), data.size());
      EXPECT_LT(MsSince(start), 2 * kShortTimeout.count());
    });
    EXPECT_FALSE(status[0].ok() && status[1].ok()) << "count " << count;
    if (GetParam() == Impl::kGloo) {
      // Both time out; the one that does first closes its connections, so the other may
      // see the peer gone (Unavailable) just before its own deadline.
      EXPECT_FALSE(status[0].ok() || status[1].ok());
      EXPECT_TRUE(absl::IsDeadlineExceeded(status[0]) || absl::IsDeadlineExceeded(status[1]))
          << status[0] << " / " << status[1];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllImpls, FailureTest, ::testing::Values(Impl::kLocal, Impl::kGloo),
                         [](const ::testing::TestParamInfo<Impl>& info) {
                           return ImplName(info.param);
                         });

TEST(GlooCommunicatorTest, SendWaitsForTheMatchingRecv) {
  // Gloo's Send is a rendezvous: with no Recv posted it times out (LocalCommunicator buffers).
  auto comms = MakeGroup(Impl::kGloo, 2, kShortTimeout);
  ASSERT_EQ(comms.size(), 2u);
  int x = 5;
  absl::Status status = comms[1]->Send(&x, sizeof(x), 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "bytes to rank 0")) << status;
}

TEST(GlooCommunicatorTest, RendezvousTimesOutWhenRankMissing) {
  InMemoryKvStore store;
  const Clock::time_point start = Clock::now();
  auto comm = CreateGlooCommunicator(&store, "lonely", 0, 2, "127.0.0.1", kShortTimeout);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_LT(MsSince(start), 2 * kShortTimeout.count());
}

TEST(GlooCommunicatorTest, RejectsBadArguments) {
  InMemoryKvStore store;
  const milliseconds t(100);
  EXPECT_EQ(CreateGlooCommunicator(&store, "p", 2, 2, "127.0.0.1", t).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(&store, "p", 0, 0, "127.0.0.1", t).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(nullptr, "p", 0, 2, "127.0.0.1", t).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(&store, "p", 0, 2, "127.0.0.1", milliseconds(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCommunicatorTest, GroupOfOneNeedsNoNetworkOrStore) {
  auto comm =
      CreateGlooCommunicator(nullptr, "solo", 0, 1, "no-such-host.invalid", milliseconds(100));
  ASSERT_TRUE(comm.ok()) << comm.status();
  float data[3] = {1.5f, -2.f, 3.f}, out[3] = {};
  ASSERT_OK((*comm)->AllReduceSum(data, 3));
  EXPECT_EQ(data[1], -2.f);
  ASSERT_OK((*comm)->AllGather(data, 3, out));
  EXPECT_EQ(out[2], 3.f);
  ASSERT_OK((*comm)->Barrier());
}

TEST(GlooCommunicatorTest, GroupsShareAStoreUnderDifferentPrefixes) {
  InMemoryKvStore store;
  std::vector<std::unique_ptr<Communicator>> comms(4);  // ranks 0,1 of "a", then of "b"
  RunRanks(4, [&](int i) {
    auto comm = CreateGlooCommunicator(&store, i < 2 ? "a" : "b", i % 2, 2, "127.0.0.1",
                                       std::chrono::seconds(10));
    ASSERT_TRUE(comm.ok()) << comm.status();
    comms[i] = std::move(*comm);
  });
  ASSERT_TRUE(comms[0] && comms[1] && comms[2] && comms[3]);
  RunRanks(4, [&](int i) {
    float x = i < 2 ? 1.f + i : 10.f * i;  // group a: 1 + 2; group b: 20 + 30
    ASSERT_OK(comms[i]->AllReduceSum(&x, 1));
    EXPECT_EQ(x, i < 2 ? 3.f : 50.f);
  });
}

TEST(InMemoryKvStoreTest, GetWaitsForSet) {
  InMemoryKvStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_OK(store.Set("k", std::string("v\0w", 3)));
  });
  absl::StatusOr<std::string> value = store.Get("k", std::chrono::seconds(5));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("v\0w", 3));
  ASSERT_OK(store.Set("k", "x"));
  EXPECT_EQ(*store.Get("k", milliseconds(0)), "x");
}

TEST(InMemoryKvStoreTest, GetTimesOut) {
  InMemoryKvStore store;
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(store.Get("missing", milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(MsSince(start), 95);
}

}  // namespace
}  // namespace moeshard::testing
