// Chunked prefill outside the serving path (local/chunked_forward.h): how a batch is cut into
// steps, and that a prompt several steps long gives bit-identical float32 logits to one big
// step on the CPU — for one worker, tensor parallel 2 and layer split 2 in-process — and
// matches the test models' goldens through `moeshard check`'s path (CheckModel) with a small
// --max-batch-tokens, the engine's greedy generations included.
#include "local/chunked_forward.h"

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "common/model/kv_pools.h"
#include "common/model/model_loader.h"
#include "eval/golden_check.h"
#include "gtest/gtest.h"
#include "local/local_engine.h"
#include "tests/testdata/testdata_dir.h"
#include "worker/inprocess_group.h"
#include "worker/kv_cache.h"

namespace moeshard {
namespace {

std::vector<int32_t> Iota(int32_t n, int32_t from) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// `n` ids in [0, vocab) from `seed` (a fixed linear congruential sequence).
std::vector<int32_t> Prompt(int64_t n, uint64_t seed, int64_t vocab) {
  std::vector<int32_t> v(n);
  for (int32_t& id : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(vocab));
  }
  return v;
}

TEST(SplitIntoSteps, CutsAtTheStepSizeAndContinuesAtTheNextPosition) {
  const std::vector<SeqChunk> batch = {SeqChunk{Iota(10, 100), 3, {7, 8}, true}, SeqChunk{Iota(5, 200), 0, {9}, false}};
  const auto steps = SplitIntoSteps(batch, 4);
  // A: 10 tokens from position 3 -> 4 + 4 + 2; B fills the third step's 2 left and 3 more.
  ASSERT_EQ(steps.size(), 4u);
  const std::vector<std::vector<std::pair<int64_t, size_t>>> want = {
      {{3, 4}}, {{7, 4}}, {{11, 2}, {0, 2}}, {{2, 3}}};  // (start_pos, tokens) per piece
  for (size_t s = 0; s < steps.size(); ++s) {
    ASSERT_EQ(steps[s].size(), want[s].size()) << "step " << s;
    for (size_t p = 0; p < steps[s].size(); ++p) {
      EXPECT_EQ(steps[s][p].start_pos, want[s][p].first) << "step " << s << " piece " << p;
      EXPECT_EQ(steps[s][p].tokens.size(), want[s][p].second) << "step " << s << " piece " << p;
    }
  }
  EXPECT_EQ(steps[1][0].tokens, Iota(4, 104));
  EXPECT_EQ(steps[2][1].tokens, Iota(2, 200));
  EXPECT_EQ(steps[3][0].tokens, Iota(3, 202));
  EXPECT_EQ(steps[3][0].block_table, std::vector<int32_t>{9});
  EXPECT_TRUE(steps[2][0].all_logits);
  EXPECT_FALSE(steps[3][0].all_logits);
  // A step that fits is one step, untouched.
  const auto one = SplitIntoSteps(batch, 15);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].size(), 2u);
  EXPECT_EQ(one[0][0].tokens, batch[0].tokens);
}

struct Layout {
  const char* model;
  int tp, stages;
};

class ChunkedForwardTest : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    const std::string path = test::TestDataDir() + "/" + GetParam().model;
    ASSERT_TRUE(std::filesystem::exists(path)) << "no test model at " << path;
    auto m = LoadModel(path, /*load_tokenizer=*/false);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<LoadedModel>(std::move(*m));
    goldens_ = path + "/goldens.safetensors";
    ASSERT_TRUE(std::filesystem::exists(goldens_)) << goldens_;
  }
  RunnerOptions Options(int64_t max_batch_tokens) const {
    RunnerOptions ro;
    ro.device = Device::kCpu;
    ro.num_kv_blocks = 128;
    ro.block_size = 16;
    ro.max_batch_tokens = max_batch_tokens;
    return ro;
  }
  // Logits of `batch` (block tables filled in here) in steps of `step` tokens (0: one Forward).
  std::vector<float> Run(std::vector<SeqChunk> batch, int64_t step) {
    auto runner = CreateInProcessRunner(model_->config, *model_->source, Options(step > 0 ? step : 8192), GetParam().tp,
                                        GetParam().stages);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return {};
    BlockAllocator blocks(128);
    std::vector<std::vector<int32_t>> tables(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      EXPECT_TRUE(blocks.Reserve(tables[i], batch[i].start_pos + batch[i].tokens.size(), 16).ok());
      batch[i].block_table = tables[i];
    }
    std::vector<float> logits;
    absl::Status st = step > 0 ? ForwardChunked(**runner, batch, &logits) : (*runner)->Forward(batch, &logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  }
  std::unique_ptr<LoadedModel> model_;
  std::string goldens_;
};

