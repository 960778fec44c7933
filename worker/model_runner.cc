// The backend-independent half of ModelRunner: batch validation, the default Forward and
// the option parsers. The factory is in runner_factory.cc.
#include "worker/model_runner.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/sampler.h"

namespace moeshard {

absl::StatusOr<Device> ParseDevice(const std::string& s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda" || s == "gpu") return Device::kCuda;
  return absl::InvalidArgumentError(absl::StrCat("unknown device '", s, "' (cpu or cuda)"));
}

absl::StatusOr<ActPrecision> ParsePrecision(const std::string& s) {
  if (s == "float32" || s == "fp32") return ActPrecision::kFloat32;
  if (s == "bfloat16" || s == "bf16") return ActPrecision::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", s, "' (float32 or bfloat16)"));
}

absl::StatusOr<KvDType> ParseKvDType(const std::string& s) {
  if (s == "auto") return KvDType::kAuto;
  if (s == "float32" || s == "fp32") return KvDType::kFloat32;
  if (s == "bfloat16" || s == "bf16") return KvDType::kBFloat16;
  if (s == "fp8" || s == "fp8_e4m3" || s == "e4m3") return KvDType::kFp8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype '", s, "' (auto, float32, bfloat16 or fp8)"));
}

absl::StatusOr<ExpertLayout> ParseExpertLayout(const std::string& s) {
  if (s == "auto") return ExpertLayout::kAuto;
  if (s == "stream") return ExpertLayout::kStream;
  if (s == "stored") return ExpertLayout::kStored;
  return absl::InvalidArgumentError(absl::StrCat("unknown expert layout '", s, "' (auto, stream or stored)"));
}

absl::Status CheckBlockTable(const std::vector<int32_t>& table, int64_t n, int64_t num_blocks, int64_t block_size,
                             int64_t first_block) {
  const int64_t need = (n + block_size - 1) / block_size;
  if (static_cast<int64_t>(table.size()) < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("block table has ", table.size(), " blocks, ", need, " needed for ", n, " positions"));
  }
  for (int64_t i = first_block; i < need; ++i) {
    if (table[i] < 0 || table[i] >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block id ", table[i], " outside the pool of ", num_blocks));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::ValidateBatch(const std::vector<SeqChunk>& batch) const {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  int64_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqChunk& c = batch[i];
    if (c.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " has no tokens"));
    if (c.start_pos < 0) return absl::InvalidArgumentError(absl::StrCat("chunk ", i, " starts at a negative position"));
    for (int32_t id : c.tokens) {
      if (id < 0 || id >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary of ", config_.vocab_size));
      }
    }
    RETURN_IF_ERROR(CheckBlockTable(c.block_table, c.start_pos + static_cast<int64_t>(c.tokens.size()),
                                    options_.num_kv_blocks, options_.block_size));
    if (sliding_pool()) {
      const int64_t first = std::max<int64_t>(0, c.start_pos - config_.sliding_window + 1) / options_.block_size;
      absl::Status st = CheckBlockTable(c.sliding_table, c.start_pos + static_cast<int64_t>(c.tokens.size()),
                                        options_.num_sliding_kv_blocks, options_.block_size, first);
      if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("sliding ", st.message()));
    }
    total += static_cast<int64_t>(c.tokens.size());
  }
  if (options_.device == Device::kCuda && total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", total, " tokens exceeds the runner's ", options_.max_batch_tokens, " per step"));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Forward(const std::vector<SeqChunk>& batch, std::vector<float>* logits) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  std::vector<float> hidden;
  RETURN_IF_ERROR(Embed(batch, &hidden));
  RETURN_IF_ERROR(RunLayers(batch, &hidden));
  return Head(batch, hidden, logits);
}

absl::Status ModelRunner::ForwardArgMax(const std::vector<SeqChunk>& batch, std::vector<int32_t>* ids) {
  std::vector<float> logits;
  RETURN_IF_ERROR(Forward(batch, &logits));
  const int64_t V = config_.vocab_size, rows = static_cast<int64_t>(logits.size()) / V;
  ids->resize(rows);
  for (int64_t r = 0; r < rows; ++r) (*ids)[r] = ArgMax(logits.data() + r * V, V);
  return absl::OkStatus();
}

int64_t ModelRunner::TraceRow(const std::vector<SeqChunk>& batch) const {
  if (trace_position_ < 0) return -1;
  int64_t row = 0;
  for (const SeqChunk& c : batch) {
    const int64_t n = static_cast<int64_t>(c.tokens.size());
    if (c.start_pos <= trace_position_ && trace_position_ < c.start_pos + n) return row + trace_position_ - c.start_pos;
    row += n;
  }
  return -1;
}

}  // namespace moeshard
