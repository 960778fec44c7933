// The layer sequences of worker/model, op by op, against each architecture's spec, through a
// LayerOps that records every call. The goldens say that numbers differ; this says which step
// of which layer is missing, extra, out of order or has the wrong option. The Muse Spark
// expectation is written from shared/reference/muse_spark.py (MuseSpark.layer), one op per
// step of the reference; the Qwen3-MoE one from Hugging Face's Qwen3MoeDecoderLayer.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/model/model.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

const char* NextName(NextInput::Kind k) {
  switch (k) {
    case NextInput::Kind::kNone:
      return "none";
    case NextInput::Kind::kMlp:
      return "mlp";
    case NextInput::Kind::kAttention:
      return "attention";
  }
  return "?";
}

// Records each op as one line; the call numbered fail_at returns an error.
class RecordingOps : public LayerOps {
 public:
  std::vector<std::string> calls;
  int fail_at = -1;

  absl::Status AttentionInput(int64_t li, const AttentionInputOpts& o) override {
    return Rec(absl::StrCat("AttentionInput ", li, " qk_norm=", o.qk_norm, " rope=", o.rope));
  }
  absl::Status Attention(int64_t li, int64_t window) override {
    return Rec(absl::StrCat("Attention ", li, " window=", window));
  }
  absl::Status OutputGate(int64_t li) override { return Rec(absl::StrCat("OutputGate ", li)); }
  absl::Status OutputProjection(int64_t li) override { return Rec(absl::StrCat("OutputProjection ", li)); }
  absl::Status Residual(int64_t li, Block block, const ResidualOpts& o) override {
    return Rec(absl::StrCat("Residual ", li, block == Block::kAttention ? " attention" : " mlp", " gated=", o.gated,
                            " next=", NextName(o.next.kind), " f32=", o.next.f32_copy));
  }
  absl::Status MlpInput(int64_t li, const MlpInputOpts& o) override {
    return Rec(absl::StrCat("MlpInput ", li, " f32=", o.f32_copy));
  }
  absl::Status DenseMlp(int64_t li) override { return Rec(absl::StrCat("DenseMlp ", li)); }
  absl::Status Route(int64_t li, const RouteOpts& o) override {
    return Rec(absl::StrCat("Route ", li, " topk_only=", o.softmax_topk_only, " renormalize=", o.renormalize,
                            " latent=", o.latent));
  }
  absl::Status LatentIn(int64_t li) override { return Rec(absl::StrCat("LatentIn ", li)); }
  absl::Status Experts(int64_t li, const ExpertsOpts& o) override {
    std::string then;  // the residual update the experts announce (a fusion hint)
    if (o.residual) {
      then = absl::StrCat(" then gated=", o.residual->gated, " next=", NextName(o.residual->next.kind),
                          " f32=", o.residual->next.f32_copy);
    }
    return Rec(absl::StrCat("Experts ", li, " output_norm=", o.output_norm, then));
  }
  absl::Status LatentOut(int64_t li) override { return Rec(absl::StrCat("LatentOut ", li)); }

 private:
  absl::Status Rec(std::string call) {
    calls.push_back(std::move(call));
    if (static_cast<int>(calls.size()) - 1 == fail_at) return absl::InternalError("injected");
    return absl::OkStatus();
  }
};

// muse_spark.py default_layer_types: S F S S repeating.
bool MuseFull(int64_t i) { return i % 4 == 1; }

json MuseJson(int64_t num_layers) {
  return json{{"architectures", {"MuseSparkForCausalLM"}},
              {"model_type", "muse_spark"},
              {"vocab_size", 256},
              {"hidden_size", 64},
              {"num_hidden_layers", num_layers},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 16},
              {"sliding_window", 8},
              {"rope_theta", 500000.0},
              {"rms_norm_eps", 1e-5},
              {"num_experts", 8},
              {"num_experts_per_tok", 2},
              {"moe_latent_size", 32},
              {"expert_intermediate_size", 48}};
}

// MuseSpark.layer(i) of the reference, step by step; li is the shard's local index of layer i.
void ExpectMuseLayer(std::vector<std::string>& want, int64_t i, int64_t li, bool last_local, int64_t window) {
  const bool full = MuseFull(i);
  const std::vector<std::string> layer = {
      // x = rms(s) * attn_norm; q, k, v = x @ W; no q/k norm; rope(q), rope(k) unless full
      absl::StrCat("AttentionInput ", li, " qk_norm=0 rope=", !full),
      // causal mask, and qi - kj < sliding_window unless full
      absl::StrCat("Attention ", li, " window=", full ? 0 : window),
      // o * sigmoid(x @ gate_proj) per head
      absl::StrCat("OutputGate ", li),
      // a = o @ o_proj
      absl::StrCat("OutputProjection ", li),
      // s = alpha * s + beta * (rms(a) * attn_out_norm); next: moe_norm, the router in fp32
      absl::StrCat("Residual ", li, " attention gated=1 next=mlp f32=1"),
      // y = rms(s) * moe_norm; logits = y.float32 @ router
      absl::StrCat("MlpInput ", li, " f32=1"),
      // topk(logits), softmax(top_v) over the top-k only
      absl::StrCat("Route ", li, " topk_only=1 renormalize=1 latent=1"),
      // z = y @ latent_in
      absl::StrCat("LatentIn ", li),
      // comb[t] += top_w * rms(d), d = silu(z @ gate) * (z @ up) @ down
      absl::StrCat("Experts ", li, " output_norm=1"),
      // f = comb @ latent_out
      absl::StrCat("LatentOut ", li),
      // s = alpha * s + beta * (rms(f) * moe_out_norm); then the next layer's attn_norm
      absl::StrCat("Residual ", li, " mlp gated=1 next=", last_local ? "none" : "attention", " f32=0"),
  };
  want.insert(want.end(), layer.begin(), layer.end());
}

// The ops the model file of config j runs for layers [begin, end).
std::vector<std::string> Record(const json& j, int64_t begin, int64_t end) {
  auto c = ParseHfConfig(j);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return {};
  RecordingOps ops;
  absl::Status st = RunLayerSequence(*c, begin, end, ops);
  EXPECT_TRUE(st.ok()) << st;
  return ops.calls;
}

TEST(LayerSequenceTest, MuseSparkFollowsTheReference) {
  std::vector<std::string> want;
  for (int64_t i = 0; i < 6; ++i) ExpectMuseLayer(want, i, i, i == 5, 8);
  EXPECT_THAT(Record(MuseJson(6), 0, 6), ::testing::ElementsAreArray(want));
}

// A pipeline stage: local indices from 0, each layer's options from its global index.
TEST(LayerSequenceTest, MuseSparkShardUsesGlobalLayerSpecs) {
  std::vector<std::string> want;
  for (int64_t i = 3; i < 6; ++i) ExpectMuseLayer(want, i, i - 3, i == 5, 8);
  EXPECT_THAT(Record(MuseJson(8), 3, 6), ::testing::ElementsAreArray(want));
}

json Qwen3Json() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "mlp_only_layers": [2],
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "sliding_window": 16,
    "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]})");
}

// Qwen3MoeDecoderLayer: input_layernorm → q/k/v proj → q_norm, k_norm → RoPE → attention
// (sliding per layer_types) → o_proj → h += attn; post_attention_layernorm → Qwen3MoeSparseMoeBlock
// (softmax over all experts, top-k, renormalized when norm_topk_prob) or Qwen3MoeMLP on
// mlp_only_layers → h += mlp.
std::vector<std::string> Qwen3Layers(int64_t begin, int64_t end, bool renormalize) {
  std::vector<std::string> want;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t li = i - begin;
    const bool dense = i == 2, sliding = i % 2 == 1;
    want.push_back(absl::StrCat("AttentionInput ", li, " qk_norm=1 rope=1"));
    want.push_back(absl::StrCat("Attention ", li, " window=", sliding ? 16 : 0));
    want.push_back(absl::StrCat("OutputProjection ", li));
    want.push_back(absl::StrCat("Residual ", li, " attention gated=0 next=mlp f32=", !dense));
    want.push_back(absl::StrCat("MlpInput ", li, " f32=", !dense));
    if (dense) {
      want.push_back(absl::StrCat("DenseMlp ", li));
    } else {
      want.push_back(absl::StrCat("Route ", li, " topk_only=0 renormalize=", renormalize, " latent=0"));
      // The hint: the very update that follows.
      want.push_back(absl::StrCat("Experts ", li,
                                  " output_norm=0 then gated=0 next=", i + 1 < end ? "attention" : "none", " f32=0"));
    }
    want.push_back(absl::StrCat("Residual ", li, " mlp gated=0 next=", i + 1 < end ? "attention" : "none", " f32=0"));
  }
  return want;
}

TEST(LayerSequenceTest, Qwen3MoeFollowsHuggingFace) {
  for (bool renormalize : {true, false}) {
    json j = Qwen3Json();
    j["norm_topk_prob"] = renormalize;
    EXPECT_THAT(Record(j, 0, 4), ::testing::ElementsAreArray(Qwen3Layers(0, 4, renormalize))) << renormalize;
    EXPECT_THAT(Record(j, 1, 3), ::testing::ElementsAreArray(Qwen3Layers(1, 3, renormalize))) << renormalize;
  }
}

// Each residual's hint names the block that follows it, with the same fp32 wish.
TEST(LayerSequenceTest, FusionHintsMatchTheNextOp) {
  for (json j : {Qwen3Json(), MuseJson(5)}) {
    const std::vector<std::string> calls = Record(j, 0, j["num_hidden_layers"].get<int64_t>());
    ASSERT_FALSE(calls.empty());
    for (size_t n = 0; n < calls.size(); ++n) {
      const std::string& op = calls[n];
      if (op.rfind("Residual ", 0) != 0) continue;
      const std::string next = n + 1 < calls.size() ? calls[n + 1] : "";
      if (op.find("next=mlp") != std::string::npos) {
        const bool f32 = op.find("f32=1") != std::string::npos;
        EXPECT_EQ(next.rfind("MlpInput ", 0), 0u) << op;
        EXPECT_NE(next.find(f32 ? "f32=1" : "f32=0"), std::string::npos) << op << " then " << next;
      } else if (op.find("next=attention") != std::string::npos) {
        EXPECT_EQ(next.rfind("AttentionInput ", 0), 0u) << op;
      } else {
        EXPECT_EQ(next, "") << op;
      }
    }
  }
}

TEST(LayerSequenceTest, StopsAtTheFirstFailingOp) {
  auto c = ParseHfConfig(MuseJson(4));
  ASSERT_TRUE(c.ok()) << c.status();
  RecordingOps ops;
  ops.fail_at = 13;  // layer 1's OutputGate
  absl::Status st = RunLayerSequence(*c, 0, 4, ops);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  ASSERT_EQ(ops.calls.size(), 14u);
  EXPECT_EQ(ops.calls.back(), "OutputGate 1");
}

TEST(LayerSequenceTest, RefusesLayersOutsideTheModel) {
  auto c = ParseHfConfig(MuseJson(4));
  ASSERT_TRUE(c.ok()) << c.status();
  RecordingOps ops;
  EXPECT_EQ(RunLayerSequence(*c, 2, 5, ops).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunLayerSequence(*c, 3, 2, ops).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ops.calls.empty());
}

}  // namespace
}  // namespace moeshard
