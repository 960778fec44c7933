// GpuModelRunner's set-up: the device and stream, weights (from a checkpoint or random on the
// GPU), the KV pool and step arena sized once, and each step's preparation (its indices in
// one upload). Also the factory functions of worker/gpu/gpu_model_runner.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "worker/gpu/gpu_model_runner_impl.h"
#include "worker/gpu/random_weights.h"
#include "worker/model_bench.h"

namespace moeshard {
namespace gpu_runner {

absl::Status GpuModelRunner::StartDevice() {
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(gemm_, Gemm::Create(stream_));
  const char* gemv = std::getenv("MOESHARD_GEMV");
  gemv_enabled_ = !(gemv && std::string(gemv) == "0");
  const char* prep = std::getenv("MOESHARD_QK_PREP");
  qk_prep_enabled_ = !(prep && std::string(prep) == "0");
  if (const char* c = std::getenv("MOESHARD_ATTN_FUSED_MAX_CONTEXT")) fused_max_context_ = std::max(0L, std::strtol(c, nullptr, 10));
  if (const char* c = std::getenv("MOESHARD_ATTN_FUSED_MAX_TOKENS")) fused_max_tokens_ = std::max(0L, std::strtol(c, nullptr, 10));
  const char* fuse = std::getenv("MOESHARD_FUSE_NORMS");
  fuse_norms_ = !(fuse && std::string(fuse) == "0");
  if (const char* mb = std::getenv("MOESHARD_FP8_PREFILL_COPY_MB")) kv_copy_cap_mb_ = std::max(0L, std::strtol(mb, nullptr, 10));
  const char* moe_res = std::getenv("MOESHARD_FUSE_MOE_RESIDUAL");
  fuse_moe_residual_ = !(moe_res && std::string(moe_res) == "0");
  const char* mix_in = std::getenv("MOESHARD_MIX_IN_COMBINE");
  mix_in_combine_ = !(mix_in && std::string(mix_in) == "0");
  const char* fold = std::getenv("MOESHARD_FOLD_RESIDUAL");
  fold_residual_ = !(fold && std::string(fold) == "0");
  const char* fold_moe = std::getenv("MOESHARD_FOLD_MOE_RESIDUAL");
  fold_moe_residual_ = fold_moe && std::string(fold_moe) == "1";  // off until measured on a GPU
  if (const char* rep = std::getenv("MOESHARD_REPEAT_OPS")) {
    ASSIGN_OR_RETURN(repeat_ops_, ParseRepeatOps(rep));
  }
  if (comm_ && comm_->device_memory()) comm_->set_stream(stream_);
  if (options_.profile) prof_.Enable(64 + 16 * static_cast<int>(shard_.layer_end - shard_.layer_begin));
  return absl::OkStatus();
}

std::string GpuModelRunner::backend() const {
  std::string s = absl::StrCat("cuda:", options_.gpu_index, act_ == ActDType::kF32 ? " float32" : " bfloat16", " kv ",
                               kv_elem_ == KvElem::kF32    ? "float32"
                               : kv_elem_ == KvElem::kBF16 ? "bfloat16"
                                                           : "fp8");
  // The Q/K/V projection writes K and V in the activations' dtype: a float32 cache beside bfloat16
  // activations holds bfloat16 values exactly, at twice the memory (measured bit-identical results,
  // docs/PERFORMANCE.md). Say so where the user reads the backend.
  if (act_ == ActDType::kBF16 && kv_elem_ == KvElem::kF32) {
    absl::StrAppend(&s,
                    " (K and V are made in bfloat16: this float32 cache changes no result, only doubles the"
                    " cache's memory; --dtype float32 computes them in float32)");
  }
  int moe = 0, streaming = 0;
  if (w_) {
    for (const GpuLayerWeights& l : w_->layers) {
      if (!l.experts) continue;
      ++moe;
      if (l.expert_formats & kMoeNvfp4Repacked) ++streaming;
    }
  }
  if (moe > 0) {
    absl::StrAppend(&s, ", experts ",
                    streaming == moe ? "streaming"
                    : streaming == 0 ? "stored"
                                     : absl::StrCat("streaming in ", streaming, " of ", moe, " MoE layers"));
    // Why the others stay stored: the first reason given (the loader's, per layer).
    for (const std::string& why : w_->experts_stored_why) {
      if (why.empty()) continue;
      absl::StrAppend(&s, " (", streaming == 0 ? "" : "the others stored: ", why, ")");
      break;
    }
  }
  return s;
}

// The expert formats kept in the streaming kernels' layout (RunnerOptions::expert_layout).
RepackPolicy GpuModelRunner::Repack() const {
  switch (options_.expert_layout) {
    case ExpertLayout::kStream:
      return RepackPolicy{true, true, true};
    case ExpertLayout::kStored:
      return RepackPolicy{false, false, false};
    case ExpertLayout::kAuto:
      break;
  }
  return RepackPolicy{true, false, false};
}

absl::Status GpuModelRunner::Init(const TensorSource& src) {
  RETURN_IF_ERROR(StartDevice());
  ASSIGN_OR_RETURN(host_w_, LoadModelWeights(config_, src, shard_));
  ASSIGN_OR_RETURN(w_, UploadModelWeights(*host_w_, act_, stream_, Repack()));
  return InitBuffers();
}

absl::Status GpuModelRunner::InitRandom(WeightFormat expert_format, uint64_t seed, WeightFormat dense_format) {
  RETURN_IF_ERROR(StartDevice());
  ASSIGN_OR_RETURN(auto made,
                   RandomModelWeights(config_, shard_, act_, expert_format, seed, stream_, dense_format, Repack()));
  host_w_ = std::move(made.first);
  w_ = std::move(made.second);
  return InitBuffers();
}

// The KV cache, the step arena and the pinned staging buffer, all sized here once.
absl::Status GpuModelRunner::InitBuffers() {
  const ModelConfig& c = config_;
  nq_ = host_w_->num_local_heads;
  nkv_ = host_w_->num_local_kv_heads;
  inter_ = std::max(c.expert_intermediate, host_w_->local_dense_intermediate);

  switch (options_.kv_dtype) {
    case KvDType::kAuto: kv_elem_ = act_ == ActDType::kF32 ? KvElem::kF32 : KvElem::kBF16; break;
    case KvDType::kFloat32: kv_elem_ = KvElem::kF32; break;
    case KvDType::kBFloat16: kv_elem_ = KvElem::kBF16; break;
    case KvDType::kFp8E4M3: kv_elem_ = KvElem::kFp8E4M3; break;
  }
  const size_t elem = kv_elem_ == KvElem::kF32 ? 4 : kv_elem_ == KvElem::kBF16 ? 2 : 1;
  for (int64_t li = shard_.layer_begin; li < shard_.layer_end; ++li) {
    // Sliding-window layers with their own pool hold num_sliding_kv_blocks blocks.
    const int64_t slots = (InSlidingPool(li - shard_.layer_begin) ? options_.num_sliding_kv_blocks
                                                                    : options_.num_kv_blocks) * options_.block_size;
    KvCacheView v;
    v.elem = kv_elem_;
    v.block_size = options_.block_size;
    v.num_kv_heads = nkv_;
    v.head_dim = c.head_dim;
    v.num_blocks = slots / options_.block_size;
    const size_t bytes = static_cast<size_t>(slots * nkv_ * c.head_dim) * elem;
    ASSIGN_OR_RETURN(v.k, kv_pool_.Alloc(bytes));
    ASSIGN_OR_RETURN(v.v, kv_pool_.Alloc(bytes));
    if (kv_elem_ == KvElem::kFp8E4M3) {
      ASSIGN_OR_RETURN(void* ks, kv_pool_.Alloc(static_cast<size_t>(slots * nkv_) * 4));
      ASSIGN_OR_RETURN(void* vs, kv_pool_.Alloc(static_cast<size_t>(slots * nkv_) * 4));
      v.k_scale = static_cast<float*>(ks);
      v.v_scale = static_cast<float*>(vs);
    }
    kv_.push_back(v);
  }
  kv_bytes_ = kv_pool_.bytes_in_use();

  // Scratch of the largest step: the buffers an attention block, an MLP block and HeadDevice take.
  const int64_t T = options_.max_batch_tokens, H = c.hidden_size, hd = c.head_dim, Lw = c.expert_width();
  const int64_t E = std::max<int64_t>(c.num_experts, 1), K = std::max<int64_t>(c.top_k, 1);
  logit_rows_ = std::max<int64_t>(1, std::min<int64_t>(T, kLogitChunkBytes / (4 * c.vocab_size)));
  // The step's indices ([ids, positions, slots, table offsets] per token, with a sliding pool
  // its [slots, table offsets] too, rows, block tables of up to 8 × the pools) and residual
  // stream; then the largest of one attention block, one MLP block (with the expert step's
  // workspace) and one chunk of the LM head.
  index_capacity_ = (sliding_pool() ? 7 : 5) * T + (sliding_pool() ? 16 : 8) * options_.num_kv_blocks;
  const int64_t fixed = 4 * index_capacity_ + 4 * H * T + (act_bytes_ + 4) * H * T + 4 * H * T;  // + xn_, xn32_, a_
  const int64_t attn = T * act_bytes_ * (H + 2 * nq_ * hd + 2 * nkv_ * hd + nq_) + kAttentionWorkspaceBytes;
  int64_t mlp = T * (act_bytes_ * H + 8 * H);
  if (host_w_->num_local_experts > 0) {
    mlp += T * (4 * E + 8 * K + 4 * Lw + 2 * act_bytes_ * Lw);
    uint32_t formats = 0;  // every layer's: the expert step's workspace fits the largest
    for (const auto& l : w_->layers) formats |= l.expert_formats;
    mlp += static_cast<int64_t>(MoeExpertWorkspaceBytes(static_cast<int>(host_w_->num_local_experts), Lw,
                                                        c.expert_intermediate, T, static_cast<int>(K), formats));
  }
  mlp = std::max(mlp, T * (act_bytes_ * H + 8 * H + 2 * act_bytes_ * host_w_->local_dense_intermediate));
  const int64_t head = logit_rows_ * (act_bytes_ * H + 4 * c.vocab_size);
  size_t bytes = static_cast<size_t>(fixed + std::max({attn, mlp, head})) + 256 * 32;  // + alignment of ~32 buffers
  bytes += size_t{4} << 20;
  RETURN_IF_ERROR(arena_.Reserve(bytes));
  stage_floats_ = T * std::max(H, Lw);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&stage_, static_cast<size_t>(stage_floats_) * 4));
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Prepare(const std::vector<SeqChunk>& batch) {
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  arena_.Reset();
  arena_error_ = absl::OkStatus();
  T_ = 0;
  R_ = 0;
  max_chunk_tokens_ = 0;
  trace_row_ = TraceRow(batch);
  int64_t max_context = 0;
  // With a sliding pool every chunk's sliding table travels too (after all block tables; its
  // -1 entries, before the window, are never read: kernels/cuda read keys from p - window + 1).
  const bool sliding = sliding_pool();
  int64_t table_total = 0, full_total = 0;
  for (auto& ch : batch) {
    max_chunk_tokens_ = std::max<int64_t>(max_chunk_tokens_, static_cast<int64_t>(ch.tokens.size()));
    max_context = std::max<int64_t>(max_context, ch.start_pos + static_cast<int64_t>(ch.tokens.size()));
    T_ += static_cast<int64_t>(ch.tokens.size());
    R_ += ch.all_logits ? static_cast<int64_t>(ch.tokens.size()) : 1;
    full_total += static_cast<int64_t>(ch.block_table.size());
    if (sliding) table_total += static_cast<int64_t>(ch.sliding_table.size());
  }
  table_total += full_total;
  // Short-context decode: QkPrep and the attention in one launch a layer (AttentionInput); its
  // own decode graphs (ForwardGraph's key).
  fused_decode_ = max_chunk_tokens_ == 1 && T_ <= fused_max_tokens_ && max_context <= fused_max_context_ &&
                  act_ == ActDType::kBF16;
  const int64_t per_token = sliding ? 6 : 4;
  if (T_ > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", T_, " tokens exceeds ", options_.max_batch_tokens));
  }
  // [ids T][pos T][slots T][table offsets T]([sliding slots T][sliding table offsets T])[rows R]
  // [tables][sliding tables]: every address but the tables' depends on T only (decode graphs).
  if (per_token * T_ + R_ + table_total > index_capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("the batch's block tables (", table_total,
                                                   " entries) exceed this runner's index space"));
  }
  host_idx_.assign(per_token * T_ + R_ + table_total, 0);
  int32_t *ids = host_idx_.data(), *pos = ids + T_, *slots = pos + T_, *toff = slots + T_,
          *sslots = toff + T_, *stoff = sslots + T_, *rows = ids + per_token * T_, *tables = rows + R_;
  int64_t t = 0, r = 0, toffset = 0, stoffset = full_total;
  const int64_t bs = options_.block_size;
  for (auto& ch : batch) {
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    std::copy(ch.block_table.begin(), ch.block_table.end(), tables + toffset);
    if (sliding) std::copy(ch.sliding_table.begin(), ch.sliding_table.end(), tables + stoffset);
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int64_t p = ch.start_pos + i;
      ids[t] = ch.tokens[i];
      pos[t] = static_cast<int32_t>(p);
      slots[t] = static_cast<int32_t>(ch.block_table[p / bs] * bs + p % bs);
      toff[t] = static_cast<int32_t>(toffset);
      if (sliding) {
        sslots[t] = static_cast<int32_t>(ch.sliding_table[p / bs] * bs + p % bs);
        stoff[t] = static_cast<int32_t>(stoffset);
      }
      if (ch.all_logits || i == n - 1) rows[r++] = static_cast<int32_t>(t);
    }
    toffset += static_cast<int64_t>(ch.block_table.size());
    if (sliding) stoffset += static_cast<int64_t>(ch.sliding_table.size());
  }
  // A fixed size, so that the addresses after it depend on T only (decode graphs replay them).
  int32_t* dev = static_cast<int32_t*>(Take(index_capacity_ * 4));
  s_ = F32(T_ * config_.hidden_size);
  xn_ = Act(T_ * config_.hidden_size);
  xn32_ = F32(T_ * config_.hidden_size);
  a_ = F32(T_ * config_.hidden_size);  // kept across the MLP block when its residual update is folded
  RETURN_IF_ERROR(arena_error_);
  step_mark_ = arena_.Mark();
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host_idx_.data(), host_idx_.size() * 4,
                                                cudaMemcpyHostToDevice, stream_));
  ids_ = dev;
  pos_ = dev + T_;
  slots_ = dev + 2 * T_;
  toff_ = dev + 3 * T_;
  sliding_slots_ = sliding ? dev + 4 * T_ : slots_;
  sliding_toff_ = sliding ? dev + 5 * T_ : toff_;
  rows_ = dev + per_token * T_;
  tables_ = rows_ + R_;
  return PrepareKvCopy(batch);
}

