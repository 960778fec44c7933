// Incremental detokenization: text released as tokens arrive, partial UTF-8 held back,
// stop strings found across token boundaries and truncated, hidden and special tokens.
#include "common/tokenizer/detokenizer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "router_test_util.h"

namespace moeshard::router {
namespace {

using testing::ByteIds;
using testing::kImEnd;
using testing::kThink;
using testing::MakeTestTokenizer;

// Feeds `ids`; returns what each Add released, then Flush (unless stopped) as the last entry.
std::vector<std::string> Feed(IncrementalDetokenizer& d, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(d.Add(id));
  out.push_back(d.Flush());
  return out;
}

IncrementalDetokenizer::Options Opts(std::vector<std::string> stop, std::vector<int32_t> hidden = {},
                                     bool skip_special = true) {
  IncrementalDetokenizer::Options o;
  o.stop = std::move(stop);
  o.hidden_ids = std::move(hidden);
  o.skip_special_tokens = skip_special;
  return o;
}

std::string Joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const auto& p : parts) s += p;
  return s;
}

class DetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(tok_, nullptr); }
  std::unique_ptr<Tokenizer> tok_ = MakeTestTokenizer();
};

TEST_F(DetokenizerTest, PlainTextIsReleasedAtOnce) {
  IncrementalDetokenizer d(tok_.get(), {});
  EXPECT_EQ(Feed(d, ByteIds("abc")), (std::vector<std::string>{"a", "b", "c", ""}));
  EXPECT_FALSE(d.stopped());
}

TEST_F(DetokenizerTest, PartialUtf8IsHeldUntilComplete) {
  IncrementalDetokenizer d(tok_.get(), {});
  // "€" as three byte tokens, then as "\xE2\x82" + "\xAC!" (a character split inside tokens).
  EXPECT_EQ(Feed(d, {0xE2, 0x82, 0xAC, 'x', 259, 260}), (std::vector<std::string>{"", "", "€", "x", "", "€!", ""}));
}

TEST_F(DetokenizerTest, IncompleteCharacterAtTheEndBecomesReplacement) {
  IncrementalDetokenizer d(tok_.get(), {});
  EXPECT_EQ(Feed(d, {'a', 0xE2, 0x82}), (std::vector<std::string>{"a", "", "", "\xEF\xBF\xBD"}));
}

TEST_F(DetokenizerTest, IllFormedBytesBecomeReplacements) {
  IncrementalDetokenizer d(tok_.get(), {});
  // A stray continuation byte, and a lead byte followed by ASCII.
  EXPECT_EQ(Joined(Feed(d, {'a', 0x80, 'b', 0xE2, 'c'})),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD"
            "c");
}

TEST_F(DetokenizerTest, StopStringAcrossTokensIsTruncated) {
  IncrementalDetokenizer d(tok_.get(), Opts({"STOP"}));
  auto out = Feed(d, ByteIds("ab STOP cd"));
  // "S", "T", "O" are held (a stop string may be starting); "P" completes it.
  EXPECT_EQ(out[0], "a");
  EXPECT_EQ(out[2], " ");
  EXPECT_EQ(out[3], "");
  EXPECT_EQ(Joined(out), "ab ");
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.matched_stop(), "STOP");
  EXPECT_EQ(d.Add('z'), "");  // nothing after a stop
}

TEST_F(DetokenizerTest, StopStringInsideMultiByteTokens) {
  // "xEN" + "D!" holds "END" across two tokens; the text before it is released.
  IncrementalDetokenizer d(tok_.get(), Opts({"END"}));
  EXPECT_EQ(d.Add('a'), "a");
  EXPECT_EQ(d.Add(256), "x");  // "EN" is held back
  EXPECT_EQ(d.Add(257), "");
  EXPECT_TRUE(d.stopped());
  EXPECT_EQ(d.Flush(), "");
}

TEST_F(DetokenizerTest, FalseStartIsReleased) {
  IncrementalDetokenizer d(tok_.get(), Opts({"STOP"}));
  EXPECT_EQ(Joined(Feed(d, ByteIds("STOStOP STOPPED"))), "STOStOP ");
  EXPECT_EQ(d.matched_stop(), "STOP");
  IncrementalDetokenizer d2(tok_.get(), Opts({"STOP"}));
  EXPECT_EQ(Feed(d2, ByteIds("ST")), (std::vector<std::string>{"", "", "ST"}));  // never completed: flushed
  EXPECT_FALSE(d2.stopped());
}

TEST_F(DetokenizerTest, EarliestOfSeveralStopStringsWins) {
  IncrementalDetokenizer d(tok_.get(), Opts({"cd", "bcx", "b"}));
  EXPECT_EQ(Joined(Feed(d, ByteIds("abcd"))), "a");
  EXPECT_EQ(d.matched_stop(), "b");
}

TEST_F(DetokenizerTest, OverlappingPrefixesAreHeld) {
  IncrementalDetokenizer d(tok_.get(), Opts({"aab"}));
  auto out = Feed(d, ByteIds("aaab"));
  EXPECT_EQ(Joined(out), "a");
  EXPECT_TRUE(d.stopped());
}

TEST_F(DetokenizerTest, UnicodeStopString) {
  IncrementalDetokenizer d(tok_.get(), Opts({"€!"}));
  EXPECT_EQ(d.Add('q'), "q");
  EXPECT_EQ(d.Add(259), "");  // half a "€": held
  EXPECT_EQ(d.Add(260), "");  // completes "€!"
  EXPECT_TRUE(d.stopped());
}

TEST_F(DetokenizerTest, SpecialAndHiddenTokensAddNoText) {
  IncrementalDetokenizer d(tok_.get(), Opts({}, {'z'}));
  EXPECT_EQ(Joined(Feed(d, {'a', kImEnd, 'z', kThink, 'b'})), "a<think>b");
  IncrementalDetokenizer shown(tok_.get(), Opts({}, {}, false));
  EXPECT_EQ(Joined(Feed(shown, {'a', kImEnd})), "a<|im_end|>");
}

TEST_F(DetokenizerTest, NoTokenizerMeansNoText) {
  IncrementalDetokenizer d(nullptr, Opts({"a"}));
  EXPECT_EQ(Joined(Feed(d, {'a', 'b'})), "");
  EXPECT_FALSE(d.stopped());
}

TEST(Utf8Test, IncompleteTail) {
  EXPECT_EQ(IncompleteUtf8Tail(""), 0u);
  EXPECT_EQ(IncompleteUtf8Tail("abc"), 0u);
  EXPECT_EQ(IncompleteUtf8Tail("a\xE2"), 1u);
  EXPECT_EQ(IncompleteUtf8Tail("a\xE2\x82"), 2u);
  EXPECT_EQ(IncompleteUtf8Tail("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(IncompleteUtf8Tail("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Tail("\x80"), 0u);      // a stray continuation: ill-formed, not incomplete
  EXPECT_EQ(IncompleteUtf8Tail("\xE0\x80"), 0u);  // overlong start: ill-formed
  EXPECT_EQ(IncompleteUtf8Tail("\xED\xA0"), 0u);  // surrogate: ill-formed
}

TEST(Utf8Test, Lossy) {
  EXPECT_EQ(Utf8Lossy("h\xC3\xA9llo"), "héllo");
  EXPECT_EQ(Utf8Lossy("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xE2\x82"), "\xEF\xBF\xBD");  // one maximal subpart, one replacement
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "😀");
}

}  // namespace
}  // namespace moeshard::router
