// The Qwen3 tokenizer against goldens produced by Hugging Face's `tokenizers`
// (testdata/qwen3moe-tok/tokenizer-goldens.json): every case and every chat, loaded from
// tokenizer.json and again from the GGUF file's tokenizer.ggml.* keys.
#include "common/tokenizer/tokenizer.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/gguf.h"
#include "common/tokenizer/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testdata/testdata_dir.h"

namespace moeshard {
namespace {

using ::testing::ElementsAreArray;
using Json = nlohmann::json;

std::string QwenDir() {
  return test::TestDataDir() + "/qwen3moe-tok";
}

struct Shared {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = absl::UnknownError("not loaded");
  Json goldens;
  double load_ms = 0;
};

// Loaded once for all tests (the vocab has 151k entries).
const Shared& Qwen() {
  static const Shared* const shared = [] {
    auto* s = new Shared();
    const std::string dir = QwenDir();
    std::ifstream in(dir + "/tokenizer-goldens.json");
    s->goldens = Json::parse(in, nullptr, /*allow_exceptions=*/false);
    const auto start = std::chrono::steady_clock::now();
    auto spec = TokenizerSpecFromHfJson(dir + "/tokenizer.json");
    s->tokenizer = spec.ok() ? Tokenizer::Create(*std::move(spec)) : spec.status();
    s->load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return s;
  }();
  return *shared;
}

class QwenTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(QwenDir() + "/tokenizer.json")) << "no Qwen3 tokenizer at " << QwenDir();
    ASSERT_TRUE(Qwen().tokenizer.ok()) << Qwen().tokenizer.status();
    ASSERT_TRUE(Qwen().goldens.is_object()) << "tokenizer-goldens.json is missing or broken";
    tok_ = Qwen().tokenizer->get();
  }
  const Json& goldens() const { return Qwen().goldens; }
  const Tokenizer* tok_ = nullptr;
};

// Every golden case through `tok`: same ids, and the ids decode to "decoded".
void ExpectCases(const Tokenizer& tok, const Json& goldens) {
  ASSERT_GE(goldens["cases"].size(), 20u);
  for (const Json& c : goldens["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(testing::Message() << "text: " << text);
    const std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    auto ids = tok.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(want));
    auto decoded = tok.Decode(want);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
  }
}

// Every golden chat: rendered text, its ids, and back.
void ExpectChats(const Tokenizer& tok, const Json& goldens) {
  ASSERT_GE(goldens["chats"].size(), 1u);
  for (const Json& chat : goldens["chats"]) {
    std::vector<ChatMessage> messages;
    for (const Json& m : chat["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    ChatOptions options;
    options.enable_thinking = chat["enable_thinking"].get<bool>();
    const std::string want_text = chat["text"].get<std::string>();
    SCOPED_TRACE(testing::Message() << "chat: " << want_text);
    auto text = RenderChatMl(messages, options);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(*text, want_text);
    auto ids = tok.Encode(want_text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(chat["ids"].get<std::vector<int32_t>>()));
    auto decoded = tok.Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, want_text);
  }
}

TEST_F(QwenTokenizerTest, MatchesEveryGoldenCase) { ExpectCases(*tok_, goldens()); }

TEST_F(QwenTokenizerTest, MatchesEveryGoldenChat) { ExpectChats(*tok_, goldens()); }

TEST_F(QwenTokenizerTest, SpecialTokensAndIds) {
  EXPECT_EQ(tok_->vocab_size(), 151669);
  EXPECT_EQ(tok_->TokenId("<|im_end|>"), 151645);
  EXPECT_EQ(tok_->TokenId("<think>"), 151667);
  EXPECT_EQ(tok_->TokenId("no such token"), std::nullopt);
  EXPECT_TRUE(tok_->IsSpecial(151645));
  EXPECT_FALSE(tok_->IsSpecial(151667));  // <think> is added but not special
  EXPECT_FALSE(tok_->IsSpecial(220));
  EXPECT_FALSE(tok_->IsSpecial(-1));
  EXPECT_EQ(tok_->eos_id(), 151645);  // from tokenizer_config.json
  EXPECT_EQ(tok_->bos_id(), std::nullopt);
  EXPECT_EQ(*tok_->TokenBytes(220), " ");
  EXPECT_EQ(*tok_->TokenBytes(151644), "<|im_start|>");
}

TEST_F(QwenTokenizerTest, TokenBytesConcatenateToTheText) {
  const std::string text = "emoji 🤖🚀 and ZWJ 👩\u200d💻 日本語";
  auto ids = tok_->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::string bytes;
  for (int32_t id : *ids) bytes += *tok_->TokenBytes(id);
  EXPECT_EQ(bytes, text);
  // A token holding part of a character decodes to U+FFFD on its own.
  EXPECT_EQ(*tok_->Decode({11162}), " \xEF\xBF\xBD");  // " " + 2 of 4 bytes of U+1F916
}

TEST_F(QwenTokenizerTest, NormalizesToNfcButNotAddedTokens) {
  // "e" + COMBINING ACUTE composes to "é" before BPE.
  EXPECT_EQ(*tok_->Encode("caf\x65\xCC\x81"), *tok_->Encode("caf\xC3\xA9"));
  EXPECT_THAT(*tok_->Encode("<|im_start|><|im_end|>"), ElementsAreArray({151644, 151645}));
}

TEST_F(QwenTokenizerTest, LongTextRoundTrips) {
  std::string text;
  for (const Json& c : goldens()["cases"]) text += c["text"].get<std::string>() + "\n";
  while (text.size() < 4096) text += text;
  const auto start = std::chrono::steady_clock::now();
  auto ids = tok_->Encode(text);
  const double encode_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*tok_->Decode(*ids), text);
  RecordProperty("encode_bytes", static_cast<int>(text.size()));
  RecordProperty("encode_us", static_cast<int>(encode_ms * 1000));
  RecordProperty("load_ms", static_cast<int>(Qwen().load_ms));
  // Times are recorded, not asserted: performance belongs in benchmarks, not in tests.
}

// The same vocabulary from the GGUF file's metadata gives the same ids.
TEST_F(QwenTokenizerTest, GgufVocabMatchesEveryGolden) {
  const std::string path = QwenDir() + "/model-f16.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << "no " << path;
  auto gguf = GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto spec = TokenizerSpecFromGguf(**gguf);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->nfc);
  auto tok = Tokenizer::Create(*std::move(spec));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 151936);  // padded with unused [PAD] entries
  EXPECT_EQ((*tok)->eos_id(), 151645);
  EXPECT_TRUE((*tok)->IsSpecial(151645));
  EXPECT_FALSE((*tok)->IsSpecial(151667));  // <think>: user-defined, not control
  ExpectCases(**tok, goldens());
  ExpectChats(**tok, goldens());
}

}  // namespace
}  // namespace moeshard