absl::Status GpuModelRunner::UploadHidden(const std::vector<float>& h) {
  if (static_cast<int64_t>(h.size()) != T_ * config_.hidden_size) {
    return absl::InvalidArgumentError("hidden state size does not match the batch");
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s_, h.data(), h.size() * 4, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Download(const float* dev, int64_t n, std::vector<float>* out) {
  out->resize(n);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out->data(), dev, n * 4, cudaMemcpyDeviceToHost, stream_));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  prof_.Collect();
  return absl::OkStatus();
}

}  // namespace gpu_runner

using gpu_runner::GpuModelRunner;

static absl::Status CheckGpu(const RunnerOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device is visible");
  }
  if (options.gpu_index < 0 || options.gpu_index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("GPU ", options.gpu_index, " does not exist (", count, " visible)"));
  }
  if (options.max_batch_tokens <= 0) return absl::InvalidArgumentError("max_batch_tokens must be positive");
  if (options.block_size <= 0 || options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("KV cache needs a positive block size and block count");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateGpuModelRunner(const ModelConfig& config, const TensorSource& src,
                                                                   const ShardSpec& shard, const RunnerOptions& options,
                                                                   Communicator* tp_comm) {
  RETURN_IF_ERROR(CheckGpu(options));
  auto r = std::make_unique<GpuModelRunner>(config, shard, options, tp_comm);
  RETURN_IF_ERROR(r->Init(src));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateRandomGpuModelRunner(const ModelConfig& config,
                                                                         const ShardSpec& shard,
                                                                         const RunnerOptions& options,
                                                                         WeightFormat expert_format, uint64_t seed,
                                                                         Communicator* tp_comm,
                                                                         WeightFormat dense_format) {
  RETURN_IF_ERROR(CheckGpu(options));
  if (shard.tp_size > 1 && (tp_comm == nullptr || tp_comm->size() != shard.tp_size)) {
    return absl::InvalidArgumentError("tensor parallel shard needs a communicator of tp_size ranks");
  }
  auto r = std::make_unique<GpuModelRunner>(config, shard, options, tp_comm);
  RETURN_IF_ERROR(r->InitRandom(expert_format, seed, dense_format));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

}  // namespace moeshard
