#include "coordinator/plan.h"

#include <cmath>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

ModelConfig PlanConfig(int64_t num_layers, int64_t kv_heads = 4, int64_t experts = 8, int64_t dense = 0,
                       bool has_dense_layer = false) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.num_heads = kv_heads * 2;
  c.num_kv_heads = kv_heads;
  c.num_experts = experts;
  c.top_k = 2;
  c.dense_intermediate = dense;
  c.layers.resize(num_layers);
  if (has_dense_layer) c.layers[0].moe = false;
  return c;
}

std::vector<std::vector<double>> WeightVectors(int n) {
  std::vector<std::vector<double>> out;
  out.push_back({});  // even
  std::vector<double> inc(n), dec(n), heavy(n, 1.0), light(n, 1.0), ends(n, 1.0), frac(n);
  for (int i = 0; i < n; ++i) {
    inc[i] = i + 1;
    dec[i] = n - i;
    frac[i] = 0.1 + 0.37 * i;
  }
  heavy[0] = 10.0;
  light[0] = 0.01;
  ends[0] = 2.0;
  ends[n - 1] = 2.0;
  for (auto* w : {&inc, &dec, &heavy, &light, &ends, &frac}) out.push_back(*w);
  return out;
}

TEST(PlanTest, LayerSplitExhaustive) {
  for (int64_t layers = 1; layers <= 12; ++layers) {
    for (int workers = 1; workers <= 6; ++workers) {
      for (const std::vector<double>& weights : WeightVectors(workers)) {
        SCOPED_TRACE(::testing::Message() << layers << " layers, " << workers << " workers, "
                                          << weights.size() << " weights");
        absl::StatusOr<Plan> plan = MakePlan(PlanConfig(layers), ParallelMode::kLayerSplit, workers, weights);
        if (workers > layers) {
          ASSERT_FALSE(plan.ok());
          EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
          EXPECT_THAT(plan.status().message(), HasSubstr("at least one layer"));
          continue;
        }
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_EQ(plan->pp_size, workers);
        EXPECT_EQ(plan->tp_size, 1);
        ASSERT_EQ(static_cast<int>(plan->shards.size()), workers);
        std::vector<double> w = weights.empty() ? std::vector<double>(workers, 1.0) : weights;
        const double wsum = std::accumulate(w.begin(), w.end(), 0.0);
        bool all_quotas_at_least_one = true;
        for (int i = 0; i < workers; ++i) all_quotas_at_least_one &= layers * w[i] / wsum >= 1.0;
        int64_t next = 0;
        for (int i = 0; i < workers; ++i) {
          const ShardSpec& s = plan->shards[i];
          EXPECT_EQ(s.layer_begin, next) << "worker " << i;
          EXPECT_GE(s.layer_end - s.layer_begin, 1) << "worker " << i;
          EXPECT_EQ(s.first_stage, i == 0);
          EXPECT_EQ(s.last_stage, i == workers - 1);
          EXPECT_EQ(s.tp_rank, 0);
          EXPECT_EQ(s.tp_size, 1);
          const double quota = layers * w[i] / wsum;
          const int64_t size = s.layer_end - s.layer_begin;
          if (all_quotas_at_least_one) {
            EXPECT_LT(std::abs(size - quota), 1.0 + 1e-9) << "worker " << i;
          }
          // The floor of one layer may only take from others, never give a stage extra.
          EXPECT_LE(size, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(quota - 1e-9)))) << "worker " << i;
          next = s.layer_end;
        }
        EXPECT_EQ(next, layers);
        // Deterministic.
        absl::StatusOr<Plan> again = MakePlan(PlanConfig(layers), ParallelMode::kLayerSplit, workers, weights);
        ASSERT_TRUE(again.ok());
        for (int i = 0; i < workers; ++i) EXPECT_EQ(again->shards[i].layer_end, plan->shards[i].layer_end);
      }
    }
  }
}

// Equal weights (the coordinator's default and the in-process layer split of `moeshard check`
// and `eval`): sizes differ by at most one, the first num_layers % stages stages hold the extra.
TEST(PlanTest, EqualWeightsGiveTheEvenSplit) {
  for (int64_t layers = 1; layers <= 24; ++layers) {
    for (int64_t stages = 1; stages <= layers; ++stages) {
      auto ranges = SplitLayers(layers, std::vector<double>(stages, 1.0));
      ASSERT_TRUE(ranges.ok()) << ranges.status();
      int64_t begin = 0;
      for (int64_t s = 0; s < stages; ++s) {
        const int64_t want = layers / stages + (s < layers % stages ? 1 : 0);
        EXPECT_EQ((*ranges)[s], std::make_pair(begin, begin + want)) << layers << " layers, stage " << s << " of " << stages;
        begin += want;
      }
    }
  }
}

