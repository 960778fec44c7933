// GpuModelRunner: the forward pass of worker/cpu_model_runner.cc, op for op, on the GPU.
// A step: the batch's indices (ids, positions, cache slots, block tables, rows that want
// logits) go to the device in one copy; the residual stream s [T, H] (fp32) lives in the
// step arena; each layer runs attention then the MLP/MoE block as kernel launches on the
// runner's stream; the LM head writes fp32 logits in row chunks that are copied back.
#include "worker/gpu/gpu_model_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/moe/moe_expert.h"
#include "worker/gpu/decode_graphs.h"
#include "worker/gpu/device_memory.h"
#include "worker/gpu/gpu_weights.h"
#include "worker/gpu/random_weights.h"
#include "worker/gpu/step_profile.h"
#include "worker/model_bench.h"

namespace moeshard {
namespace {

using namespace gpu;  // NOLINT: this file is the GPU backend

constexpr size_t kLogitChunkBytes = size_t{256} << 20;
constexpr int64_t kAttentionWorkspaceBytes = int64_t{64} << 20;

class GpuModelRunner : public ModelRunner {
 public:
  GpuModelRunner(const ModelConfig& c, const ShardSpec& s, const RunnerOptions& o, Communicator* comm)
      : ModelRunner(c, s, o), comm_(comm) {
    act_ = o.precision == ActPrecision::kFloat32 ? ActDType::kF32 : ActDType::kBF16;
    act_bytes_ = act_ == ActDType::kF32 ? 4 : 2;
  }
  ~GpuModelRunner() override {
    if (stream_) {
      cudaSetDevice(options_.gpu_index);
      cudaStreamSynchronize(stream_);
      gemm_.reset();
      w_.reset();
      cudaStreamDestroy(stream_);
    }
    if (stage_) cudaFreeHost(stage_);
  }

  absl::Status Init(const TensorSource& src);
  absl::Status InitRandom(WeightFormat expert_format, uint64_t seed);

  absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    RETURN_IF_ERROR(Prepare(batch));
    if (!w_->embed.valid()) return absl::FailedPreconditionError("this shard holds no embedding");
    RETURN_IF_ERROR(EmbedDevice());
    return Download(s_, T_ * config_.hidden_size, hidden);
  }
  absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) override {
    RETURN_IF_ERROR(Prepare(batch));
    RETURN_IF_ERROR(UploadHidden(*hidden));
    RETURN_IF_ERROR(LayersDevice());
    return Download(s_, T_ * config_.hidden_size, hidden);
  }
  absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                    std::vector<float>* logits) override {
    RETURN_IF_ERROR(Prepare(batch));
    RETURN_IF_ERROR(UploadHidden(hidden));
    return HeadDevice(logits);
  }
  absl::Status Forward(const std::vector<SeqChunk>& batch, std::vector<float>* logits) override {
    RETURN_IF_ERROR(ValidateBatch(batch));
    RETURN_IF_ERROR(Prepare(batch));
    if (!w_->embed.valid() || !shard_.last_stage) {
      return absl::FailedPreconditionError("Forward needs a shard with the embedding and the LM head");
    }
    if (absl::Status g = ForwardGraph(batch, logits); !absl::IsUnavailable(g)) return g;
    RETURN_IF_ERROR(EmbedDevice());
    RETURN_IF_ERROR(LayersDevice());
    return HeadDevice(logits);
  }
  size_t kv_bytes() const override { return kv_bytes_; }
  std::string ProfileReport() const override { return prof_.Report(); }
  void ResetProfile() override { prof_.Reset(); }
  void SetProfiling(bool on) override { prof_.SetActive(on && options_.profile); }
  std::string backend() const override {
    return absl::StrCat("cuda:", options_.gpu_index, act_ == ActDType::kF32 ? " float32" : " bfloat16", " kv ",
                        kv_elem_ == KvElem::kF32 ? "float32" : kv_elem_ == KvElem::kBF16 ? "bfloat16" : "fp8");
  }

 private:
  absl::Status Prepare(const std::vector<SeqChunk>& batch);
  absl::Status StartDevice();
  absl::Status InitBuffers();
  absl::Status EmbedDevice() {
    EmbedParams p{w_->embed, ids_, T_, s_};
    return gpu::Embed(p, stream_);
  }
  absl::Status LayersDevice();
  absl::Status HeadDevice(std::vector<float>* logits);
  absl::Status HeadRows(int64_t r0, int64_t n);
  absl::Status ForwardGraph(const std::vector<SeqChunk>& batch, std::vector<float>* logits);
  absl::Status AttentionBlock(int64_t li);
  absl::Status MlpBlock(int64_t li);
  absl::Status AllReduce(float* dev, int64_t n);
  // out (activation dtype) = rmsnorm(x rows) ⊙ weight; optional fp32 copy and row gather.
  absl::Status Norm(const void* x, ActDType x_dtype, int64_t rows, int64_t dim, const float* weight, void* out,
                    float* out_f32 = nullptr, const int32_t* row_index = nullptr) {
    RmsNormParams p;
    p.x = x;
    p.x_dtype = x_dtype;
    p.row_index = row_index;
    p.rows = rows;
    p.dim = dim;
    p.weight = weight;
    p.eps = config_.rms_eps;
    p.out = out;
    p.out_dtype = act_;
    p.out_f32 = out_f32;
    return gpu::RmsNorm(p, stream_);
  }
  absl::Status ResidualUpdate(const float* out, const float* norm, const float* alpha, const float* beta);
  absl::Status Project(const DenseWeight& w, const void* x, void* y, ActDType y_dtype, int64_t rows,
                       const float* bias = nullptr, const char* category = "dense projections");
  absl::Status UploadHidden(const std::vector<float>& h);
  absl::Status Download(const float* dev, int64_t n, std::vector<float>* out);
  void* Act(int64_t elems) { return Take(elems * act_bytes_); }
  float* F32(int64_t elems) { return static_cast<float*>(Take(elems * 4)); }
  void* Take(int64_t bytes) {
    auto p = arena_.AllocBytes(static_cast<size_t>(bytes));
    if (!p.ok()) {
      arena_error_ = p.status();
      return nullptr;
    }
    return *p;
  }

  Communicator* comm_;
  ActDType act_;
  int64_t act_bytes_;
  KvElem kv_elem_ = KvElem::kBF16;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<ModelWeights> host_w_;
  std::unique_ptr<GpuModelWeights> w_;
  DevicePool kv_pool_;
  std::vector<KvCacheView> kv_;
  size_t kv_bytes_ = 0;
  StepArena arena_;
  absl::Status arena_error_;
  StepProfiler prof_;
  DecodeGraphs graphs_;
  float* head_logits_ = nullptr;  // HeadRows' output (arena)
  float* stage_ = nullptr;  // pinned host memory for all-reduces and hidden states
  int64_t index_capacity_ = 0;  // int32 entries of a step's index upload
  int64_t stage_floats_ = 0, nq_ = 0, nkv_ = 0, inter_ = 0, logit_rows_ = 0;
  // The current step.
  std::vector<int32_t> host_idx_;
  int64_t T_ = 0, R_ = 0, max_chunk_tokens_ = 0;
  size_t step_mark_ = 0;  // the arena past the step's indices and residual stream
  int32_t *ids_ = nullptr, *pos_ = nullptr, *slots_ = nullptr, *toff_ = nullptr, *tables_ = nullptr,
          *rows_ = nullptr;
  float* s_ = nullptr;
};

absl::Status GpuModelRunner::StartDevice() {
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.gpu_index));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ASSIGN_OR_RETURN(gemm_, Gemm::Create(stream_));
  if (comm_ && comm_->device_memory()) comm_->set_stream(stream_);
  if (options_.profile) prof_.Enable(64 + 16 * static_cast<int>(shard_.layer_end - shard_.layer_begin));
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Init(const TensorSource& src) {
  RETURN_IF_ERROR(StartDevice());
  ASSIGN_OR_RETURN(host_w_, LoadModelWeights(config_, src, shard_));
  ASSIGN_OR_RETURN(w_, UploadModelWeights(*host_w_, act_, stream_));
  return InitBuffers();
}

absl::Status GpuModelRunner::InitRandom(WeightFormat expert_format, uint64_t seed) {
  RETURN_IF_ERROR(StartDevice());
  ASSIGN_OR_RETURN(auto made, RandomModelWeights(config_, shard_, act_, expert_format, seed, stream_));
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
  const int64_t slots = options_.num_kv_blocks * options_.block_size;
  const size_t elem = kv_elem_ == KvElem::kF32 ? 4 : kv_elem_ == KvElem::kBF16 ? 2 : 1;
  for (int64_t li = shard_.layer_begin; li < shard_.layer_end; ++li) {
    KvCacheView v;
    v.elem = kv_elem_;
    v.block_size = options_.block_size;
    v.num_kv_heads = nkv_;
    v.head_dim = c.head_dim;
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

  // Scratch of the largest step: the buffers AttentionBlock, MlpBlock and HeadDevice take.
  const int64_t T = options_.max_batch_tokens, H = c.hidden_size, hd = c.head_dim, Lw = c.expert_width();
  const int64_t E = std::max<int64_t>(c.num_experts, 1), K = std::max<int64_t>(c.top_k, 1);
  logit_rows_ = std::max<int64_t>(1, std::min<int64_t>(T, kLogitChunkBytes / (4 * c.vocab_size)));
  // The step's indices ([ids, positions, slots, table offsets] per token, rows, block tables
  // of up to 8 × the pool) and residual stream; then the largest of one attention block, one
  // MLP block (with the expert step's workspace) and one chunk of the LM head.
  index_capacity_ = 5 * T + 8 * options_.num_kv_blocks;
  const int64_t fixed = 4 * index_capacity_ + 4 * H * T;
  const int64_t attn = T * (act_bytes_ * (H + 2 * nq_ * hd + 2 * nkv_ * hd + nq_) + 4 * H) + kAttentionWorkspaceBytes;
  int64_t mlp = T * (act_bytes_ * H + 8 * H);
  if (host_w_->num_local_experts > 0) {
    mlp += T * (4 * E + 8 * K + 4 * Lw + 2 * act_bytes_ * Lw);
    mlp += static_cast<int64_t>(MoeExpertWorkspaceBytes(static_cast<int>(host_w_->num_local_experts), Lw,
                                                        c.expert_intermediate, T, static_cast<int>(K)));
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
  int64_t table_total = 0;
  for (auto& ch : batch) {
    max_chunk_tokens_ = std::max<int64_t>(max_chunk_tokens_, static_cast<int64_t>(ch.tokens.size()));
    T_ += static_cast<int64_t>(ch.tokens.size());
    R_ += ch.all_logits ? static_cast<int64_t>(ch.tokens.size()) : 1;
    table_total += static_cast<int64_t>(ch.block_table.size());
  }
  if (T_ > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", T_, " tokens exceeds ", options_.max_batch_tokens));
  }
  // [ids T][pos T][slots T][table offsets T][rows R][tables]
  if (4 * T_ + R_ + table_total > index_capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("the batch's block tables (", table_total,
                                                   " entries) exceed this runner's index space"));
  }
  host_idx_.assign(4 * T_ + R_ + table_total, 0);
  int32_t *ids = host_idx_.data(), *pos = ids + T_, *slots = pos + T_, *toff = slots + T_, *rows = toff + T_,
          *tables = rows + R_;
  int64_t t = 0, r = 0, toffset = 0;
  const int64_t bs = options_.block_size;
  for (auto& ch : batch) {
    const int64_t n = static_cast<int64_t>(ch.tokens.size());
    std::copy(ch.block_table.begin(), ch.block_table.end(), tables + toffset);
    for (int64_t i = 0; i < n; ++i, ++t) {
      const int64_t p = ch.start_pos + i;
      ids[t] = ch.tokens[i];
      pos[t] = static_cast<int32_t>(p);
      slots[t] = static_cast<int32_t>(ch.block_table[p / bs] * bs + p % bs);
      toff[t] = static_cast<int32_t>(toffset);
      if (ch.all_logits || i == n - 1) rows[r++] = static_cast<int32_t>(t);
    }
    toffset += static_cast<int64_t>(ch.block_table.size());
  }
  // A fixed size, so that the addresses after it depend on T only (decode graphs replay them).
  int32_t* dev = static_cast<int32_t*>(Take(index_capacity_ * 4));
  s_ = F32(T_ * config_.hidden_size);
  RETURN_IF_ERROR(arena_error_);
  step_mark_ = arena_.Mark();
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, host_idx_.data(), host_idx_.size() * 4,
                                                cudaMemcpyHostToDevice, stream_));
  ids_ = dev;
  pos_ = dev + T_;
  slots_ = dev + 2 * T_;
  toff_ = dev + 3 * T_;
  rows_ = dev + 4 * T_;
  tables_ = rows_ + R_;
  return absl::OkStatus();
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

