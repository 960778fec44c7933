#include "worker/generation.h"

#include <chrono>

#include "common/status.h"

namespace moeshard {

absl::StatusOr<GenerateResult> Generate(ModelRunner& runner, BlockAllocator& blocks, const std::vector<int32_t>& prompt,
                                        const GenerateOptions& opt, const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (opt.max_new_tokens < 0) return absl::InvalidArgumentError("max_new_tokens must not be negative");
  RETURN_IF_ERROR(opt.sampling.Validate());
  const int64_t V = runner.config().vocab_size;
  GenerateResult res;
  std::vector<int32_t> table;
  struct Freer {
    BlockAllocator& b;
    std::vector<int32_t>& t;
    ~Freer() { b.Free(t); }
  } freer{blocks, table};
  Sampler sampler(opt.sampling);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  int64_t pos = 0;
  const int64_t n = prompt.size();
  const int64_t chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : n;
  while (pos < n) {
    int64_t m = std::min(chunk, n - pos);
    SeqChunk c;
    c.tokens.assign(prompt.begin() + pos, prompt.begin() + pos + m);
    c.start_pos = pos;
    RETURN_IF_ERROR(blocks.Reserve(table, pos + m, runner.block_size()));
    c.block_table = table;
    RETURN_IF_ERROR(runner.Forward({c}, &logits));
    pos += m;
  }
  auto t1 = std::chrono::steady_clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  std::string text;
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    int32_t tok = sampler.Sample(logits.data(), V, pos);
    bool eos = std::find(opt.eos_ids.begin(), opt.eos_ids.end(), tok) != opt.eos_ids.end();
    if (eos) {
      res.finish_reason = "stop";
      break;
    }
    res.tokens.push_back(tok);
    if (!opt.stop.empty() && opt.tokenizer != nullptr) {
      auto piece = opt.tokenizer->TokenBytes(tok);
      if (piece.ok()) text += *piece;
      bool hit = false;
      for (const auto& s : opt.stop) hit |= !s.empty() && text.find(s) != std::string::npos;
      if (hit) {
        res.tokens.pop_back();
        res.finish_reason = "stop";
        break;
      }
    }
    if (on_token) on_token(tok);
    if (i + 1 == opt.max_new_tokens) break;
    SeqChunk c;
    c.tokens = {tok};
    c.start_pos = pos;
    RETURN_IF_ERROR(blocks.Reserve(table, pos + 1, runner.block_size()));
    c.block_table = table;
    RETURN_IF_ERROR(runner.Forward({c}, &logits));
    ++pos;
  }
  if (res.finish_reason.empty()) res.finish_reason = "length";
  res.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return res;
}

}  // namespace moeshard