// A 300-token prompt in steps of 16, 7 and 1 tokens: every position's logits equal one step's,
// bit for bit (float32 on the CPU: a row's arithmetic does not depend on the step).
TEST_P(ChunkedForwardTest, LongPromptIsBitIdenticalToOneStep) {
  const int64_t V = model_->config.vocab_size;
  const std::vector<int32_t> prompt = Prompt(300, 5, V);
  const std::vector<float> whole = Run({SeqChunk{prompt, 0, {}, true}}, 0);
  ASSERT_EQ(static_cast<int64_t>(whole.size()), 300 * V);
  for (int64_t step : {16, 7}) {
    EXPECT_EQ(Run({SeqChunk{prompt, 0, {}, true}}, step), whole) << "steps of " << step;
  }
  // Last-position logits only (what a prefill asks for), in steps of 1.
  const std::vector<float> last(whole.end() - V, whole.end());
  EXPECT_EQ(Run({SeqChunk{prompt, 0, {}, false}}, 1), last);
}

// A ragged batch (all logits, last only, all logits; one starts past position 0 is not
// possible without its KV, so all start at 0) cut across sequence boundaries.
TEST_P(ChunkedForwardTest, RaggedBatchKeepsItsRowsInOrder) {
  const int64_t V = model_->config.vocab_size;
  std::vector<SeqChunk> batch = {SeqChunk{Prompt(37, 1, V), 0, {}, true}, SeqChunk{Prompt(50, 2, V), 0, {}, false},
                                 SeqChunk{Prompt(23, 3, V), 0, {}, true}};
  const std::vector<float> whole = Run(batch, 0);
  ASSERT_EQ(static_cast<int64_t>(whole.size()), (37 + 1 + 23) * V);
  EXPECT_EQ(Run(batch, 16), whole);
  EXPECT_EQ(Run(batch, 9), whole);
}

// `moeshard check`'s path with --max-batch-tokens 16: the goldens' 100-token sequence is
// seven steps (whole, batched and the decode's prefill half), the generations run through the
// engine in steps of 16, and everything is within the fp32 tolerance — with the same errors
// as unchunked.
TEST_P(ChunkedForwardTest, CheckPassesTheGoldensInSmallSteps) {
  CheckLayout chunked{Options(16), GetParam().tp, GetParam().stages};
  auto rep = CheckModel(*model_, goldens_, CheckLimits(Tolerance::kFp32), chunked);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->pass()) << rep->Format();
  ASSERT_FALSE(rep->gens.empty());
  CheckLayout whole{Options(8192), GetParam().tp, GetParam().stages};
  auto ref = CheckModel(*model_, goldens_, CheckLimits(Tolerance::kFp32), whole);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(rep->seqs.size(), ref->seqs.size());
  for (size_t i = 0; i < rep->seqs.size(); ++i) {
    EXPECT_EQ(rep->seqs[i].max_err, ref->seqs[i].max_err) << rep->seqs[i].name;
    EXPECT_EQ(rep->seqs[i].max_lse_err, ref->seqs[i].max_lse_err) << rep->seqs[i].name;
  }
  bool long_seq = false;
  for (const SeqReport& s : rep->seqs) long_seq |= s.positions >= 100;
  EXPECT_TRUE(long_seq) << "the goldens hold no sequence several steps of 16 long";
}

// A runner that records the largest step it was given, over a real one.
class StepRecorder : public ModelRunner {
 public:
  explicit StepRecorder(std::unique_ptr<ModelRunner> inner)
      : ModelRunner(inner->config(), inner->shard(), inner->options()), inner_(std::move(inner)) {}
  absl::Status Embed(const std::vector<SeqChunk>& b, std::vector<float>* h) override { return inner_->Embed(b, h); }
  absl::Status RunLayers(const std::vector<SeqChunk>& b, std::vector<float>* h) override {
    return inner_->RunLayers(b, h);
  }
  absl::Status Head(const std::vector<SeqChunk>& b, const std::vector<float>& h, std::vector<float>* l) override {
    return inner_->Head(b, h, l);
  }
  absl::Status Forward(const std::vector<SeqChunk>& b, std::vector<float>* l) override {
    int64_t n = 0;
    for (const SeqChunk& c : b) n += static_cast<int64_t>(c.tokens.size());
    *largest_ = std::max(*largest_, n);
    return inner_->Forward(b, l);
  }
  size_t kv_bytes() const override { return inner_->kv_bytes(); }
  std::string backend() const override { return inner_->backend(); }
  std::shared_ptr<int64_t> largest() const { return largest_; }

 private:
  std::unique_ptr<ModelRunner> inner_;
  std::shared_ptr<int64_t> largest_ = std::make_shared<int64_t>(0);
};

