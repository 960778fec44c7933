// Hub-layout random weights -> llama.cpp's qwen3moe GGUF. Metadata follows
// convert_hf_to_gguf.py (Qwen3MoeModel): every integer hyperparameter as u32, floats as f32
// (llama.cpp's loader checks the stored types), general.alignment 32, and the tokenizer
// (see gguf_vocab.h). Experts of one projection are stacked into one [E, rows, cols]
// tensor whose rows are quantized one by one.
#include "eval/random_model_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "eval/gguf_vocab.h"
#include "common/dtype.h"
#include "common/formats/gguf_quant.h"
#include "common/model/model_config.h"
#include "common/splitmix64.h"
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

// F32, F16 (round to nearest even), BF16 (exact here: the source is bf16) or Q8_0 (rows of
// `row` values quantized as ggml does).
std::string EncodePlain(const std::vector<float>& v, GgmlType type, int64_t row) {
  if (type == GgmlType::kF32) return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
  if (type == GgmlType::kQ8_0) {
    std::string b;
    for (size_t r = 0; r < v.size(); r += row) QuantizeRowQ8_0(v.data() + r, row, &b);
    return b;
  }
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


// Checks the arch and types, and reads the tokenizer folder (whose size becomes the vocab).
absl::Status PrepareGguf(const GgufExportOptions& o, RandomModelSpec* spec, GgufVocab* vocab) {
  if (spec->arch != "qwen3_moe") {
    return absl::InvalidArgumentError(absl::StrCat("--format gguf is only for --arch qwen3_moe (llama.cpp has no '",
                                                   spec->arch, "' architecture)"));
  }
  if (o.expert_type != GgmlType::kQ8_0 && o.expert_type != GgmlType::kMXFP4) {
    return absl::InvalidArgumentError("GGUF experts must be Q8_0 or MXFP4");
  }
  if (o.dense_type != GgmlType::kBF16 && o.dense_type != GgmlType::kF16 && o.dense_type != GgmlType::kQ8_0) {
    return absl::InvalidArgumentError("GGUF dense tensors must be BF16, F16 or Q8_0");
  }
  if (!o.tokenizer_dir.empty()) {
    auto it = spec->overrides.find("vocab");
    ASSIGN_OR_RETURN(*vocab, GgufVocabFromDir(o.tokenizer_dir, it == spec->overrides.end() ? 0 : it->second));
    spec->overrides["vocab"] = static_cast<int64_t>(vocab->tokens.size());
  }
  return absl::OkStatus();
}

absl::Status CheckBlockSizes(const ModelConfig& c, const GgufExportOptions& o) {
  if (c.hidden_size % kGgufBlock != 0 || c.expert_intermediate % kGgufBlock != 0 ||
      (o.dense_type == GgmlType::kQ8_0 && (c.num_heads * c.head_dim) % kGgufBlock != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("Q8_0/MXFP4 matrices need --hidden (", c.hidden_size,
                                                   "), --intermediate (", c.expert_intermediate,
                                                   ") and heads x head-dim to be multiples of 32"));
  }
  return absl::OkStatus();
}

// Synthetic weights: SplitMix64 bits per tensor (seeded by the spec's seed and the name).
class Bits {
 public:
  Bits(uint64_t seed, const std::string& name) : rng_(0) {
    uint64_t s = seed * kSplitMix64Gamma;
    for (unsigned char ch : name) s = (s ^ ch) * 0x100000001B3ull;  // FNV-1a over the name
    rng_.set_state(s);
  }
  uint64_t Next() { return rng_.Next(); }
  void Fill(char* p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t v = Next();
      std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
  }
  float Uniform(float a) { return a * static_cast<float>((Next() >> 40) * 0x1p-23 - 1.0); }  // in [-a, a)

 private:
  SplitMix64Rng rng_;
};

// One tensor of a synthetic file: block types get random codes and one block scale that
// gives the values standard deviation `sd`; plain types uniform values of that deviation.
std::string SynthTensor(const GgufTensorPlan& t, const ModelConfig& c, uint64_t seed) {
  Bits bits(seed, t.name);
  uint64_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  const double sH = 1.0 / std::sqrt(static_cast<double>(c.hidden_size));
  double sd = 1.0 / std::sqrt(static_cast<double>(t.shape.back()));
  if (t.name == "token_embd.weight") sd = 1.0;
  if (t.name == "output.weight" || t.name.find("ffn_gate_inp") != std::string::npos) sd = 2.0 * sH;
  const uint64_t blocks = n / kGgufBlock;
  if (t.type == GgmlType::kQ8_0) {  // int8 codes uniform in [-128, 127] have rms 73.9
    std::string b(blocks * kQ8_0BlockBytes, '\0');
    bits.Fill(b.data(), b.size());
    const uint16_t d = F32ToF16(static_cast<float>(sd / 73.9));
    for (uint64_t k = 0; k < blocks; ++k) std::memcpy(&b[k * kQ8_0BlockBytes], &d, 2);
    return b;
  }
  if (t.type == GgmlType::kMXFP4) {  // E2M1 codes uniform over the 16 have rms 2.926
    std::string b(blocks * kMxfp4BlockBytes, '\0');
    bits.Fill(b.data(), b.size());
    const auto e = static_cast<char>(127 + std::lround(std::log2(sd / 2.926)));
    for (uint64_t k = 0; k < blocks; ++k) b[k * kMxfp4BlockBytes] = e;
    return b;
  }
  std::vector<float> v(n);
  const bool norm = t.shape.size() == 1;  // norm weights scatter around one
  const float a = static_cast<float>(std::sqrt(3.0) * (norm ? 0.1 : sd));
  for (float& x : v) x = (norm ? 1.f : 0.f) + bits.Uniform(a);
  return EncodePlain(v, t.type, t.shape.back());
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
  if (s == "q8_0") return GgmlType::kQ8_0;
  return absl::InvalidArgumentError(absl::StrCat("--dense-type '", s, "' (bf16, f16, q8_0)"));
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
  RandomModelSpec spec = spec_in;
  GgufVocab vocab;
  RETURN_IF_ERROR(PrepareGguf(o, &spec, &vocab));
  ASSIGN_OR_RETURN(RandomModel m, MakeRandomModel(spec));
  const ModelConfig& c = m.config;
  RETURN_IF_ERROR(CheckBlockSizes(c, o));
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
      bytes = EncodePlain(v, t.type, t.shape.back());
    }
    RETURN_IF_ERROR(w.AddTensor(t.name, t.type, t.shape, std::move(bytes)));
  }
  return w.Write(out_file);
}

