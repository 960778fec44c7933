// Hub-layout random weights -> llama.cpp's qwen3moe GGUF. Metadata follows
// convert_hf_to_gguf.py (Qwen3MoeModel): every integer hyperparameter as u32, floats as f32
// (llama.cpp's loader checks the stored types), general.alignment 32, and the tokenizer
// (see gguf_vocab.h). Experts of one projection are stacked into one [E, rows, cols]
// tensor whose rows are quantized one by one.
#include "cli/random_model_gguf.h"

#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "cli/gguf_vocab.h"
#include "common/dtype.h"
#include "common/formats/gguf_quant.h"
#include "common/status.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

// llama.cpp's llama_ftype of a file whose experts are `expert_type`.
uint32_t FileType(GgmlType expert_type) {
  constexpr uint32_t kMostlyQ8_0 = 7, kMostlyMxfp4Moe = 38;
  return expert_type == GgmlType::kMXFP4 ? kMostlyMxfp4Moe : kMostlyQ8_0;
}

absl::StatusOr<std::vector<float>> ToFloats(const TensorToWrite& t) {
  const size_t n = t.dtype == DType::kBF16 ? t.bytes.size() / 2 : t.bytes.size() / 4;
  std::vector<float> v(n);
  if (t.dtype == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, &t.bytes[2 * i], 2);
      v[i] = Bf16ToF32(h);
    }
  } else if (t.dtype == DType::kF32) {
    std::memcpy(v.data(), t.bytes.data(), 4 * n);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' is ", DTypeName(t.dtype), ", not BF16/F32"));
  }
  return v;
}

// Plain types: F32, F16 (round to nearest even) or BF16 (exact here: the source is bf16).
std::string EncodePlain(const std::vector<float>& v, GgmlType type) {
  if (type == GgmlType::kF32) return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
  std::string b(2 * v.size(), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = type == GgmlType::kF16 ? F32ToF16(v[i]) : F32ToBf16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

void AddModelMetadata(const RandomModelSpec& spec, const json& hf, const GgufExportOptions& o, GgufWriter* w) {
  const std::string a = "qwen3moe";
  auto u32 = [&](const char* key, const char* hf_key) {
    w->AddU32(absl::StrCat(a, ".", key), hf[hf_key].get<uint32_t>());
  };
  w->AddString("general.architecture", a);
  w->AddString("general.type", "model");
  w->AddString("general.name", absl::StrCat("moeshard-random-", spec.arch, "-", spec.preset));
  w->AddU32("general.file_type", FileType(o.expert_type));
  w->AddU32("general.quantization_version", 2);
  u32("context_length", "max_position_embeddings");
  u32("embedding_length", "hidden_size");
  u32("block_count", "num_hidden_layers");
  u32("feed_forward_length", "intermediate_size");
  u32("attention.head_count", "num_attention_heads");
  u32("attention.head_count_kv", "num_key_value_heads");
  u32("attention.key_length", "head_dim");
  u32("attention.value_length", "head_dim");
  u32("expert_count", "num_experts");
  u32("expert_used_count", "num_experts_per_tok");
  u32("expert_feed_forward_length", "moe_intermediate_size");
  w->AddF32(a + ".rope.freq_base", hf["rope_theta"].get<float>());
  w->AddF32(a + ".attention.layer_norm_rms_epsilon", hf["rms_norm_eps"].get<float>());
}

}  // namespace

absl::StatusOr<GgmlType> ParseExpertType(const std::string& s) {
  if (s == "q8_0") return GgmlType::kQ8_0;
  if (s == "mxfp4") return GgmlType::kMXFP4;
  return absl::InvalidArgumentError(absl::StrCat("--expert-type '", s, "' (q8_0, mxfp4)"));
}

absl::StatusOr<GgmlType> ParseDenseType(const std::string& s) {
  if (s == "bf16") return GgmlType::kBF16;
  if (s == "f16") return GgmlType::kF16;
  return absl::InvalidArgumentError(absl::StrCat("--dense-type '", s, "' (bf16, f16)"));
}

std::vector<GgufTensorPlan> PlanQwen3MoeGguf(const ModelConfig& c, const GgufExportOptions& o) {
  const int64_t V = c.vocab_size, H = c.hidden_size, hd = c.head_dim, E = c.num_experts, I = c.expert_intermediate;
  const GgmlType d = o.dense_type, f = GgmlType::kF32, x = o.expert_type;
  std::vector<GgufTensorPlan> p = {{"token_embd.weight", {V, H}, d, "model.embed_tokens.weight"},
                                   {"output_norm.weight", {H}, f, "model.norm.weight"}};
  if (!c.tie_word_embeddings) p.push_back({"output.weight", {V, H}, d, "lm_head.weight"});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto add = [&](const char* gguf, std::vector<int64_t> shape, GgmlType type, const char* hub) {
      p.push_back({absl::StrCat("blk.", i, ".", gguf, ".weight"), std::move(shape), type,
                   absl::StrCat("model.layers.", i, ".", hub, ".weight")});
    };
    add("attn_norm", {H}, f, "input_layernorm");
    add("attn_q", {c.num_heads * hd, H}, d, "self_attn.q_proj");
    add("attn_k", {c.num_kv_heads * hd, H}, d, "self_attn.k_proj");
    add("attn_v", {c.num_kv_heads * hd, H}, d, "self_attn.v_proj");
    add("attn_output", {H, c.num_heads * hd}, d, "self_attn.o_proj");
    add("attn_q_norm", {hd}, f, "self_attn.q_norm");
    add("attn_k_norm", {hd}, f, "self_attn.k_norm");
    add("ffn_norm", {H}, f, "post_attention_layernorm");
    add("ffn_gate_inp", {E, H}, f, "mlp.gate");
    add("ffn_gate_exps", {E, I, H}, x, "mlp.experts.*.gate_proj");
    add("ffn_up_exps", {E, I, H}, x, "mlp.experts.*.up_proj");
    add("ffn_down_exps", {E, H, I}, x, "mlp.experts.*.down_proj");
  }
  return p;
}

