#include "common/model/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/gguf.h"
#include "common/mapped_file.h"
#include "common/status.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

absl::Status KeyError(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: key '", key, "' ", what));
}

absl::StatusOr<int64_t> GetIntKey(const json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return KeyError(key, "is missing");
  if (!it->is_number_integer()) return KeyError(key, "must be an integer");
  return it->get<int64_t>();
}

absl::StatusOr<int64_t> GetIntKeyOr(const json& j, const std::string& key, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) return KeyError(key, "must be an integer");
  return it->get<int64_t>();
}

absl::StatusOr<double> GetNumKeyOr(const json& j, const std::string& key, double dflt, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return KeyError(key, "is missing");
    return dflt;
  }
  if (!it->is_number()) return KeyError(key, "must be a number");
  return it->get<double>();
}

absl::StatusOr<bool> GetBoolKeyOr(const json& j, const std::string& key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return KeyError(key, "must be true or false");
  return it->get<bool>();
}

// Either key of a (classic, newer) pair; both present and different is an error.
absl::StatusOr<int64_t> GetEitherInt(const json& j, const std::string& a, const std::string& b) {
  bool ha = j.contains(a) && !j[a].is_null(), hb = j.contains(b) && !j[b].is_null();
  if (!ha && !hb) return KeyError(a, absl::StrCat("is missing (nor is '", b, "' given)"));
  int64_t va = 0, vb = 0;
  if (ha) { ASSIGN_OR_RETURN(va, GetIntKey(j, a)); }
  if (hb) { ASSIGN_OR_RETURN(vb, GetIntKey(j, b)); }
  if (ha && hb && va != vb) return KeyError(a, absl::StrCat("= ", va, " disagrees with '", b, "' = ", vb));
  return ha ? va : vb;
}

absl::StatusOr<double> RopeTheta(const json& j) {
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && !rp->is_null()) {
    if (!rp->is_object()) return KeyError("rope_parameters", "must be an object");
    auto type = rp->find("rope_type");
    if (type != rp->end() && type->is_string() && *type != "default") {
      return KeyError("rope_parameters.rope_type", absl::StrCat("'", type->get<std::string>(), "' is not supported"));
    }
    auto theta = rp->find("rope_theta");
    if (theta == rp->end() || !theta->is_number()) return KeyError("rope_parameters.rope_theta", "must be a number");
    return theta->get<double>();
  }
  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    return KeyError("rope_scaling", "is set; only unscaled RoPE is supported");
  }
  return GetNumKeyOr(j, "rope_theta", 10000.0, true);
}

