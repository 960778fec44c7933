// GpuModelRunner: the forward pass on the GPU. A step: the batch's indices (ids, positions,
// cache slots, block tables, rows that want logits) go to the device in one copy; the residual
// stream s [T, H] (fp32) lives in the step arena; the layers are the model file's sequence
// (worker/model) over this runner's LayerOps, each op kernel launches on the runner's stream,
// fused where it pays (QKV and gate+up as one Gemv, QkPrep, the next block's input norm in the
// residual update); the LM head writes fp32 logits in row chunks that are copied back.
#include "worker/gpu/gpu_model_runner_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/moe/moe_expert.h"
#include "worker/model/model.h"

namespace moeshard::gpu_runner {

namespace {

GemvWeight GemvTypeOf(const DenseWeight& w) {
  if (w.q8_scales) return GemvWeight::kQ8;
  return w.dtype == ActDType::kF32 ? GemvWeight::kF32 : GemvWeight::kBF16;
}

GemvMatrix GemvOf(const DenseWeight& w, const float* bias, void* y) {
  GemvMatrix m;
  m.w = w.data;
  m.scales = w.q8_scales;
  m.rows = w.rows;
  m.bias = bias;
  m.y = y;
  return m;
}

}  // namespace

// Decode-sized batches (≤ kGemvMaxTokens rows whose x fits one launch, or up to kGemvWideMaxTokens of
// split Q8 weights with bf16 x: gemv_wide.cu) read each weight once through Gemv, up to three matrices
// of the same input in one launch; larger ones go through cuBLAS.
bool GpuModelRunner::UseGemv(const DenseWeight& w, int64_t rows) const {
  if (!gemv_enabled_ || !GemvSupports(GemvTypeOf(w), w.cols)) return false;
  if (rows > kGemvMaxTokens) return GemvWideTakes(GemvTypeOf(w), w.dtype == ActDType::kF32, w.cols, rows);
  return GemvOneLaunch(GemvTypeOf(w), w.dtype, w.cols, rows);
}

// Rows of one Gemv launch when a batch of `rows` goes through Gemv in chunks (0: it does not; split Q8
// weights with bf16 x take the wide kernel instead, UseGemv).
// Between kGemvMaxTokens and MOESHARD_GEMV_CHUNKED_MAX rows (default 32; 0 off), Q8_0 and bf16
// weights: each chunk reads the weights again, and up to four chunks that still costs less than
// the GEMM path, whose expansion of a Q8_0 weight to bf16 (written, then read) took 5.7 ms of a
// 16-stream decode step of the Qwen3-30B shape against 0.23 ms of Q8_0 bytes. Measured on the
// H200 (2026-12-04, bench-model, chunked against not): 16 streams 15.98 against 18.52 ms a step
// (dense 2.99 / 5.71, LM head 0.51 / 1.47), 32 streams dense 5.43 / 5.64 and LM head 1.02 / 1.47,
// 64 streams dense 10.3 / 5.7 (slower: hence 32); the fp32 router chunked was slower at every
// size (1.26 / 0.63 ms at 16), so fp32 weights never chunk.
int64_t GpuModelRunner::GemvChunk(const DenseWeight& w, int64_t rows) const {
  static const int64_t most = [] {
    const char* v = std::getenv("MOESHARD_GEMV_CHUNKED_MAX");
    return v && *v ? std::atoll(v) : int64_t{32};
  }();
  if (!gemv_enabled_ || rows <= kGemvMaxTokens || rows > most || GemvTypeOf(w) == GemvWeight::kF32 ||
      !GemvSupports(GemvTypeOf(w), w.cols)) {
    return 0;
  }
  for (int64_t n = kGemvMaxTokens; n >= 1; --n) {
    if (GemvOneLaunch(GemvTypeOf(w), w.dtype, w.cols, n)) return n;
  }
  return 0;
}

absl::Status GpuModelRunner::ProjectMany(std::initializer_list<ProjectOut> outs, const void* x, ActDType y_dtype,
                                         int64_t rows, const char* category, const gpu::GemvResidualIn& res) {
  const DenseWeight& w0 = *outs.begin()->w;
  bool fused = outs.size() <= 3, chunked = !res.s && outs.size() <= 3;
  int64_t chunk = kGemvMaxTokens;
  for (const ProjectOut& o : outs) {
    const bool same = GemvTypeOf(*o.w) == GemvTypeOf(w0) && o.w->cols == w0.cols;
    fused = fused && UseGemv(*o.w, rows) && same;
    const int64_t n = GemvChunk(*o.w, rows);
    chunked = chunked && n > 0 && same;
    chunk = std::min(chunk, n);
  }
  if (!fused && !chunked) {
    if (res.s) return absl::InternalError("a folded residual update needs the Gemv path");
    for (const ProjectOut& o : outs) RETURN_IF_ERROR(Project(*o.w, x, o.y, y_dtype, rows, o.bias, category));
    return absl::OkStatus();
  }
  if (fused) chunk = rows;
  GemvParams g;
  g.wtype = GemvTypeOf(w0);
  g.x_dtype = w0.dtype;
  g.y_dtype = y_dtype;
  g.cols = w0.cols;
  g.res = res;
  const int64_t x_row = w0.cols * (w0.dtype == ActDType::kF32 ? 4 : 2), y_elem = y_dtype == ActDType::kF32 ? 4 : 2;
  auto region = prof_.Region(category, stream_);
  for (int64_t t0 = 0; t0 < rows; t0 += chunk) {  // token rows are independent: chunks give each row's own sums
    g.x = static_cast<const char*>(x) + t0 * x_row;
    g.num_tokens = std::min(chunk, rows - t0);
    g.num_matrices = 0;
    for (const ProjectOut& o : outs) {
      g.m[g.num_matrices++] = GemvOf(*o.w, o.bias, static_cast<char*>(o.y) + t0 * o.w->rows * y_elem);
    }
    RETURN_IF_ERROR(Gemv(g, stream_));
  }
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Project(const DenseWeight& w, const void* x, void* y, ActDType y_dtype, int64_t rows,
                                     const float* bias, const char* category) {
  if (UseGemv(w, rows) || GemvChunk(w, rows) > 0) return ProjectMany({{&w, y, bias}}, x, y_dtype, rows, category);
  GemmArgs a;
  a.scratch = w_->gemm_scratch;
  a.scratch_bytes = w_->gemm_scratch_bytes;
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
                                            const float* beta, bool gated, const float* next_norm, bool next_f32) {
  ResidualParams p;
  p.s = s_;
  p.out = out;
  p.rows = T_;
  p.dim = config_.hidden_size;
  p.gated = gated;
  p.out_norm = norm;
  p.alpha = alpha;
  p.beta = beta;
  p.eps = config_.rms_eps;
  p.pre_add = pre_add_;  // the attention block's update, when Route's router folded it in
  pre_add_ = nullptr;
  if (moe_mix_pending_) {
    p.out = nullptr;
    p.mix_rows = moe_rows_.rows;
    p.mix_pos = moe_rows_.pos;
    p.mix_weights = wts_;
    p.mix_k = static_cast<int>(config_.top_k);
    moe_mix_pending_ = false;
  }
  if (next_norm && fuse_norms_) {  // the next block's input norm, from the updated stream
    p.next_norm = next_norm;
    p.next_out = xn_;
    p.next_dtype = act_;
    p.next_out_f32 = next_f32 ? xn32_ : nullptr;
    prenormed_ = true;
  }
  return gpu::Residual(p, stream_);
}

// Whether the attention block's residual update goes into the router's GEMV (fold_residual_):
// one token (one stream's decode step: with more, each router block's per-token norms cost
// more than the kernel they save — 6.60 against 6.48 ms a step at four streams), one GPU, the
// plain form, an MoE block next whose fp32 router takes the GEMV, no trace.
bool GpuModelRunner::FoldsAttentionResidual(int64_t li, const ResidualOpts& opts) const {
  const DenseWeight& router = w_->layers[li].router;
  return fold_residual_ && T_ == 1 && fuse_norms_ && shard_.tp_size <= 1 && !opts.gated && trace_row_ < 0 &&
         opts.next.kind == NextInput::Kind::kMlp && opts.next.f32_copy && w_->layers[li].moe_norm &&
         router.data && GemvTypeOf(router) == GemvWeight::kF32 && UseGemv(router, T_) &&
         router.cols == config_.hidden_size && config_.hidden_size % 4 == 0;
}

// Whether the MLP block's residual update goes into the experts' down kernel (MoeExpertStepResidual;
// fold_moe_residual_), its norm into the next layer's Q/K/V GEMV (GemvResidualIn without add): one
// token, one GPU holding every expert, the plain update straight after the experts, a next layer on
// this shard whose Q/K/V take one Gemv launch, no trace and no repeated ops.
bool GpuModelRunner::FoldsMoeResidual(int64_t li, const ExpertsOpts& opts) const {
  const int64_t H = config_.hidden_size;
  if (!fold_moe_residual_ || T_ != 1 || !fuse_norms_ || shard_.tp_size > 1 || trace_row_ >= 0 || repeat_ops_ != 0 ||
      opts.output_norm || !opts.residual || opts.residual->gated ||
      opts.residual->next.kind != NextInput::Kind::kAttention || opts.residual->next.f32_copy || mix_ != f_ ||
      li + 1 >= static_cast<int64_t>(w_->layers.size()) || H % 4 != 0 ||
      host_w_->num_local_experts != config_.num_experts) {
    return false;
  }
  const GpuLayerWeights& next = w_->layers[li + 1];
  if (!next.attn_norm) return false;
  for (const DenseWeight* w : {&next.q, &next.k, &next.v}) {
    if (!w->data || !UseGemv(*w, T_) || GemvTypeOf(*w) != GemvTypeOf(next.q) || w->cols != H) return false;
  }
  return true;
}

// The model file's layer sequence (worker/model) over this runner's ops, below.
absl::Status GpuModelRunner::LayersDevice() {
  prenormed_ = false;
  moe_mix_pending_ = false;
  moe_residual_done_ = false;
  qkv_res_ = {};
  return RunLayerSequence(config_, shard_.layer_begin, shard_.layer_end, *this);
}

// The attention block's scratch comes from the arena released here (the previous block's is
// dead); its input norm is skipped when the previous residual update already wrote it.
absl::Status GpuModelRunner::AttentionInput(int64_t li, const AttentionInputOpts& opts) {
  const ModelConfig& c = config_;
  const GpuLayerWeights& lw = w_->layers[li];
  const int64_t T = T_, H = c.hidden_size, hd = c.head_dim;
  if (moe_mix_pending_) return absl::InternalError("the experts' rows were left unmixed (no MLP residual update)");
  arena_.Release(step_mark_);
  void* x = xn_;
  void* q = q_ = Act(T * nq_ * hd);
  void* k = k_ = Act(T * nkv_ * hd);
  void* v = v_ = Act(T * nkv_ * hd);
  o_ = Act(T * nq_ * hd);
  RETURN_IF_ERROR(arena_error_);
  const gpu::GemvResidualIn res = qkv_res_;  // the input norm of an update the experts stored (FoldsMoeResidual)
  qkv_res_ = {};
  if (!prenormed_ && !res.s) RETURN_IF_ERROR(Norm(s_, ActDType::kF32, T, H, lw.attn_norm, x));
  prenormed_ = false;
  for (int rep = 0; rep < Reps(kRepeatQkv); ++rep) {
    RETURN_IF_ERROR(ProjectMany({{&lw.q, q, lw.q_bias}, {&lw.k, k, lw.k_bias}, {&lw.v, v, lw.v_bias}}, x, act_, T,
                                "dense projections", res));
  }
  // One kernel for q/k norm, RoPE and the KV write; else each its own, and the KV write at
  // the start of Attention.
  fused_prep_ = QkPrepSupports(hd) && qk_prep_enabled_;
  prep_in_attention_ = false;
  if (fused_prep_) {
    QkPrepParams qp;
    qp.q = q;
    qp.k = k;
    qp.v = v;
    qp.dtype = act_;
    qp.num_tokens = T;
    qp.num_heads = nq_;
    qp.q_norm = opts.qk_norm ? lw.q_norm : nullptr;
    qp.k_norm = opts.qk_norm ? lw.k_norm : nullptr;
    qp.eps = c.rms_eps;
    qp.rope = opts.rope;
    qp.pos = pos_;
    qp.theta = c.rope_theta;
    qp.slots = InSlidingPool(li) ? sliding_slots_ : slots_;
    qp.cache = kv_[li];
    if (fused_decode_) {  // Attention runs it inside its launch when it can
      prep_ = qp;
      prep_in_attention_ = true;
      return absl::OkStatus();
    }
    auto region = prof_.Region("attention", stream_);
    RETURN_IF_ERROR(gpu::QkPrep(qp, stream_));
  }
  if (opts.qk_norm && !fused_prep_) {
    for (auto [buf, heads, w] : {std::tuple{q, nq_, lw.q_norm}, std::tuple{k, nkv_, lw.k_norm}}) {
      RETURN_IF_ERROR(Norm(buf, act_, T * heads, hd, w, buf));
    }
  }
  if (opts.rope && !fused_prep_) {
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
  return absl::OkStatus();
}

absl::Status GpuModelRunner::Attention(int64_t li, int64_t window) {
  const int64_t T = T_, hd = config_.head_dim;
  KvWriteParams kw;
  kw.k = k_;
  kw.v = v_;
  kw.dtype = act_;
  kw.num_tokens = T;
  const bool sliding = InSlidingPool(li);  // its KV, slots and table in the sliding pool
  kw.slots = sliding ? sliding_slots_ : slots_;
  kw.cache = kv_[li];
  AttentionParams ap;
  ap.q = q_;
  ap.out = o_;
  ap.dtype = act_;
  ap.num_tokens = T;
  ap.num_heads = nq_;
  ap.pos = pos_;
  ap.table_offset = sliding ? sliding_toff_ : toff_;
  ap.block_tables = tables_;
  ap.window = window;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.cache = kv_[li];
  ap.max_tokens_per_seq = max_chunk_tokens_;
  if (max_chunk_tokens_ <= 8) {  // decode: split each sequence's context across blocks
    // Any size works (fewer splits when it is small); capped so the arena stays bounded.
    const int64_t ws =
        std::min<int64_t>(AttentionWorkspaceBytes(T, nq_, hd, kAttentionMaxSplits), kAttentionWorkspaceBytes);
    ap.workspace = Take(ws);
    ap.workspace_bytes = ws;
    RETURN_IF_ERROR(arena_error_);
  }
  auto region = prof_.Region("attention", stream_);
  if (prep_in_attention_) {
    prep_in_attention_ = false;
    if (gpu::AttentionDecodeFusedSupports(ap, prep_)) {
      for (int rep = 1; rep < Reps(kRepeatAttention); ++rep) RETURN_IF_ERROR(gpu::AttentionDecodeFused(ap, prep_, stream_));
      return gpu::AttentionDecodeFused(ap, prep_, stream_);
    }
    RETURN_IF_ERROR(gpu::QkPrep(prep_, stream_));  // the shape the fused kernel does not take
  }
  if (!fused_prep_) RETURN_IF_ERROR(gpu::KvWrite(kw, stream_));
  if (kv_copy_active_) RETURN_IF_ERROR(UseKvCopy(li, &ap));
  for (int rep = 1; rep < Reps(kRepeatAttention); ++rep) RETURN_IF_ERROR(gpu::Attention(ap, stream_));
  return gpu::Attention(ap, stream_);
}

absl::Status GpuModelRunner::OutputGate(int64_t li) {
  const int64_t T = T_;
  void* g = Act(T * nq_);
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(Project(w_->layers[li].head_gate, xn_, g, act_, T));
  HeadGateParams hg{o_, g, act_, T, nq_, config_.head_dim};
  return gpu::HeadGate(hg, stream_);
}

absl::Status GpuModelRunner::OutputProjection(int64_t li) {
  const GpuLayerWeights& lw = w_->layers[li];
  for (int rep = 0; rep < Reps(kRepeatO); ++rep) RETURN_IF_ERROR(Project(lw.o, o_, a_, ActDType::kF32, T_, lw.o_bias));
  return AllReduce(a_, T_ * config_.hidden_size);
}

// With a next block (opts.next), its input norm rides on the update.
absl::Status GpuModelRunner::Residual(int64_t li, Block block, const ResidualOpts& opts) {
  if (block == Block::kMlp && moe_residual_done_) {  // the experts' down kernel did it (FoldsMoeResidual)
    moe_residual_done_ = false;
    return absl::OkStatus();
  }
  const GpuLayerWeights& lw = w_->layers[li];
  const float* next_norm = nullptr;
  if (opts.next.kind == NextInput::Kind::kMlp) {
    next_norm = lw.moe_norm;
  } else if (opts.next.kind == NextInput::Kind::kAttention && li + 1 < static_cast<int64_t>(w_->layers.size())) {
    next_norm = w_->layers[li + 1].attn_norm;
  }
  if (block == Block::kAttention && FoldsAttentionResidual(li, opts)) {
    router_res_ = {s_, a_, lw.moe_norm, config_.rms_eps, xn_, act_};
    pre_add_ = a_;
    prenormed_ = true;  // the router's GEMV writes xn_
    return absl::OkStatus();
  }
  if (block == Block::kAttention) {
    RETURN_IF_ERROR(
        ResidualUpdate(a_, lw.attn_out_norm, lw.attn_alpha, lw.attn_beta, opts.gated, next_norm, opts.next.f32_copy));
  } else {
    RETURN_IF_ERROR(
        ResidualUpdate(f_, lw.moe_out_norm, lw.moe_alpha, lw.moe_beta, opts.gated, next_norm, opts.next.f32_copy));
  }
  return trace_row_ >= 0 && trace_sink_ ? TraceResidual(li, block) : absl::OkStatus();
}

absl::Status GpuModelRunner::TraceResidual(int64_t li, Block block) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &capture));
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();  // a decode graph: not traced
  ResidualTrace t{trace_position_, shard_.layer_begin + li, block, {}, {}, {}};
  RETURN_IF_ERROR(Download(s_ + trace_row_ * config_.hidden_size, config_.hidden_size, &t.s));
  if (block == Block::kMlp && routed_layer_ == li && logits_ && expert_ids_) {  // this block's routing
    const int64_t E = config_.num_experts, K = config_.top_k;
    RETURN_IF_ERROR(Download(logits_ + trace_row_ * E, E, &t.router_logits));
    t.experts.resize(K);
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(t.experts.data(), expert_ids_ + trace_row_ * K, K * sizeof(int32_t),
                                                  cudaMemcpyDeviceToHost, stream_));
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  }
  trace_sink_(t);
  return absl::OkStatus();
}

// The MLP block's scratch from the released arena; the input norm as in AttentionInput.
absl::Status GpuModelRunner::MlpInput(int64_t li, const MlpInputOpts& opts) {
  const int64_t T = T_, H = config_.hidden_size;
  arena_.Release(step_mark_);
  f_ = F32(T * H);
  y32_ = opts.f32_copy ? xn32_ : nullptr;
  RETURN_IF_ERROR(arena_error_);
  if (!prenormed_) RETURN_IF_ERROR(Norm(s_, ActDType::kF32, T, H, w_->layers[li].moe_norm, xn_, y32_));
  prenormed_ = false;
  return absl::OkStatus();
}

absl::Status GpuModelRunner::DenseMlp(int64_t li) {
  const GpuLayerWeights& lw = w_->layers[li];
  const int64_t T = T_, I = lw.dense.gate.rows;
  void *g = Act(T * I), *u = Act(T * I);
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(ProjectMany({{&lw.dense.gate, g, nullptr}, {&lw.dense.up, u, nullptr}}, xn_, act_, T));
  SiluMulParams sm{g, u, g, act_, T * I};
  RETURN_IF_ERROR(gpu::SiluMul(sm, stream_));
  RETURN_IF_ERROR(Project(lw.dense.down, g, f_, ActDType::kF32, T));
  return AllReduce(f_, T * config_.hidden_size);
}

// Takes the whole MoE block's scratch: without a latent the experts read xn_ and write f_.
absl::Status GpuModelRunner::Route(int64_t li, const RouteOpts& opts) {
  const ModelConfig& c = config_;
  const int64_t T = T_, E = c.num_experts, K = c.top_k, Lw = c.expert_width();
  if (!y32_) return absl::FailedPreconditionError("Route needs MlpInput's fp32 copy");
  logits_ = F32(T * E);
  routed_layer_ = li;
  wts_ = F32(T * K);
  expert_ids_ = static_cast<int32_t*>(Take(T * K * 4));
  mix_ = opts.latent ? F32(T * Lw) : f_;
  mix_act_ = opts.latent && mix_in_combine_ && act_ == ActDType::kBF16 && shard_.tp_size <= 1 ? Act(T * Lw) : nullptr;
  z_ = opts.latent ? Act(T * Lw) : xn_;
  moe_ws_bytes_ = MoeExpertWorkspaceBytes(static_cast<int>(host_w_->num_local_experts), Lw, c.expert_intermediate, T,
                                          static_cast<int>(K), w_->layers[li].expert_formats);
  moe_ws_ = Take(static_cast<int64_t>(moe_ws_bytes_));
  RETURN_IF_ERROR(arena_error_);
  const gpu::GemvResidualIn res = router_res_;  // the attention block's folded update (FoldsAttentionResidual)
  router_res_ = {};
  for (int rep = 0; rep < Reps(kRepeatRouter); ++rep) {  // fp32 router
    const DenseWeight& router = w_->layers[li].router;
    RETURN_IF_ERROR(res.s ? ProjectMany({{&router, logits_, nullptr}}, y32_, ActDType::kF32, T, "router", res)
                          : Project(router, y32_, logits_, ActDType::kF32, T, nullptr, "router"));
  }
  RoutingParams rp;
  rp.logits = logits_;
  rp.num_tokens = T;
  rp.num_experts = E;
  rp.top_k = K;
  rp.softmax_topk_only = opts.softmax_topk_only;
  rp.renormalize = opts.renormalize;
  rp.expert_begin = host_w_->expert_begin;
  rp.num_local_experts = host_w_->num_local_experts;
  rp.local_ids = expert_ids_;
  rp.weights = wts_;
  for (int rep = 1; rep < Reps(kRepeatRouting); ++rep) RETURN_IF_ERROR(gpu::Routing(rp, stream_));
  return gpu::Routing(rp, stream_);
}