absl::Status GpuModelRunner::Project(const DenseWeight& w, const void* x, void* y, ActDType y_dtype, int64_t rows,
                                     const float* bias, const char* category) {
  GemmArgs a;
  a.w = w;
  a.x = x;
  a.x_dtype = w.dtype;
  a.y = y;
  a.y_dtype = y_dtype;
  a.num_tokens = rows;
  auto region = prof_.Region(category, stream_);
  RETURN_IF_ERROR(gemm_->Run(a));
  if (bias) {
    AddBiasParams b{y, y_dtype, bias, rows, w.rows};
    RETURN_IF_ERROR(gpu::AddBias(b, stream_));
  }
  return absl::OkStatus();
}

absl::Status GpuModelRunner::AllReduce(float* dev, int64_t n) {
  if (shard_.tp_size <= 1) return absl::OkStatus();
  if (comm_->device_memory()) return comm_->AllReduceSum(dev, static_cast<size_t>(n));  // NCCL on stream_
  if (n > stage_floats_) return absl::InternalError("all-reduce larger than the staging buffer");
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(stage_, dev, n * 4, cudaMemcpyDeviceToHost, stream_));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  RETURN_IF_ERROR(comm_->AllReduceSum(stage_, static_cast<size_t>(n)));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, stage_, n * 4, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status GpuModelRunner::ResidualUpdate(const float* out, const float* norm, const float* alpha,
                                            const float* beta) {
  ResidualParams p;
  p.s = s_;
  p.out = out;
  p.rows = T_;
  p.dim = config_.hidden_size;
  p.gated = config_.gated_residual;
  p.out_norm = norm;
  p.alpha = alpha;
  p.beta = beta;
  p.eps = config_.rms_eps;
  return gpu::Residual(p, stream_);
}

absl::Status GpuModelRunner::LayersDevice() {
  for (int64_t li = 0; li < shard_.layer_end - shard_.layer_begin; ++li) {
    RETURN_IF_ERROR(AttentionBlock(li));
    RETURN_IF_ERROR(MlpBlock(li));
  }
  return absl::OkStatus();
}

absl::Status GpuModelRunner::AttentionBlock(int64_t li) {
  const ModelConfig& c = config_;
  const GpuLayerWeights& lw = w_->layers[li];
  const LayerSpec& spec = c.layers[shard_.layer_begin + li];
  const int64_t T = T_, H = c.hidden_size, hd = c.head_dim;
  arena_.Release(step_mark_);  // the previous block's scratch is dead
  void *x = Act(T * H), *q = Act(T * nq_ * hd), *k = Act(T * nkv_ * hd), *v = Act(T * nkv_ * hd),
       *o = Act(T * nq_ * hd);
  float* a = F32(T * H);
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(Norm(s_, ActDType::kF32, T, H, lw.attn_norm, x));
  RETURN_IF_ERROR(Project(lw.q, x, q, act_, T, lw.q_bias));
  RETURN_IF_ERROR(Project(lw.k, x, k, act_, T, lw.k_bias));
  RETURN_IF_ERROR(Project(lw.v, x, v, act_, T, lw.v_bias));
  if (c.qk_norm) {
    for (auto [buf, heads, w] : {std::tuple{q, nq_, lw.q_norm}, std::tuple{k, nkv_, lw.k_norm}}) {
      RETURN_IF_ERROR(Norm(buf, act_, T * heads, hd, w, buf));
    }
  }
  if (spec.rope) {
    for (auto [buf, heads] : {std::pair{q, nq_}, std::pair{k, nkv_}}) {
      RopeParams rp;
      rp.x = buf;
      rp.dtype = act_;
      rp.num_tokens = T;
      rp.heads = heads;
      rp.head_dim = hd;
      rp.pos = pos_;
      rp.theta = c.rope_theta;
      RETURN_IF_ERROR(gpu::Rope(rp, stream_));
    }
  }
  KvWriteParams kw;
  kw.k = k;
  kw.v = v;
  kw.dtype = act_;
  kw.num_tokens = T;
  kw.slots = slots_;
  kw.cache = kv_[li];
  AttentionParams ap;
  ap.q = q;
  ap.out = o;
  ap.dtype = act_;
  ap.num_tokens = T;
  ap.num_heads = nq_;
  ap.pos = pos_;
  ap.table_offset = toff_;
  ap.block_tables = tables_;
  ap.window = spec.sliding ? c.sliding_window : 0;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.cache = kv_[li];
  ap.max_tokens_per_seq = max_chunk_tokens_;
  if (max_chunk_tokens_ <= 8) {  // decode: split each sequence's context across blocks
    // Any size works (fewer splits when it is small); capped so the arena stays bounded.
    const int64_t ws = std::min<int64_t>(AttentionWorkspaceBytes(T, nq_, hd, 32), kAttentionWorkspaceBytes);
    ap.workspace = Take(ws);
    ap.workspace_bytes = ws;
    RETURN_IF_ERROR(arena_error_);
  }
  {
    auto region = prof_.Region("attention", stream_);
    RETURN_IF_ERROR(gpu::KvWrite(kw, stream_));
    RETURN_IF_ERROR(gpu::Attention(ap, stream_));
  }
  if (c.attn_output_gate) {
    void* g = Act(T * nq_);
    RETURN_IF_ERROR(arena_error_);
    RETURN_IF_ERROR(Project(lw.head_gate, x, g, act_, T));
    HeadGateParams hg{o, g, act_, T, nq_, hd};
    RETURN_IF_ERROR(gpu::HeadGate(hg, stream_));
  }
  RETURN_IF_ERROR(Project(lw.o, o, a, ActDType::kF32, T, lw.o_bias));
  RETURN_IF_ERROR(AllReduce(a, T * H));
  return ResidualUpdate(a, lw.attn_out_norm, lw.attn_alpha, lw.attn_beta);
}

