// Tokenizer metadata of `make-model --format gguf`: the engine's tokenizer built from the
// GGUF (TokenizerSpecFromGguf) encodes like the one built from tokenizer.json. For the real
// Qwen3 tokenizer of the test models' qwen3moe-tok (tests/testdata; missing is a failure) the
// metadata must also equal, array for array, what llama.cpp's convert_hf_to_gguf.py wrote into
// model-f16.gguf (rebuilt there byte for byte), and every qwen3moe.* key it wrote must be in our
// file with the same stored type; encodings must equal the `tokenizers` library's
// (tokenizer-goldens.json).
#include "eval/gguf_vocab.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "eval/random_model.h"
#include "eval/random_model_gguf.h"
#include "common/formats/gguf.h"
#include "common/mapped_file.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/worker/gguf_test_util.h"

namespace moeshard {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kTexts = {"Hello, world!",
                                         " the theory",
                                         "tabs\tand\nnewlines\n\n",
                                         "Numbers: 0 12 345",
                                         "<|im_start|>user\nhi<|im_end|>",
                                         "emoji 🤖 日本語",
                                         ""};

// A tokenizer from a spec, or null after reporting why.
std::unique_ptr<Tokenizer> Build(absl::StatusOr<TokenizerSpec> spec) {
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return nullptr;
  auto t = Tokenizer::Create(std::move(*spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}
std::unique_ptr<Tokenizer> FromGguf(const GgufFile& g) { return Build(TokenizerSpecFromGguf(g)); }
std::unique_ptr<Tokenizer> FromJson(const std::string& path) { return Build(TokenizerSpecFromHfJson(path)); }

void ExpectSameEncodings(const Tokenizer& a, const Tokenizer& b, const std::vector<std::string>& texts) {
  for (const std::string& s : texts) {
    auto x = a.Encode(s), y = b.Encode(s);
    ASSERT_TRUE(x.ok() && y.ok()) << s;
    EXPECT_EQ(*x, *y) << "'" << s << "'";
    auto d = a.Decode(*x);
    ASSERT_TRUE(d.ok()) << s;
    EXPECT_EQ(*d, s);
  }
}

TEST(GgufVocabTest, ByteLevelTokenizerRoundTrips) {
  test::TempDir dir;
  RandomModelSpec spec;
  spec.arch = "qwen3_moe";
  ASSERT_TRUE(WriteRandomGguf(spec, GgufExportOptions(), dir.Path("m.gguf")).ok());
  auto g = GgufFile::Open(dir.Path("m.gguf"));
  ASSERT_TRUE(g.ok()) << g.status();
  const int64_t V = 512;  // tiny preset
  std::ofstream(dir.Path("tokenizer.json")) << ByteLevelTokenizerJson(V).dump();
  auto from_gguf = FromGguf(**g);
  auto from_json = FromJson(dir.Path("tokenizer.json"));
  ASSERT_TRUE(from_gguf && from_json);
  EXPECT_EQ(from_gguf->vocab_size(), V);
  ExpectSameEncodings(*from_gguf, *from_json, kTexts);
  EXPECT_EQ(from_gguf->bos_id(), V - 3);
  EXPECT_EQ(from_gguf->eos_id(), V - 1);
  EXPECT_TRUE(from_gguf->IsSpecial(V - 2));
  const std::vector<int64_t>& types = **(*g)->GetIntArray("tokenizer.ggml.token_type");
  EXPECT_EQ(types[65], kTokenNormal);
  EXPECT_EQ(types[V - 1], kTokenControl);
}

TEST(GgufVocabTest, FollowsTheConvertersRules) {
  json tok = {{"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
                {"merges", json::array({json::array({"a", "b"})})}}},
              {"added_tokens",
               {{{"id", 4}, {"content", "<|end|>"}, {"special", true}},
                {{"id", 5}, {"content", "<think>"}, {"special", false}},
                {{"id", 6}, {"content", "<|fim|>"}, {"special", false}}}}};
  json tc = {{"eos_token", {{"content", "<|end|>"}}}, {"add_bos_token", true}, {"chat_template", "{{ x }}"}};
  json config = {{"bos_token_id", 5}, {"eos_token_id", 6}, {"pad_token_id", 4}};
  auto v = GgufVocabFromHf(tok, tc, config, 9);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->tokens,
            (std::vector<std::string>{"a", "b", "ab", "[PAD3]", "<|end|>", "<think>", "<|fim|>", "[PAD7]", "[PAD8]"}));
  EXPECT_EQ(v->token_types, (std::vector<int32_t>{1, 1, 1, 5, 3, 4, 3, 5, 5}));
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(v->eos_id, 4);  // tokenizer_config.json first
  EXPECT_EQ(v->bos_id, 5);  // then config.json
  EXPECT_EQ(v->pad_id, 4);
  EXPECT_TRUE(v->add_bos);
  EXPECT_EQ(v->chat_template, "{{ x }}");
  EXPECT_FALSE(GgufVocabFromHf(tok, json(), json(), 6).ok());  // id 6 does not fit
  auto natural = GgufVocabFromHf(tok, json(), json(), 0);
  ASSERT_TRUE(natural.ok());
  EXPECT_EQ(natural->tokens.size(), 7u);
}

TEST(GgufVocabTest, Qwen3TokenizerMatchesLlamaCppsConverter) {
  const std::string td = test::TestdataDir();
  const std::string tok_dir = td + "/qwen3moe-tok";
  ASSERT_TRUE(std::filesystem::exists(tok_dir + "/tokenizer.json")) << "no test model at " << tok_dir;
  test::TempDir dir;
  RandomModelSpec spec;
  spec.arch = "qwen3_moe";
  GgufExportOptions opts;
  opts.tokenizer_dir = tok_dir;
  const std::string path = dir.Path("m.gguf");
  ASSERT_TRUE(WriteRandomGguf(spec, opts, path).ok());
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*(*g)->GetStringArray("tokenizer.ggml.tokens"))->size(), 151936u);  // config.json's vocab_size

  // The tokenizers library's encodings.
  auto from_gguf = FromGguf(**g);
  ASSERT_TRUE(from_gguf);
  auto text = ReadFileToString(tok_dir + "/tokenizer-goldens.json");
  ASSERT_TRUE(text.ok());
  const json goldens = json::parse(*text);
  std::vector<std::string> texts;
  for (const json& c : goldens["cases"]) {
    texts.push_back(c["text"]);
    auto ids = from_gguf->Encode(c["text"].get<std::string>());
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["text"];
  }
  auto from_json = FromJson(tok_dir + "/tokenizer.json");
  ASSERT_TRUE(from_json);
  ExpectSameEncodings(*from_gguf, *from_json, kTexts);

  // llama.cpp's converter output for the same tokenizer.
  const std::string ref_path = tok_dir + "/model-f16.gguf";
  auto ref = GgufFile::Open(ref_path);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (const char* k : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}) {
    EXPECT_TRUE(**(*g)->GetStringArray(k) == **(*ref)->GetStringArray(k)) << k;
  }
  EXPECT_TRUE(**(*g)->GetIntArray("tokenizer.ggml.token_type") == **(*ref)->GetIntArray("tokenizer.ggml.token_type"));
  for (const char* k :
       {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"}) {
    EXPECT_EQ(*(*g)->GetInt(k), *(*ref)->GetInt(k)) << k;
  }
  for (const char* k :
       {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template", "general.architecture"}) {
    EXPECT_EQ(*(*g)->GetString(k), *(*ref)->GetString(k)) << k;
  }
  EXPECT_EQ(*(*g)->GetBool("tokenizer.ggml.add_bos_token"), *(*ref)->GetBool("tokenizer.ggml.add_bos_token"));
  auto ours = test::ReadGgufHeader(path);
  auto theirs = test::ReadGgufHeader(ref_path);
  ASSERT_TRUE(ours.ok() && theirs.ok());
  for (const auto& [key, type] : theirs->kv_types) {
    if (key.rfind("qwen3moe.", 0) != 0 && key.rfind("tokenizer.", 0) != 0) continue;
    EXPECT_EQ(ours->kv_types.count(key), 1u) << key << " is missing";
    EXPECT_EQ(ours->kv_types[key], type) << key;
  }
}

}  // namespace
}  // namespace moeshard
