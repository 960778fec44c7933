// DevicePool and StepArena (worker/gpu/device_memory.h): allocations never overlap, also
// when a large (dedicated) allocation comes first, and the arena's Mark/Release replays the
// same addresses. Labelled `gpu`; exits 77 (SKIPPED) without a device.
#include "worker/gpu/device_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard::gpu {
namespace {

class DeviceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

void ExpectDisjoint(std::vector<std::pair<char*, size_t>> spans) {
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first) << "allocations " << i - 1 << " and " << i;
  }
}

TEST_F(DeviceMemoryTest, LargeFirstAllocationDoesNotReceiveLaterSmallOnes) {
  for (size_t chunk : {size_t{1} << 20, size_t{0}}) {
    DevicePool pool(chunk);
    std::vector<std::pair<char*, size_t>> spans;
    for (size_t bytes : {size_t{3} << 20, size_t{1000}, size_t{5} << 20, size_t{4096}, size_t{700} << 10,
                         size_t{700} << 10, size_t{1}}) {
      auto p = pool.Alloc(bytes);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u);
      spans.push_back({static_cast<char*>(*p), bytes});
    }
    ExpectDisjoint(spans);
  }
}

TEST_F(DeviceMemoryTest, UploadLandsOnTheStream) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DevicePool pool;
  std::vector<int> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int>(i * 7);
  auto p = pool.Upload(host.data(), host.size() * sizeof(int), s);
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<int> back(host.size());
  ASSERT_EQ(cudaMemcpyAsync(back.data(), *p, back.size() * sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaStreamDestroy(s);
}

TEST_F(DeviceMemoryTest, ArenaMarkReleaseReplaysAddressesAndRefusesOverflow) {
  StepArena arena;
  ASSERT_TRUE(arena.Reserve(1 << 20).ok());
  auto a = arena.Alloc<float>(100);
  ASSERT_TRUE(a.ok());
  const size_t mark = arena.Mark();
  auto b1 = arena.Alloc<float>(1000);
  arena.Release(mark);
  auto b2 = arena.Alloc<float>(1000);
  ASSERT_TRUE(b1.ok() && b2.ok());
  EXPECT_EQ(*b1, *b2);
  EXPECT_NE(*a, *b1);
  EXPECT_FALSE(arena.AllocBytes(size_t{2} << 20).ok());
}

}  // namespace
}  // namespace moeshard::gpu
