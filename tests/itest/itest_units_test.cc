// The pure parts of the integration suite (moeshard-itest) and `moeshard bench serve`, checked without a
// cluster: SSE framing, the Prometheus text parser, OpenAI error bodies, prompts,
// percentiles and the --pools list.
#include <gtest/gtest.h>

#include "bench/serve_bench.h"
#include "tests/itest/client.h"
#include "tests/itest/metrics_scrape.h"
#include "tests/itest/suite.h"

namespace moeshard::itest {
namespace {

std::vector<std::string> FeedAll(const std::vector<std::string>& pieces, SseParser& p) {
  std::vector<std::string> got;
  for (const auto& s : pieces) {
    p.Feed(s.data(), s.size(), [&](const std::string& d) {
      got.push_back(d);
      return true;
    });
  }
  return got;
}

TEST(SseParser, SplitsEventsAcrossReads) {
  SseParser p;
  auto got = FeedAll({"data: {\"a\"", ":1}\n\nda", "ta: [DONE]\n", "\n"}, p);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "[DONE]"}));
  EXPECT_TRUE(p.pending().empty());
}

TEST(SseParser, CrLfCommentsAndMultiLineData) {
  SseParser p;
  auto got = FeedAll({": keep-alive\r\n\r\nevent: x\r\ndata:one\r\ndata: two\r\n\r\n"}, p);
  EXPECT_EQ(got, (std::vector<std::string>{"one\ntwo"}));
}

TEST(SseParser, StopsWhenTheCallbackSaysSo) {
  SseParser p;
  int n = 0;
  std::string s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
  EXPECT_FALSE(p.Feed(s.data(), s.size(), [&](const std::string&) { return ++n < 2; }));
  EXPECT_EQ(n, 2);
}

TEST(SseParser, KeepsAnUnfinishedEvent) {
  SseParser p;
  EXPECT_TRUE(FeedAll({"data: [DONE]\n"}, p).empty());
  EXPECT_EQ(p.pending(), "data: [DONE]\n");
}

TEST(Exposition, ParsesLabelsAndValues) {
  auto s = ParseExposition(
      "# HELP moeshard:x_total help\n# TYPE moeshard:x_total counter\n"
      "moeshard:x_total{finished_reason=\"abort\",pool=\"a\\\"b\"} 3\n"
      "moeshard:h_bucket{le=\"+Inf\"} 7\nmoeshard:g 0.25 1700000000\nup 1e3\n");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[0].name, "moeshard:x_total");
  EXPECT_EQ((*s)[0].labels.at("finished_reason"), "abort");
  EXPECT_EQ((*s)[0].labels.at("pool"), "a\"b");
  EXPECT_EQ((*s)[0].value, 3);
  EXPECT_EQ((*s)[1].labels.at("le"), "+Inf");
  EXPECT_DOUBLE_EQ((*s)[2].value, 0.25);
  EXPECT_DOUBLE_EQ((*s)[3].value, 1000);
}

TEST(Exposition, RejectsGarbage) {
  EXPECT_FALSE(ParseExposition("moeshard:x{a=\"1\" 3\n").ok());
  EXPECT_FALSE(ParseExposition("moeshard:x three\n").ok());
}

