// `moeshard up --pools FILE` parsing (cli/up_pools.h): each pool's own settings routed to its
// workers or coordinators, and every malformed file refused with the pool and key named.
#include "cli/up_pools.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(UpPoolsTest, PerPoolSettingsGoToTheirProcesses) {
  auto pools = ParseUpPools(R"({"pools": [
      {"name": "short", "max_model_len": 32768, "workers": 2, "mode": "tensor-parallel"},
      {"name": "long", "max_model_len": 262144, "replicas": 2, "layer_split": "3,1", "kv_dtype": "fp8",
       "num_kv_blocks": 20000, "num_sliding_kv_blocks": 512, "max_batch_tokens": 8192, "max_num_seqs": 4,
       "max_tokens_per_step": 4096, "dtype": "bfloat16", "expert_layout": "stream"}]})");
  ASSERT_TRUE(pools.ok()) << pools.status();
  ASSERT_EQ(pools->size(), 2u);
  const UpPool& s = (*pools)[0];
  EXPECT_EQ(s.name, "short");
  EXPECT_EQ(s.max_model_len, 32768);
  EXPECT_EQ(s.replicas, 1);
  EXPECT_EQ(s.workers, 2);
  EXPECT_EQ(s.mode, "tensor-parallel");
  EXPECT_TRUE(s.worker_flags.empty());
  EXPECT_TRUE(s.coordinator_flags.empty());
  const UpPool& l = (*pools)[1];
  EXPECT_EQ(l.max_model_len, 262144);
  EXPECT_EQ(l.replicas, 2);
  EXPECT_EQ(l.workers, 1);
  EXPECT_EQ(l.mode, "layer-split");
  EXPECT_EQ(l.layer_split, "3,1");
  // nlohmann's objects iterate in key order.
  EXPECT_THAT(l.worker_flags, ElementsAre(Pair("dtype", "bfloat16"), Pair("expert-layout", "stream"),
                                          Pair("kv-dtype", "fp8"), Pair("max-batch-tokens", "8192")));
  EXPECT_THAT(l.coordinator_flags, ElementsAre(Pair("max-num-seqs", "4"), Pair("max-tokens-per-step", "4096"),
                                               Pair("num-kv-blocks", "20000"), Pair("num-sliding-kv-blocks", "512")));
}

TEST(UpPoolsTest, PoolFlagPrefersThePoolsOwn) {
  const std::vector<std::pair<std::string, std::string>> own = {{"kv-dtype", "fp8"}};
  FlagValue v = PoolFlag(own, "kv-dtype", {true, "bfloat16"});
  EXPECT_TRUE(v.has);
  EXPECT_EQ(v.value, "fp8");
  v = PoolFlag(own, "dtype", {true, "float32"});
  EXPECT_TRUE(v.has);
  EXPECT_EQ(v.value, "float32");
  v = PoolFlag(own, "max-batch-tokens", {});
  EXPECT_FALSE(v.has);
  v = PoolFlag({}, "kv-dtype", {});
  EXPECT_FALSE(v.has);
}

void ExpectError(const std::string& json, const std::string& says) {
  auto pools = ParseUpPools(json);
  ASSERT_FALSE(pools.ok()) << json;
  EXPECT_EQ(pools.status().code(), absl::StatusCode::kInvalidArgument) << json;
  EXPECT_THAT(std::string(pools.status().message()), HasSubstr(says)) << json;
}

TEST(UpPoolsTest, RefusesMalformedFilesWithTheReason) {
  ExpectError("", "needs {\"pools\"");
  ExpectError("{\"pools\": []}", "at least one pool");
  ExpectError("{\"pools\": {}}", "needs {\"pools\"");
  ExpectError("[1, 2]", "needs {\"pools\"");
  ExpectError(R"({"pools": [{"name": "a"}], "pool": 1})", "unknown top-level key \"pool\"");
  ExpectError(R"({"pools": [3]})", "pool 0 is not an object");
  ExpectError(R"({"pools": [{"max_model_len": 5}]})", "pool 0 needs a name");
  ExpectError(R"({"pools": [{"name": ""}]})", "pool 0 needs a name");
  ExpectError(R"({"pools": [{"name": 7}]})", "pool 0 needs a name");
  ExpectError(R"({"pools": [{"name": "a"}, {"name": "a"}]})", "pool name a repeats");
  ExpectError(R"({"pools": [{"name": "a", "kv-dtype": "fp8"}]})", "pool a: unknown key \"kv-dtype\"");
  ExpectError(R"({"pools": [{"name": "a", "kv_dtype": "fp4"}]})",
              "kv_dtype \"fp4\" is not one of auto, float32, bfloat16, fp8");
  ExpectError(R"({"pools": [{"name": "a", "kv_dtype": 8}]})", "kv_dtype must be a string");
  ExpectError(R"({"pools": [{"name": "a", "expert_layout": "repacked"}]})",
              "expert_layout \"repacked\" is not one of auto, stream, stored");
  ExpectError(R"({"pools": [{"name": "a", "max_model_len": "32k"}]})", "max_model_len must be an integer");
  ExpectError(R"({"pools": [{"name": "a", "max_model_len": 1.5}]})", "max_model_len must be an integer");
  ExpectError(R"({"pools": [{"name": "a", "max_model_len": -1}]})", "max_model_len must be >= 0 (got -1)");
  ExpectError(R"({"pools": [{"name": "a", "replicas": 0}]})", "replicas must be >= 1 (got 0)");
  ExpectError(R"({"pools": [{"name": "a", "workers": 0}]})", "workers must be >= 1");
  ExpectError(R"({"pools": [{"name": "a", "mode": "pipeline"}]})",
              "mode \"pipeline\" is not one of layer-split, tensor-parallel");
  ExpectError(R"({"pools": [{"name": "a", "num_kv_blocks": 0}]})", "num_kv_blocks must be >= 1");
}

// The step budget a pool's coordinator gets (cli/up_pools.h StepTokensFlag).
TEST(UpPoolsTest, GpuPoolsStepAtMostTheWorkersBatch) {
  // CPU workers: whatever was asked, or nothing (the coordinator's own default).
  auto v = StepTokensFlag("a", false, {}, {});
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->has);
  v = StepTokensFlag("a", false, {true, "16384"}, {true, "1024"});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->value, "16384");
  // GPU workers: 4096 by default, fewer when the workers take fewer tokens a step.
  v = StepTokensFlag("a", true, {}, {});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->has);
  EXPECT_EQ(v->value, "4096");
  v = StepTokensFlag("a", true, {}, {true, "2048"});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->value, "2048");
  v = StepTokensFlag("a", true, {true, "8192"}, {});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->value, "8192");
  v = StepTokensFlag("a", true, {true, "16384"}, {true, "16384"});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->value, "16384");
  // More than a GPU worker takes: refused before anything starts, naming the pool and both flags.
  v = StepTokensFlag("long", true, {true, "16384"}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              AllOf(HasSubstr("pool long"), HasSubstr("--max-tokens-per-step 16384"), HasSubstr("--max-batch-tokens 8192")));
  v = StepTokensFlag("a", true, {true, "many"}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("positive count"));
  v = StepTokensFlag("a", true, {}, {true, "0"});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("--max-batch-tokens must be a positive count"));
}

}  // namespace
}  // namespace moeshard
