// The router library in operation, against fake coordinators on free ports: readiness
// and 503s, metrics (and promtool's lint), API keys, a client that disconnects mid-stream,
// shutdown, dispatch across pools and retry after a coordinator fails.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router_test_util.h"

namespace moeshard::router::testing {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

class RouterOpsTest : public RouterHttpTest {};

TEST_F(RouterOpsTest, NotReadyGives503WithRetryAfter) {
  auto o = h_->fake().options();
  o.ready = false;
  h_->fake().set_options(o);
  ASSERT_TRUE(h_->WaitReady(503));
  auto res = cli_->Get("/ready");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(Json::parse(res->body)["pools"][0]["coordinators"][0]["ready"], false);
  res = cli_->Post("/v1/completions", Json{{"prompt", "hi"}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_TRUE(Json::parse(res->body)["error"]["message"].is_string());
  EXPECT_EQ(cli_->Get("/health")->status, 200);  // alive all the same
  o.ready = true;
  h_->fake().set_options(o);
  ASSERT_TRUE(h_->WaitReady(200));
  PostOk("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1}});
}

// Runs promtool (when installed) on `text`; returns its complaints, one per line.
std::vector<std::string> PromtoolProblems(const std::string& text) {
  const std::string path = ::testing::TempDir() + "/router_metrics.txt";
  std::ofstream(path) << text;
  FILE* p = popen(("/usr/bin/promtool check metrics < " + path + " 2>&1").c_str(), "r");
  std::vector<std::string> lines;
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) lines.emplace_back(buf);
  if (p != nullptr) pclose(p);
  std::remove(path.c_str());
  return lines;
}

TEST_F(RouterOpsTest, MetricsAreExposedAndLint) {
  PostOk("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}});
  cli_->Post("/v1/completions", "{", "application/json");
  auto res = cli_->Get("/metrics");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const std::string& m = res->body;
  EXPECT_THAT(m, HasSubstr("# TYPE moeshard_router_requests_total counter"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_requests_total{pool=\"default\"} 1"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_rejected_total{pool=\"none\",reason=\"bad_request\"} 1"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_requests_in_flight{pool=\"default\"} 0"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_http_requests_total{code=\"200\",endpoint=\"/v1/completions\"} 1"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_http_requests_total{code=\"400\",endpoint=\"/v1/completions\"} 1"));
  EXPECT_THAT(m, HasSubstr("moeshard_router_coordinator_ready{coordinator="));
  EXPECT_THAT(m, HasSubstr("moeshard_generation_tokens_total{pool=\"default\"} 2"));
  if (access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool not installed";
  // The default prefix moeshard_ is what promtool accepts: no complaint at all.
  EXPECT_THAT(PromtoolProblems(m), ::testing::IsEmpty());
}

TEST(RouterAuthTest, ApiKeyGuardsV1MetricsAndTheDetailedReady) {
  RouterHarness h(1, "", [](RouterConfig& c) { c.api_key = "sekrit"; });
  ASSERT_TRUE(h.WaitReady());
  auto cli = h.Client();
  for (const httplib::Headers& bad :
       {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong"}},
        httplib::Headers{{"Authorization", "sekrit"}}, httplib::Headers{{"Authorization", "Bearer sekrit2"}}}) {
    auto res = cli->Get("/v1/models", bad);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    Json j = Json::parse(res->body, nullptr, false);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["code"], "invalid_api_key");
    res = cli->Post("/v1/completions", bad, Json{{"prompt", "hi"}}.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
  }
  const httplib::Headers good = {{"Authorization", "Bearer sekrit"}};
  EXPECT_EQ(cli->Get("/v1/models", good)->status, 200);
  auto res = cli->Post("/v1/completions", good, Json{{"prompt", "hi"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  for (const char* open : {"/health", "/ready"}) EXPECT_EQ(cli->Get(open)->status, 200) << open;
  // Without the key /ready says only whether it is ready: no pools, addresses or errors.
  EXPECT_EQ(Json::parse(cli->Get("/ready")->body), Json({{"ready", true}}));
  EXPECT_TRUE(Json::parse(cli->Get("/ready", good)->body).contains("pools"));
  EXPECT_EQ(cli->Get("/metrics")->status, 401);
  EXPECT_EQ(cli->Get("/metrics", httplib::Headers{{"Authorization", "Bearer wrong"}})->status, 401);
  EXPECT_EQ(cli->Get("/metrics", good)->status, 200);
}

TEST_F(RouterOpsTest, ClientDisconnectCancelsTheCoordinatorCall) {
  auto o = h_->fake().options();
  o.token_delay_ms = 30;
  h_->fake().set_options(o);
  RawConnection conn(h_->router().http_port());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(conn.Send(StreamRequest(1000)));
  const std::string got = conn.ReadUntil("data: ", 3);
  ASSERT_THAT(got, HasSubstr("HTTP/1.1 200"));
  const int64_t sent_at_close = h_->fake().tokens_sent();
  conn.Close();
  ASSERT_TRUE(h_->fake().WaitCancelled(1, 5000)) << "the coordinator call was not cancelled";
  // The next token's write finds the connection gone (one token, at times two, in flight).
  EXPECT_LE(h_->fake().tokens_sent() - sent_at_close, 3);
  ASSERT_TRUE(h_->fake().WaitIdle(2000));
  // The router's accounting is back to zero.
  auto res = cli_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("moeshard_router_requests_in_flight{pool=\"default\"} 0"));
  Json ready = Json::parse(cli_->Get("/ready")->body);
  EXPECT_EQ(ready["pools"][0]["coordinators"][0]["in_flight_tokens"], 0);
}

TEST(RouterShutdownTest, ShutdownCancelsRunningStreams) {
  RouterHarness h(1, "", [](RouterConfig& c) { c.drain_timeout = absl::ZeroDuration(); });
  ASSERT_TRUE(h.WaitReady());
  auto o = h.fake().options();
  o.token_delay_ms = 20;
  h.fake().set_options(o);
  RawConnection conn(h.router().http_port());
  ASSERT_TRUE(conn.Send(StreamRequest(1000)));
  conn.ReadUntil("data: ", 2);
  std::thread stopper([&] { h.router().Shutdown(); });
  const std::string all = conn.ReadUntil("data: [DONE]", 1);
  conn.Close();  // an idle keep-alive connection would hold the server's stop for its timeout
  stopper.join();
  EXPECT_TRUE(h.fake().WaitCancelled(1, 3000));
  EXPECT_THAT(all, HasSubstr("\"error\""));
  EXPECT_THAT(all, HasSubstr("shutting down"));
  EXPECT_THAT(all, HasSubstr("data: [DONE]"));
}

TEST(RouterPoolsTest, DispatchBySizeThenLoad) {
  RouterHarness h(3, R"({"pools": [
      {"name": "large", "max_model_len": 4096, "coordinators": ["{COORD1}", "{COORD2}"]},
      {"name": "small", "max_model_len": 64, "coordinators": ["{COORD0}"]}]})");
  auto o = h.fake(1).options();
  o.outstanding_tokens = 1000;
  h.fake(1).set_options(o);
  ASSERT_TRUE(h.WaitAllCoordinatorsReady());
  ASSERT_TRUE(h.WaitCoordinatorSeen([](const Json& c) { return c.value("outstanding_tokens", 0) == 1000; }));
  auto cli = h.Client();
  auto post = [&](const Json& body) {
    auto res = cli->Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
  };
  post({{"prompt", "short"}, {"max_tokens", 10}});  // 15 tokens: the small pool
  EXPECT_EQ(h.fake(0).num_generate_calls(), 1);
  post({{"prompt", std::string(100, 'a')}, {"max_tokens", 10}});  // 110: the large pool, least loaded
  EXPECT_EQ(h.fake(2).num_generate_calls(), 1);
  EXPECT_EQ(h.fake(1).num_generate_calls(), 0);
  post({{"prompt", "short"}});  // no max_tokens: fills the small pool's context
  EXPECT_EQ(h.fake(0).last_request().max_tokens(), 59);
  auto res = cli->Post("/v1/completions", Json{{"prompt", "x"}, {"max_tokens", 4096}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("context_length_exceeded"));
  auto metrics = cli->Get("/metrics");
  EXPECT_THAT(metrics->body, HasSubstr("moeshard_router_requests_total{pool=\"small\"} 2"));
  EXPECT_THAT(metrics->body, HasSubstr("moeshard_router_requests_total{pool=\"large\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("moeshard_router_rejected_total{pool=\"none\",reason=\"context_length\"} 1"));
}

TEST(RouterPoolsTest, FailedCoordinatorIsRetriedElsewhere) {
  RouterHarness h(2, R"({"pools": [{"name": "p", "max_model_len": 4096, "coordinators": ["{COORD0}", "{COORD1}"]}]})");
  auto o = h.fake(0).options();
  o.fail_generate = true;
  h.fake(0).set_options(o);
  o = h.fake(1).options();
  o.outstanding_tokens = 50;  // so that the failing one is tried first
  h.fake(1).set_options(o);
  ASSERT_TRUE(h.WaitAllCoordinatorsReady());
  ASSERT_TRUE(h.WaitCoordinatorSeen([](const Json& c) { return c.value("outstanding_tokens", 0) == 50; }));
  auto cli = h.Client();
  auto res = cli->Post("/v1/completions", Json{{"prompt", "retry"}, {"max_tokens", 3}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(Json::parse(res->body)["choices"][0]["text"], "ret");
  EXPECT_EQ(h.fake(0).num_generate_calls(), 1);
  EXPECT_EQ(h.fake(1).num_generate_calls(), 1);
}

}  // namespace
}  // namespace moeshard::router::testing

namespace moeshard::router::testing {
namespace {

// Prompt text past --max-prompt-bytes is refused with 400 before it reaches the tokenizer (or
// a coordinator); a body past six times the limit gets 413 before it is read.
TEST(RouterLimitsTest, PromptBytesAreCheckedBeforeTokenizing) {
  RouterHarness h(1, "", [](RouterConfig& c) { c.max_prompt_bytes = 1000; });
  ASSERT_TRUE(h.WaitReady());
  auto cli = h.Client();
  auto res = cli->Post("/v1/completions", Json{{"prompt", std::string(1001, 'a')}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, HasSubstr("limit of 1000"));
  Json chat = {{"messages", {{{"role", "user"}, {"content", std::string(600, 'a')}}, {{"role", "user"}, {"content", std::string(600, 'b')}}}}};
  res = cli->Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(h.fake().num_generate_calls(), 0);
  res = cli->Post("/v1/completions", Json{{"prompt", std::string(2 << 20, 'a')}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  res = cli->Post("/v1/completions", Json{{"prompt", std::string(999, 'a')}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

}  // namespace
}  // namespace moeshard::router::testing
