#include "worker/cpu_model_runner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ops.h"

namespace moeshard {
namespace {

void Residual(const ModelConfig& c, const std::vector<float>& out_norm, const std::vector<float>& alpha,
              const std::vector<float>& beta, std::vector<float>& out, std::vector<float>& s, int64_t T) {
  const int64_t H = c.hidden_size;
  if (!c.gated_residual) {
    for (size_t i = 0; i < s.size(); ++i) s[i] += out[i];
    return;
  }
  // s = alpha ⊙ s + beta ⊙ (rmsnorm(out) * out_norm)
  RmsNorm(out.data(), T, H, out_norm.data(), c.rms_eps, out.data());
  for (int64_t t = 0; t < T; ++t) {
    float* st = s.data() + t * H;
    const float* ot = out.data() + t * H;
    for (int64_t i = 0; i < H; ++i) st[i] = alpha[i] * st[i] + beta[i] * ot[i];
  }
}

void AddBias(std::vector<float>& y, const std::vector<float>& b) {
  if (b.empty()) return;
  for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
}

inline float Silu(float x) { return x / (1.f + std::exp(-x)); }

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CpuModelRunner::Create(const ModelConfig& config, const TensorSource& src,
                                                                    const ShardSpec& shard, const RunnerOptions& options,
                                                                    Communicator* tp_comm) {
  std::unique_ptr<CpuModelRunner> r(new CpuModelRunner(config, shard, options, tp_comm));
  ASSIGN_OR_RETURN(r->w_, LoadModelWeights(config, src, shard));
  r->kv_ = std::make_unique<KvCache>(shard.layer_end - shard.layer_begin, options.num_kv_blocks, options.block_size,
                                     r->w_->num_local_kv_heads, config.head_dim);
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

absl::Status CpuModelRunner::AttentionBlock(int64_t li, const std::vector<SeqChunk>& batch, const std::vector<int32_t>& pos,
                                         std::vector<float>& s) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = w_->layers[li];
  const LayerSpec& spec = c.layers[shard_.layer_begin + li];
  const int64_t T = pos.size(), H = c.hidden_size, hd = c.head_dim;
  const int64_t nq = w_->num_local_heads, nkv = w_->num_local_kv_heads;
  std::vector<float> x(T * H), q(T * nq * hd), k(T * nkv * hd), v(T * nkv * hd), o(T * nq * hd), a(T * H);
  RmsNorm(s.data(), T, H, lw.attn_norm.data(), c.rms_eps, x.data());
  MatMul(x.data(), T, lw.q, q.data());
  MatMul(x.data(), T, lw.k, k.data());
  MatMul(x.data(), T, lw.v, v.data());
  AddBias(q, lw.q_bias);
  AddBias(k, lw.k_bias);
  AddBias(v, lw.v_bias);
  if (c.qk_norm) {
    RmsNorm(q.data(), T * nq, hd, lw.q_norm.data(), c.rms_eps, q.data());
    RmsNorm(k.data(), T * nkv, hd, lw.k_norm.data(), c.rms_eps, k.data());
  }
  if (spec.rope) {
    RopeNeox(q.data(), T, nq, hd, pos.data(), c.rope_theta);
    RopeNeox(k.data(), T, nkv, hd, pos.data(), c.rope_theta);
  }
  int64_t t0 = 0;
  for (const SeqChunk& ch : batch) {
    int64_t n = ch.tokens.size();
    RETURN_IF_ERROR(kv_->Write(li, ch.block_table, ch.start_pos, n, k.data() + t0 * nkv * hd, v.data() + t0 * nkv * hd));
    PagedKv kv{kv_->k(li), kv_->v(li), kv_->block_size(), ch.block_table.data()};
    Attention(q.data() + t0 * nq * hd, n, nq, nkv, hd, ch.start_pos, kv, spec.sliding ? c.sliding_window : 0,
              o.data() + t0 * nq * hd);
    t0 += n;
  }
  if (c.attn_output_gate) {
    std::vector<float> g(T * nq);
    MatMul(x.data(), T, lw.head_gate, g.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < nq; ++h) {
        float gate = 1.f / (1.f + std::exp(-g[t * nq + h]));
        float* oh = o.data() + (t * nq + h) * hd;
        for (int64_t d = 0; d < hd; ++d) oh[d] *= gate;
      }
    }
  }
  MatMul(o.data(), T, lw.o, a.data());
  AddBias(a, lw.o_bias);
  RETURN_IF_ERROR(AllReduce(a));
  Residual(c, lw.attn_out_norm, lw.attn_alpha, lw.attn_beta, a, s, T);
  return absl::OkStatus();
}

absl::Status CpuModelRunner::MlpBlock(int64_t li, std::vector<float>& s) {
  const ModelConfig& c = config_;
  const LayerWeights& lw = w_->layers[li];
  const LayerSpec& spec = c.layers[shard_.layer_begin + li];
  const int64_t H = c.hidden_size, T = s.size() / H;
  std::vector<float> y(T * H), f(T * H);
  RmsNorm(s.data(), T, H, lw.moe_norm.data(), c.rms_eps, y.data());
  auto swiglu = [](const ExpertWeights& ew, const float* in, int64_t n, float* out) {
    const int64_t I = ew.gate.rows;
    std::vector<float> g(n * I), u(n * I);
    MatMul(in, n, ew.gate, g.data());
    MatMul(in, n, ew.up, u.data());
    for (int64_t i = 0; i < n * I; ++i) g[i] = Silu(g[i]) * u[i];
    MatMul(g.data(), n, ew.down, out);
  };
  if (!spec.moe) {
    swiglu(lw.dense, y.data(), T, f.data());
    RETURN_IF_ERROR(AllReduce(f));
  } else {
    const int64_t E = c.num_experts, K = c.top_k, Lw = c.expert_width();
    std::vector<float> logits(T * E), wts(T * K);
    std::vector<int32_t> ids(T * K);
    MatMul(y.data(), T, lw.router, logits.data());  // fp32 router
    TopKRouting(logits.data(), T, E, K, c.router_softmax_topk_only, c.norm_topk_prob, ids.data(), wts.data());
    std::vector<float> z;
    const float* zin = y.data();
    if (c.latent_size > 0) {
      z.resize(T * Lw);
      MatMul(y.data(), T, lw.latent_in, z.data());
      zin = z.data();
    }
    // Group (token, weight) pairs by local expert; each token's sum runs in expert order.
    std::vector<float> mix(T * Lw, 0.f);
    std::vector<std::vector<std::pair<int32_t, float>>> routed(w_->num_local_experts);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        int64_t e = ids[t * K + j] - w_->expert_begin;
        if (e >= 0 && e < w_->num_local_experts) routed[e].push_back({static_cast<int32_t>(t), wts[t * K + j]});
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
      swiglu(lw.experts[e], xin.data(), n, dout.data());
      if (c.expert_output_norm) RmsNorm(dout.data(), n, Lw, nullptr, c.rms_eps, dout.data());
      for (int64_t i = 0; i < n; ++i) {
        float* m = mix.data() + r[i].first * Lw;
        const float* d = dout.data() + i * Lw;
        for (int64_t l = 0; l < Lw; ++l) m[l] += r[i].second * d[l];
      }
    }
    RETURN_IF_ERROR(AllReduce(mix));  // one Lw-wide fp32 partial per token
    if (c.latent_size > 0) {
      MatMul(mix.data(), T, lw.latent_out, f.data());
    } else {
      f.swap(mix);
    }
  }
  Residual(c, lw.moe_out_norm, lw.moe_alpha, lw.moe_beta, f, s, T);
  return absl::OkStatus();
}

absl::Status CpuModelRunner::RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) {
  std::vector<int32_t> pos;
  for (auto& c : batch) {
    for (size_t i = 0; i < c.tokens.size(); ++i) pos.push_back(static_cast<int32_t>(c.start_pos + i));
  }
  if (hidden->size() != pos.size() * config_.hidden_size) {
    return absl::InvalidArgumentError("hidden state size does not match the batch");
  }
  for (int64_t li = 0; li < shard_.layer_end - shard_.layer_begin; ++li) {
    RETURN_IF_ERROR(AttentionBlock(li, batch, pos, *hidden));
    RETURN_IF_ERROR(MlpBlock(li, *hidden));
  }
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
