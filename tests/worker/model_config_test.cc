#include "common/model/model_config.h"

#include "common/model/kv_pools.h"

#include "gtest/gtest.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

json Qwen3Classic() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 512,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "rope_theta": 1000000.0, "rope_scaling": null, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
    "tie_word_embeddings": false, "sliding_window": null, "use_sliding_window": false})");
}

TEST(ModelConfigTest, ClassicAndNewerKeysAgree) {
  json classic = Qwen3Classic();
  json newer = classic;
  newer.erase("num_experts");
  newer["num_local_experts"] = 8;
  newer.erase("rope_theta");
  newer.erase("rope_scaling");
  newer["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  newer.erase("torch_dtype");
  newer["dtype"] = "bfloat16";
  auto a = ParseHfConfig(classic), b = ParseHfConfig(newer);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());
  EXPECT_EQ(a->num_experts, 8);
  EXPECT_DOUBLE_EQ(b->rope_theta, 1e6);
  EXPECT_TRUE(a->qk_norm);
  EXPECT_FALSE(a->gated_residual);
}

TEST(ModelConfigTest, ErrorsNameTheKey) {
  struct Bad {
    const char* key;
    json value;
  };
  for (auto [key, value] : std::vector<Bad>{{"num_attention_heads", nullptr}, {"hidden_size", "wide"},
                                            {"num_key_value_heads", 3}, {"num_experts_per_tok", 9},
                                            {"mlp_only_layers", json::array({7})}, {"model_type", "llama4"},
                                            {"rope_scaling", {{"rope_type", "yarn"}}}}) {
    json j = Qwen3Classic();
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    auto c = ParseHfConfig(j);
    ASSERT_FALSE(c.ok()) << key;
    EXPECT_NE(std::string(c.status().message()).find(key), std::string::npos) << c.status();
  }
  json j = Qwen3Classic();
  j["num_local_experts"] = 16;
  auto c = ParseHfConfig(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("disagrees"), std::string::npos) << c.status();
}

TEST(ModelConfigTest, Qwen3DenseLayersAndSlidingWindow) {
  json j = Qwen3Classic();
  j["mlp_only_layers"] = {0};
  j["decoder_sparse_step"] = 2;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  j["max_window_layers"] = 2;
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status();
  // layer 0: listed; layer 2: (2+1) % 2 != 0 -> dense too.
  EXPECT_FALSE(c->layers[0].moe);
  EXPECT_TRUE(c->layers[1].moe);
  EXPECT_FALSE(c->layers[2].moe);
  EXPECT_TRUE(c->layers[3].moe);
  EXPECT_FALSE(c->layers[1].sliding);
  EXPECT_TRUE(c->layers[2].sliding);
  EXPECT_EQ(c->sliding_window, 8);
}

TEST(ModelConfigTest, MuseSparkPatternAndRope) {
  json j = {{"model_type", "muse_spark"}, {"vocab_size", 512}, {"hidden_size", 128}, {"num_hidden_layers", 8},
            {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"sliding_window", 16},
            {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-5}, {"num_experts", 16}, {"num_experts_per_tok", 4},
            {"moe_latent_size", 64}, {"expert_intermediate_size", 64}};
  auto c = ParseHfConfig(j);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(c->layers[i].sliding, i % 4 != 1) << i;
    EXPECT_EQ(c->layers[i].rope, c->layers[i].sliding) << i;
  }
  EXPECT_TRUE(c->expert_output_norm && c->gated_residual && c->attn_output_gate && c->router_softmax_topk_only);
  j["layer_types"] = {"full_attention"};
  auto bad = ParseHfConfig(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("layer_types"), std::string::npos);
  j.erase("layer_types");
  j["quantization_config"] = {{"quant_method", "awq"}};
  bad = ParseHfConfig(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("quant_method"), std::string::npos);
}

// Two KV pools only for a model with both kinds of layer; the sliding pool's default size.
TEST(ModelConfigTest, SlidingKvPoolForModelsWithBothLayerKinds) {
  auto qwen = ParseHfConfig(Qwen3Classic());
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_FALSE(HasBothLayerKinds(*qwen));
  EXPECT_EQ(DefaultSlidingKvBlocks(*qwen, 1024, 16, 64, 512), 0);
  json j = Qwen3Classic();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  j["max_window_layers"] = 0;  // every layer sliding: one kind, one pool
  auto all_sliding = ParseHfConfig(j);
  ASSERT_TRUE(all_sliding.ok()) << all_sliding.status();
  EXPECT_FALSE(HasBothLayerKinds(*all_sliding));
  j["max_window_layers"] = 2;  // layers 2 and 3 sliding
  auto mixed = ParseHfConfig(j);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_TRUE(HasBothLayerKinds(*mixed));
  // Window 8, blocks of 4: 64 sequences x (ceil(7 / 4) + 2) + 2 x ceil(512 / 4) = 256 + 256.
  EXPECT_EQ(DefaultSlidingKvBlocks(*mixed, 1024, 4, 64, 512), 512);
  EXPECT_EQ(DefaultSlidingKvBlocks(*mixed, 512, 4, 64, 512), 0);  // not smaller than the full pool

  // One sequence's KV by kind (bench-model's memory plan), 10 bytes a token a layer.
  const KvBytesByKind one = SequenceKvBytes(*qwen, 10, 1000, 16);  // one kind: every position, every layer
  EXPECT_EQ(one.full_layers, static_cast<int64_t>(qwen->layers.size()));
  EXPECT_EQ(one.sliding_layers, 0);
  EXPECT_DOUBLE_EQ(one.full_bytes, 10.0 * 1000 * static_cast<double>(qwen->layers.size()));
  EXPECT_DOUBLE_EQ(one.sliding_bytes, 0);
  EXPECT_EQ(SequenceKvBytes(*all_sliding, 10, 1000, 16).sliding_layers, 0);  // one pool keeps every position
  // Window 8, blocks of 4: a sliding layer holds ceil(7 / 4) + 1 = 3 blocks (12 tokens) at most.
  const KvBytesByKind at100 = SequenceKvBytes(*mixed, 10, 100, 4), at1000 = SequenceKvBytes(*mixed, 10, 1000, 4);
  EXPECT_EQ(at100.full_layers, 2);
  EXPECT_EQ(at100.sliding_layers, 2);
  EXPECT_DOUBLE_EQ(at100.full_bytes, 2 * 100 * 10.0);
  EXPECT_DOUBLE_EQ(at100.sliding_bytes, 2 * 12 * 10.0);
  EXPECT_DOUBLE_EQ(at1000.full_bytes, 2 * 1000 * 10.0);
  EXPECT_DOUBLE_EQ(at1000.sliding_bytes, at100.sliding_bytes);                      // flat past the window
  EXPECT_DOUBLE_EQ(SequenceKvBytes(*mixed, 10, 5, 4).sliding_bytes, 2 * 8 * 10.0);  // 5 tokens: 2 blocks
}

}  // namespace
}  // namespace moeshard