absl::Status GpuModelRunner::MlpBlock(int64_t li) {
  const ModelConfig& c = config_;
  const GpuLayerWeights& lw = w_->layers[li];
  const LayerSpec& spec = c.layers[shard_.layer_begin + li];
  const int64_t T = T_, H = c.hidden_size;
  arena_.Release(step_mark_);
  void* y = Act(T * H);
  float* f = F32(T * H);
  float* y32 = spec.moe ? F32(T * H) : nullptr;
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(Norm(s_, ActDType::kF32, T, H, lw.moe_norm, y, y32));
  if (!spec.moe) {
    const int64_t I = lw.dense.gate.rows;
    void *g = Act(T * I), *u = Act(T * I);
    RETURN_IF_ERROR(arena_error_);
    RETURN_IF_ERROR(Project(lw.dense.gate, y, g, act_, T));
    RETURN_IF_ERROR(Project(lw.dense.up, y, u, act_, T));
    SiluMulParams sm{g, u, g, act_, T * I};
    RETURN_IF_ERROR(gpu::SiluMul(sm, stream_));
    RETURN_IF_ERROR(Project(lw.dense.down, g, f, ActDType::kF32, T));
    RETURN_IF_ERROR(AllReduce(f, T * H));
    return ResidualUpdate(f, lw.moe_out_norm, lw.moe_alpha, lw.moe_beta);
  }
  const int64_t E = c.num_experts, K = c.top_k, Lw = c.expert_width();
  float* logits = F32(T * E);
  float* wts = F32(T * K);
  int32_t* ids = static_cast<int32_t*>(Take(T * K * 4));
  float* mix = c.latent_size > 0 ? F32(T * Lw) : f;
  void* z = c.latent_size > 0 ? Act(T * Lw) : y;
  const size_t ws_bytes = MoeExpertWorkspaceBytes(static_cast<int>(host_w_->num_local_experts), Lw,
                                                  c.expert_intermediate, T, static_cast<int>(K));
  void* ws = Take(static_cast<int64_t>(ws_bytes));
  RETURN_IF_ERROR(arena_error_);
  GemmArgs ra;
  ra.w = lw.router;
  ra.x = y32;
  ra.y = logits;
  ra.num_tokens = T;
  {
    auto region = prof_.Region("router", stream_);
    RETURN_IF_ERROR(gemm_->Run(ra));  // fp32 router
  }
  RoutingParams rp;
  rp.logits = logits;
  rp.num_tokens = T;
  rp.num_experts = E;
  rp.top_k = K;
  rp.softmax_topk_only = c.router_softmax_topk_only;
  rp.renormalize = c.norm_topk_prob;
  rp.expert_begin = host_w_->expert_begin;
  rp.num_local_experts = host_w_->num_local_experts;
  rp.local_ids = ids;
  rp.weights = wts;
  RETURN_IF_ERROR(gpu::Routing(rp, stream_));
  if (c.latent_size > 0) RETURN_IF_ERROR(Project(lw.latent_in, y, z, act_, T));
  MoeExpertParams mp;
  mp.experts = lw.experts;
  mp.num_local_experts = static_cast<int>(host_w_->num_local_experts);
  mp.width = Lw;
  mp.inter = c.expert_intermediate;
  mp.num_tokens = T;
  mp.top_k = static_cast<int>(K);
  mp.expert_ids = ids;
  mp.weights = wts;
  mp.x = z;
  mp.act_dtype = act_;
  mp.output_norm = c.expert_output_norm;
  mp.eps = c.rms_eps;
  mp.out = mix;
  mp.workspace = ws;
  mp.workspace_bytes = ws_bytes;
  mp.expert_formats = lw.expert_formats;
  {
    auto region = prof_.Region("expert step", stream_);
    RETURN_IF_ERROR(MoeExpertStep(mp, stream_));
  }
  RETURN_IF_ERROR(AllReduce(mix, T * Lw));  // one Lw-wide fp32 partial per token
  if (c.latent_size > 0) {
    void* mix_act = mix;
    if (act_ != ActDType::kF32) {
      mix_act = Act(T * Lw);
      RETURN_IF_ERROR(arena_error_);
      ConvertParams cv{mix, ActDType::kF32, mix_act, act_, T * Lw};
      RETURN_IF_ERROR(gpu::Convert(cv, stream_));
    }
    RETURN_IF_ERROR(Project(lw.latent_out, mix_act, f, ActDType::kF32, T));
  }
  return ResidualUpdate(f, lw.moe_out_norm, lw.moe_alpha, lw.moe_beta);
}