absl::Status GpuModelRunner::LatentIn(int64_t li) {
  return Project(w_->layers[li].latent_in, xn_, z_, act_, T_);
}

absl::Status GpuModelRunner::Experts(int64_t li, const ExpertsOpts& opts) {
  const ModelConfig& c = config_;
  const GpuLayerWeights& lw = w_->layers[li];
  const int64_t T = T_, K = c.top_k, Lw = c.expert_width();
  MoeExpertParams mp;
  mp.experts = lw.experts;
  mp.num_local_experts = static_cast<int>(host_w_->num_local_experts);
  mp.num_total_experts = static_cast<int>(c.num_experts);
  mp.width = Lw;
  mp.inter = c.expert_intermediate;
  mp.num_tokens = T;
  mp.top_k = static_cast<int>(K);
  mp.expert_ids = expert_ids_;
  mp.weights = wts_;
  mp.x = z_;
  mp.act_dtype = act_;
  mp.output_norm = opts.output_norm;
  mp.eps = c.rms_eps;
  mp.out = mix_;
  mp.out_act = mix_act_;
  mp.workspace = moe_ws_;
  mp.workspace_bytes = moe_ws_bytes_;
  mp.expert_formats = lw.expert_formats;
  // One token on one GPU: the update inside the experts' down kernel, its norm in the next Q/K/V GEMV.
  if (FoldsMoeResidual(li, opts)) {
    bool taken = false;
    {
      auto region = prof_.Region("expert step", stream_);
      ASSIGN_OR_RETURN(taken, MoeExpertStepResidual(mp, s_, pre_add_, stream_));
    }
    if (taken) {
      pre_add_ = nullptr;
      moe_residual_done_ = true;
      qkv_res_ = {s_, nullptr, w_->layers[li + 1].attn_norm, config_.rms_eps, xn_, act_, act_ == ActDType::kBF16,
                  /*norm_early=*/true};
      return absl::OkStatus();
    }
  }
  // On one GPU the MLP block's residual update mixes the experts' rows itself (one kernel less).
  if (fuse_moe_residual_ && shard_.tp_size <= 1 && !opts.output_norm && mix_ == f_ && K <= 64) {
    auto region = prof_.Region("expert step", stream_);
    for (int rep = 0; rep < Reps(kRepeatExperts); ++rep) {
      ASSIGN_OR_RETURN(moe_rows_, MoeExpertStepRows(mp, stream_));
    }
    moe_mix_pending_ = true;
    return absl::OkStatus();
  }
  {
    auto region = prof_.Region("expert step", stream_);
    for (int rep = 0; rep < Reps(kRepeatExperts); ++rep) RETURN_IF_ERROR(MoeExpertStep(mp, stream_));
  }
  return AllReduce(mix_, T * Lw);  // one Lw-wide fp32 partial per token
}

