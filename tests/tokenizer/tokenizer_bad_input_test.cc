// A small hand-made byte-level tokenizer: BPE and added-token behaviour with known
// answers, and bad input of every kind (text, ids, specs, tokenizer.json files), which
// must give an error status and never crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testdata/testdata_dir.h"

namespace moeshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string Spell(const std::string& bytes) {
  std::string out;
  tokenizer_internal::AppendByteLevel(bytes, &out);
  return out;
}

// Ids 0..255 are the bytes; then merges up to "hello" and " w"; then added tokens.
TokenizerSpec SmallSpec() {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.push_back(Spell(std::string(1, static_cast<char>(b))));
  for (const char* t : {"he", "ll", "hell", "hello", " w"}) {
    spec.vocab.push_back(Spell(t));  // 256..260
    spec.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {Spell(" "), "w"}};
  }
  spec.added = {{.id = 261, .content = "<|x|>", .special = true},
                {.id = 262, .content = "<|x|>!"},
                {.id = 263, .content = "[L]", .lstrip = true},
                {.id = 264, .content = "[R]", .rstrip = true}};
  spec.eos_id = 261;
  return spec;
}

std::unique_ptr<Tokenizer> SmallTokenizer() {
  auto tok = Tokenizer::Create(SmallSpec());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

TEST(SmallTokenizerTest, BpeAndAddedTokens) {
  auto tok = SmallTokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(*tok->Encode("hello"), ElementsAre(259));
  EXPECT_THAT(*tok->Encode("hello world"), ElementsAre(259, 260, 'o', 'r', 'l', 'd'));
  EXPECT_THAT(*tok->Encode(""), ElementsAre());
  // Longest added token wins; lstrip/rstrip eat neighbouring whitespace.
  EXPECT_THAT(*tok->Encode("a<|x|>!b<|x|>"), ElementsAre('a', 262, 'b', 261));
  EXPECT_THAT(*tok->Encode("a \t[L] b"), ElementsAre('a', 263, ' ', 'b'));
  EXPECT_THAT(*tok->Encode("a [R]\n b"), ElementsAre('a', ' ', 264, 'b'));
  EXPECT_EQ(*tok->Decode({259, 261, 260}), "hello<|x|> w");
  EXPECT_TRUE(tok->IsSpecial(261));
  EXPECT_FALSE(tok->IsSpecial(262));
  EXPECT_EQ(tok->eos_id(), 261);
  EXPECT_EQ(tok->vocab_size(), 265);
}

TEST(SmallTokenizerTest, InvalidUtf8IsAnError) {
  auto tok = SmallTokenizer();
  ASSERT_NE(tok, nullptr);
  for (const std::string& bad :
       std::vector<std::string>{"\xff", "abc\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                "ok\x80", "\xe2\x82", std::string("a\0\xfe", 3)}) {
    auto ids = tok->Encode(bad);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << ids.status();
    EXPECT_THAT(ids.status().message(), HasSubstr("UTF-8"));
  }
  EXPECT_THAT(*tok->Encode(std::string("a\0b", 3)), ElementsAre('a', 0, 'b'));
}

TEST(SmallTokenizerTest, BadIdsAreErrors) {
  auto tok = SmallTokenizer();
  ASSERT_NE(tok, nullptr);
  for (int32_t id : {-1, 265, 1 << 30, INT32_MIN}) {
    EXPECT_EQ(tok->Decode({1, id}).status().code(), absl::StatusCode::kInvalidArgument) << id;
    EXPECT_FALSE(tok->TokenBytes(id).ok()) << id;
    EXPECT_FALSE(tok->IsSpecial(id));
  }
  TokenizerSpec spec = SmallSpec();
  spec.added.push_back({.id = 300, .content = "<far>"});  // leaves ids 265..299 unused
  auto holes = Tokenizer::Create(std::move(spec));
  ASSERT_TRUE(holes.ok()) << holes.status();
  EXPECT_FALSE((*holes)->Decode({270}).ok());
  EXPECT_EQ(*(*holes)->Decode({300}), "<far>");
  // Bytes that are not UTF-8 on their own decode to U+FFFD.
  EXPECT_EQ(*tok->Decode({0xE2, 0x82, 'a', 0xFF}),
            "\xEF\xBF\xBD"
            "a\xEF\xBF\xBD");
}

TEST(SmallTokenizerTest, BadSpecsAreErrors) {
  const auto expect_error = [](TokenizerSpec spec, const char* what) {
    auto tok = Tokenizer::Create(std::move(spec));
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << tok.status();
  };
  TokenizerSpec s = SmallSpec();
  s.merges.push_back({"x", "nope"});
  expect_error(s, "merge of an unknown token");
  s = SmallSpec();
  s.merges.push_back({"x", "y"});  // "xy" is not in the vocab
  expect_error(s, "merge into an unknown token");
  s = SmallSpec();
  s.vocab[65] = "";
  expect_error(s, "a byte without a token");
  s = SmallSpec();
  s.split_regex = "(unclosed";
  expect_error(s, "a regex that does not compile");
  s = SmallSpec();
  s.added.push_back({.id = 270, .content = ""});
  expect_error(s, "an empty added token");
  s = SmallSpec();
  s.added.push_back({.id = -3, .content = "<neg>"});
  expect_error(s, "a negative added id");
  s = SmallSpec();
  s.added.push_back({.id = 261, .content = "<again>"});
  expect_error(s, "an added id twice");
  s = SmallSpec();
  s.eos_id = 5000;
  expect_error(s, "eos out of range");
}

TEST(SmallTokenizerTest, RandomInputNeverCrashesAndValidTextRoundTrips) {
  auto tok = SmallTokenizer();
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes(rng() % 40, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    auto ids = tok->Encode(bytes);
    if (!ids.ok()) {
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    }
    std::vector<int32_t> random_ids(rng() % 8);
    for (int32_t& id : random_ids) id = static_cast<int32_t>(rng() % 300) - 10;
    (void)tok->Decode(random_ids);

    std::string text;  // valid UTF-8 from random code points and added tokens
    for (int n = rng() % 20; n > 0; --n) {
      const uint32_t pick = rng() % 10;
      if (pick == 0) {
        text += "<|x|>";
        continue;
      }
      uint32_t cp = pick < 5 ? rng() % 0x80 : rng() % 0x110000;
      if (cp >= 0xD800 && cp < 0xE000) cp = ' ';
      char buf[4];
      int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      if (len == 1) {
        buf[0] = static_cast<char>(cp);
      } else {
        for (int i = len - 1; i > 0; --i, cp >>= 6) buf[i] = static_cast<char>(0x80 | (cp & 0x3F));
        buf[0] = static_cast<char>((0xF00 >> len) | cp);
      }
      text.append(buf, len);
    }
    auto text_ids = tok->Encode(text);
    ASSERT_TRUE(text_ids.ok()) << text_ids.status();
    EXPECT_EQ(*tok->Decode(*text_ids), text);
  }
}

std::vector<std::string> SplitQwen(const std::string& text) {
  auto re = tokenizer_internal::SplitRegex::Create(tokenizer_internal::kQwen2Pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  std::vector<std::string> pieces;
  if (re.ok()) {
    EXPECT_TRUE((*re)->Split(text, [&](std::string_view p) { pieces.emplace_back(p); }).ok());
  }
  return pieces;
}

TEST(SplitRegexTest, WhitespaceIsOniguruma) {
  EXPECT_THAT(SplitQwen("I'M here  \n\n x"), ElementsAre("I", "'M", " here", "  \n\n", " x"));
  // U+180E is not \s for Oniguruma (PCRE2's own \s would take it); U+0085 is.
  EXPECT_THAT(SplitQwen("x!\u180E!"), ElementsAre("x", "!\u180E!"));
  EXPECT_THAT(SplitQwen("x!\u0085!"), ElementsAre("x", "!", "\u0085", "!"));
}

// tokenizer.json files, well formed and not.
class HfJsonTest : public ::testing::Test {
 protected:
  static Json GoodJson() {
    const TokenizerSpec spec = SmallSpec();
    Json vocab = Json::object();
    for (size_t id = 0; id < 261; ++id) vocab[spec.vocab[id]] = id;
    Json merges = Json::array();
    for (const auto& [a, b] : spec.merges) merges.push_back(a + " " + b);
    return Json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
                {"added_tokens", {{{"id", 261}, {"content", "<|x|>"}, {"special", true}}}},
                {"normalizer", {{"type", "NFC"}}},
                {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                {"decoder", {{"type", "ByteLevel"}}}};
  }
  std::string Write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/tokenizer_bad_input_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                             std::to_string(file_idx_++) + ".json";
    std::ofstream(path, std::ios::binary) << text;
    written_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& path : written_) std::remove(path.c_str());
  }
  absl::Status Load(const std::string& text) {
    auto spec = TokenizerSpecFromHfJson(Write(text));
    if (!spec.ok()) return spec.status();
    return Tokenizer::Create(*std::move(spec)).status();
  }
  int file_idx_ = 0;
  std::vector<std::string> written_;
};

TEST_F(HfJsonTest, GoodFileLoads) {
  auto spec = TokenizerSpecFromHfJson(Write(GoodJson().dump()));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->nfc);
  auto tok = Tokenizer::Create(*std::move(spec));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("hello world<|x|>"), ElementsAre(259, 260, 'o', 'r', 'l', 'd', 261));
  Json pairs = GoodJson();  // merges as [a, b] pairs
  for (Json& m : pairs["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = Json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  EXPECT_TRUE(Load(pairs.dump()).ok());
}

TEST_F(HfJsonTest, BrokenFilesAreErrors) {
  const std::string good = GoodJson().dump();
  EXPECT_FALSE(TokenizerSpecFromHfJson(::testing::TempDir() + "/does_not_exist.json").ok());
  for (size_t cut : {size_t{0}, size_t{1}, good.size() / 3, good.size() / 2, good.size() - 1}) {
    EXPECT_EQ(Load(good.substr(0, cut)).code(), absl::StatusCode::kInvalidArgument)
        << "cut at " << cut;
  }
  EXPECT_FALSE(Load("[1, 2, 3]").ok());
  EXPECT_FALSE(Load("\"\xff\"").ok());
  const auto expect = [&](absl::StatusCode code, const char* what, auto edit) {
    Json j = GoodJson();
    edit(j);
    const absl::Status status = Load(j.dump());
    EXPECT_EQ(status.code(), code) << what << ": " << status;
  };
  using Code = absl::StatusCode;
  expect(Code::kInvalidArgument, "missing model", [](Json& j) { j.erase("model"); });
  expect(Code::kInvalidArgument, "model not an object", [](Json& j) { j["model"] = 3; });
  expect(Code::kUnimplemented, "WordPiece", [](Json& j) { j["model"]["type"] = "WordPiece"; });
  expect(Code::kInvalidArgument, "no vocab", [](Json& j) { j["model"].erase("vocab"); });
  expect(Code::kInvalidArgument, "vocab id a string",
         [](Json& j) { j["model"]["vocab"]["a"] = "x"; });
  expect(Code::kInvalidArgument, "negative vocab id",
         [](Json& j) { j["model"]["vocab"]["a"] = -4; });
  expect(Code::kInvalidArgument, "vocab id twice", [](Json& j) { j["model"]["vocab"]["zz"] = 5; });
  expect(Code::kInvalidArgument, "no merges", [](Json& j) { j["model"].erase("merges"); });
  expect(Code::kInvalidArgument, "merge a number",
         [](Json& j) { j["model"]["merges"].push_back(7); });
  expect(Code::kInvalidArgument, "merge without space",
         [](Json& j) { j["model"]["merges"].push_back("he"); });
  expect(Code::kInvalidArgument, "merge of unknown tokens",
         [](Json& j) { j["model"]["merges"].push_back("qq zz"); });
  expect(Code::kInvalidArgument, "merge into an unknown token",
         [](Json& j) { j["model"]["merges"].push_back("x y"); });
  expect(Code::kInvalidArgument, "added token without id",
         [](Json& j) { j["added_tokens"][0].erase("id"); });
  expect(Code::kInvalidArgument, "added_tokens not a list",
         [](Json& j) { j["added_tokens"] = "x"; });
  expect(Code::kUnimplemented, "Lowercase normalizer",
         [](Json& j) { j["normalizer"]["type"] = "Lowercase"; });
  expect(Code::kUnimplemented, "no pre-tokenizer", [](Json& j) { j.erase("pre_tokenizer"); });
  expect(Code::kUnimplemented, "Whitespace",
         [](Json& j) { j["pre_tokenizer"]["type"] = "Whitespace"; });
  expect(Code::kUnimplemented, "Split Removed", [](Json& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
          {{"type", "ByteLevel"}, {"use_regex", false}, {"add_prefix_space", false}}}}};
  });
  expect(Code::kInvalidArgument, "bad Split regex", [](Json& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L"}}}, {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"use_regex", false}, {"add_prefix_space", false}}}}};
  });
  expect(Code::kUnimplemented, "WordPiece decoder",
         [](Json& j) { j["decoder"]["type"] = "WordPiece"; });
}

TEST_F(HfJsonTest, MutatedFilesNeverCrash) {
  const std::string good = GoodJson().dump();
  constexpr char kBytes[] = "{}[]\",:0a -\\\xff";
  std::mt19937 rng(11);
  int num_ok = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string text = good;
    for (int n = 1 + rng() % 3; n > 0; --n) {
      text[rng() % text.size()] = kBytes[rng() % (sizeof(kBytes) - 1)];
    }
    num_ok += Load(text).ok();  // either way, no crash
  }
  EXPECT_LT(num_ok, 300);
}

TEST_F(HfJsonTest, TruncatedQwenFileIsAnError) {
  std::ifstream in(test::TestDataDir() + "/qwen3moe-tok/tokenizer.json");
  ASSERT_TRUE(in) << "no qwen3moe-tok/tokenizer.json under " << test::TestDataDir();
  std::string head(200000, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  EXPECT_EQ(Load(head).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeshard
