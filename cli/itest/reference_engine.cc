#include "cli/itest/reference_engine.h"

#include "common/status.h"
#include "worker/generation.h"

namespace moeshard::itest {

// Room for the longest sequence the suite asks for (prompts up to a few hundred tokens).
constexpr int64_t kMaxPositions = 2048;

absl::StatusOr<std::unique_ptr<ReferenceEngine>> ReferenceEngine::Load(const std::string& path) {
  std::unique_ptr<ReferenceEngine> e(new ReferenceEngine());
  ASSIGN_OR_RETURN(e->model_, LoadModel(path, /*load_tokenizer=*/true));
  const ModelConfig& c = e->model_.config;
  RunnerOptions ro;
  ro.num_kv_blocks = kMaxPositions / ro.block_size + 2;
  ShardSpec shard{0, c.num_layers, 0, 1, true, true};
  ASSIGN_OR_RETURN(e->runner_, ModelRunner::Create(c, *e->model_.source, shard, ro));
  e->blocks_ = std::make_unique<BlockAllocator>(ro.num_kv_blocks);
  return e;
}

absl::StatusOr<std::vector<int32_t>> ReferenceEngine::Greedy(const std::vector<int32_t>& prompt, int64_t n) {
  if (static_cast<int64_t>(prompt.size()) + n > kMaxPositions) {
    return absl::InvalidArgumentError("reference engine: sequence longer than it was sized for");
  }
  std::lock_guard<std::mutex> lock(mu_);
  GenerateOptions go;  // temperature 0, no EOS ids: greedy for exactly n tokens
  go.max_new_tokens = n;
  ASSIGN_OR_RETURN(GenerateResult r, Generate(*runner_, *blocks_, prompt, go));
  return r.tokens;
}

}  // namespace moeshard::itest
