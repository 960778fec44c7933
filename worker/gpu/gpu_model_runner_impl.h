// The GPU model runner's class, shared by its two source files: gpu_runner_setup.cc (device,
// weights, buffers and the per-step preparation) and gpu_model_runner.cc (the forward pass).
// Internal to worker/gpu: everything else uses worker/gpu/gpu_model_runner.h.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/moe/moe_expert.h"
#include "worker/gpu/decode_graphs.h"
#include "worker/gpu/device_memory.h"
#include "worker/gpu/gpu_model_runner.h"
#include "worker/gpu/gpu_weights.h"
#include "worker/gpu/runner_repeat.h"
#include "worker/gpu/step_profile.h"
#include "worker/model/layer_ops.h"

namespace moeshard::gpu_runner {

using namespace gpu;  // NOLINT: the GPU backend

constexpr size_t kLogitChunkBytes = size_t{256} << 20;
constexpr int64_t kAttentionWorkspaceBytes = int64_t{64} << 20;

class GpuModelRunner : public ModelRunner, private LayerOps {
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
  absl::Status InitRandom(WeightFormat expert_format, uint64_t seed, WeightFormat dense_format);

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
  // The rows' greedy tokens found on the device (gpu::ArgMax): one id a row comes back.
  absl::Status ForwardArgMax(const std::vector<SeqChunk>& batch, std::vector<int32_t>* ids) override;
  size_t kv_bytes() const override { return kv_bytes_; }
  std::string ProfileReport() const override { return prof_.Report(); }
  void ResetProfile() override { prof_.Reset(); }
  void SetProfiling(bool on) override { prof_.SetActive(on && options_.profile); }
  // "cuda:0 bfloat16 kv bfloat16", and for MoE models where the experts are kept: ", experts
  // stored" or ", experts streaming" (repacked for the streaming kernels: --expert-layout), or how
  // many of the layers each, and why the stored ones stayed stored (the loader's first reason).
  std::string backend() const override;

