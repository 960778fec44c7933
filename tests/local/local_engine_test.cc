// The Engine in one process (local/) on a test model with a tokenizer: its greedy tokens equal
// an independent loop written here (the runner's Forward and an argmax, one token at a time),
// concurrent requests batch without changing their tokens, a stop string ends the output as
// the router ends it, and the pool refuses a KV pool that is not its runner's.
#include "local/local_engine.h"

#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "local/inprocess_worker_pool.h"
#include "tests/testdata/testdata_dir.h"
#include "worker/kv_cache.h"
#include "common/model/model_loader.h"
#include "worker/sampler.h"

namespace moeshard {
namespace {

constexpr int64_t kBlocks = 64, kBlockSize = 16;

RunnerOptions CpuOptions() {
  RunnerOptions ro;
  ro.device = Device::kCpu;
  ro.num_kv_blocks = kBlocks;
  ro.block_size = kBlockSize;
  return ro;
}

class LocalEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::TestDataDir() + "/qwen3moe-tok";
    ASSERT_TRUE(std::filesystem::exists(path)) << "no test model at " << path;
    auto m = LoadModel(path, /*load_tokenizer=*/true);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<LoadedModel>(std::move(*m));
    ASSERT_NE(model_->tokenizer, nullptr);
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> NewRunner() {
    const ModelConfig& c = model_->config;
    return ModelRunner::Create(c, *model_->source, ShardSpec{0, c.num_layers, 0, 1, true, true}, CpuOptions());
  }
  // The reference: prefill, then one token at a time, argmax of the last row.
  std::vector<int32_t> ReferenceGreedy(const std::vector<int32_t>& prompt, int64_t n) {
    auto runner = NewRunner();
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return {};
    BlockAllocator blocks(kBlocks);
    std::vector<int32_t> table, out;
    EXPECT_TRUE(blocks.Reserve(table, static_cast<int64_t>(prompt.size()) + n, kBlockSize).ok());
    std::vector<float> logits;
    EXPECT_TRUE((*runner)->Forward({SeqChunk{prompt, 0, table, false}}, &logits).ok());
    const int64_t vocab = model_->config.vocab_size;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(ArgMax(logits.data(), vocab));
      if (i + 1 == n) break;
      const int64_t pos = static_cast<int64_t>(prompt.size()) + i;
      EXPECT_TRUE((*runner)->Forward({SeqChunk{{out.back()}, pos, table, false}}, &logits).ok());
    }
    return out;
  }
  std::unique_ptr<Engine> Start() {
    auto runner = NewRunner();
    EXPECT_TRUE(runner.ok()) << runner.status();
    LocalEngineOptions eo;
    eo.max_model_len = kBlocks * kBlockSize;
    eo.max_tokens_per_step = 16;  // the prompts below run as several prefill chunks
    auto engine = StartLocalEngine(std::move(*runner), eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  EngineRequest Greedy(const std::string& text, int64_t n) {
    EngineRequest r;
    auto ids = model_->tokenizer->Encode(text);
    EXPECT_TRUE(ids.ok());
    r.prompt_ids = *ids;
    r.max_tokens = n;
    r.ignore_eos = true;
    return r;
  }

  std::unique_ptr<LoadedModel> model_;
};

TEST_F(LocalEngineTest, GreedyEqualsAReferenceLoopAlsoWhenBatched) {
  auto engine = Start();
  ASSERT_NE(engine, nullptr);
  const EngineRequest a = Greedy("The quick brown fox jumps over the lazy dog, and then it", 12);
  const EngineRequest b = Greedy("Once upon a time", 9);
  const std::vector<int32_t> want_a = ReferenceGreedy(a.prompt_ids, 12), want_b = ReferenceGreedy(b.prompt_ids, 9);
  ASSERT_EQ(want_a.size(), 12u);
  auto alone = RunRequest(*engine, a);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->tokens, want_a);
  EXPECT_EQ(alone->finish_reason, "length");
  // Both at once: they share steps (continuous batching), each keeps its own tokens.
  auto fa = std::async(std::launch::async, [&] { return RunRequest(*engine, a); });
  auto fb = std::async(std::launch::async, [&] { return RunRequest(*engine, b); });
  auto ra = fa.get(), rb = fb.get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_EQ(ra->tokens, want_a);
  EXPECT_EQ(rb->tokens, want_b);
}

TEST_F(LocalEngineTest, StopStringEndsTheOutputAsTheRouterDoes) {
  auto engine = Start();
  ASSERT_NE(engine, nullptr);
  const EngineRequest req = Greedy("Once upon a time", 24);
  TextOptions text;
  text.tokenizer = model_->tokenizer.get();
  auto whole = RunRequest(*engine, req, text);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->tokens.size(), 24u);
  // A stop string of two characters from the middle of the greedy text.
  std::string stop;
  size_t at = whole->text.size() / 3;
  for (; at + 2 <= whole->text.size() && stop.empty(); ++at) {
    const std::string c = whole->text.substr(at, 2);
    if (c[0] > ' ' && c[0] < 127 && c[1] > ' ' && c[1] < 127) stop = c;
  }
  ASSERT_FALSE(stop.empty()) << whole->text;
  text.stop = {stop};
  auto cut = RunRequest(*engine, req, text);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->text, whole->text.substr(0, whole->text.find(stop)));
  EXPECT_EQ(cut->finish_reason, "stop");
  EXPECT_EQ(cut->stop_string, stop);
  // The tokens are the greedy ones up to the token that completed the stop string.
  ASSERT_FALSE(cut->tokens.empty());
  ASSERT_LT(cut->tokens.size(), whole->tokens.size());
  EXPECT_EQ(cut->tokens, std::vector<int32_t>(whole->tokens.begin(), whole->tokens.begin() + cut->tokens.size()));
  std::string upto;
  for (int32_t t : cut->tokens) upto += *model_->tokenizer->TokenBytes(t);
  EXPECT_NE(upto.find(stop), std::string::npos);
  upto.clear();
  for (size_t i = 0; i + 1 < cut->tokens.size(); ++i) upto += *model_->tokenizer->TokenBytes(cut->tokens[i]);
  EXPECT_EQ(upto.find(stop), std::string::npos);  // not complete one token earlier
}

TEST_F(LocalEngineTest, PoolRefusesAnotherKvPool) {
  auto runner = NewRunner();
  ASSERT_TRUE(runner.ok());
  InProcessWorkerPool pool(runner->get());
  Plan plan;
  plan.num_workers = 1;
  HandshakeOptions ho;
  ho.num_kv_blocks = kBlocks;
  ho.block_size = kBlockSize;
  EXPECT_TRUE(pool.Handshake(plan, ho).ok());
  ho.num_kv_blocks = kBlocks * 2;
  EXPECT_EQ(pool.Handshake(plan, ho).code(), absl::StatusCode::kFailedPrecondition);
  plan.num_workers = 2;
  EXPECT_EQ(pool.Handshake(plan, ho).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeshard
