// KV by layer kind on the GPU (SKIPPED without one): muse-spark-tiny (window 16) with 8-token
// blocks, a 200-token sequence through the CUDA runner with its sliding-window layers' KV in a
// pool of 6 recycled blocks and with one pool; float32 activations and KV, so the two runs do
// the same arithmetic and should agree bit for bit (allowed: 1e-6, in case a library call is not
// deterministic). 24-token chunks take the prefill attention kernels, the single-token steps the
// split-decode kernels and CUDA graphs: every path reads the sliding layers' KV through the
// sliding table. Also against the CPU runner (the reference) within the fp32 goldens' tolerance,
// max |l - r| / max(1, |r|) <= 1e-3.
#include <cmath>
#include <cstdio>

#include "common/model/kv_pools.h"
#include "common/model/model_loader.h"
#include "gtest/gtest.h"
#include "tests/local/sliding_steps.h"
#include "tests/testdata/testdata_dir.h"

namespace moeshard {
namespace {

TEST(GpuSlidingPoolTest, LogitsEqualOnePool) {
  auto m = LoadModel(test::TestDataDir() + "/muse-spark-tiny", /*load_tokenizer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = m->config;
  ASSERT_TRUE(HasBothLayerKinds(c));
  auto runner = [&](Device device, int64_t sliding_blocks) {
    RunnerOptions ro;
    ro.device = device;
    ro.precision = ActPrecision::kFloat32;
    ro.kv_dtype = KvDType::kFloat32;
    ro.num_kv_blocks = 64;
    ro.block_size = 8;
    ro.num_sliding_kv_blocks = sliding_blocks;
    return ModelRunner::Create(c, *m->source, ShardSpec{0, c.num_layers, 0, 1, true, true}, ro);
  };
  auto one_pool = runner(Device::kCuda, 0);
  if (!one_pool.ok() && one_pool.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << one_pool.status();
  }
  ASSERT_TRUE(one_pool.ok()) << one_pool.status();
  auto two_pools = runner(Device::kCuda, 6);
  auto cpu = runner(Device::kCpu, 6);
  ASSERT_TRUE(two_pools.ok()) << two_pools.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_LT((*two_pools)->kv_bytes(), (*one_pool)->kv_bytes());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back((31 + i * 17 + i * i) % 200);
  auto want = test::RunSlidingSteps(**one_pool, tokens);
  auto got = test::RunSlidingSteps(**two_pools, tokens);
  auto ref = test::RunSlidingSteps(**cpu, tokens);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(got->size(), want->size());
  ASSERT_EQ(ref->size(), want->size());
  double max_diff = 0, max_ref_diff = 0;
  for (size_t i = 0; i < want->size(); ++i) {
    max_diff = std::max<double>(max_diff, std::fabs((*got)[i] - (*want)[i]));
    max_ref_diff = std::max<double>(max_ref_diff, std::fabs((*got)[i] - (*ref)[i]) / std::max(1.f, std::fabs((*ref)[i])));
  }
  EXPECT_LE(max_diff, 1e-6) << "the sliding pool changed the GPU's logits";
  std::printf("sliding pool vs one pool: max |diff| %g; vs the CPU: max relative error %g\n", max_diff, max_ref_diff);
  EXPECT_LT(max_ref_diff, 1e-3) << "the GPU's sliding pool against the CPU reference";
}

}  // namespace
}  // namespace moeshard
