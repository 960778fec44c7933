// `moeshard generate`: loads a model folder or .gguf file in this process, streams the
// continuation of a prompt (optionally chat-formatted), then prints prompt and generation
// speed. It runs the cluster's Engine over an in-process worker pool (local/local_engine.h),
// so scheduling, sampling and stop strings are the served ones.
#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/flags/args.h"
#include "worker/runner_flags.h"
#include "cli/commands.h"
#include "common/status.h"
#include "common/tokenizer/chat_template.h"
#include "common/model/kv_pools.h"
#include "common/model/model_loader.h"
#include "local/local_engine.h"

namespace moeshard {
namespace {

absl::Status RunGenerate(const Args& a) {
  ASSIGN_OR_RETURN(std::string path, a.Required("model"));
  ASSIGN_OR_RETURN(int64_t n, a.GetInt("max-tokens", 32));
  ASSIGN_OR_RETURN(double temp, a.GetDouble("temperature", 0.0));
  ASSIGN_OR_RETURN(int64_t seed, a.GetInt("seed", -1));
  ASSIGN_OR_RETURN(int64_t top_k, a.GetInt("top-k", 0));
  ASSIGN_OR_RETURN(double top_p, a.GetDouble("top-p", 1.0));
  ASSIGN_OR_RETURN(double min_p, a.GetDouble("min-p", 0.0));
  if (n < 0 || n > 1000000) return absl::InvalidArgumentError("-n must be between 0 and 1000000");
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(path));
  std::vector<int32_t> prompt;
  if (a.Has("prompt-ids")) {
    for (auto piece : absl::StrSplit(a.Get("prompt-ids"), ',', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(piece, &id)) return absl::InvalidArgumentError("--prompt-ids needs comma-separated integers");
      prompt.push_back(id);
    }
  } else {
    ASSIGN_OR_RETURN(std::string text, a.Required("prompt"));
    if (m.tokenizer == nullptr) return absl::FailedPreconditionError("this model has no tokenizer; use --prompt-ids");
    if (a.Flag("chat")) {
      ChatOptions co;
      co.enable_thinking = !a.Flag("no-think");
      ASSIGN_OR_RETURN(text, RenderChatMl({{"user", text}}, co));
    }
    ASSIGN_OR_RETURN(prompt, m.tokenizer->Encode(text));
  }
  ASSIGN_OR_RETURN(RunnerOptions ro, ParseRunnerFlags(a));
  ro.num_kv_blocks = (static_cast<int64_t>(prompt.size()) + n) / ro.block_size + 2;
  // Sliding-window layers in their own pool of just their window when that is smaller (the
  // engine frees their blocks as the sequence moves on).
  ro.num_sliding_kv_blocks = DefaultSlidingKvBlocks(m.config, ro.num_kv_blocks, ro.block_size, 1, ro.max_batch_tokens);
  ShardSpec shard{0, m.config.num_layers, 0, 1, true, true};
  ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(m.config, *m.source, shard, ro));
  EngineRequest req;
  req.prompt_ids = prompt;
  req.max_tokens = n;
  req.sampling.temperature = static_cast<float>(temp);
  req.sampling.top_k = static_cast<int32_t>(top_k);
  req.sampling.top_p = static_cast<float>(top_p);
  req.sampling.min_p = static_cast<float>(min_p);
  req.sampling.has_seed = seed >= 0;
  req.sampling.seed = static_cast<uint64_t>(seed);
  RETURN_IF_ERROR(req.sampling.Validate());
  TextOptions text;
  text.tokenizer = m.tokenizer.get();
  if (a.Has("stop")) text.stop.push_back(a.Get("stop"));
  if (m.tokenizer) {
    auto shown = m.tokenizer->Decode(prompt);
    if (shown.ok()) std::fputs(shown->c_str(), stdout);
  }
  LocalResult r;
  if (n > 0) {
    LocalEngineOptions eo;
    eo.max_model_len = static_cast<int64_t>(prompt.size()) + n + 1;
    eo.max_num_seqs = 1;
    eo.max_tokens_per_step = ro.max_batch_tokens;
    ASSIGN_OR_RETURN(auto engine, StartLocalEngine(std::move(runner), eo));
    ASSIGN_OR_RETURN(r, RunRequest(*engine, req, text, [&](int32_t tok, const std::string& piece) {
      if (!m.tokenizer) {
        if (tok >= 0) std::printf("%d ", tok);
      } else {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
      }
      std::fflush(stdout);
    }));
  }
  std::printf("\n");
  const double prefill = r.first_token_seconds, decode = r.seconds - r.first_token_seconds;
  const size_t decoded = r.tokens.empty() ? 0 : r.tokens.size() - 1;
  std::fprintf(stderr, "prompt: %zu tokens, %.1f tok/s | generation: %zu tokens, %.1f tok/s | finish: %s\n",
               prompt.size(), prefill > 0 ? prompt.size() / prefill : 0.0, r.tokens.size(),
               decode > 0 ? decoded / decode : 0.0, r.finish_reason.empty() ? "length" : r.finish_reason.c_str());
  return absl::OkStatus();
}

}  // namespace

int GenerateCommand(const std::vector<std::string>& argv) {
  std::vector<std::string> norm;
  for (auto& s : argv) norm.push_back(s == "-n" ? "--max-tokens" : s);
  auto a = Args::Parse(norm, {"model", "prompt", "prompt-ids", "max-tokens", "temperature", "seed", "top-k", "top-p", "min-p", "stop",
                              "device", "gpu", "dtype", "kv-dtype", "expert-layout", "max-batch-tokens"},
                       {"chat", "no-think", "help"});
  if (!a.ok() || a->Flag("help")) {
    std::fprintf(stderr,
                 "usage: moeshard generate --model PATH (--prompt TEXT | --prompt-ids 1,2,3) [-n N] [--chat [--no-think]]\n"
                 "       [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--stop STRING]\n"
                 "       [--device cpu|cuda] [--gpu N] [--dtype bfloat16|float32] [--kv-dtype auto|float32|bfloat16|fp8]\n"
                 "       [--max-batch-tokens N]  (tokens per step; a longer prompt is prefilled in chunks)\n%s\n",
                 a.ok() ? "" : std::string(a.status().message()).c_str());
    return a.ok() ? 0 : 2;
  }
  absl::Status st = RunGenerate(*a);
  if (!st.ok()) {
    std::fprintf(stderr, "generate: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace moeshard