absl::Status GpuModelRunner::LatentOut(int64_t li) {
  const int64_t T = T_, Lw = config_.expert_width();
  void* mix_act = mix_act_ ? mix_act_ : mix_;
  const bool converted = mix_act_ != nullptr;
  mix_act_ = nullptr;  // this step's copy, used once
  if (act_ != ActDType::kF32 && !converted) {
    mix_act = Act(T * Lw);
    RETURN_IF_ERROR(arena_error_);
    ConvertParams cv{mix_, ActDType::kF32, mix_act, act_, T * Lw};
    RETURN_IF_ERROR(gpu::Convert(cv, stream_));
  }
  return Project(w_->layers[li].latent_out, mix_act, f_, ActDType::kF32, T);
}

// Final norm and LM head of rows [r0, r0 + n) into head_logits_ (device).
absl::Status GpuModelRunner::HeadRows(int64_t r0, int64_t n) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  arena_.Release(step_mark_);
  void* xh = Act(logit_rows_ * H);
  head_logits_ = F32(logit_rows_ * V);
  RETURN_IF_ERROR(arena_error_);
  RETURN_IF_ERROR(Norm(s_, ActDType::kF32, n, H, w_->final_norm, xh, nullptr, rows_ + r0));
  for (int rep = 1; rep < Reps(kRepeatLmHead); ++rep) {
    RETURN_IF_ERROR(Project(w_->lm_head, xh, head_logits_, ActDType::kF32, n, nullptr, "lm head"));
  }
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
// host) as a replayed CUDA graph; Unavailable when the step does not qualify. A step holding the
// traced position (MOESHARD_TRACE_POSITION) runs eagerly: a graph's updates are not traced.
absl::Status GpuModelRunner::LaunchGraph(const std::vector<SeqChunk>& batch, float** device_logits) {
  if (!graphs_.enabled() || prof_.enabled() || trace_row_ >= 0 || max_chunk_tokens_ != 1 || R_ > logit_rows_ ||
      T_ > 256 || !shard_.first_stage || !shard_.last_stage || (shard_.tp_size > 1 && !comm_->device_memory())) {
    return absl::UnavailableError("not a graph step");
  }
  RETURN_IF_ERROR(graphs_.Launch(T_ * 2 + (fused_decode_ ? 1 : 0), stream_, [&]() -> absl::Status {
    RETURN_IF_ERROR(EmbedDevice());
    RETURN_IF_ERROR(LayersDevice());
    return HeadRows(0, R_);
  }));
  // The graph wrote the logits where HeadRows' allocations land for this T (a replay runs no
  // host code, so take the same allocations again to find them).
  arena_.Release(step_mark_);
  Act(logit_rows_ * config_.hidden_size);
  *device_logits = F32(logit_rows_ * config_.vocab_size);
  return arena_error_;
}

