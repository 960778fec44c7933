// Multi-rank forward passes in one process, one thread per rank over LocalGroup: tensor
// parallel (heads and experts split, fp32 all-reduce) and layer split (hidden states
// handed from stage to stage) must give the single-worker logits.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/comm/local_communicator.h"
#include "gtest/gtest.h"
#include "tests/testdata/testdata_dir.h"
#include "common/model/model_loader.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

std::string TpTestData() { return test::TestDataDir(); }

std::vector<int32_t> Ids(int n, int vocab) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((i * 37 + 11) % vocab);
  return v;
}

std::vector<SeqChunk> Batch(int vocab) {
  std::vector<SeqChunk> b = {{Ids(23, vocab), 0, {}, true}, {Ids(9, vocab), 0, {}, true}};
  b[0].block_table = {0, 1};
  b[1].block_table = {2};
  return b;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// A test model and the tensor-parallel sizes it must run (each divides its KV heads and
// experts: muse-spark-kv4 exists so that 4 does).
struct TpCase {
  const char* model;
  std::vector<int> tp_sizes;
};

class MultiRankTest : public ::testing::TestWithParam<TpCase> {
 protected:
  void SetUp() override {
    std::string path = TpTestData() + "/" + GetParam().model;
    ASSERT_TRUE(std::filesystem::exists(path)) << "no test model at " << path;
    auto m = LoadModel(path, false);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<LoadedModel>(std::move(*m));
    auto r = ModelRunner::Create(model_->config, *model_->source, {0, model_->config.num_layers, 0, 1, true, true}, opts_);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*r)->Forward(Batch(model_->config.vocab_size), &reference_).ok());
  }
  // Two layer-split stages, uneven: stage 0 takes one layer, stage 1 the rest.
  void TwoStages(std::unique_ptr<ModelRunner>* r0, std::unique_ptr<ModelRunner>* r1) {
    const ModelConfig& c = model_->config;
    auto a = ModelRunner::Create(c, *model_->source, {0, 1, 0, 1, true, false}, opts_);
    auto b = ModelRunner::Create(c, *model_->source, {1, c.num_layers, 0, 1, false, true}, opts_);
    ASSERT_TRUE(a.ok() && b.ok());
    *r0 = std::move(*a);
    *r1 = std::move(*b);
  }
  RunnerOptions opts_{8, 16};
  std::unique_ptr<LoadedModel> model_;
  std::vector<float> reference_;
};

TEST_P(MultiRankTest, TensorParallelMatchesOneWorker) {
  for (int tp : GetParam().tp_sizes) {
    const ModelConfig& c = model_->config;
    ASSERT_EQ(c.num_kv_heads % tp, 0) << "tp " << tp;
    ASSERT_EQ(c.num_experts % tp, 0) << "tp " << tp;
    auto group = LocalGroup::Create(tp);
    std::vector<std::vector<float>> out(tp);
    std::vector<absl::Status> st(tp);
    std::vector<std::thread> th;
    for (int r = 0; r < tp; ++r) {
      th.emplace_back([&, r] {
        auto comm = group->Rank(r);
        auto runner = ModelRunner::Create(c, *model_->source, {0, c.num_layers, r, tp, true, true}, opts_, comm.get());
        if (!runner.ok()) {
          st[r] = runner.status();
          comm->Abort();
          return;
        }
        st[r] = (*runner)->Forward(Batch(c.vocab_size), &out[r]);
      });
    }
    for (auto& t : th) t.join();
    for (int r = 0; r < tp; ++r) {
      ASSERT_TRUE(st[r].ok()) << "tp " << tp << " rank " << r << ": " << st[r];
      EXPECT_LT(MaxDiff(out[r], reference_), 2e-4) << "tp " << tp << " rank " << r;
    }
  }
}

