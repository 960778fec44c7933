// `make-model --format gguf` (WriteRandomGguf) for every expert type x dense type:
//  (a) the file is what llama.cpp's qwen3moe loader asks for: tensor names, ne order
//      (innermost first, as create_tensor in llama-model.cpp lists them) and types; metadata
//      keys with the stored GGUF types its loader checks (u32 / f32 / string / arrays);
//      tensor offsets sequential and padded to general.alignment (gguf.cpp's check);
//  (b) every expert row as the engine expands it equals the source row quantized and then
//      expanded with ggml's formulas, bit for bit, and lies within half a quantization step
//      of the source (MXFP4: values past 6 * scale saturate); dense tensors hold the source
//      exactly (BF16, F32) or rounded to nearest (F16), or rows quantized as ggml does (Q8_0);
//  (c) the engine's logits from the GGUF equal, within 1e-4 relative, its logits from a
//      safetensors folder holding the same weights as f32, built here from the source weights.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eval/random_model.h"
#include "eval/random_model_gguf.h"
#include "common/dtype.h"
#include "common/formats/gguf.h"
#include "common/formats/gguf_quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "tests/worker/gguf_test_util.h"
#include "common/model/model_loader.h"

namespace moeshard {
namespace {

struct Case {
  GgmlType experts, dense;
};

class GgufExportTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    spec_.arch = "qwen3_moe";
    spec_.preset = "tiny";
    spec_.seed = 7;
    opts_.expert_type = GetParam().experts;
    opts_.dense_type = GetParam().dense;
    path_ = dir_.Path("m.gguf");
    ASSERT_TRUE(WriteRandomGguf(spec_, opts_, path_).ok());
    auto src = MakeRandomModel(spec_);
    ASSERT_TRUE(src.ok()) << src.status();
    src_ = std::move(*src);
    for (const TensorToWrite& t : src_.tensors) hub_[t.name] = test::SourceFloats(t);
  }

  test::TempDir dir_;
  RandomModelSpec spec_;
  GgufExportOptions opts_;
  std::string path_;
  RandomModel src_;
  std::map<std::string, std::vector<float>> hub_;  // source weights as f32
};