// `moeshard generate`'s path: the in-process Engine over a runner of max_batch_tokens 8 prefills a
// 150-token prompt in steps of at most 8 (its step is capped at the runner's) and generates the
// same greedy tokens as over a runner that takes the prompt in one step.
TEST_P(ChunkedForwardTest, EngineStepsAreCappedAtTheRunnersBatch) {
  const int64_t V = model_->config.vocab_size;
  EngineRequest req;
  req.prompt_ids = Prompt(150, 11, V);
  req.max_tokens = 12;
  req.ignore_eos = true;
  std::vector<std::vector<int32_t>> got;
  for (int64_t step : {8, 8192}) {
    auto runner =
        CreateInProcessRunner(model_->config, *model_->source, Options(step), GetParam().tp, GetParam().stages);
    ASSERT_TRUE(runner.ok()) << runner.status();
    auto recorder = std::make_unique<StepRecorder>(std::move(*runner));
    std::shared_ptr<int64_t> largest = recorder->largest();
    LocalEngineOptions eo;  // its own step would be 512
    auto engine = StartLocalEngine(std::move(recorder), eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto r = RunRequest(**engine, req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens.size(), 12u);
    got.push_back(r->tokens);
    (*engine)->Stop();
    EXPECT_EQ(*largest, std::min<int64_t>(step, 150)) << "the largest step over a runner of " << step;
  }
  EXPECT_EQ(got[0], got[1]);
}

// The in-process commands over a runner with a sliding pool (muse-spark-tiny: window 16, layers of
// both kinds): a ragged batch of 300-, 90- and 41-token prompts in steps of 16, 7 and 40 tokens
// gives the one-pool logits bit for bit, every chunk's sliding table holding only its window
// (the pool is sized for the window and one step, far below the prompts' blocks), and every
// sliding block is back in the pool afterwards. A one-kind model keeps one pool.
TEST_P(ChunkedForwardTest, SlidingPoolGivesTheOnePoolLogits) {
  const ModelConfig& c = model_->config;
  const int64_t V = c.vocab_size;
  std::vector<SeqChunk> batch = {SeqChunk{Prompt(300, 21, V), 0, {}, true}, SeqChunk{Prompt(90, 22, V), 0, {}, false},
                                 SeqChunk{Prompt(41, 23, V), 0, {}, true}};
  const std::vector<float> whole = Run(batch, 0);
  for (int64_t step : {16, 7, 40}) {
    RunnerOptions ro = Options(step);
    ro.num_sliding_kv_blocks = DefaultSlidingKvBlocks(c, ro.num_kv_blocks, ro.block_size, 3, step);
    auto runner = CreateInProcessRunner(c, *model_->source, ro, GetParam().tp, GetParam().stages);
    ASSERT_TRUE(runner.ok()) << runner.status();
    if (!HasBothLayerKinds(c)) {
      EXPECT_EQ(ro.num_sliding_kv_blocks, 0);
      EXPECT_FALSE((*runner)->sliding_pool());
      continue;
    }
    ASSERT_TRUE((*runner)->sliding_pool()) << "steps of " << step;
    EXPECT_LT(ro.num_sliding_kv_blocks, (300 + 90 + 41) / 16) << "a pool that could hold every block proves nothing";
    BlockAllocator blocks(128);
    std::vector<SeqChunk> b = batch;
    std::vector<std::vector<int32_t>> tables(b.size());
    for (size_t i = 0; i < b.size(); ++i) {
      ASSERT_TRUE(blocks.Reserve(tables[i], static_cast<int64_t>(b[i].tokens.size()), 16).ok());
      b[i].block_table = tables[i];
    }
    SlidingTables sliding(**runner);
    std::vector<float> logits;
    absl::Status st = ForwardChunked(**runner, b, &logits, 0, &sliding);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(logits, whole) << "steps of " << step;
    for (int64_t i = 0; i < 3; ++i) sliding.Release(i);
    EXPECT_EQ(sliding.num_free(), ro.num_sliding_kv_blocks);
    // Without the caller's tables the call keeps its own, with the same logits.
    std::vector<float> again;
    ASSERT_TRUE(ForwardChunked(**runner, b, &again).ok());
    EXPECT_EQ(again, whole) << "steps of " << step << ", the call's own tables";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ChunkedForwardTest,
                         ::testing::Values(Layout{"muse-spark-tiny", 1, 1}, Layout{"qwen3moe-tiny", 1, 1},
                                           Layout{"muse-spark-tiny", 2, 1}, Layout{"qwen3moe-tiny", 1, 2}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           std::string n = std::string(i.param.model) + "_tp" + std::to_string(i.param.tp) + "_ls" +
                                           std::to_string(i.param.stages);
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace moeshard