TEST_P(MultiRankTest, LayerSplitMatchesOneWorker) {
  std::unique_ptr<ModelRunner> r0, r1;
  ASSERT_NO_FATAL_FAILURE(TwoStages(&r0, &r1));
  auto batch = Batch(model_->config.vocab_size);
  std::vector<float> hidden, logits;
  ASSERT_TRUE(r0->Embed(batch, &hidden).ok());
  ASSERT_TRUE(r0->RunLayers(batch, &hidden).ok());
  ASSERT_TRUE(r1->RunLayers(batch, &hidden).ok());
  ASSERT_TRUE(r1->Head(batch, hidden, &logits).ok());
  EXPECT_EQ(MaxDiff(logits, reference_), 0.0);
}

// The residual trace follows the stream: in a layer split, each stage reports its own layers
// (model indices, attention then MLP) for the traced row, and a stage's last report is exactly
// the hidden state it hands on; a position no chunk holds is not traced.
TEST_P(MultiRankTest, ResidualTraceFollowsTheStream) {
  const ModelConfig& c = model_->config;
  std::unique_ptr<ModelRunner> r0, r1;
  ASSERT_NO_FATAL_FAILURE(TwoStages(&r0, &r1));
  std::vector<ResidualTrace> got;
  auto sink = [&got](const ResidualTrace& t) { got.push_back(t); };
  r0->SetResidualTrace(5, sink);  // row 5 of the first chunk
  r1->SetResidualTrace(5, sink);
  auto batch = Batch(c.vocab_size);
  const int64_t H = c.hidden_size;
  std::vector<float> hidden;
  ASSERT_TRUE(r0->Embed(batch, &hidden).ok());
  ASSERT_TRUE(r0->RunLayers(batch, &hidden).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].s, std::vector<float>(hidden.begin() + 5 * H, hidden.begin() + 6 * H));
  ASSERT_TRUE(r1->RunLayers(batch, &hidden).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(2 * c.num_layers));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].position, 5);
    EXPECT_EQ(got[i].layer, static_cast<int64_t>(i / 2));
    EXPECT_EQ(got[i].block, i % 2 == 0 ? Block::kAttention : Block::kMlp);
    ASSERT_EQ(got[i].s.size(), static_cast<size_t>(H));
  }
  EXPECT_NE(got[0].s, got[1].s);
  EXPECT_EQ(got.back().s, std::vector<float>(hidden.begin() + 5 * H, hidden.begin() + 6 * H));
  got.clear();
  r0->SetResidualTrace(40, sink);  // beyond both chunks (23 and 9 tokens from position 0)
  ASSERT_TRUE(r0->Embed(batch, &hidden).ok());
  ASSERT_TRUE(r0->RunLayers(batch, &hidden).ok());
  EXPECT_TRUE(got.empty());
}

TEST_P(MultiRankTest, BadShardsAreRefused) {
  const ModelConfig& c = model_->config;
  EXPECT_FALSE(ModelRunner::Create(c, *model_->source, {0, c.num_layers + 1, 0, 1, true, true}, opts_).ok());
  EXPECT_FALSE(ModelRunner::Create(c, *model_->source, {0, c.num_layers, 0, 3, true, true}, opts_).ok());
  auto r = ModelRunner::Create(c, *model_->source, {0, c.num_layers, 0, 1, true, true}, opts_);
  ASSERT_TRUE(r.ok());
  std::vector<float> l;
  EXPECT_FALSE((*r)->Forward({{{static_cast<int32_t>(c.vocab_size)}, 0, {0}, false}}, &l).ok()) << "token out of range";
  EXPECT_FALSE((*r)->Forward({{{1, 2}, 0, {99}, false}}, &l).ok()) << "block id out of range";
  EXPECT_FALSE((*r)->Forward({{{1, 2}, 16, {0}, false}}, &l).ok()) << "table too short";
}

INSTANTIATE_TEST_SUITE_P(TestData, MultiRankTest,
                         ::testing::Values(TpCase{"qwen3moe-tiny", {2}}, TpCase{"muse-spark-tiny", {2}},
                                           TpCase{"muse-spark-tiny-nvfp4", {2}}, TpCase{"muse-spark-kv4", {2, 4}}),
                         [](const auto& i) {
                           std::string n = i.param.model;
                           for (auto& ch : n) ch = isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace moeshard