TEST_P(GgufExportTest, LayoutAndMetadataAreLlamaCpps) {
  auto raw = test::ReadGgufHeader(path_);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const ModelConfig& c = src_.config;
  const uint32_t f32 = 0, x = static_cast<uint32_t>(GetParam().experts), d = static_cast<uint32_t>(GetParam().dense);
  const int64_t H = c.hidden_size, V = c.vocab_size, E = c.num_experts, I = c.expert_intermediate, hd = c.head_dim;
  // ne as llama-model.cpp's LLM_ARCH_QWEN3MOE create_tensor calls give them.
  std::map<std::string, std::pair<std::vector<int64_t>, uint32_t>> want = {
      {"token_embd.weight", {{H, V}, d}}, {"output_norm.weight", {{H}, f32}}, {"output.weight", {{H, V}, d}}};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto n = [&](const char* s) { return absl::StrCat("blk.", i, ".", s, ".weight"); };
    want[n("attn_norm")] = {{H}, f32};
    want[n("attn_q")] = {{H, hd * c.num_heads}, d};
    want[n("attn_k")] = {{H, hd * c.num_kv_heads}, d};
    want[n("attn_v")] = {{H, hd * c.num_kv_heads}, d};
    want[n("attn_output")] = {{hd * c.num_heads, H}, d};
    want[n("attn_q_norm")] = {{hd}, f32};
    want[n("attn_k_norm")] = {{hd}, f32};
    want[n("ffn_norm")] = {{H}, f32};
    want[n("ffn_gate_inp")] = {{H, E}, f32};
    want[n("ffn_gate_exps")] = {{H, I, E}, x};
    want[n("ffn_up_exps")] = {{H, I, E}, x};
    want[n("ffn_down_exps")] = {{I, H, E}, x};
  }
  ASSERT_EQ(raw->tensors.size(), want.size());
  uint64_t expect_offset = 0;
  for (const test::RawTensorInfo& t : raw->tensors) {
    auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << "unexpected tensor " << t.name;
    EXPECT_EQ(t.ne, it->second.first) << t.name;
    EXPECT_EQ(t.ggml_type, it->second.second) << t.name;
    EXPECT_EQ(t.offset, expect_offset) << t.name;
    expect_offset += (t.nbytes + 31) / 32 * 32;
  }
  // Metadata: GGUF value types as llama.cpp's loader demands them (4 = u32, 6 = f32, 8 = string).
  const std::string a = "qwen3moe.";
  const std::map<std::string, std::pair<uint32_t, int64_t>> ints = {
      {"general.alignment", {4, 32}},
      {a + "context_length", {4, c.max_position_embeddings}},
      {a + "embedding_length", {4, H}},
      {a + "block_count", {4, c.num_layers}},
      {a + "feed_forward_length", {4, src_.hf_config["intermediate_size"].get<int64_t>()}},
      {a + "attention.head_count", {4, c.num_heads}},
      {a + "attention.head_count_kv", {4, c.num_kv_heads}},
      {a + "attention.key_length", {4, hd}},
      {a + "attention.value_length", {4, hd}},
      {a + "expert_count", {4, E}},
      {a + "expert_used_count", {4, c.top_k}},
      {a + "expert_feed_forward_length", {4, I}},
      {"tokenizer.ggml.bos_token_id", {4, V - 3}},
      {"tokenizer.ggml.eos_token_id", {4, V - 1}}};
  auto g = GgufFile::Open(path_);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const auto& [key, tv] : ints) {
    EXPECT_EQ(raw->kv_types[key], tv.first) << key;
    EXPECT_EQ(*(*g)->GetInt(key), tv.second) << key;
  }
  for (const char* k : {"rope.freq_base", "attention.layer_norm_rms_epsilon"}) EXPECT_EQ(raw->kv_types[a + k], 6u) << k;
  EXPECT_FLOAT_EQ(*(*g)->GetFloat(a + "rope.freq_base"), static_cast<float>(c.rope_theta));
  EXPECT_FLOAT_EQ(*(*g)->GetFloat(a + "attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_eps));
  EXPECT_EQ(*(*g)->GetString("general.architecture"), "qwen3moe");
  EXPECT_TRUE((*g)->GetString("general.name").ok());
  EXPECT_EQ(*(*g)->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*(*g)->GetString("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(raw->kv_types["tokenizer.ggml.tokens"], 9u);
  EXPECT_EQ(raw->array_types["tokenizer.ggml.tokens"], 8u);
  EXPECT_EQ(raw->array_types["tokenizer.ggml.token_type"], 5u);  // i32
  EXPECT_EQ(raw->array_types["tokenizer.ggml.merges"], 8u);
  EXPECT_EQ((*(*g)->GetStringArray("tokenizer.ggml.tokens"))->size(), static_cast<size_t>(V));

  // The engine reads back the same model description.
  auto gc = ConfigFromGguf(**g);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->vocab_size, V);
  EXPECT_EQ(gc->hidden_size, H);
  EXPECT_EQ(gc->num_layers, c.num_layers);
  EXPECT_EQ(gc->num_heads, c.num_heads);
  EXPECT_EQ(gc->num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(gc->head_dim, hd);
  EXPECT_EQ(gc->num_experts, E);
  EXPECT_EQ(gc->top_k, c.top_k);
  EXPECT_EQ(gc->expert_intermediate, I);
  EXPECT_EQ(gc->tie_word_embeddings, false);
  EXPECT_FLOAT_EQ(static_cast<float>(gc->rope_theta), static_cast<float>(c.rope_theta));
}

TEST_P(GgufExportTest, ExpertsAreGgmlQuantizedSourceWeights) {
  auto g = GgufFile::Open(path_);
  ASSERT_TRUE(g.ok()) << g.status();
  const ModelConfig& c = src_.config;
  const bool q8 = GetParam().experts == GgmlType::kQ8_0;
  const int64_t block_bytes = q8 ? kQ8_0BlockBytes : kMxfp4BlockBytes;
  int64_t checked = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (const char* proj : {"gate", "up", "down"}) {
      const TensorInfo* t = (*g)->Find(absl::StrCat("blk.", i, ".ffn_", proj, "_exps.weight"));
      ASSERT_NE(t, nullptr);
      const int64_t rows = t->shape[1], cols = t->shape[2], row_bytes = cols / 32 * block_bytes;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::vector<float>& w =
            hub_[absl::StrCat("model.layers.", i, ".mlp.experts.", e, ".", proj, "_proj.weight")];
        for (int64_t r = 0; r < rows; ++r) {
          const float* src = w.data() + r * cols;
          std::vector<float> want = test::GgmlQuantDequant(src, cols, q8), got(cols);
          const uint8_t* row = t->data + (e * rows + r) * row_bytes;
          for (int64_t b = 0; b < cols / 32; ++b) {
            if (q8)
              DequantQ8_0Block(row + b * block_bytes, got.data() + 32 * b);
            else
              DequantMxfp4Block(row + b * block_bytes, got.data() + 32 * b);
          }
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), 4 * cols)) << t->name << " expert " << e << " row " << r;
          for (int64_t j = 0; j < cols; ++j) {
            ASSERT_LE(std::fabs(got[j] - src[j]), test::HalfStep(src + j / 32 * 32, src[j], q8))
                << t->name << " expert " << e << " row " << r << " col " << j;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, c.num_layers * c.num_experts * (2 * c.expert_intermediate + c.hidden_size));
}

TEST_P(GgufExportTest, DenseTensorsHoldTheSourceWeights) {
  auto g = GgufFile::Open(path_);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const GgufTensorPlan& p : PlanQwen3MoeGguf(src_.config, opts_)) {
    if (p.hub.find('*') != std::string::npos) continue;
    const TensorInfo* t = (*g)->Find(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    const std::vector<float>& w = hub_[p.hub];
    ASSERT_EQ(static_cast<size_t>(t->numel()), w.size()) << p.name;
    if (t->dtype == DType::kQ8_0) {  // rows quantized as ggml does
      const int64_t cols = p.shape.back();
      for (int64_t r = 0; r * cols < static_cast<int64_t>(w.size()); ++r) {
        std::vector<float> want = test::GgmlQuantDequant(w.data() + r * cols, cols, true), got(cols);
        for (int64_t b = 0; b < cols / 32; ++b) {
          DequantQ8_0Block(t->data + (r * cols / 32 + b) * kQ8_0BlockBytes, got.data() + 32 * b);
        }
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), 4 * cols)) << p.name << " row " << r;
      }
      continue;
    }
    std::vector<float> want = test::AsStored(w, t->dtype);
    for (size_t k = 0; k < w.size(); ++k) {
      ASSERT_EQ(test::ElementAsFloat(*t, k), want[k]) << p.name << "[" << k << "]";
    }
  }
}

