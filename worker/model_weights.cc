#include "worker/model_weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace moeshard {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

absl::Status Missing(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("tensor '", name, "' is missing from the checkpoint"));
}

absl::Status BadShape(const TensorInfo& t, const std::vector<int64_t>& want) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has shape ", ShapeStr(t.shape),
                                                 ", expected ", ShapeStr(want)));
}

absl::StatusOr<WeightFormat> FormatOf(const TensorInfo& t) {
  switch (t.dtype) {
    case DType::kF32: return WeightFormat::kF32;
    case DType::kBF16: return WeightFormat::kBF16;
    case DType::kF16: return WeightFormat::kF16;
    case DType::kQ8_0: return WeightFormat::kQ8_0;
    case DType::kMXFP4: return WeightFormat::kMXFP4;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has dtype ", DTypeName(t.dtype),
                                                     ", which is not a supported weight format"));
  }
}

// A matrix [rows, cols] (or the e-th of a stack [E, rows, cols] when num_stacked > 0).
absl::StatusOr<WeightRef> Matrix(const TensorSource& src, const std::string& name, int64_t rows, int64_t cols,
                                 int64_t num_stacked = 0, int64_t e = 0) {
  const TensorInfo* t = src.Find(name);
  if (t == nullptr) return Missing(name);
  WeightRef w;
  w.rows = rows;
  w.cols = cols;
  const TensorInfo* scale = src.Find(name + "_scale");
  if (t->dtype == DType::kU8 && scale != nullptr) {  // NVFP4 triplet
    if (num_stacked > 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': stacked NVFP4 experts are not supported"));
    if (cols % 16 != 0) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': NVFP4 needs columns divisible by 16"));
    if (t->shape != std::vector<int64_t>{rows, cols / 2}) return BadShape(*t, {rows, cols / 2});
    if (scale->dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", scale->name, "' must be F8_E4M3, is ", DTypeName(scale->dtype)));
    }
    if (scale->shape != std::vector<int64_t>{rows, cols / 16}) return BadShape(*scale, {rows, cols / 16});
    const TensorInfo* s2 = src.Find(name + "_scale_2");
    if (s2 == nullptr) return Missing(name + "_scale_2");
    if (s2->dtype != DType::kF32 || s2->numel() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", s2->name, "' must be one F32 value"));
    }
    w.format = WeightFormat::kNVFP4;
    w.data = t->data;
    w.row_stride_bytes = cols / 2;
    w.scale = scale->data;
    w.scale_row_stride = cols / 16;
    float s;
    std::memcpy(&s, s2->data, 4);
    w.scale2 = s;
    return w;
  }
  ASSIGN_OR_RETURN(w.format, FormatOf(*t));
  std::vector<int64_t> want = num_stacked > 0 ? std::vector<int64_t>{num_stacked, rows, cols}
                                              : std::vector<int64_t>{rows, cols};
  if (t->shape != want) return BadShape(*t, want);
  if ((w.format == WeightFormat::kQ8_0 || w.format == WeightFormat::kMXFP4) && cols % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': block format needs columns divisible by 32"));
  }
  w.row_stride_bytes = WeightRowBytes(w.format, cols);
  if (static_cast<uint64_t>(w.row_stride_bytes) * rows * std::max<int64_t>(num_stacked, 1) > t->nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' holds fewer bytes than its shape needs"));
  }
  w.data = t->data + e * rows * w.row_stride_bytes;
  return w;
}

absl::StatusOr<std::vector<float>> Vector(const TensorSource& src, const std::string& name, int64_t n,
                                          bool optional = false) {
  const TensorInfo* t = src.Find(name);
  if (t == nullptr) {
    if (optional) return std::vector<float>{};
    return Missing(name);
  }
  if (t->shape != std::vector<int64_t>{n}) return BadShape(*t, {n});
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case DType::kF32: std::memcpy(&v[i], t->data + 4 * i, 4); break;
      case DType::kBF16: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); v[i] = Bf16ToF32(h); break; }
      case DType::kF16: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); v[i] = F16ToF32(h); break; }
      default:
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ", DTypeName(t->dtype),
                                                       "; vectors must be F32, BF16 or F16"));
    }
  }
  return v;
}

// Tensor names of one layout.
struct Names {
  bool gguf = false;
  std::string embed, head, norm;
  std::string L(int64_t i, const char* hf_qwen, const char* hf_muse, const char* gguf_name, Arch a) const {
    if (gguf) return absl::StrCat("blk.", i, ".", gguf_name);
    return absl::StrCat("model.layers.", i, ".", a == Arch::kMuseSpark ? hf_muse : hf_qwen);
  }
};

