#include "worker/cpu_model_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ops.h"
#include "worker/model/model.h"

namespace moeshard {
namespace {

void AddBias(std::vector<float>& y, const std::vector<float>& b) {
  if (b.empty()) return;
  for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
}

inline float Silu(float x) { return x / (1.f + std::exp(-x)); }

// out [n, width] = down(silu(gate(in)) ⊙ up(in)).
void SwiGlu(const ExpertWeights& ew, const float* in, int64_t n, float* out) {
  const int64_t I = ew.gate.rows;
  std::vector<float> g(n * I), u(n * I);
  MatMul(in, n, ew.gate, g.data());
  MatMul(in, n, ew.up, u.data());
  for (int64_t i = 0; i < n * I; ++i) g[i] = Silu(g[i]) * u[i];
  MatMul(g.data(), n, ew.down, out);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CpuModelRunner::Create(const ModelConfig& config, const TensorSource& src,
                                                                    const ShardSpec& shard, const RunnerOptions& options,
                                                                    Communicator* tp_comm) {
  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(config, shard, options, tp_comm));
  ASSIGN_OR_RETURN(r->w_, LoadModelWeights(config, src, shard));
  std::vector<bool> in_sliding_pool;
  for (int64_t li = 0; li < shard.layer_end - shard.layer_begin; ++li) in_sliding_pool.push_back(r->InSlidingPool(li));
  r->kv_ = std::make_unique<KvCache>(shard.layer_end - shard.layer_begin, options.num_kv_blocks, options.block_size,
                                     r->w_->num_local_kv_heads, config.head_dim, in_sliding_pool,
                                     options.num_sliding_kv_blocks);
  return std::unique_ptr<ModelRunner>(std::move(r));
}

absl::Status CpuModelRunner::Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) {
  if (!w_->embed.valid()) return absl::FailedPreconditionError("this shard holds no embedding");
  const int64_t H = config_.hidden_size;
  int64_t T = 0;
  for (auto& c : batch) T += c.tokens.size();
  hidden->assign(T * H, 0.f);
  int64_t t = 0;
  for (auto& c : batch) {
    for (int32_t id : c.tokens) DequantRow(w_->embed, id, hidden->data() + (t++) * H);
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::AllReduce(std::vector<float>& v) {
  if (shard_.tp_size <= 1) return absl::OkStatus();
  return comm_->AllReduceSum(v.data(), v.size());
}

absl::Status CpuModelRunner::RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) {
  pos_.clear();
  for (auto& c : batch) {
    for (size_t i = 0; i < c.tokens.size(); ++i) pos_.push_back(static_cast<int32_t>(c.start_pos + i));
  }
  if (hidden->size() != pos_.size() * config_.hidden_size) {
    return absl::InvalidArgumentError("hidden state size does not match the batch");
  }
  batch_ = &batch;
  s_ = hidden;
  trace_row_ = TraceRow(batch);
  absl::Status st = RunLayerSequence(config_, shard_.layer_begin, shard_.layer_end, *this);
  batch_ = nullptr;
  s_ = nullptr;
  return st;
}

absl::Status CpuModelRunner::AttentionInput(int64_t li, const AttentionInputOpts& opts) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = w_->layers[li];
  const int64_t T = this->T(), H = c.hidden_size, hd = c.head_dim;
  const int64_t nq = w_->num_local_heads, nkv = w_->num_local_kv_heads;
  x_.assign(T * H, 0.f);
  q_.assign(T * nq * hd, 0.f);
  k_.assign(T * nkv * hd, 0.f);
  v_.assign(T * nkv * hd, 0.f);
  RmsNorm(s_->data(), T, H, lw.attn_norm.data(), c.rms_eps, x_.data());
  MatMul(x_.data(), T, lw.q, q_.data());
  MatMul(x_.data(), T, lw.k, k_.data());
  MatMul(x_.data(), T, lw.v, v_.data());
  AddBias(q_, lw.q_bias);
  AddBias(k_, lw.k_bias);
  AddBias(v_, lw.v_bias);
  if (opts.qk_norm) {
    RmsNorm(q_.data(), T * nq, hd, lw.q_norm.data(), c.rms_eps, q_.data());
    RmsNorm(k_.data(), T * nkv, hd, lw.k_norm.data(), c.rms_eps, k_.data());
  }
  if (opts.rope) {
    RopeNeox(q_.data(), T, nq, hd, pos_.data(), c.rope_theta);
    RopeNeox(k_.data(), T, nkv, hd, pos_.data(), c.rope_theta);
  }
  return absl::OkStatus();
}

// Chunk by chunk: its K/V into the cache, then its queries over the cache. A sliding layer
// with its own pool goes through the chunk's sliding table; the kernel reads keys from
// p - window + 1 on, so never an entry released (-1) before the window of start_pos.
absl::Status CpuModelRunner::Attention(int64_t li, int64_t window) {
  const bool sliding = InSlidingPool(li);
  const int64_t hd = config_.head_dim, nq = w_->num_local_heads, nkv = w_->num_local_kv_heads;
  o_.assign(T() * nq * hd, 0.f);
  int64_t t0 = 0;
  for (const SeqChunk& ch : *batch_) {
    int64_t n = ch.tokens.size();
    const std::vector<int32_t>& table = sliding ? ch.sliding_table : ch.block_table;
    RETURN_IF_ERROR(kv_->Write(li, table, ch.start_pos, n, k_.data() + t0 * nkv * hd, v_.data() + t0 * nkv * hd));
    PagedKv kv{kv_->k(li), kv_->v(li), kv_->block_size(), table.data()};
    moeshard::Attention(q_.data() + t0 * nq * hd, n, nq, nkv, hd, ch.start_pos, kv, window, o_.data() + t0 * nq * hd);
    t0 += n;
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::OutputGate(int64_t li) {
  const int64_t T = this->T(), hd = config_.head_dim, nq = w_->num_local_heads;
  std::vector<float> g(T * nq);
  MatMul(x_.data(), T, w_->layers[li].head_gate, g.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nq; ++h) {
      float gate = 1.f / (1.f + std::exp(-g[t * nq + h]));
      float* oh = o_.data() + (t * nq + h) * hd;
      for (int64_t d = 0; d < hd; ++d) oh[d] *= gate;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuModelRunner::OutputProjection(int64_t li) {
  const LayerWeights& lw = w_->layers[li];
  a_.assign(T() * config_.hidden_size, 0.f);
  MatMul(o_.data(), T(), lw.o, a_.data());
  AddBias(a_, lw.o_bias);
  return AllReduce(a_);
}

// opts.next is a fusion hint: the CPU runs each block's input norm on its own.
absl::Status CpuModelRunner::Residual(int64_t li, Block block, const ResidualOpts& opts) {
  const LayerWeights& lw = w_->layers[li];
  const bool attn = block == Block::kAttention;
  std::vector<float>& out = attn ? a_ : f_;
  std::vector<float>& s = *s_;
  const int64_t T = this->T(), H = config_.hidden_size;
  if (!opts.gated) {
    for (size_t i = 0; i < s.size(); ++i) s[i] += out[i];
  } else {
    // s = alpha ⊙ s + beta ⊙ (rmsnorm(out) * out_norm)
    const std::vector<float>& alpha = attn ? lw.attn_alpha : lw.moe_alpha;
    const std::vector<float>& beta = attn ? lw.attn_beta : lw.moe_beta;
    RmsNorm(out.data(), T, H, (attn ? lw.attn_out_norm : lw.moe_out_norm).data(), config_.rms_eps, out.data());
    for (int64_t t = 0; t < T; ++t) {
      float* st = s.data() + t * H;
      const float* ot = out.data() + t * H;
      for (int64_t i = 0; i < H; ++i) st[i] = alpha[i] * st[i] + beta[i] * ot[i];
    }
  }
  if (trace_row_ >= 0 && trace_sink_) {
    trace_sink_({trace_position_, shard_.layer_begin + li, block,
                 std::vector<float>(s.begin() + trace_row_ * H, s.begin() + (trace_row_ + 1) * H), {}, {}});
  }
  return absl::OkStatus();
}

// y is float32 already: opts.f32_copy changes nothing here.
absl::Status CpuModelRunner::MlpInput(int64_t li, const MlpInputOpts& opts) {
  const int64_t T = this->T(), H = config_.hidden_size;
  y_.assign(T * H, 0.f);
  f_.assign(T * H, 0.f);
  RmsNorm(s_->data(), T, H, w_->layers[li].moe_norm.data(), config_.rms_eps, y_.data());
  return absl::OkStatus();
}

absl::Status CpuModelRunner::DenseMlp(int64_t li) {
  SwiGlu(w_->layers[li].dense, y_.data(), T(), f_.data());
  return AllReduce(f_);
}

absl::Status CpuModelRunner::Route(int64_t li, const RouteOpts& opts) {
  const int64_t T = this->T(), E = config_.num_experts, K = config_.top_k;
  std::vector<float> logits(T * E);
  wts_.assign(T * K, 0.f);
  ids_.assign(T * K, 0);
  MatMul(y_.data(), T, w_->layers[li].router, logits.data());  // fp32 router
  if (router_hook_) router_hook_(shard_.layer_begin + li, pos_, E, logits.data());
  TopKRouting(logits.data(), T, E, K, opts.softmax_topk_only, opts.renormalize, ids_.data(), wts_.data());
  latent_ = opts.latent;
  return absl::OkStatus();
}

absl::Status CpuModelRunner::LatentIn(int64_t li) {
  z_.assign(T() * config_.expert_width(), 0.f);
  MatMul(y_.data(), T(), w_->layers[li].latent_in, z_.data());
  return absl::OkStatus();
}

// Groups (token, weight) pairs by local expert; each token's sum runs in expert order.
absl::Status CpuModelRunner::Experts(int64_t li, const ExpertsOpts& opts) {
  const LayerWeights& lw = w_->layers[li];
  const int64_t T = this->T(), K = config_.top_k, Lw = config_.expert_width();
  if (latent_ && static_cast<int64_t>(z_.size()) != T * Lw) {
    return absl::FailedPreconditionError("Experts at latent width without LatentIn");
  }
  const float* zin = latent_ ? z_.data() : y_.data();
  mix_.assign(T * Lw, 0.f);
  std::vector<std::vector<std::pair<int32_t, float>>> routed(w_->num_local_experts);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = ids_[t * K + j] - w_->expert_begin;
      if (e >= 0 && e < w_->num_local_experts) routed[e].push_back({static_cast<int32_t>(t), wts_[t * K + j]});
    }
  }
  std::vector<float> xin, dout;
  for (int64_t e = 0; e < w_->num_local_experts; ++e) {
    const auto& r = routed[e];
    if (r.empty()) continue;
    const int64_t n = r.size();
    xin.resize(n * Lw);
    dout.resize(n * Lw);
    for (int64_t i = 0; i < n; ++i) std::copy_n(zin + r[i].first * Lw, Lw, xin.data() + i * Lw);
    SwiGlu(lw.experts[e], xin.data(), n, dout.data());
    if (opts.output_norm) RmsNorm(dout.data(), n, Lw, nullptr, config_.rms_eps, dout.data());
    for (int64_t i = 0; i < n; ++i) {
      float* m = mix_.data() + r[i].first * Lw;
      const float* d = dout.data() + i * Lw;
      for (int64_t l = 0; l < Lw; ++l) m[l] += r[i].second * d[l];
    }
  }
  RETURN_IF_ERROR(AllReduce(mix_));  // one Lw-wide fp32 partial per token
  if (!latent_) f_.swap(mix_);  // at hidden width, the mix is the block's output
  return absl::OkStatus();
}

absl::Status CpuModelRunner::LatentOut(int64_t li) {
  MatMul(mix_.data(), T(), w_->layers[li].latent_out, f_.data());
  return absl::OkStatus();
}

absl::Status CpuModelRunner::Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                               std::vector<float>* logits) {
  if (!shard_.last_stage) return absl::FailedPreconditionError("this shard holds no LM head");
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  std::vector<float> rows;
  int64_t t0 = 0;
  for (auto& c : batch) {
    int64_t n = c.tokens.size();
    int64_t first = c.all_logits ? 0 : n - 1;
    rows.insert(rows.end(), hidden.begin() + (t0 + first) * H, hidden.begin() + (t0 + n) * H);
    t0 += n;
  }
  int64_t R = rows.size() / H;
  RmsNorm(rows.data(), R, H, w_->final_norm.data(), config_.rms_eps, rows.data());
  logits->assign(R * V, 0.f);
  MatMul(rows.data(), R, w_->lm_head, logits->data());
  return absl::OkStatus();
}

}  // namespace moeshard