 private:
  absl::Status Prepare(const std::vector<SeqChunk>& batch);
  // The FP8 prefill path (kv_copy.cc): a prefill step over an FP8 cache copies the blocks its
  // queries see to bf16 once per layer and runs the bf16 tensor-core attention on the copy.
  absl::Status PrepareKvCopy(const std::vector<SeqChunk>& batch);
  // With a copy planned for this step: dequantizes layer li's blocks and points ap at the copy.
  absl::Status UseKvCopy(int64_t li, AttentionParams* ap);
  absl::Status StartDevice();
  absl::Status InitBuffers();
  RepackPolicy Repack() const;
  absl::Status EmbedDevice() {
    EmbedParams p{w_->embed, ids_, T_, s_};
    return gpu::Embed(p, stream_);
  }
  absl::Status LayersDevice();
  absl::Status HeadDevice(std::vector<float>* logits);
  absl::Status HeadRows(int64_t r0, int64_t n);
  absl::Status ForwardGraph(const std::vector<SeqChunk>& batch, std::vector<float>* logits);
  // The decode graph's replay (ForwardGraph's conditions), leaving its R_ rows of logits on the
  // device at *device_logits; Unavailable when the step does not qualify.
  absl::Status LaunchGraph(const std::vector<SeqChunk>& batch, float** device_logits);
  // LayerOps (worker/model/layer_ops.h) on the current block's buffers below; gpu_model_runner.cc.
  // Releases the arena and takes the attention block's scratch; the input norm unless
  // prenormed_; Q/K/V in one ProjectMany (one Gemv when all three qualify); QkPrep (q/k norm,
  // RoPE and the KV write in one kernel) when it supports head_dim, else each its own kernel.
  absl::Status AttentionInput(int64_t li, const AttentionInputOpts& opts) override;
  // The KV write (when QkPrep did not do it), then paged attention; the decode workspace.
  absl::Status Attention(int64_t li, int64_t window) override;
  absl::Status OutputGate(int64_t li) override;        // gate projection + HeadGate
  absl::Status OutputProjection(int64_t li) override;  // o-proj (+bias) in fp32, all-reduce
  // ResidualUpdate; opts.next names the next block's input norm to run in the same kernel.
  absl::Status Residual(int64_t li, Block block, const ResidualOpts& opts) override;
  // Releases the arena and takes f_; the input norm (with the fp32 copy) unless prenormed_.
  absl::Status MlpInput(int64_t li, const MlpInputOpts& opts) override;
  absl::Status DenseMlp(int64_t li) override;  // gate+up in one ProjectMany, SiluMul, down, all-reduce
  // Takes the MoE block's scratch (mix, z, expert workspace), the fp32 router and Routing.
  absl::Status Route(int64_t li, const RouteOpts& opts) override;
  absl::Status LatentIn(int64_t li) override;
  absl::Status Experts(int64_t li, const ExpertsOpts& opts) override;  // MoeExpertStep, all-reduce
  absl::Status LatentOut(int64_t li) override;  // the mix to the activation dtype, latent_out
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
  // s updated with a block's output (gated or plain); with next_norm (and fusion on), the next
  // block's input norm too, into xn_ (and xn32_ when next_f32), and prenormed_ set.
  // With moe_mix_pending_, the block's output is the experts' rows mixed inside the update
  // (Experts skipped the MoE combine) and `out` is not read.
  absl::Status ResidualUpdate(const float* out, const float* norm, const float* alpha, const float* beta, bool gated,
                              const float* next_norm, bool next_f32);
  absl::Status Project(const DenseWeight& w, const void* x, void* y, ActDType y_dtype, int64_t rows,
                       const float* bias = nullptr, const char* category = "dense projections");
  struct ProjectOut {
    const DenseWeight* w;
    void* y;
    const float* bias;
  };
  // Several projections of the same x: one Gemv launch when all qualify, else one call each.
  // With res.s set, x comes from the folded residual update (GemvResidualIn): Gemv only.
  absl::Status ProjectMany(std::initializer_list<ProjectOut> outs, const void* x, ActDType y_dtype, int64_t rows,
                           const char* category = "dense projections", const gpu::GemvResidualIn& res = {});
  bool UseGemv(const DenseWeight& w, int64_t rows) const;
  int64_t GemvChunk(const DenseWeight& w, int64_t rows) const;
  bool FoldsAttentionResidual(int64_t li, const ResidualOpts& opts) const;
  bool FoldsMoeResidual(int64_t li, const ExpertsOpts& opts) const;
  absl::Status UploadHidden(const std::vector<float>& h);
  absl::Status Download(const float* dev, int64_t n, std::vector<float>* out);
  // The traced row of s after a residual update (SetResidualTrace), outside graph capture.
  absl::Status TraceResidual(int64_t li, Block block);
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
  bool gemv_enabled_ = true;  // MOESHARD_GEMV=0: every projection through cuBLAS
  bool qk_prep_enabled_ = true;  // MOESHARD_QK_PREP=0: q/k norm, RoPE and the KV write as separate kernels
  bool fuse_norms_ = true;  // MOESHARD_FUSE_NORMS=0: each block's input norm as its own kernel
  bool prenormed_ = false;  // xn_ (and xn32_) already hold the next block's normalized input
  // MOESHARD_FUSE_MOE_RESIDUAL=0: the MoE combine as its own kernel. Else, on one GPU (no
  // all-reduce between them) without a latent or output norm, Experts leaves the combine to
  // the MLP block's residual update: moe_rows_ and moe_mix_pending_ until it runs.
  bool fuse_moe_residual_ = true;
  bool moe_mix_pending_ = false;
  // On one GPU with a latent (Muse Spark) in bf16, the MoE combine writes the mix's bf16 copy for
  // latent_out itself (MoeExpertParams::out_act): no conversion kernel between them, which also
  // kept latent_out's weights from starting early (H100, 2026-12-06: Muse Spark's 8-layer decode
  // step level at one stream, 6.32-6.34 -> 6.25-6.27 ms at four). MOESHARD_MIX_IN_COMBINE=0: the
  // conversion kernel.
  bool mix_in_combine_ = true;
  void* mix_act_ = nullptr;  // [T, Lw] act: the mix's copy the combine wrote, or null
  // MOESHARD_REPEAT_OPS (benchmarks only; runner_repeat.h): ops launched twice a step, so that
  // bench-model's step time shows what each costs inside the decode chain.
  uint32_t repeat_ops_ = 0;
  // MOESHARD_FOLD_RESIDUAL=0: off. Else, on one GPU, a one-token step's attention residual update
  // is folded: the router's GEMV computes s + a_ and the MoE block's input norm itself
  // (GemvResidualIn; it writes xn_ for the experts), and the MLP block's update adds a_ to s
  // first (ResidualParams::pre_add) — one kernel less a layer.
  bool fold_residual_ = true;
  gpu::GemvResidualIn router_res_;  // set by Residual, taken by Route's router projection
  const float* pre_add_ = nullptr;  // set by Residual, taken by the MLP block's residual update
  // MOESHARD_FOLD_MOE_RESIDUAL=1: on (off by default until measured on a GPU). Then, at one token on
  // one GPU holding every expert, the MLP block's residual update runs inside the experts' down
  // kernel (moe_expert.h MoeExpertStepResidual) and the next layer's Q/K/V GEMV computes its input
  // norm from s (qkv_res_) — the residual kernel's launch gone (FoldsMoeResidual says when).
  bool fold_moe_residual_ = false;
  bool moe_residual_done_ = false;  // set by Experts, taken by Residual(kMlp)
  gpu::GemvResidualIn qkv_res_;     // set by Experts, taken by the next AttentionInput
  int Reps(uint32_t op) const { return (repeat_ops_ & op) ? 2 : 1; }
  MoeExpertRows moe_rows_;
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
  // The FP8 prefill copy (kv_copy.cc): MOESHARD_FP8_PREFILL_COPY_MB caps its bf16 bytes (default
  // 4096; 0 = off: the tensor-core prefill kernel converts FP8 tiles itself). On the H200 a
  // 131,072-token FP8 prefill took 81.0 s without it and 38.8 s with it (bf16 KV: 38.8 s).
  // [0] full layers, [1] the sliding-window layers (their window of each chunk, from its sliding
  // table with a sliding pool).
  struct KvCopyDevice {
    int32_t *src = nullptr, *tables = nullptr, *toff = nullptr;
    int64_t blocks = 0;
  };
  int64_t kv_copy_cap_mb_ = 4096;
  bool kv_copy_active_ = false;
  KvCopyDevice kv_copy_[2];
  void *kv_copy_k_ = nullptr, *kv_copy_v_ = nullptr;
  std::vector<int32_t> kv_copy_host_;
  DeviceBuffer kv_copy_buf_;
  // The current step.
  std::vector<int32_t> host_idx_;
  int64_t T_ = 0, R_ = 0, max_chunk_tokens_ = 0;
  int64_t trace_row_ = -1;  // TraceRow of the step being prepared
  int64_t routed_layer_ = -1;  // the layer whose routing logits_ and expert_ids_ hold (the trace's)
  size_t step_mark_ = 0;  // the arena past the step's indices and residual stream
  int32_t *ids_ = nullptr, *pos_ = nullptr, *slots_ = nullptr, *toff_ = nullptr, *tables_ = nullptr,
          *rows_ = nullptr;
  // The sliding pool's slots and table offsets (into tables_) of a sliding layer's tokens;
  // slots_ and toff_ without a sliding pool.
  int32_t *sliding_slots_ = nullptr, *sliding_toff_ = nullptr;
  float* s_ = nullptr;
  void* xn_ = nullptr;       // [T, H] activation dtype: the current block's normalized input
  float* xn32_ = nullptr;    // [T, H] its fp32 copy (the MoE router's input)
  // The current block's scratch (arena, taken by the block's first op).
  void *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *o_ = nullptr;  // attention: q/k/v, output per head
  float* a_ = nullptr;        // [T, H] the attention block's output (per step, outside the block arena)
  bool fused_prep_ = false;   // AttentionInput's QkPrep wrote the KV cache (or Attention's fused kernel will)
  // One token per sequence, at most fused_max_tokens_ of them (MOESHARD_ATTN_FUSED_MAX_TOKENS,
  // default 2) and every context at most fused_max_context_ (MOESHARD_ATTN_FUSED_MAX_CONTEXT,
  // default 1024; 0 never): Attention runs QkPrep's work inside the decode attention launch
  // (gpu::AttentionDecodeFused) when it supports the shape; prep_ is that QkPrep. (H200,
  // Qwen3-30B shape, 640 context: 1 stream 3.34 vs 3.59 ms a step; 4 streams 7.45 vs 7.02, and
  // 2,048 context 3.68 vs 3.61: its 8 splits a KV head are too few there.)
  bool fused_decode_ = false, prep_in_attention_ = false;
  int64_t fused_max_context_ = 1024, fused_max_tokens_ = 2;
  QkPrepParams prep_;
  float* f_ = nullptr;        // [T, H] the MLP block's output
  float* y32_ = nullptr;      // xn32_ when MlpInput kept the fp32 copy, else null
  float *logits_ = nullptr, *wts_ = nullptr;  // [T, E] router logits, [T, K] routing weights
  int32_t* expert_ids_ = nullptr;             // [T, K] local expert ids
  float* mix_ = nullptr;      // [T, Lw] the experts' mix (f_ without a latent)
  void* z_ = nullptr;         // [T, Lw] the experts' input (xn_ without a latent)
  void* moe_ws_ = nullptr;    // the expert step's workspace
  size_t moe_ws_bytes_ = 0;
};

}  // namespace moeshard::gpu_runner