absl::Status WriteSyntheticGguf(const RandomModelSpec& spec_in, const GgufExportOptions& o,
                                const std::string& out_file, int threads) {
  RandomModelSpec spec = spec_in;
  GgufVocab vocab;
  RETURN_IF_ERROR(PrepareGguf(o, &spec, &vocab));
  ASSIGN_OR_RETURN(json hf, RandomModelConfig(spec));
  ASSIGN_OR_RETURN(ModelConfig c, ParseHfConfig(hf));
  RETURN_IF_ERROR(CheckBlockSizes(c, o));
  if (o.tokenizer_dir.empty()) {
    ASSIGN_OR_RETURN(vocab, GgufVocabFromHf(ByteLevelTokenizerJson(c.vocab_size), json(), hf, c.vocab_size));
  }
  GgufWriter w;
  AddModelMetadata(spec, hf, o, &w);
  AddVocabToGguf(vocab, &w);
  const std::vector<GgufTensorPlan> plan = PlanQwen3MoeGguf(c, o);
  for (const GgufTensorPlan& t : plan) RETURN_IF_ERROR(w.AddTensorLayout(t.name, t.type, t.shape));
  return w.WriteStreamed(out_file, threads, [&](size_t i, std::string* bytes) {
    *bytes = SynthTensor(plan[i], c, spec.seed);
    return absl::OkStatus();
  });
}

}  // namespace moeshard
