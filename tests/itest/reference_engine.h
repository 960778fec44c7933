// The model run in this process by the serving Engine over an in-process worker pool
// (local/local_engine.h): the reference that a cluster's outputs must equal token for token.
// Thread-safe (one generation at a time).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "worker/kv_cache.h"
#include "common/model/model_loader.h"
#include "worker/model_runner.h"

namespace moeshard::itest {

struct GenerateOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 16;
  std::vector<int32_t> eos_ids;   // stop on these (the model's own EOS ids are not used)
  std::vector<std::string> stop;  // stop strings, as the router applies them
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // without the stop / EOS token
  std::string finish_reason;    // "stop" (EOS id or stop string) or "length"
};

// A near tie of the float32 router: at `position` and MoE layer `layer` (the model's index), the
// k-th expert by logit (`picked`, the last of the top k) and the (k+1)-th (`next`, the first left
// out), their logits `margin` apart (>= 0).
struct RouteTie {
  int64_t position = 0;
  int64_t layer = 0;
  int32_t picked = 0;
  int32_t next = 0;
  double margin = 0;
};

// The k-th and (k+1)-th entries of one token's router logits [E] in the pick's order (larger first,
// equal logits the lower expert first; K < E): `picked`, `next` and `margin` of a RouteTie.
RouteTie TopKBoundary(const float* row, int64_t E, int64_t K);

class ReferenceEngine {
 public:
  // Loads the model at `path` (folder or .gguf), all layers in one runner.
  static absl::StatusOr<std::unique_ptr<ReferenceEngine>> Load(const std::string& path);

  // Greedy continuation of `prompt`: exactly `n` tokens (EOS does not stop it). With `swap`,
  // the model runs with that router tie decided the other way: the two experts' logits exchanged
  // there (a bf16 run may pick either of two experts whose float32 logits nearly tie).
  absl::StatusOr<std::vector<int32_t>> Greedy(const std::vector<int32_t>& prompt, int64_t n,
                                              const RouteTie* swap = nullptr);
  // Generation with any options (sampling, EOS ids, stop strings: the model's tokenizer is
  // filled in when `options.stop` is set).
  absl::StatusOr<GenerateResult> Generate(const std::vector<int32_t>& prompt, GenerateOptions options);
  // The longest prompt plus completion it was sized for.
  static constexpr int64_t kMaxPositions = 4160;

  // Log-probabilities (float64 log-softmax of the fp32 logits) of the next token after each of
  // `seq`'s last `n` prefixes: row i is the distribution over the vocabulary that predicts
  // seq[size - n + i] (the last row predicts the token after `seq`).
  absl::StatusOr<std::vector<std::vector<double>>> LogProbs(const std::vector<int32_t>& seq, int64_t n,
                                                            const RouteTie* swap = nullptr);
  // The router's ties over seq's positions [0, upto): at each position and MoE layer the gap
  // between the k-th and (k+1)-th logits (ties between equal logits go to the lower expert, as
  // the pick does); the `count` smallest, smallest first.
  absl::StatusOr<std::vector<RouteTie>> RouteTies(const std::vector<int32_t>& seq, int64_t upto, int count);

  const ModelConfig& config() const { return model_.config; }
  const Tokenizer* tokenizer() const { return model_.tokenizer.get(); }

 private:
  ReferenceEngine() = default;
  // Generate with mu_ held.
  absl::StatusOr<GenerateResult> GenerateLocked(const std::vector<int32_t>& prompt, GenerateOptions options);
  // Installs the runner's router hook (mu_ held) that exchanges `swap`'s two logits (none when null).
  absl::Status SetSwap(const RouteTie* swap);
  // The fp32 logits of every position of seq [len, vocab] (mu_ held).
  absl::Status Forward(const std::vector<int32_t>& seq, std::vector<float>* logits);

  LoadedModel model_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockAllocator> blocks_;  // LogProbs' blocks; the engine frees all of its own
  std::unique_ptr<Engine> engine_;          // over runner_, no prefix cache
  std::mutex mu_;
};

}  // namespace moeshard::itest