absl::Status GpuModelRunner::ForwardGraph(const std::vector<SeqChunk>& batch, std::vector<float>* logits) {
  float* lg = nullptr;
  RETURN_IF_ERROR(LaunchGraph(batch, &lg));
  const int64_t V = config_.vocab_size;
  logits->resize(R_ * V);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), lg, R_ * V * 4, cudaMemcpyDeviceToHost, stream_));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status GpuModelRunner::ForwardArgMax(const std::vector<SeqChunk>& batch, std::vector<int32_t>* ids) {
  RETURN_IF_ERROR(ValidateBatch(batch));
  RETURN_IF_ERROR(Prepare(batch));
  if (!w_->embed.valid() || !shard_.last_stage) {
    return absl::FailedPreconditionError("Forward needs a shard with the embedding and the LM head");
  }
  if (R_ > logit_rows_) return ModelRunner::ForwardArgMax(batch, ids);  // logits in several chunks
  float* lg = nullptr;
  absl::Status g = LaunchGraph(batch, &lg);
  if (absl::IsUnavailable(g)) {
    RETURN_IF_ERROR(EmbedDevice());
    RETURN_IF_ERROR(LayersDevice());
    RETURN_IF_ERROR(HeadRows(0, R_));
    lg = head_logits_;
  } else if (!g.ok()) {
    return g;
  }
  gpu::ArgMaxParams a;
  a.logits = lg;
  a.rows = R_;
  a.vocab = config_.vocab_size;
  uint8_t* scratch = static_cast<uint8_t*>(Take(gpu::ArgMaxBytes(R_) + 4 * R_));
  RETURN_IF_ERROR(arena_error_);
  a.partial_value = reinterpret_cast<float*>(scratch);
  a.partial_index = reinterpret_cast<int64_t*>(scratch + R_ * gpu::kArgMaxSplits * sizeof(float));
  a.out = reinterpret_cast<int32_t*>(scratch + gpu::ArgMaxBytes(R_));
  RETURN_IF_ERROR(gpu::ArgMax(a, stream_));
  int32_t* host = reinterpret_cast<int32_t*>(stage_);  // pinned
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, a.out, R_ * 4, cudaMemcpyDeviceToHost, stream_));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  prof_.Collect();
  ids->assign(host, host + R_);
  return absl::OkStatus();
}

}  // namespace moeshard::gpu_runner
