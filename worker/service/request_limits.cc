#include "worker/service/request_limits.h"

#include <unistd.h>

#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/security/cluster_credential.h"

namespace moeshard {

WorkerLimits DefaultWorkerLimits(bool cpu) {
  WorkerLimits l;
  l.max_kv_bytes = int64_t{1} << 40;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (cpu && pages > 0 && page > 0) l.max_kv_bytes = static_cast<int64_t>(pages) * page / 2;
  return l;
}

absl::Status ValidateHandshake(const v1::HandshakeRequest& req, const ModelConfig& config, const WorkerLimits& limits) {
  // The fingerprint is compared in constant time and never echoed: it identifies the model.
  if (!SecretEquals(req.model_fingerprint(), config.Fingerprint())) {
    return absl::FailedPreconditionError("model mismatch: the coordinator's model is not the one this worker loaded");
  }
  if (req.num_workers() < 1 || req.num_workers() > limits.max_workers || req.worker_index() < 0 ||
      req.worker_index() >= req.num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("handshake: worker index or count out of range (at most ", limits.max_workers, " workers)"));
  }
  const v1::ShardProto& s = req.shard();
  if (s.layer_begin() < 0 || s.layer_begin() >= s.layer_end() || s.layer_end() > config.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("handshake: layer range outside the model's ", config.num_layers, " layers"));
  }
  if (s.tp_size() < 1 || s.tp_rank() < 0 || s.tp_rank() >= s.tp_size() || s.tp_size() > req.num_workers() ||
      s.pp_size() < 1 || s.pp_rank() < 0 || s.pp_rank() >= s.pp_size() || s.pp_size() > req.num_workers()) {
    return absl::InvalidArgumentError("handshake: tensor or pipeline rank out of range");
  }
  if (req.group_id().empty() || req.group_id().size() > 256 || req.store_address().empty() || req.store_address().size() > 1024) {
    return absl::InvalidArgumentError("handshake: group id and store address must be 1-256 and 1-1024 bytes");
  }
  if (req.timeout_ms() < 0 || req.timeout_ms() > limits.max_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("handshake: timeout out of [0, ", limits.max_timeout_ms, "] ms"));
  }
  if (req.block_size() < 1 || req.block_size() > limits.max_block_size) {
    return absl::InvalidArgumentError(absl::StrCat("handshake: block size out of [1, ", limits.max_block_size, "]"));
  }
  if (req.num_kv_blocks() < 1) return absl::InvalidArgumentError("handshake: needs at least one KV block");
  if (req.num_sliding_kv_blocks() < 0) return absl::InvalidArgumentError("handshake: negative sliding KV blocks");
  // Keys and values of this shard's layers in float32, the widest KV dtype: the sliding layers'
  // from their own pool when there is one.
  const double per_layer_token = 2.0 * std::max<int64_t>(config.num_kv_heads, 1) * std::max<int64_t>(config.head_dim, 1) * 4.0;
  double bytes = 0;
  for (int64_t l = s.layer_begin(); l < s.layer_end(); ++l) {
    const bool own_pool = req.num_sliding_kv_blocks() > 0 && l >= 0 && l < static_cast<int64_t>(config.layers.size()) &&
                          config.layers[l].sliding;
    bytes += per_layer_token * static_cast<double>(own_pool ? req.num_sliding_kv_blocks() : req.num_kv_blocks()) *
             req.block_size();
  }
  if (bytes > static_cast<double>(limits.max_kv_bytes)) {
    // %.0f: the byte count can pass int64's range (a cast would be undefined behaviour).
    return absl::ResourceExhaustedError(
        absl::StrFormat("handshake: %d KV blocks need up to %.0f bytes, more than this worker's limit of %d",
                        req.num_kv_blocks(), bytes, limits.max_kv_bytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateStep(const v1::StepRequest& req, int32_t block_size, const WorkerLimits& limits) {
  if (req.chunks_size() > limits.max_step_chunks || req.released_seqs_size() > limits.max_released_seqs) {
    return absl::InvalidArgumentError("step: too many chunks or released sequences");
  }
  int64_t total = 0;
  std::unordered_set<int64_t> seqs;
  // block * block_size + offset of every KV slot this step writes, in each pool.
  std::unordered_set<int64_t> written, sliding_written;
  auto writes_once = [&](const v1::ChunkProto& c, const google::protobuf::RepeatedField<int32_t>& table,
                         std::unordered_set<int64_t>& slots) {
    for (int64_t p = c.start_pos(); p < c.start_pos() + c.tokens_size(); ++p) {
      const int64_t idx = p / block_size;
      if (idx >= table.size()) break;  // the runner reports the short table
      if (!slots.insert(static_cast<int64_t>(table[static_cast<int>(idx)]) * block_size + p % block_size).second) {
        return false;
      }
    }
    return true;
  };
  for (const v1::ChunkProto& c : req.chunks()) {
    total += c.tokens_size();
    if (total > limits.max_step_tokens) return absl::InvalidArgumentError(absl::StrCat("step: more than ", limits.max_step_tokens, " tokens"));
    if (!seqs.insert(c.seq_id()).second) return absl::InvalidArgumentError("step: a sequence appears twice");
    if (c.start_pos() < 0 || c.start_pos() > (int64_t{1} << 40)) return absl::InvalidArgumentError("step: position out of range");
    if (!writes_once(c, c.block_table(), written) || !writes_once(c, c.sliding_table(), sliding_written)) {
      return absl::InvalidArgumentError("step: two sequences write the same KV slot");
    }
  }
  return absl::OkStatus();
}

}  // namespace moeshard