TEST(PlanTest, HandComputedSplits) {
  auto ranges = SplitLayers(8, {2, 1, 1});
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  EXPECT_THAT(*ranges, ElementsAre(Pair(0, 4), Pair(4, 6), Pair(6, 8)));
  ranges = SplitLayers(10, {1, 1, 1});  // 3.33 each: the leftover layer goes to the lowest index
  ASSERT_TRUE(ranges.ok());
  EXPECT_THAT(*ranges, ElementsAre(Pair(0, 4), Pair(4, 7), Pair(7, 10)));
  ranges = SplitLayers(12, {1, 1, 100});  // two stages pinned to one layer, the rest to the third
  ASSERT_TRUE(ranges.ok());
  EXPECT_THAT(*ranges, ElementsAre(Pair(0, 1), Pair(1, 2), Pair(2, 12)));
  ranges = SplitLayers(7, {1, 2, 1});  // quotas 1.75, 3.5, 1.75: both leftovers to the 0.75s
  ASSERT_TRUE(ranges.ok());
  EXPECT_THAT(*ranges, ElementsAre(Pair(0, 2), Pair(2, 5), Pair(5, 7)));

  absl::StatusOr<Plan> plan = MakePlan(PlanConfig(8), ParallelMode::kLayerSplit, 3, {2, 1, 1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->shards[0].DebugString(), "layers [0, 4) tp 0/1 first");
  EXPECT_EQ(plan->shards[1].DebugString(), "layers [4, 6) tp 0/1");
  EXPECT_EQ(plan->shards[2].DebugString(), "layers [6, 8) tp 0/1 last");
  EXPECT_THAT(plan->Describe(), HasSubstr("layer-split, 3 workers (pp 3 x tp 1)"));
  EXPECT_THAT(plan->Describe(), HasSubstr("worker 2 (stage 2): layers [6, 8)"));
}

TEST(PlanTest, LayerSplitErrors) {
  auto plan = MakePlan(PlanConfig(8), ParallelMode::kLayerSplit, 0, {});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  plan = MakePlan(PlanConfig(8), ParallelMode::kLayerSplit, 3, {1, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("2 layer weights given for 3 pipeline stage"));
  plan = MakePlan(PlanConfig(8), ParallelMode::kLayerSplit, 3, {1, 0, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("layer weight 1 is 0"));
  plan = MakePlan(PlanConfig(8), ParallelMode::kLayerSplit, 2, {1, -2});
  EXPECT_FALSE(plan.ok());
  plan = MakePlan(PlanConfig(2), ParallelMode::kLayerSplit, 3, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("3 pipeline stages for a model of 2 layers"));
}

TEST(PlanTest, TensorParallel) {
  const ModelConfig c = PlanConfig(6, /*kv_heads=*/4, /*experts=*/8);
  EXPECT_THAT(ValidTensorParallelSizes(c), ElementsAre(1, 2, 4));
  for (int workers = 1; workers <= 6; ++workers) {
    SCOPED_TRACE(workers);
    absl::StatusOr<Plan> plan = MakePlan(c, ParallelMode::kTensorParallel, workers, {});
    if (workers == 3 || workers > 4) {
      ASSERT_FALSE(plan.ok());
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(plan.status().message(), HasSubstr("worker counts that work: 1, 2, 4"));
      EXPECT_THAT(plan.status().message(), HasSubstr("4 KV heads, 8 experts"));
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->pp_size, 1);
    EXPECT_EQ(plan->tp_size, workers);
    for (int w = 0; w < workers; ++w) {
      const ShardSpec& s = plan->shards[w];
      EXPECT_EQ(s.layer_begin, 0);
      EXPECT_EQ(s.layer_end, 6);
      EXPECT_EQ(s.tp_rank, w);
      EXPECT_EQ(s.tp_size, workers);
      EXPECT_TRUE(s.first_stage && s.last_stage);
      EXPECT_EQ(plan->WorkerIndex(plan->PpRank(w), plan->TpRank(w)), w);
    }
  }
  // One dense layer: its intermediate size must divide too.
  const ModelConfig dense = PlanConfig(4, /*kv_heads=*/8, /*experts=*/8, /*dense=*/6, /*has_dense_layer=*/true);
  EXPECT_THAT(ValidTensorParallelSizes(dense), ElementsAre(1, 2));
  auto plan = MakePlan(dense, ParallelMode::kTensorParallel, 4, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("worker counts that work: 1, 2 (they divide 8 KV heads, 8 experts, "
                                                 "dense intermediate 6)"));
  // The same dense size without dense layers does not constrain.
  EXPECT_THAT(ValidTensorParallelSizes(PlanConfig(4, 8, 8, 6, false)), ElementsAre(1, 2, 4, 8));
  // Weights belong to pipeline stages: tensor parallel has one.
  plan = MakePlan(c, ParallelMode::kTensorParallel, 2, {1, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("for 1 pipeline stage"));
}

TEST(PlanTest, ParseMode) {
  EXPECT_EQ(*ParseMode("layer-split"), ParallelMode::kLayerSplit);
  EXPECT_EQ(*ParseMode("tensor-parallel"), ParallelMode::kTensorParallel);
  EXPECT_EQ(ParseMode("pipeline").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModeName(ParallelMode::kTensorParallel), "tensor-parallel");
}

TEST(PlanTest, ParseLayerWeights) {
  EXPECT_THAT(*ParseLayerWeights("2,1,1"), ElementsAre(2.0, 1.0, 1.0));
  EXPECT_THAT(*ParseLayerWeights(" 2, 1.5 ,1 "), ElementsAre(2.0, 1.5, 1.0));
  EXPECT_TRUE(ParseLayerWeights("")->empty());
  for (const char* bad : {"2,,1", "a", "0", "1,-1", "inf", "nan", "1,"}) {
    EXPECT_EQ(ParseLayerWeights(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace moeshard