absl::Status Validate(ModelConfig& c) {
  auto need_pos = [](int64_t v, const char* key) -> absl::Status {
    if (v <= 0) return KeyError(key, absl::StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(need_pos(c.vocab_size, "vocab_size"));
  RETURN_IF_ERROR(need_pos(c.hidden_size, "hidden_size"));
  RETURN_IF_ERROR(need_pos(c.num_layers, "num_hidden_layers"));
  RETURN_IF_ERROR(need_pos(c.num_heads, "num_attention_heads"));
  RETURN_IF_ERROR(need_pos(c.num_kv_heads, "num_key_value_heads"));
  RETURN_IF_ERROR(need_pos(c.head_dim, "head_dim"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return KeyError("num_key_value_heads", absl::StrCat("= ", c.num_kv_heads, " must divide num_attention_heads = ", c.num_heads));
  }
  if (c.head_dim % 2 != 0) return KeyError("head_dim", "must be even (RoPE rotates halves)");
  if (c.num_layers > 100000 || c.vocab_size > (1 << 24) || c.hidden_size > (1 << 20) ||
      c.num_heads > 4096 || c.head_dim > 4096) {
    return absl::InvalidArgumentError("config.json: a size is implausibly large");
  }
  bool any_moe = false;
  for (auto& l : c.layers) any_moe |= l.moe;
  if (any_moe) {
    RETURN_IF_ERROR(need_pos(c.num_experts, "num_experts"));
    RETURN_IF_ERROR(need_pos(c.top_k, "num_experts_per_tok"));
    RETURN_IF_ERROR(need_pos(c.expert_intermediate, c.arch == Arch::kMuseSpark ? "expert_intermediate_size" : "moe_intermediate_size"));
    if (c.top_k > c.num_experts) {
      return KeyError("num_experts_per_tok", absl::StrCat("= ", c.top_k, " exceeds num_experts = ", c.num_experts));
    }
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) return KeyError("rope_theta", "must be positive");
  if (!(c.rms_eps > 0)) return KeyError("rms_norm_eps", "must be positive");
  if (c.sliding_window < 0) return KeyError("sliding_window", "must not be negative");
  for (auto& l : c.layers) {
    if (l.sliding && c.sliding_window <= 0) return KeyError("sliding_window", "is needed by a sliding layer");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseQwen3(const json& j) {
  ModelConfig c;
  c.arch = Arch::kQwen3Moe;
  c.model_type = "qwen3_moe";
  ASSIGN_OR_RETURN(c.vocab_size, GetIntKey(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, GetIntKey(j, "hidden_size"));
  ASSIGN_OR_RETURN(c.num_layers, GetIntKey(j, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_heads, GetIntKey(j, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_kv_heads, GetIntKeyOr(j, "num_key_value_heads", c.num_heads));
  if (c.num_heads <= 0) return KeyError("num_attention_heads", "must be positive");
  ASSIGN_OR_RETURN(c.head_dim, GetIntKeyOr(j, "head_dim", c.hidden_size / c.num_heads));
  ASSIGN_OR_RETURN(c.rope_theta, RopeTheta(j));
  ASSIGN_OR_RETURN(double eps, GetNumKeyOr(j, "rms_norm_eps", 1e-6, false));
  c.rms_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetIntKeyOr(j, "max_position_embeddings", 32768));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBoolKeyOr(j, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.attention_bias, GetBoolKeyOr(j, "attention_bias", false));
  ASSIGN_OR_RETURN(c.num_experts, GetEitherInt(j, "num_experts", "num_local_experts"));
  ASSIGN_OR_RETURN(c.top_k, GetIntKey(j, "num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.expert_intermediate, GetIntKey(j, "moe_intermediate_size"));
  ASSIGN_OR_RETURN(c.dense_intermediate, GetIntKeyOr(j, "intermediate_size", 0));
  ASSIGN_OR_RETURN(c.norm_topk_prob, GetBoolKeyOr(j, "norm_topk_prob", false));
  ASSIGN_OR_RETURN(int64_t sparse_step, GetIntKeyOr(j, "decoder_sparse_step", 1));
  if (sparse_step <= 0) return KeyError("decoder_sparse_step", "must be positive");
  std::vector<int64_t> mlp_only;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    if (!j["mlp_only_layers"].is_array()) return KeyError("mlp_only_layers", "must be a list of layer indices");
    for (auto& v : j["mlp_only_layers"]) {
      if (!v.is_number_integer()) return KeyError("mlp_only_layers", "must be a list of layer indices");
      mlp_only.push_back(v.get<int64_t>());
    }
  }
  ASSIGN_OR_RETURN(bool use_sliding, GetBoolKeyOr(j, "use_sliding_window", false));
  ASSIGN_OR_RETURN(int64_t window, GetIntKeyOr(j, "sliding_window", 0));
  ASSIGN_OR_RETURN(int64_t max_window_layers, GetIntKeyOr(j, "max_window_layers", c.num_layers));
  c.qk_norm = true;
  c.layers.resize(c.num_layers > 0 && c.num_layers < 100000 ? c.num_layers : 0);
  std::vector<std::string> layer_types;
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (auto& v : j["layer_types"]) {
      if (!v.is_string()) return KeyError("layer_types", "must be a list of strings");
      layer_types.push_back(v.get<std::string>());
    }
    if (static_cast<int64_t>(layer_types.size()) != c.num_layers) {
      return KeyError("layer_types", absl::StrCat("has ", layer_types.size(), " entries for ", c.num_layers, " layers"));
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(c.layers.size()); ++i) {
    auto& l = c.layers[i];
    bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() ||
                 (i + 1) % sparse_step != 0 || c.num_experts == 0;
    l.moe = !dense;
    if (!layer_types.empty()) {
      if (layer_types[i] != "sliding_attention" && layer_types[i] != "full_attention") {
        return KeyError("layer_types", absl::StrCat("entry ", i, " '", layer_types[i], "' is unknown"));
      }
      l.sliding = layer_types[i] == "sliding_attention";
    } else {
      l.sliding = use_sliding && window > 0 && i >= max_window_layers;
    }
    l.rope = true;
  }
  for (int64_t idx : mlp_only) {
    if (idx < 0 || idx >= c.num_layers) return KeyError("mlp_only_layers", absl::StrCat("names layer ", idx, " of ", c.num_layers));
  }
  bool any_sliding = false;
  for (auto& l : c.layers) any_sliding |= l.sliding;
  c.sliding_window = any_sliding ? window : 0;
  for (auto& l : c.layers) {
    if (!l.moe && c.dense_intermediate <= 0) return KeyError("intermediate_size", "is needed by dense MLP layers");
  }
  return c;
}

absl::StatusOr<ModelConfig> ParseMuse(const json& j) {
  ModelConfig c;
  c.arch = Arch::kMuseSpark;
  c.model_type = "muse_spark";
  ASSIGN_OR_RETURN(c.vocab_size, GetIntKey(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, GetIntKey(j, "hidden_size"));
  ASSIGN_OR_RETURN(c.num_layers, GetIntKey(j, "num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_heads, GetIntKey(j, "num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_kv_heads, GetIntKey(j, "num_key_value_heads"));
  ASSIGN_OR_RETURN(c.head_dim, GetIntKey(j, "head_dim"));
  ASSIGN_OR_RETURN(c.sliding_window, GetIntKey(j, "sliding_window"));
  ASSIGN_OR_RETURN(c.rope_theta, RopeTheta(j));
  ASSIGN_OR_RETURN(double eps, GetNumKeyOr(j, "rms_norm_eps", 0, true));
  c.rms_eps = static_cast<float>(eps);
  ASSIGN_OR_RETURN(c.num_experts, GetEitherInt(j, "num_experts", "num_local_experts"));
  ASSIGN_OR_RETURN(c.top_k, GetIntKey(j, "num_experts_per_tok"));
  ASSIGN_OR_RETURN(c.latent_size, GetIntKey(j, "moe_latent_size"));
  ASSIGN_OR_RETURN(c.expert_intermediate, GetIntKey(j, "expert_intermediate_size"));
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetIntKeyOr(j, "max_position_embeddings", 1 << 20));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBoolKeyOr(j, "tie_word_embeddings", false));
  if (c.latent_size <= 0) return KeyError("moe_latent_size", "must be positive");
  c.norm_topk_prob = true;
  c.attn_output_gate = true;
  c.gated_residual = true;
  c.router_softmax_topk_only = true;
  c.expert_output_norm = true;
  if (c.num_layers <= 0 || c.num_layers > 100000) return KeyError("num_hidden_layers", "must be positive");
  c.layers.resize(c.num_layers);
  auto lt = j.find("layer_types");
  if (lt == j.end() || lt->is_null()) {
    for (int64_t i = 0; i < c.num_layers; ++i) c.layers[i].sliding = (i % 4 != 1);
  } else {
    if (!lt->is_array()) return KeyError("layer_types", "must be a list");
    if (static_cast<int64_t>(lt->size()) != c.num_layers) {
      return KeyError("layer_types", absl::StrCat("has ", lt->size(), " entries for ", c.num_layers, " layers"));
    }
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const auto& v = (*lt)[i];
      if (!v.is_string() || (v != "sliding_attention" && v != "full_attention")) {
        return KeyError("layer_types", absl::StrCat("entry ", i, " must be \"sliding_attention\" or \"full_attention\""));
      }
      c.layers[i].sliding = v == "sliding_attention";
    }
  }
  for (auto& l : c.layers) {
    l.rope = l.sliding;  // RoPE on sliding layers only; full layers use no position encoding
    l.moe = true;
  }
  auto q = j.find("quantization_config");
  if (q != j.end() && !q->is_null()) {
    if (!q->is_object() || !q->contains("quant_method") || !(*q)["quant_method"].is_string()) {
      return KeyError("quantization_config.quant_method", "is missing");
    }
    std::string m = (*q)["quant_method"];
    if (m != "nvfp4") return KeyError("quantization_config.quant_method", absl::StrCat("'", m, "' is not supported (nvfp4 is)"));
    ASSIGN_OR_RETURN(int64_t gs, GetIntKeyOr(*q, "group_size", 16));
    if (gs != 16) return KeyError("quantization_config.group_size", "must be 16 for nvfp4");
    c.nvfp4_experts = true;
  }
  return c;
}

void ReadEos(const json& j, ModelConfig& c) {
  auto e = j.find("eos_token_id");
  if (e != j.end()) {
    if (e->is_number_integer()) c.eos_token_ids.push_back(e->get<int32_t>());
    if (e->is_array()) {
      for (auto& v : *e) {
        if (v.is_number_integer()) c.eos_token_ids.push_back(v.get<int32_t>());
      }
    }
  }
  auto b = j.find("bos_token_id");
  if (b != j.end() && b->is_number_integer()) c.bos_token_id = b->get<int32_t>();
}

}  // namespace

std::string ModelConfig::Fingerprint() const {
  return absl::StrCat(model_type, ":V", vocab_size, ":H", hidden_size, ":N", num_layers, ":q", num_heads,
                      ":kv", num_kv_heads, ":hd", head_dim, ":E", num_experts, ":k", top_k, ":I",
                      expert_intermediate, ":L", latent_size, nvfp4_experts ? ":nvfp4" : "");
}

absl::StatusOr<ModelConfig> ParseHfConfig(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: must be a JSON object");
  std::string type;
  if (j.contains("model_type") && j["model_type"].is_string()) type = j["model_type"];
  if (type.empty() && j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string()) {
    std::string a = j["architectures"][0];
    if (a == "Qwen3MoeForCausalLM") type = "qwen3_moe";
    if (a == "MuseSparkForCausalLM") type = "muse_spark";
  }
  if (type.empty()) return KeyError("model_type", "is missing");
  absl::StatusOr<ModelConfig> c;
  if (type == "qwen3_moe") {
    c = ParseQwen3(j);
  } else if (type == "muse_spark") {
    c = ParseMuse(j);
  } else {
    return KeyError("model_type", absl::StrCat("'", type, "' is not a supported architecture (qwen3_moe, muse_spark)"));
  }
  if (!c.ok()) return c.status();
  ReadEos(j, *c);
  RETURN_IF_ERROR(Validate(*c));
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  auto c = ParseHfConfig(j);
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& g) {
  ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  if (arch != "qwen3moe") {
    return absl::InvalidArgumentError(absl::StrCat("gguf: general.architecture '", arch, "' is not supported (qwen3moe is)"));
  }
  json j;
  j["model_type"] = "qwen3_moe";
  auto p = [&](const char* k) { return absl::StrCat(arch, ".", k); };
  ASSIGN_OR_RETURN(int64_t n_layers, g.GetInt(p("block_count")));
  ASSIGN_OR_RETURN(int64_t hidden, g.GetInt(p("embedding_length")));
  ASSIGN_OR_RETURN(int64_t heads, g.GetInt(p("attention.head_count")));
  ASSIGN_OR_RETURN(int64_t kv, g.GetInt(p("attention.head_count_kv")));
  ASSIGN_OR_RETURN(int64_t experts, g.GetInt(p("expert_count")));
  ASSIGN_OR_RETURN(int64_t used, g.GetInt(p("expert_used_count")));
  ASSIGN_OR_RETURN(int64_t eff, g.GetInt(p("expert_feed_forward_length")));
  ASSIGN_OR_RETURN(double eps, g.GetFloat(p("attention.layer_norm_rms_epsilon")));
  j["num_hidden_layers"] = n_layers;
  j["hidden_size"] = hidden;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv;
  j["num_experts"] = experts;
  j["num_experts_per_tok"] = used;
  j["moe_intermediate_size"] = eff;
  j["rms_norm_eps"] = eps;
  // Optional keys: absent takes the default; present with the wrong type is an error that
  // names the key (never a crash on a malformed file).
  auto opt_int = [&](const std::string& key, int64_t dflt) { return g.Has(key) ? g.GetInt(key) : absl::StatusOr<int64_t>(dflt); };
  ASSIGN_OR_RETURN(int64_t head_dim, opt_int(p("attention.key_length"), hidden / std::max<int64_t>(heads, 1)));
  ASSIGN_OR_RETURN(double theta, g.Has(p("rope.freq_base")) ? g.GetFloat(p("rope.freq_base")) : absl::StatusOr<double>(10000.0));
  ASSIGN_OR_RETURN(int64_t ctx, opt_int(p("context_length"), 32768));
  ASSIGN_OR_RETURN(int64_t ffn, opt_int(p("feed_forward_length"), 0));
  // llama.cpp always renormalizes qwen3moe's top-k weights unless told otherwise.
  ASSIGN_OR_RETURN(bool norm_w, g.Has(p("expert_weights_norm")) ? g.GetBool(p("expert_weights_norm")) : absl::StatusOr<bool>(true));
  j["head_dim"] = head_dim;
  j["rope_theta"] = theta;
  j["max_position_embeddings"] = ctx;
  if (ffn > 0) j["intermediate_size"] = ffn;
  j["norm_topk_prob"] = norm_w;
  j["tie_word_embeddings"] = g.Find("output.weight") == nullptr;
  ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, g.GetStringArray("tokenizer.ggml.tokens"));
  j["vocab_size"] = static_cast<int64_t>(tokens->size());
  ASSIGN_OR_RETURN(int64_t eos, opt_int("tokenizer.ggml.eos_token_id", -1));
  ASSIGN_OR_RETURN(int64_t bos, opt_int("tokenizer.ggml.bos_token_id", -1));
  if (eos >= 0) j["eos_token_id"] = eos;
  if (bos >= 0) j["bos_token_id"] = bos;
  auto c = ParseHfConfig(j);
  if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat("gguf metadata: ", c.status().message()));
  return c;
}

}  // namespace moeshard