TEST(SumSamples, AddsTheFamilyWhereTheLabelsMatch) {
  Scrape s;
  s.prefix = "moeshard:";
  auto parsed = ParseExposition(
      "moeshard:r_total{pool=\"short\",reason=\"x\"} 2\nmoeshard:r_total{pool=\"long\"} 5\n"
      "moeshard:r_total{pool=\"short\",reason=\"y\"} 1\nmoeshard_r_total{pool=\"short\"} 100\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  s.samples = *parsed;
  EXPECT_EQ(SumSamples(s, "r_total"), 8);
  EXPECT_EQ(SumSamples(s, "r_total", {{"pool", "short"}}), 3);
  EXPECT_EQ(SumSamples(s, "r_total", {{"pool", "short"}, {"reason", "y"}}), 1);
  EXPECT_EQ(SumSamples(s, "r_total", {{"pool", "none"}}), 0);
}

TEST(PoolSpecs, ShortestFirst) {
  auto p = ParsePoolSpecs("short:512,long:2048");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].name, "short");
  EXPECT_EQ((*p)[0].max_model_len, 512);
  EXPECT_EQ((*p)[1].name, "long");
  EXPECT_EQ((*p)[1].max_model_len, 2048);
  EXPECT_EQ((*p)[0].kv_blocks, 0);
  auto sized = ParsePoolSpecs("short:512:kvblocks=96,long:2048:kvblocks=1000");
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)[0].kv_blocks, 96);
  EXPECT_EQ((*sized)[1].kv_blocks, 1000);
  EXPECT_EQ((*sized)[1].max_model_len, 2048);
  for (const char* bad : {"short:512", "long:2048,short:512", "a:512,b:512", "a:5x,b:9", "a,b:9", ":5,b:9", "",
                          "a:5:kvblocks=0,b:9", "a:5:blocks=3,b:9", "a:5:kvblocks=x,b:9", "a:5:kvblocks=3:4,b:9"}) {
    EXPECT_FALSE(ParsePoolSpecs(bad).ok()) << bad;
  }
}

TEST(SplitUrl, BaseAndPath) {
  std::string base, path;
  SplitUrl("http://127.0.0.1:9000/metrics", &base, &path);
  EXPECT_EQ(base, "http://127.0.0.1:9000");
  EXPECT_EQ(path, "/metrics");
  SplitUrl("http://h:1", &base, &path);
  EXPECT_EQ(base, "http://h:1");
  EXPECT_EQ(path, "/metrics");
}

HttpResponse Response(int status, const std::string& body) {
  HttpResponse r;
  r.status = status;
  r.body = body;
  return r;
}

TEST(ErrorBody, AcceptsOpenAiShape) {
  EXPECT_TRUE(
      CheckErrorBody(
          Response(400, R"({"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}})"), 400)
          .ok());
  EXPECT_TRUE(
      CheckErrorBody(Response(404, R"({"error":{"message":"m","type":"t","param":"model","code":"model_not_found"}})"))
          .ok());
}

TEST(ErrorBody, RejectsOthers) {
  const std::string ok = R"({"error":{"message":"m","type":"t","param":null,"code":null}})";
  EXPECT_FALSE(CheckErrorBody(Response(500, ok)).ok());
  EXPECT_FALSE(CheckErrorBody(Response(400, ok), 401).ok());
  EXPECT_FALSE(CheckErrorBody(Response(400, "bad request")).ok());
  EXPECT_FALSE(CheckErrorBody(Response(400, R"({"error":"m"})")).ok());
  EXPECT_FALSE(CheckErrorBody(Response(400, R"({"error":{"message":"m","type":"t","code":null}})")).ok());
  EXPECT_FALSE(CheckErrorBody(Response(400, R"({"error":{"message":"","type":"t","param":null,"code":null}})")).ok());
}

TEST(MakePrompt, DeterministicAndInRange) {
  auto a = MakePrompt(100, 7, 50), b = MakePrompt(100, 7, 50), c = MakePrompt(100, 8, 50);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int32_t id : a) EXPECT_TRUE(id >= 0 && id < 50);
}

TEST(DescribeDiff, NamesTheFirstDifference) {
  EXPECT_NE(DescribeDiff({1, 2, 3}, {1, 5, 3}).find("index 1: want 2, got 5"), std::string::npos);
}

TEST(Percentile, InterpolatesBetweenRanks) {
  EXPECT_DOUBLE_EQ(bench::Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(bench::Percentile({3, 1, 2}, 50), 2);
  EXPECT_DOUBLE_EQ(bench::Percentile({1, 2, 3, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(bench::Percentile({1, 2, 3, 4}, 100), 4);
  EXPECT_NEAR(bench::Percentile({0, 10}, 99), 9.9, 1e-12);
}

}  // namespace
}  // namespace moeshard::itest