absl::Status LoadLayer(const ModelConfig& c, const TensorSource& src, const Names& nm, const ShardSpec& sh,
                       int64_t i, const ModelWeights& mw, LayerWeights& lw) {
  const Arch a = c.arch;
  const int64_t H = c.hidden_size, hd = c.head_dim, nq = c.num_heads, nkv = c.num_kv_heads;
  const int64_t nql = mw.num_local_heads, nkvl = mw.num_local_kv_heads, r = sh.tp_rank;
  auto name = [&](const char* q, const char* m, const char* g) { return nm.L(i, q, m, g, a); };

  ASSIGN_OR_RETURN(lw.attn_norm, Vector(src, name("input_layernorm.weight", "attn_norm.weight", "attn_norm.weight"), H));
  ASSIGN_OR_RETURN(WeightRef q, Matrix(src, name("self_attn.q_proj.weight", "self_attn.q_proj.weight", "attn_q.weight"), nq * hd, H));
  ASSIGN_OR_RETURN(WeightRef k, Matrix(src, name("self_attn.k_proj.weight", "self_attn.k_proj.weight", "attn_k.weight"), nkv * hd, H));
  ASSIGN_OR_RETURN(WeightRef v, Matrix(src, name("self_attn.v_proj.weight", "self_attn.v_proj.weight", "attn_v.weight"), nkv * hd, H));
  ASSIGN_OR_RETURN(WeightRef o, Matrix(src, name("self_attn.o_proj.weight", "self_attn.o_proj.weight", "attn_output.weight"), H, nq * hd));
  lw.q = q.RowSlice(r * nql * hd, nql * hd);
  lw.k = k.RowSlice(r * nkvl * hd, nkvl * hd);
  lw.v = v.RowSlice(r * nkvl * hd, nkvl * hd);
  lw.o = o.ColSlice(r * nql * hd, nql * hd);
  if (c.attention_bias) {
    auto slice = [](std::vector<float> b, int64_t off, int64_t n) { return std::vector<float>(b.begin() + off, b.begin() + off + n); };
    ASSIGN_OR_RETURN(auto qb, Vector(src, name("self_attn.q_proj.bias", "self_attn.q_proj.bias", "attn_q.bias"), nq * hd));
    ASSIGN_OR_RETURN(auto kb, Vector(src, name("self_attn.k_proj.bias", "self_attn.k_proj.bias", "attn_k.bias"), nkv * hd));
    ASSIGN_OR_RETURN(auto vb, Vector(src, name("self_attn.v_proj.bias", "self_attn.v_proj.bias", "attn_v.bias"), nkv * hd));
    ASSIGN_OR_RETURN(lw.o_bias, Vector(src, name("self_attn.o_proj.bias", "self_attn.o_proj.bias", "attn_output.bias"), H, true));
    lw.q_bias = slice(qb, r * nql * hd, nql * hd);
    lw.k_bias = slice(kb, r * nkvl * hd, nkvl * hd);
    lw.v_bias = slice(vb, r * nkvl * hd, nkvl * hd);
    if (r != 0) lw.o_bias.clear();  // added once, by rank 0
  }
  if (c.qk_norm) {
    ASSIGN_OR_RETURN(lw.q_norm, Vector(src, name("self_attn.q_norm.weight", "", "attn_q_norm.weight"), hd));
    ASSIGN_OR_RETURN(lw.k_norm, Vector(src, name("self_attn.k_norm.weight", "", "attn_k_norm.weight"), hd));
  }
  if (c.attn_output_gate) {
    ASSIGN_OR_RETURN(WeightRef g, Matrix(src, name("", "self_attn.gate_proj.weight", ""), nq, H));
    lw.head_gate = g.RowSlice(r * nql, nql);
  }
  if (c.gated_residual) {
    ASSIGN_OR_RETURN(lw.attn_out_norm, Vector(src, name("", "attn_out_norm.weight", ""), H));
    ASSIGN_OR_RETURN(lw.attn_alpha, Vector(src, name("", "attn_residual.alpha", ""), H));
    ASSIGN_OR_RETURN(lw.attn_beta, Vector(src, name("", "attn_residual.beta", ""), H));
    ASSIGN_OR_RETURN(lw.moe_out_norm, Vector(src, name("", "moe_out_norm.weight", ""), H));
    ASSIGN_OR_RETURN(lw.moe_alpha, Vector(src, name("", "moe_residual.alpha", ""), H));
    ASSIGN_OR_RETURN(lw.moe_beta, Vector(src, name("", "moe_residual.beta", ""), H));
  }
  ASSIGN_OR_RETURN(lw.moe_norm, Vector(src, name("post_attention_layernorm.weight", "moe_norm.weight", "ffn_norm.weight"), H));

  const int64_t Lw = c.expert_width(), I = c.expert_intermediate, E = c.num_experts;
  if (!c.layers[i].moe) {
    const int64_t Id = c.dense_intermediate, Il = mw.local_dense_intermediate;
    ASSIGN_OR_RETURN(WeightRef g, Matrix(src, name("mlp.gate_proj.weight", "", "ffn_gate.weight"), Id, H));
    ASSIGN_OR_RETURN(WeightRef u, Matrix(src, name("mlp.up_proj.weight", "", "ffn_up.weight"), Id, H));
    ASSIGN_OR_RETURN(WeightRef d, Matrix(src, name("mlp.down_proj.weight", "", "ffn_down.weight"), H, Id));
    lw.dense = {g.RowSlice(r * Il, Il), u.RowSlice(r * Il, Il), d.ColSlice(r * Il, Il)};
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(lw.router, Matrix(src, name("mlp.gate.weight", "mlp.router.weight", "ffn_gate_inp.weight"), E, H));
  if (c.latent_size > 0) {
    ASSIGN_OR_RETURN(lw.latent_in, Matrix(src, name("", "mlp.latent_in.weight", ""), Lw, H));
    ASSIGN_OR_RETURN(lw.latent_out, Matrix(src, name("", "mlp.latent_out.weight", ""), H, Lw));
  }
  lw.experts.resize(mw.num_local_experts);
  for (int64_t j = 0; j < mw.num_local_experts; ++j) {
    int64_t e = mw.expert_begin + j;
    ExpertWeights& ew = lw.experts[j];
    if (nm.gguf) {
      ASSIGN_OR_RETURN(ew.gate, Matrix(src, name("", "", "ffn_gate_exps.weight"), I, Lw, E, e));
      ASSIGN_OR_RETURN(ew.up, Matrix(src, name("", "", "ffn_up_exps.weight"), I, Lw, E, e));
      ASSIGN_OR_RETURN(ew.down, Matrix(src, name("", "", "ffn_down_exps.weight"), Lw, I, E, e));
    } else {
      std::string p = absl::StrCat("model.layers.", i, ".mlp.experts.", e, ".");
      ASSIGN_OR_RETURN(ew.gate, Matrix(src, p + "gate_proj.weight", I, Lw));
      ASSIGN_OR_RETURN(ew.up, Matrix(src, p + "up_proj.weight", I, Lw));
      ASSIGN_OR_RETURN(ew.down, Matrix(src, p + "down_proj.weight", Lw, I));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const ModelConfig& c, const TensorSource& src,
                                                               const ShardSpec& shard) {
  RETURN_IF_ERROR(ValidateShard(c, shard));
  auto mw = std::make_unique<ModelWeights>();
  Names nm;
  nm.gguf = src.Find("token_embd.weight") != nullptr;
  nm.embed = nm.gguf ? "token_embd.weight" : "model.embed_tokens.weight";
  nm.head = nm.gguf ? "output.weight" : "lm_head.weight";
  nm.norm = nm.gguf ? "output_norm.weight" : "model.norm.weight";
  mw->num_local_heads = c.num_heads / shard.tp_size;
  mw->num_local_kv_heads = c.num_kv_heads / shard.tp_size;
  mw->num_local_experts = c.num_experts / shard.tp_size;
  mw->expert_begin = shard.tp_rank * mw->num_local_experts;
  mw->local_dense_intermediate = c.dense_intermediate / shard.tp_size;
  const int64_t V = c.vocab_size, H = c.hidden_size;
  if (shard.first_stage || (shard.last_stage && c.tie_word_embeddings)) {
    ASSIGN_OR_RETURN(mw->embed, Matrix(src, nm.embed, V, H));
  }
  if (shard.last_stage) {
    ASSIGN_OR_RETURN(mw->final_norm, Vector(src, nm.norm, H));
    if (c.tie_word_embeddings) {
      mw->lm_head = mw->embed;
    } else {
      ASSIGN_OR_RETURN(mw->lm_head, Matrix(src, nm.head, V, H));
    }
  }
  mw->layers.resize(shard.layer_end - shard.layer_begin);
  for (int64_t i = shard.layer_begin; i < shard.layer_end; ++i) {
    RETURN_IF_ERROR(LoadLayer(c, src, nm, shard, i, *mw, mw->layers[i - shard.layer_begin]));
  }
  return mw;
}

}  // namespace moeshard