absl::Status WriteRandomGguf(const RandomModelSpec& spec_in, const GgufExportOptions& o, const std::string& out_file) {
  if (spec_in.arch != "qwen3_moe") {
    return absl::InvalidArgumentError(absl::StrCat("--format gguf is only for --arch qwen3_moe (llama.cpp has no '",
                                                   spec_in.arch, "' architecture)"));
  }
  if (o.expert_type != GgmlType::kQ8_0 && o.expert_type != GgmlType::kMXFP4) {
    return absl::InvalidArgumentError("GGUF experts must be Q8_0 or MXFP4");
  }
  if (o.dense_type != GgmlType::kBF16 && o.dense_type != GgmlType::kF16) {
    return absl::InvalidArgumentError("GGUF dense tensors must be BF16 or F16");
  }
  RandomModelSpec spec = spec_in;
  GgufVocab vocab;
  if (!o.tokenizer_dir.empty()) {
    auto it = spec.overrides.find("vocab");
    ASSIGN_OR_RETURN(vocab, GgufVocabFromDir(o.tokenizer_dir, it == spec.overrides.end() ? 0 : it->second));
    spec.overrides["vocab"] = static_cast<int64_t>(vocab.tokens.size());
  }
  ASSIGN_OR_RETURN(RandomModel m, MakeRandomModel(spec));
  const ModelConfig& c = m.config;
  if (c.hidden_size % kGgufBlock != 0 || c.expert_intermediate % kGgufBlock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Q8_0/MXFP4 experts need --hidden (", c.hidden_size,
                                                   ") and --intermediate (", c.expert_intermediate,
                                                   ") to be multiples of 32"));
  }
  if (o.tokenizer_dir.empty()) {
    ASSIGN_OR_RETURN(vocab, GgufVocabFromHf(ByteLevelTokenizerJson(c.vocab_size), json(), m.hf_config, c.vocab_size));
  }

  std::map<std::string, const TensorToWrite*> hub;
  for (const TensorToWrite& t : m.tensors) hub[t.name] = &t;
  auto floats = [&](const std::string& name) -> absl::StatusOr<std::vector<float>> {
    auto it = hub.find(name);
    if (it == hub.end()) return absl::InternalError(absl::StrCat("random model has no tensor ", name));
    return ToFloats(*it->second);
  };

  GgufWriter w;
  AddModelMetadata(spec, m.hf_config, o, &w);
  AddVocabToGguf(vocab, &w);
  for (const GgufTensorPlan& t : PlanQwen3MoeGguf(c, o)) {
    std::string bytes;
    if (const size_t star = t.hub.find('*'); star != std::string::npos) {  // one row-major stack of E experts
      const int64_t rows = t.shape[1], cols = t.shape[2];
      for (int64_t e = 0; e < c.num_experts; ++e) {
        ASSIGN_OR_RETURN(std::vector<float> v, floats(absl::StrCat(t.hub.substr(0, star), e, t.hub.substr(star + 1))));
        for (int64_t r = 0; r < rows; ++r) {
          if (o.expert_type == GgmlType::kQ8_0) {
            QuantizeRowQ8_0(v.data() + r * cols, cols, &bytes);
          } else {
            QuantizeRowMxfp4(v.data() + r * cols, cols, &bytes);
          }
        }
      }
    } else {
      ASSIGN_OR_RETURN(std::vector<float> v, floats(t.hub));
      bytes = EncodePlain(v, t.type);
    }
    RETURN_IF_ERROR(w.AddTensor(t.name, t.type, t.shape, std::move(bytes)));
  }
  return w.Write(out_file);
}

}  // namespace moeshard