// Final norm and LM head of rows [r0, r0 + n) into head_logits_ (device).
absl::Status GpuModelRunner::HeadRows(int64_t r0, int64_t n) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  arena_.Release(step_mark_);
  void* xh = Act(logit_rows_ * H);
  head_logits_ = F32(logit_rows_ * V);
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(Norm(s_, ActDType::kF32, n, H, w_->final_norm, xh, nullptr, rows_ + r0));
  return Project(w_->lm_head, xh, head_logits_, ActDType::kF32, n, nullptr, "lm head");
}

absl::Status GpuModelRunner::HeadDevice(std::vector<float>* logits) {
  if (!shard_.last_stage) return absl::FailedPreconditionError("this shard holds no LM head");
  const int64_t V = config_.vocab_size;
  logits->resize(R_ * V);
  for (int64_t r0 = 0; r0 < R_; r0 += logit_rows_) {
    const int64_t n = std::min(logit_rows_, R_ - r0);
    RETURN_IF_ERROR(HeadRows(r0, n));
    MOESHARD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(logits->data() + r0 * V, head_logits_, n * V * 4, cudaMemcpyDeviceToHost, stream_));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  prof_.Collect();
  return absl::OkStatus();
}

// A decode step (one token per sequence, one chunk of logits, nothing staged through the
// host) as a replayed CUDA graph; Unavailable when the step does not qualify.
absl::Status GpuModelRunner::ForwardGraph(const std::vector<SeqChunk>& batch, std::vector<float>* logits) {
  if (!graphs_.enabled() || prof_.enabled() || max_chunk_tokens_ != 1 || R_ > logit_rows_ || T_ > 256 ||
      !shard_.first_stage || !shard_.last_stage || (shard_.tp_size > 1 && !comm_->device_memory())) {
    return absl::UnavailableError("not a graph step");
  }
  RETURN_IF_ERROR(graphs_.Launch(T_, stream_, [&]() -> absl::Status {
    RETURN_IF_ERROR(EmbedDevice());
    RETURN_IF_ERROR(LayersDevice());
    return HeadRows(0, R_);
  }));
  // The graph wrote the logits where HeadRows' allocations land for this T (a replay runs no
  // host code, so take the same allocations again to find them).
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  arena_.Release(step_mark_);
  Act(logit_rows_ * H);
  float* lg = F32(logit_rows_ * V);
  RETURN_IF_ERROR(arena_error_);
  logits->resize(R_ * V);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), lg, R_ * V * 4, cudaMemcpyDeviceToHost, stream_));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace

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
                                                                         Communicator* tp_comm) {
  RETURN_IF_ERROR(CheckGpu(options));
  if (shard.tp_size > 1 && (tp_comm == nullptr || tp_comm->size() != shard.tp_size)) {
    return absl::InvalidArgumentError("tensor parallel shard needs a communicator of tp_size ranks");
  }
  auto r = std::make_unique<GpuModelRunner>(config, shard, options, tp_comm);
  RETURN_IF_ERROR(r->InitRandom(expert_format, seed));
  return std::unique_ptr<ModelRunner>(std::move(r));
}

}  // namespace moeshard
