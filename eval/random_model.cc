#include "eval/random_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/formats/safetensors.h"
#include "common/model/model_config.h"
#include "common/splitmix64.h"
#include "common/status.h"
#include "kernels/cpu/quantize.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

// SplitMix64 (common/splitmix64.h) + Box-Muller: fast, deterministic across platforms.
class Rng {
 public:
  explicit Rng(uint64_t s) : bits_(s * kSplitMix64Gamma + 1) {}
  double Uniform() { return ((bits_.Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double Normal() {
    if (have_) { have_ = false; return spare_; }
    double u = Uniform(), v = Uniform(), r = std::sqrt(-2 * std::log(u));
    spare_ = r * std::sin(2 * M_PI * v);
    have_ = true;
    return r * std::cos(2 * M_PI * v);
  }

 private:
  SplitMix64Rng bits_;
  bool have_ = false;
  double spare_ = 0;
};

std::string Bf16Bytes(const std::vector<float>& v) {
  std::string b(v.size() * 2, '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = F32ToBf16(v[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

std::string F32Bytes(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

struct Writer {
  Rng rng;
  std::vector<TensorToWrite> out;
  std::vector<float> Randn(int64_t n, double std) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(rng.Normal() * std);
    return v;
  }
  // Values rounded to bf16 so the stored weights are exactly what any reference would use.
  void Bf16(const std::string& name, std::vector<int64_t> shape, double std) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({name, DType::kBF16, shape, Bf16Bytes(Randn(n, std))});
  }
  void AroundOne(const std::string& name, int64_t n, double spread, double scale = 1.0) {
    auto v = Randn(n, spread);
    for (auto& x : v) x = static_cast<float>(scale * (1.0 + x));
    out.push_back({name, DType::kBF16, {n}, Bf16Bytes(v)});
  }
  void F32(const std::string& name, std::vector<int64_t> shape, double std) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({name, DType::kF32, shape, F32Bytes(Randn(n, std))});
  }
  void Expert(const std::string& name, int64_t rows, int64_t cols, bool nvfp4) {
    if (!nvfp4) return Bf16(name, {rows, cols}, 1.0 / std::sqrt(static_cast<double>(cols)));
    auto w = Randn(rows * cols, 1.0 / std::sqrt(static_cast<double>(cols)));
    for (auto& x : w) x = Bf16ToF32(F32ToBf16(x));
    Nvfp4Matrix q = QuantizeNvfp4(w.data(), rows, cols);
    out.push_back({name, DType::kU8, {rows, cols / 2}, std::string(q.packed.begin(), q.packed.end())});
    out.push_back({name + "_scale", DType::kF8E4M3, {rows, cols / 16}, std::string(q.scale.begin(), q.scale.end())});
    out.push_back({name + "_scale_2", DType::kF32, {}, F32Bytes({q.scale2})});
  }
};

std::vector<int> ByteToUnicode() {
  std::vector<int> m(256, -1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[b] = printable ? b : 256 + n++;
  }
  return m;
}

std::string Utf8(int cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

json ByteLevelTokenizerJson(int64_t vocab_size) {
  auto b2u = ByteToUnicode();
  auto tok = [&](const std::string& bytes) {
    std::string s;
    for (unsigned char c : bytes) s += Utf8(b2u[c]);
    return s;
  };
  json vocab = json::object();
  std::vector<std::string> strings;
  for (int b = 0; b < 256; ++b) {
    strings.push_back(tok(std::string(1, static_cast<char>(b))));
    vocab[strings.back()] = b;
  }
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int64_t num_special = 3;
  // Merges: " " + letter, then frequent English letter pairs and " th", " the".
  std::vector<std::pair<std::string, std::string>> merges;
  for (char c = 'a'; c <= 'z'; ++c) merges.push_back({" ", std::string(1, c)});
  for (const char* p : {"th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
                        "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le", "ve"}) {
    merges.push_back({std::string(1, p[0]), std::string(1, p[1])});
  }
  merges.push_back({" t", "he"});
  json jm = json::array();
  int64_t next = 256;
  for (auto& [a, b] : merges) {
    if (next >= vocab_size - num_special) break;
    std::string ta = tok(a), tb = tok(b);
    if (!vocab.contains(tok(a + b))) vocab[tok(a + b)] = next++;
    jm.push_back(ta + " " + tb);
  }
  json added = json::array();
  int64_t reserved = 0;
  while (next < vocab_size - num_special) {
    std::string content = absl::StrCat("<|reserved_", reserved++, "|>");
    added.push_back({{"id", next}, {"content", content}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
    ++next;
  }
  for (int64_t i = 0; i < num_special; ++i) {
    added.push_back({{"id", next}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
    ++next;
  }
  json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = {{"type", "NFC"}};
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  t["post_processor"] = nullptr;
  t["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  t["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", jm}};
  return t;
}

absl::StatusOr<json> RandomModelConfig(const RandomModelSpec& s) {
  json c;
  auto ov = [&](const char* k, int64_t d) {
    auto it = s.overrides.find(k);
    return it == s.overrides.end() ? d : it->second;
  };
  // full: every layer of the real model (qwen3_moe: Qwen3-30B-A3B); full-layer: one of them.
  const bool whole = s.preset == "full";
  bool tiny = s.preset == "tiny", small = s.preset == "small", full = s.preset == "full-layer" || whole;
  if (!tiny && !small && !full) {
    return absl::InvalidArgumentError(absl::StrCat("unknown preset '", s.preset, "' (tiny, small, full-layer, full)"));
  }
  if (whole && s.arch != "qwen3_moe") return absl::InvalidArgumentError("--preset full is for --arch qwen3_moe");
  if (s.arch == "muse_spark") {
    c["architectures"] = {"MuseSparkForCausalLM"};
    c["model_type"] = "muse_spark";
    c["vocab_size"] = ov("vocab", tiny ? 512 : small ? 2048 : 202048);
    c["hidden_size"] = ov("hidden", tiny ? 128 : small ? 512 : 8192);
    c["num_hidden_layers"] = ov("layers", tiny ? 8 : small ? 8 : 1);
    c["num_attention_heads"] = ov("heads", tiny ? 8 : small ? 8 : 128);
    c["num_key_value_heads"] = ov("kv-heads", tiny ? 2 : small ? 4 : 16);
    c["head_dim"] = ov("head-dim", tiny ? 16 : 64);
    c["sliding_window"] = ov("window", tiny ? 16 : small ? 256 : 2048);
    c["rope_theta"] = tiny ? 10000.0 : 500000.0;
    c["rms_norm_eps"] = 1e-5;
    c["num_experts"] = ov("experts", tiny ? 16 : small ? 32 : 256);
    c["num_experts_per_tok"] = ov("top-k", tiny ? 4 : small ? 4 : 8);
    c["moe_latent_size"] = ov("latent", tiny ? 64 : small ? 256 : 4096);
    c["expert_intermediate_size"] = ov("intermediate", tiny ? 64 : small ? 256 : 4096);
    c["max_position_embeddings"] = 1 << 20;
    c["tie_word_embeddings"] = false;
    c["torch_dtype"] = "bfloat16";
    json lt = json::array();
    for (int64_t i = 0; i < c["num_hidden_layers"].get<int64_t>(); ++i) lt.push_back(i % 4 == 1 ? "full_attention" : "sliding_attention");
    c["layer_types"] = lt;
    if (s.nvfp4) c["quantization_config"] = {{"quant_method", "nvfp4"}, {"group_size", 16}, {"modules", "mlp.experts.*.{gate,up,down}_proj"}};
  } else if (s.arch == "qwen3_moe") {
    if (s.nvfp4) return absl::InvalidArgumentError("--nvfp4 is for muse_spark models");
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    c["vocab_size"] = ov("vocab", tiny ? 512 : small ? 2048 : 151936);
    c["hidden_size"] = ov("hidden", tiny ? 64 : small ? 512 : 2048);
    c["num_hidden_layers"] = ov("layers", tiny ? 4 : small ? 8 : whole ? 48 : 1);
    c["num_attention_heads"] = ov("heads", tiny ? 4 : small ? 8 : 32);
    c["num_key_value_heads"] = ov("kv-heads", tiny ? 2 : small ? 4 : 4);
    c["head_dim"] = ov("head-dim", tiny ? 16 : small ? 64 : 128);
    c["num_experts"] = ov("experts", tiny ? 8 : small ? 32 : 128);
    c["num_experts_per_tok"] = ov("top-k", tiny ? 2 : small ? 4 : 8);
    c["moe_intermediate_size"] = ov("intermediate", tiny ? 32 : small ? 256 : 768);
    c["intermediate_size"] = 4 * c["hidden_size"].get<int64_t>();
    c["norm_topk_prob"] = true;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = json::array();
    c["rope_theta"] = 1000000.0;
    c["rms_norm_eps"] = 1e-6;
    // Qwen3-30B-A3B-Instruct-2507's native context: llama-server caps a slot at the file's
    // context_length, so the long-context comparisons (bench/vs_llamacpp.sh --long) need it.
    c["max_position_embeddings"] = 262144;
    c["tie_word_embeddings"] = false;
    c["torch_dtype"] = "bfloat16";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown --arch '", s.arch, "' (muse_spark, qwen3_moe)"));
  }
  int64_t v = c["vocab_size"];
  c["bos_token_id"] = v - 3;
  c["eos_token_id"] = v - 1;
  if (v < 300) return absl::InvalidArgumentError("--vocab must be at least 300 (256 bytes, merges, special tokens)");
  return c;
}

absl::StatusOr<RandomModel> MakeRandomModel(const RandomModelSpec& s) {
  RandomModel m;
  ASSIGN_OR_RETURN(m.hf_config, RandomModelConfig(s));
  ASSIGN_OR_RETURN(m.config, ParseHfConfig(m.hf_config));
  const ModelConfig& c = m.config;
  Writer w{Rng(s.seed), {}};
  const int64_t V = c.vocab_size, H = c.hidden_size, nq = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  const int64_t E = c.num_experts, I = c.expert_intermediate, Lw = c.expert_width();
  const double sH = 1.0 / std::sqrt(static_cast<double>(H));
  const bool muse = c.arch == Arch::kMuseSpark;
  w.Bf16("model.embed_tokens.weight", {V, H}, muse ? 1.0 : 1.0);
  w.AroundOne("model.norm.weight", H, 0.1);
  w.Bf16("lm_head.weight", {V, H}, 2.0 * sH);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    std::string p = absl::StrCat("model.layers.", i, ".");
    w.AroundOne(p + (muse ? "attn_norm.weight" : "input_layernorm.weight"), H, 0.1);
    w.Bf16(p + "self_attn.q_proj.weight", {nq * hd, H}, sH);
    w.Bf16(p + "self_attn.k_proj.weight", {nkv * hd, H}, sH);
    w.Bf16(p + "self_attn.v_proj.weight", {nkv * hd, H}, sH);
    w.Bf16(p + "self_attn.o_proj.weight", {H, nq * hd}, 1.0 / std::sqrt(static_cast<double>(nq * hd)));
    if (muse) {
      w.Bf16(p + "self_attn.gate_proj.weight", {nq, H}, sH);
      w.AroundOne(p + "attn_out_norm.weight", H, 0.1);
      w.AroundOne(p + "attn_residual.alpha", H, 0.05);
      w.AroundOne(p + "attn_residual.beta", H, 0.2, 0.5);
      w.AroundOne(p + "moe_norm.weight", H, 0.1);
      w.F32(p + "mlp.router.weight", {E, H}, 2.0 * sH);
      w.Bf16(p + "mlp.latent_in.weight", {Lw, H}, sH);
      w.Bf16(p + "mlp.latent_out.weight", {H, Lw}, 1.0 / std::sqrt(static_cast<double>(Lw)));
      w.AroundOne(p + "moe_out_norm.weight", H, 0.1);
      w.AroundOne(p + "moe_residual.alpha", H, 0.05);
      w.AroundOne(p + "moe_residual.beta", H, 0.2, 0.5);
    } else {
      w.AroundOne(p + "self_attn.q_norm.weight", hd, 0.1);
      w.AroundOne(p + "self_attn.k_norm.weight", hd, 0.1);
      w.AroundOne(p + "post_attention_layernorm.weight", H, 0.1);
      w.Bf16(p + "mlp.gate.weight", {E, H}, 2.0 * sH);
    }
    for (int64_t e = 0; e < E; ++e) {
      std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
      w.Expert(ep + "gate_proj.weight", I, Lw, c.nvfp4_experts);
      w.Expert(ep + "up_proj.weight", I, Lw, c.nvfp4_experts);
      w.Expert(ep + "down_proj.weight", Lw, I, c.nvfp4_experts);
    }
  }
  m.tensors = std::move(w.out);
  return m;
}

absl::Status WriteRandomModel(const RandomModelSpec& s, const std::string& out_dir) {
  ASSIGN_OR_RETURN(RandomModel m, MakeRandomModel(s));
  const int64_t V = m.config.vocab_size;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  namespace fs = std::filesystem;
  fs::path d(out_dir);
  RETURN_IF_ERROR(WriteSafetensors((d / "model.safetensors").string(), m.tensors, {{"format", "pt"}}));
  std::ofstream((d / "config.json").string()) << m.hf_config.dump(2) << "\n";
  std::ofstream((d / "tokenizer.json").string()) << ByteLevelTokenizerJson(V).dump(1) << "\n";
  json gen = {{"eos_token_id", {V - 1, V - 3}}, {"bos_token_id", V - 3}};
  std::ofstream((d / "generation_config.json").string()) << gen.dump(2) << "\n";
  return absl::OkStatus();
}

}  // namespace moeshard
