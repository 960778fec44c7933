// NcclCommunicator on the GPUs this machine has: bootstrap through a KvStore, collectives
// on device buffers, and the deadline: a group whose peer never arrives (in init, or in a
// collective) is aborted with DeadlineExceeded instead of hanging. One rank per GPU (NCCL's
// rule): with one GPU the multi-rank cases skip, the one-rank and missing-peer cases run.
// Labelled `gpu`; exits 77 (SKIPPED) without a device.
#include "common/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

using namespace std::chrono_literals;

int NumGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

struct DeviceFloats {
  explicit DeviceFloats(const std::vector<float>& h, int device) : n(h.size()) {
    cudaSetDevice(device);
    cudaMalloc(&p, n * sizeof(float));
    cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> Host() const {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
  float* p = nullptr;
  size_t n;
};

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (NumGpus() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(NcclTest, OneRankGroupRunsEveryOperation) {
  InMemoryKvStore store;
  auto c = CreateNcclCommunicator(&store, "g1", 0, 1, 0, 10s);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->device_memory());
  DeviceFloats x({1.5f, -2.f, 3.f}, 0), out(std::vector<float>(3), 0);
  ASSERT_TRUE((*c)->AllReduceSum(x.p, 3).ok());
  EXPECT_EQ(x.Host(), (std::vector<float>{1.5f, -2.f, 3.f}));
  ASSERT_TRUE((*c)->AllGather(x.p, 3, out.p).ok());
  EXPECT_EQ(out.Host(), x.Host());
  EXPECT_TRUE((*c)->Barrier().ok());
  (*c)->Abort();
  absl::Status s = (*c)->AllReduceSum(x.p, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

TEST_F(NcclTest, PeerThatNeverJoinsIsCaughtByTheDeadline) {
  InMemoryKvStore store;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = CreateNcclCommunicator(&store, "g2", 0, 2, 0, 2s);  // rank 1 never comes
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_LT(s, 30.0);
  // The other side: a rank whose id never gets published times out in the store.
  auto d = CreateNcclCommunicator(&store, "g3", 1, 2, 0, 500ms);
  EXPECT_FALSE(d.ok());
}

TEST_F(NcclTest, RanksOnSeveralGpusSumAndDetectAHungPeer) {
  const int n = NumGpus();
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL allows one rank per GPU); this machine has " << n;
  InMemoryKvStore store;
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<absl::Status> st(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) {
    th.emplace_back([&, r] {
      auto c = CreateNcclCommunicator(&store, "multi", r, n, r, 20s);
      st[r] = c.status();
      if (c.ok()) comms[r] = std::move(*c);
    });
  }
  for (auto& t : th) t.join();
  for (auto& s : st) ASSERT_TRUE(s.ok()) << s;
  th.clear();
  std::vector<std::vector<float>> got(n);
  for (int r = 0; r < n; ++r) {
    th.emplace_back([&, r] {
      DeviceFloats x({static_cast<float>(r), 1.f}, r);
      st[r] = comms[r]->AllReduceSum(x.p, 2);
      got[r] = x.Host();
    });
  }
  for (auto& t : th) t.join();
  const float sum = n * (n - 1) / 2.f;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(got[r], (std::vector<float>{sum, static_cast<float>(n)}));
  }
  // Rank n-1 hangs (never calls the collective): everyone else hits the deadline.
  th.clear();
  for (int r = 0; r + 1 < n; ++r) {
    comms[r]->set_timeout(2s);
    th.emplace_back([&, r] {
      DeviceFloats x({1.f}, r);
      st[r] = comms[r]->AllReduceSum(x.p, 1);
    });
  }
  for (auto& t : th) t.join();
  for (int r = 0; r + 1 < n; ++r) EXPECT_EQ(st[r].code(), absl::StatusCode::kDeadlineExceeded) << st[r];
}

}  // namespace
}  // namespace moeshard
