// The communicator contract, checked on every implementation and group size: one thread
// per rank, uneven values per rank, answers computed by hand (closed forms).
#include <cstdint>
#include <functional>
#include <tuple>
#include <vector>

#include "tests/comm/comm_test_util.h"

namespace moeshard::testing {
namespace {

class CollectiveTest : public ::testing::TestWithParam<std::tuple<Impl, int>> {
 protected:
  Impl impl() const { return std::get<0>(GetParam()); }
  int size() const { return std::get<1>(GetParam()); }

  void SetUp() override {
    comms_ = MakeGroup(impl(), size(), std::chrono::seconds(20));
    ASSERT_EQ(comms_.size(), static_cast<size_t>(size()));
  }

  // Runs fn(comm) on one thread per rank.
  void OnEachRank(const std::function<void(Communicator&)>& fn) {
    RunRanks(size(), [&](int r) { fn(*comms_[r]); });
  }

  std::vector<std::unique_ptr<Communicator>> comms_;
};

// A payload that names its sender and message index, so a misrouted message shows.
std::vector<uint8_t> Payload(int from, int idx, size_t bytes) {
  std::vector<uint8_t> p(bytes);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(from * 31 + idx * 7 + i);
  return p;
}

TEST_P(CollectiveTest, AllReduceSumMatchesHandComputedSums) {
  // Rank r holds v(r, i) = (r + 1) * m(i) - r / 2 with m(i) = i % 97 + 1 (exact in fp32).
  // Over n ranks: sum_r (r + 1) * m = m * n(n+1)/2 and sum_r r / 2 = n(n-1)/4.
  const float n = static_cast<float>(size());
  for (size_t count : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}, size_t{100003},
                       size_t{1} << 20, size_t{0}}) {
    OnEachRank([&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i)
        data[i] = (r + 1) * static_cast<float>(i % 97 + 1) - 0.5f * r;
      ASSERT_OK(comm.AllReduceSum(data.data(), count));
      size_t num_wrong = 0, first_wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        const float want = static_cast<float>(i % 97 + 1) * n * (n + 1) / 2 - n * (n - 1) / 4;
        if (data[i] != want && num_wrong++ == 0) first_wrong = i;
      }
      EXPECT_EQ(num_wrong, 0u) << "rank " << r << ", count " << count << ", first wrong element "
                               << first_wrong << " = " << data[first_wrong];
    });
  }
}

TEST_P(CollectiveTest, AllGatherPlacesRankBlocksInOrder) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 18}) {
    OnEachRank([&](Communicator& comm) {
      const int r = comm.rank();
      std::vector<float> in(count), out(count * size(), -1.f);
      for (size_t i = 0; i < count; ++i) in[i] = 1000.f * r + (i % 1000) + 0.25f;
      ASSERT_OK(comm.AllGather(in.data(), count, out.data()));
      size_t num_wrong = 0;
      for (int q = 0; q < size(); ++q) {
        for (size_t i = 0; i < count; ++i)
          num_wrong += out[q * count + i] != 1000.f * q + (i % 1000) + 0.25f;
      }
      EXPECT_EQ(num_wrong, 0u) << "rank " << r << ", count " << count;
    });
  }
}

TEST_P(CollectiveTest, AllGatherInPlace) {
  constexpr size_t kCount = 5;
  OnEachRank([&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> buf(kCount * size(), -1.f);
    for (size_t i = 0; i < kCount; ++i) buf[r * kCount + i] = 10.f * r + i;
    ASSERT_OK(comm.AllGather(buf.data() + r * kCount, kCount, buf.data()));
    for (int q = 0; q < size(); ++q) {
      for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(buf[q * kCount + i], 10.f * q + i);
    }
  });
}

TEST_P(CollectiveTest, SendRecvChainsInBothDirections) {
  for (size_t bytes : {size_t{1}, size_t{7}, size_t{4096}, (size_t{3} << 20) + 5}) {
    OnEachRank([&](Communicator& comm) {
      const int r = comm.rank(), n = comm.size();
      // Forward 0 -> 1 -> ... -> n-1: each rank checks what it got, then passes its own on.
      if (r > 0) {
        std::vector<uint8_t> got(bytes);
        ASSERT_OK(comm.Recv(got.data(), bytes, r - 1));
        EXPECT_EQ(got, Payload(r - 1, 0, bytes))
            << "rank " << r << " forward, " << bytes << " bytes";
      }
      if (r < n - 1) ASSERT_OK(comm.Send(Payload(r, 0, bytes).data(), bytes, r + 1));
      // Backward n-1 -> ... -> 0, with another size.
      const size_t back_bytes = bytes / 2 + 3;
      if (r < n - 1) {
        std::vector<uint8_t> got(back_bytes);
        ASSERT_OK(comm.Recv(got.data(), back_bytes, r + 1));
        EXPECT_EQ(got, Payload(r + 1, 1, back_bytes)) << "rank " << r << " backward";
      }
      if (r > 0) ASSERT_OK(comm.Send(Payload(r, 1, back_bytes).data(), back_bytes, r - 1));
    });
  }
}

TEST_P(CollectiveTest, ConsecutiveMessagesArriveInOrder) {
  constexpr int kNumMessages = 40;
  auto bytes_of = [](int k) { return static_cast<size_t>(1 + k * 997 % 5000); };
  OnEachRank([&](Communicator& comm) {
    const int r = comm.rank(), last = comm.size() - 1;
    if (last == 0) return;
    if (r == 0) {  // 0 -> last, then last -> 0
      for (int k = 0; k < kNumMessages; ++k)
        ASSERT_OK(comm.Send(Payload(0, k, bytes_of(k)).data(), bytes_of(k), last));
      for (int k = 0; k < kNumMessages; ++k) {
        std::vector<uint8_t> got(bytes_of(k));
        ASSERT_OK(comm.Recv(got.data(), got.size(), last));
        EXPECT_EQ(got, Payload(last, k, bytes_of(k))) << "message " << k;
      }
    } else if (r == last) {
      for (int k = 0; k < kNumMessages; ++k) {
        std::vector<uint8_t> got(bytes_of(k));
        ASSERT_OK(comm.Recv(got.data(), got.size(), 0));
        EXPECT_EQ(got, Payload(0, k, bytes_of(k))) << "message " << k;
      }
      for (int k = 0; k < kNumMessages; ++k)
        ASSERT_OK(comm.Send(Payload(last, k, bytes_of(k)).data(), bytes_of(k), 0));
    }
  });
}

TEST_P(CollectiveTest, SendToSelf) {
  OnEachRank([&](Communicator& comm) {
    const int r = comm.rank();
    ASSERT_OK(comm.Send(Payload(r, 0, 9).data(), 9, r));
    ASSERT_OK(comm.Send(Payload(r, 1, 4).data(), 4, r));
    std::vector<uint8_t> first(9), second(4);
    ASSERT_OK(comm.Recv(first.data(), 9, r));
    ASSERT_OK(comm.Recv(second.data(), 4, r));
    EXPECT_EQ(first, Payload(r, 0, 9));
    EXPECT_EQ(second, Payload(r, 1, 4));
  });
}

TEST_P(CollectiveTest, BadPeerIsInvalidArgument) {
  float x = 0;
  EXPECT_EQ(comms_[0]->Send(&x, sizeof(x), size()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms_[0]->Recv(&x, sizeof(x), -1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(CollectiveTest, BarrierWaitsForEveryRank) {
  constexpr int kRounds = 20;
  std::vector<std::atomic<int>> arrived(kRounds);
  OnEachRank([&](Communicator& comm) {
    for (int k = 0; k < kRounds; ++k) {
      if ((k + comm.rank()) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ++arrived[k];
      ASSERT_OK(comm.Barrier());
      EXPECT_EQ(arrived[k].load(), size()) << "round " << k << ", rank " << comm.rank();
    }
  });
}

TEST_P(CollectiveTest, ManyConsecutiveMixedOps) {
  constexpr int kIters = 60;
  const int n = size();
  OnEachRank([&](Communicator& comm) {
    const int r = comm.rank();
    for (int it = 0; it < kIters; ++it) {
      // All-reduce of r + it over a count that changes every iteration:
      // sum = n(n-1)/2 + n * it.
      const size_t count = 1 + it % 13;
      std::vector<float> data(count, static_cast<float>(r + it));
      ASSERT_OK(comm.AllReduceSum(data.data(), count));
      for (float v : data) ASSERT_EQ(v, n * (n - 1) / 2.f + n * it) << "iteration " << it;
      // All-gather of two values per rank.
      float pair[2] = {static_cast<float>(r), static_cast<float>(it)};
      std::vector<float> gathered(2 * n);
      ASSERT_OK(comm.AllGather(pair, 2, gathered.data()));
      for (int q = 0; q < n; ++q) {
        ASSERT_EQ(gathered[2 * q], q);
        ASSERT_EQ(gathered[2 * q + 1], it);
      }
      // Ring shift: even ranks send first and odd ranks receive first, so no cycle of
      // Sends waits on itself.
      if (n > 1) {
        const int right = (r + 1) % n, left = (r + n - 1) % n;
        int64_t out = 1000 * r + it, in = -1;
        if (r % 2 == 0) {
          ASSERT_OK(comm.Send(&out, sizeof(out), right));
          ASSERT_OK(comm.Recv(&in, sizeof(in), left));
        } else {
          ASSERT_OK(comm.Recv(&in, sizeof(in), left));
          ASSERT_OK(comm.Send(&out, sizeof(out), right));
        }
        ASSERT_EQ(in, 1000 * left + it);
      }
      if (it % 10 == 0) ASSERT_OK(comm.Barrier());
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllImpls, CollectiveTest,
                         ::testing::Combine(::testing::Values(Impl::kLocal, Impl::kGloo),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<Impl, int>>& info) {
                           return ImplName(std::get<0>(info.param)) + "Size" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace moeshard::testing