TEST_P(GgufExportTest, LogitsMatchSafetensorsOfTheSameWeights) {
  // The same weights as f32 in the hub layout: experts quantized + expanded by ggml's rules,
  // dense matrices rounded as stored.
  std::vector<TensorToWrite> tensors;
  for (const TensorToWrite& t : src_.tensors) {
    const std::vector<float>& w = hub_[t.name];
    std::vector<float> v;
    auto ggml_rows = [&](bool q8) {
      const int64_t cols = t.shape[1];
      for (int64_t r = 0; r < t.shape[0]; ++r) {
        std::vector<float> row = test::GgmlQuantDequant(w.data() + r * cols, cols, q8);
        v.insert(v.end(), row.begin(), row.end());
      }
    };
    const bool dense = t.shape.size() == 2 && t.name.find("mlp.gate.") == std::string::npos;
    if (t.name.find(".experts.") != std::string::npos) {
      ggml_rows(GetParam().experts == GgmlType::kQ8_0);
    } else if (dense && GetParam().dense == GgmlType::kQ8_0) {
      ggml_rows(true);
    } else {
      v = dense ? test::AsStored(w, GetParam().dense == GgmlType::kF16 ? DType::kF16 : DType::kBF16) : w;
    }
    tensors.push_back(
        {t.name, DType::kF32, t.shape, std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size())});
  }
  const std::string folder = dir_.Path("f32");
  std::filesystem::create_directories(folder);
  ASSERT_TRUE(WriteSafetensors(folder + "/model.safetensors", tensors).ok());
  std::ofstream(folder + "/config.json") << src_.hf_config.dump();

  auto from_gguf = LoadModel(path_, /*load_tokenizer=*/false);
  auto from_st = LoadModel(folder, /*load_tokenizer=*/false);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  ASSERT_TRUE(from_st.ok()) << from_st.status();
  const int64_t V = src_.config.vocab_size;
  for (const std::vector<int32_t>& ids : test::SomeSequences(V)) {
    auto a = test::Logits(*from_gguf, ids);
    auto b = test::Logits(*from_st, ids);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->size(), ids.size() * V);
    ASSERT_EQ(b->size(), a->size());
    for (size_t p = 0; p < ids.size(); ++p) {
      float scale = 1.f;
      for (int64_t k = 0; k < V; ++k) scale = std::max(scale, std::fabs((*b)[p * V + k]));
      for (int64_t k = 0; k < V; ++k) {
        ASSERT_NEAR((*a)[p * V + k], (*b)[p * V + k], 1e-4f * scale) << "length " << ids.size() << " position " << p;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ExpertAndDenseTypes, GgufExportTest,
                         ::testing::Values(Case{GgmlType::kQ8_0, GgmlType::kBF16},
                                           Case{GgmlType::kQ8_0, GgmlType::kF16},
                                           Case{GgmlType::kMXFP4, GgmlType::kBF16},
                                           Case{GgmlType::kMXFP4, GgmlType::kF16},
                                           Case{GgmlType::kQ8_0, GgmlType::kQ8_0},
                                           Case{GgmlType::kMXFP4, GgmlType::kQ8_0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return absl::StrCat(GgmlTypeName(i.param.experts), "_", GgmlTypeName(i.param.dense));
                         });

TEST(GgufExportRefusalTest, OnlyQwen3MoeHasALlamaCppArchitecture) {
  test::TempDir dir;
  RandomModelSpec spec;
  spec.arch = "muse_spark";
  absl::Status st = WriteRandomGguf(spec, GgufExportOptions(), dir.Path("m.gguf"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("qwen3_moe"), std::string::npos) << st;
  spec.arch = "qwen3_moe";
  spec.overrides["hidden"] = 48;  // rows of 48 are not whole Q8_0 blocks
  EXPECT_FALSE(WriteRandomGguf(spec, GgufExportOptions(), dir.Path("m.gguf")).ok());
}

}  // namespace
}  // namespace moeshard
