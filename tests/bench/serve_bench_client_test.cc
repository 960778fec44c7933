// `moeshard bench serve`'s client (bench/serve_bench_client.h) against a fake
// OpenAI-compatible server on 127.0.0.1 that frames its server-sent events the ways real
// servers do: events split across writes, several events in one write, `data:` without the
// space, keep-alive comments, a usage chunk without choices, text that is not valid UTF-8,
// and the failures (a stream cut before [DONE], an error event, an event that is not JSON,
// an HTTP error status), each of which must name its cause.
#include <httplib.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/serve_bench_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moeshard::bench {
namespace {

using ::testing::HasSubstr;

std::string Chunk(const std::string& text) { return "data: {\"choices\":[{\"index\":0,\"text\":\"" + text + "\"}]}\n\n"; }
std::string Usage(int n) {
  return "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":16,\"completion_tokens\":" + std::to_string(n) + "}}\n\n";
}

// The pieces each scenario writes, one write each, 5 ms apart (the first after 30 ms).
std::vector<std::string> Pieces(const std::string& model) {
  if (model == "split") {
    return {"da", "ta: {\"choices\":[{\"te", "xt\":\"a\"}]}\r", "\n\r\n", Chunk("b").substr(0, 7), Chunk("b").substr(7),
            Chunk("c"), Usage(3), "data: [DO", "NE]\n\n"};
  }
  if (model == "coalesced") {
    return {": keep-alive\n\n" + Chunk("a") + "data:{\"choices\":[{\"text\":\"b\"}]}\n\n" + ": ping\n\n" + Chunk("c") +
                Chunk("d") + Usage(4) + "data: [DONE]\n\n"};
  }
  if (model == "no-usage") return {Chunk("a"), Chunk(""), Chunk("b"), "data: [DONE]\n\n"};
  if (model == "token-ids") {
    return {"data: {\"choices\":[{\"text\":\"a\",\"token_ids\":[5]}]}\n\n",
            "data: {\"choices\":[{\"text\":\"bc\",\"token_ids\":[6,7]}]}\n\n", "data: [DONE]\n\n"};
  }
  if (model == "bad-utf8") return {Chunk("\xff"), Chunk("\xe4\xbd"), Usage(2), "data: [DONE]\n\n"};
  if (model == "cut") return {Chunk("a"), Chunk("b")};
  if (model == "error-event") return {Chunk("a"), "data: {\"error\":{\"code\":503,\"message\":\"slot unavailable\"}}\n\n"};
  if (model == "garbage") return {Chunk("a"), "data: {\"choices\": [oops\n\n", "data: [DONE]\n\n"};
  return {};
}

class FakeServer {
 public:
  FakeServer() {
    server_.Post("/v1/completions", [](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body);
      const std::string model = body["model"];
      if (model == "http-400") {
        res.status = 400;
        res.set_content("{\"error\":{\"message\":\"prompt too long\"}}", "application/json");
        return;
      }
      if (!body.value("stream", false)) {
        res.set_content("{\"choices\":[{\"text\":\"ab\"}],\"usage\":{\"prompt_tokens\":16,\"completion_tokens\":2}}",
                        "application/json");
        return;
      }
      auto pieces = std::make_shared<std::vector<std::string>>(Pieces(model));
      res.set_chunked_content_provider("text/event-stream", [pieces](size_t, httplib::DataSink& sink) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        for (const std::string& p : *pieces) {
          if (!sink.write(p.data(), p.size())) return false;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        sink.done();
        return true;
      });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

Timing Send(const FakeServer& s, const std::string& model, bool stream = true) {
  openai_client::HttpClient http(s.url(), "", 10);
  RequestConfig c;
  c.model = model;
  c.prompt_len = 16;
  c.output_len = 4;
  c.stream = stream;
  return RunRequest(c, http, 0);
}

// Each good framing: content chunks, output tokens (usage when sent, else token ids or
// text pieces counted; an empty text piece carries no token), whether usage was seen.
TEST(ServeBenchClient, GoodStreamsAreTimedAndCounted) {
  struct Good {
    std::string model;
    int64_t chunks, tokens;
    bool usage;
    size_t gaps;  // inter-token latencies: a chunk of n token ids after the first adds n
  };
  const std::vector<Good> cases = {{"split", 3, 3, true, 2},      {"coalesced", 4, 4, true, 3},
                                   {"no-usage", 2, 2, false, 1},  {"bad-utf8", 2, 2, true, 1},
                                   {"token-ids", 2, 3, false, 2}};
  FakeServer s;
  for (const Good& g : cases) {
    Timing t = Send(s, g.model);
    ASSERT_TRUE(t.ok) << g.model << ": " << t.error;
    EXPECT_EQ(t.chunks, g.chunks) << g.model;
    EXPECT_EQ(t.output_tokens, g.tokens) << g.model;
    EXPECT_EQ(t.usage_seen, g.usage) << g.model;
    if (g.usage) {
      EXPECT_EQ(t.prompt_tokens, 16) << g.model;
    }
    EXPECT_EQ(t.itl_s.size(), g.gaps) << g.model;
    EXPECT_GE(t.ttft_s, 0.025) << g.model;  // the server waits 30 ms before its first write
    EXPECT_GE(t.e2e_s, t.ttft_s) << g.model;
  }
}

// Each failure, and what its error must say.
TEST(ServeBenchClient, FailuresNameTheirCause) {
  struct Failure {
    std::string model;
    std::vector<std::string> says;
  };
  const std::vector<Failure> cases = {
      {"cut", {"without [DONE] after 2 events", "\"text\":\"b\""}},
      {"error-event", {"error event", "slot unavailable"}},
      {"garbage", {"event 2 is not a JSON object", "[oops"}},
      {"http-400", {"400", "prompt too long"}},
  };
  FakeServer s;
  for (const Failure& f : cases) {
    Timing t = Send(s, f.model);
    EXPECT_FALSE(t.ok) << f.model;
    for (const std::string& want : f.says) EXPECT_THAT(t.error, HasSubstr(want)) << f.model;
  }
}

TEST(ServeBenchClient, UnstreamedUsesUsage) {
  FakeServer s;
  Timing t = Send(s, "plain", false);
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_EQ(t.output_tokens, 2);
  EXPECT_EQ(t.prompt_tokens, 16);
}

TEST(ServeBenchClient, NoServerIsATransportError) {
  openai_client::HttpClient http("http://127.0.0.1:1", "", 2);
  RequestConfig c;
  c.stream = true;
  Timing t = RunRequest(c, http, 0);
  EXPECT_FALSE(t.ok);
  EXPECT_THAT(t.error, HasSubstr("no response"));
}

TEST(ServeBenchClient, EscapedShowsBytes) {
  EXPECT_EQ(Escaped("a\nb\xff"), "a\\x0ab\\xff");
  EXPECT_EQ(Escaped("abcdef", 3), "abc... (6 bytes)");
}

}  // namespace
}  // namespace moeshard::bench
