// The router library end to end over HTTP, against a fake coordinator on free ports:
// completions, chat, streaming, stop strings, logprobs, token ids, OpenAI errors.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router_test_util.h"

namespace moeshard::router::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;

class RouterE2eTest : public RouterHttpTest {};

TEST_F(RouterE2eTest, CompletionEchoesThePrompt) {
  auto res =
      cli_->Post("/v1/completions",
                 Json{{"model", "test-model"}, {"prompt", "hello world"}, {"max_tokens", 5}, {"temperature", 0}}.dump(),
                 "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string request_id = res->get_header_value("X-Request-Id");
  ASSERT_FALSE(request_id.empty());
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["id"], "cmpl-" + request_id);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(j.contains("prompt_token_ids"));
  EXPECT_EQ(j["usage"], (Json{{"prompt_tokens", 11},
                              {"completion_tokens", 5},
                              {"total_tokens", 16},
                              {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
  const v1::SeqRequest seq = h_->fake().last_request();
  EXPECT_EQ(seq.max_tokens(), 5);
  EXPECT_EQ(seq.request_id(), request_id);
  EXPECT_EQ(seq.sampling().temperature(), 0.0f);
  EXPECT_EQ(std::vector<int32_t>(seq.prompt_ids().begin(), seq.prompt_ids().end()), ByteIds("hello world"));
}

TEST_F(RouterE2eTest, ClientRequestIdIsHonoured) {
  auto res = cli_->Post("/v1/completions", {{"X-Request-Id", "client-id_1.2"}},
                        Json{{"prompt", "hi"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("X-Request-Id"), "client-id_1.2");
  EXPECT_EQ(Json::parse(res->body)["id"], "cmpl-client-id_1.2");
  EXPECT_EQ(h_->fake().last_request().request_id(), "client-id_1.2");
  res = cli_->Post("/v1/completions", {{"X-Request-Id", "no spaces allowed"}},
                   Json{{"prompt", "hi"}, {"max_tokens", 1}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_NE(res->get_header_value("X-Request-Id"), "no spaces allowed");
  EXPECT_FALSE(res->get_header_value("X-Request-Id").empty());
}

TEST_F(RouterE2eTest, TokenIdPromptAndReturnTokenIds) {
  Json j = PostOk("/v1/completions", {{"prompt", {104, 105}},
                                      {"max_tokens", 3},
                                      {"return_token_ids", true},
                                      {"seed", 7},
                                      {"top_k", 5},
                                      {"top_p", 0.5},
                                      {"min_p", 0.1}});
  EXPECT_EQ(j["prompt_token_ids"], Json({104, 105}));
  EXPECT_EQ(j["choices"][0]["token_ids"], Json({104, 105, 104}));
  EXPECT_EQ(j["choices"][0]["text"], "hih");
  const v1::SeqRequest seq = h_->fake().last_request();
  EXPECT_EQ(seq.sampling().seed(), 7u);
  EXPECT_EQ(seq.sampling().top_k(), 5);
  EXPECT_FLOAT_EQ(seq.sampling().top_p(), 0.5f);
  EXPECT_FLOAT_EQ(seq.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(seq.sampling().temperature(), 1.0f);
}

TEST_F(RouterE2eTest, StopStringTruncatesAndCancelsTheCoordinator) {
  auto o = h_->fake().options();
  o.token_delay_ms = 20;  // the cancel has 12 tokens' time (240 ms) to reach it: TSan needed more than 60
  h_->fake().set_options(o);
  Json j = PostOk("/v1/completions", {{"prompt", "abc STOP def"}, {"max_tokens", 100}, {"stop", {"zzz", "STOP"}}});
  EXPECT_EQ(j["choices"][0]["text"], "abc ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], "STOP");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_TRUE(h_->fake().WaitCancelled(1, 3000)) << "the coordinator's call was not cancelled";
  EXPECT_LT(h_->fake().tokens_sent(), 20);
}

TEST_F(RouterE2eTest, EosAndStopTokenIds) {
  auto o = h_->fake().options();
  o.eos_after = 3;
  h_->fake().set_options(o);
  Json j = PostOk("/v1/completions", {{"prompt", "abcdef"}, {"max_tokens", 10}});
  EXPECT_EQ(j["choices"][0]["text"], "abc");  // EOS adds no text
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["stop_reason"].is_null());
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  j = PostOk("/v1/completions", {{"prompt", "abcdef"}, {"max_tokens", 10}, {"ignore_eos", true}});
  EXPECT_EQ(j["choices"][0]["text"], "abcdefabcd");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(h_->fake().last_request().ignore_eos());
  o.eos_after = -1;
  h_->fake().set_options(o);
  j = PostOk("/v1/completions", {{"prompt", "abcdef"}, {"max_tokens", 10}, {"stop_token_ids", {'c'}}});
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_EQ(j["choices"][0]["stop_reason"], 'c');
}

TEST_F(RouterE2eTest, DefaultMaxTokensFillsTheContext) {
  auto o = h_->fake().options();
  o.max_model_len = 20;
  h_->fake().set_options(o);
  ASSERT_TRUE(h_->WaitCoordinatorSeen([](const Json& c) { return c.value("max_model_len", 0) == 20; }));
  Json j = PostOk("/v1/completions", {{"prompt", "hello"}});
  EXPECT_EQ(h_->fake().last_request().max_tokens(), 15);
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(RouterE2eTest, SpecialTokenTextInACompletionPromptIsTextUnlessAllowed) {
  const std::string prompt = "hi<|im_start|>system";
  auto ids = [&](Json extra) {
    Json body = {{"prompt", prompt}, {"max_tokens", 1}, {"return_token_ids", true}};
    body.update(extra);
    return PostOk("/v1/completions", body)["prompt_token_ids"].get<std::vector<int32_t>>();
  };
  const std::vector<int32_t> as_text = ids(Json::object());
  EXPECT_THAT(as_text, ::testing::Not(::testing::Contains(kImStart)));
  EXPECT_EQ(ids({{"allow_special_tokens", false}}), as_text);
  const std::vector<int32_t> special = ids({{"allow_special_tokens", true}});
  EXPECT_EQ(std::count(special.begin(), special.end(), kImStart), 1);
  EXPECT_LT(special.size(), as_text.size());  // "<|im_start|>" is one token, not its bytes
}

TEST_F(RouterE2eTest, ChatUsesTheTemplate) {
  Json j = PostOk("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                           {"max_completion_tokens", 4},
                                           {"chat_template_kwargs", {{"enable_thinking", false}}}});
  EXPECT_THAT(j["id"].get<std::string>(), StartsWith("chatcmpl-"));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "user");  // the fake echoes the prompt's text
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  auto prompt = h_->fake().last_request().prompt_ids();
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  EXPECT_EQ(ids.front(), kImStart);
  EXPECT_THAT(ids, ::testing::Contains(kThink));  // enable_thinking=false: an empty think block
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>(ids.size()));

  PostOk("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}});
  prompt = h_->fake().last_request().prompt_ids();
  EXPECT_THAT(std::vector<int32_t>(prompt.begin(), prompt.end()), ::testing::Not(::testing::Contains(kThink)));
}

TEST_F(RouterE2eTest, CompletionLogprobs) {
  Json j = PostOk("/v1/completions", {{"prompt", "hel"}, {"max_tokens", 3}, {"logprobs", 2}});
  const Json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], Json({"h", "e", "l"}));
  EXPECT_EQ(lp["token_logprobs"], Json({-0.25, -0.5, -0.75}));
  EXPECT_EQ(lp["text_offset"], Json({0, 1, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0], (Json{{"h", -0.25}, {"b", -4.0}}));
  EXPECT_EQ(h_->fake().last_request().top_logprobs(), 2);
  EXPECT_TRUE(h_->fake().last_request().logprobs());
}

TEST_F(RouterE2eTest, ChatLogprobs) {
  Json j = PostOk("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                           {"max_tokens", 2},
                                           {"logprobs", true},
                                           {"top_logprobs", 2}});
  const Json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "u");
  EXPECT_EQ(content[0]["logprob"], -0.25);
  EXPECT_EQ(content[0]["bytes"], Json({'u'}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1], (Json{{"token", "b"}, {"logprob", -4.0}, {"bytes", {'b'}}}));
}

TEST_F(RouterE2eTest, StreamingCompletion) {
  auto o = h_->fake().options();
  o.cached_tokens = 4;
  h_->fake().set_options(o);
  auto res = cli_->Post("/v1/completions",
                        Json{{"prompt", "hello world"},
                             {"max_tokens", 6},
                             {"stream", true},
                             {"stream_options", {{"include_usage", true}}},
                             {"return_token_ids", true}}
                            .dump(),
                        "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_THAT(res->get_header_value("Content-Type"), StartsWith("text/event-stream"));
  SseStream s = ParseSse(res->body);
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.well_formed) << res->body;
  ASSERT_GE(s.events.size(), 3u);
  std::string text;
  std::vector<int> ids;
  for (size_t i = 0; i + 2 < s.events.size(); ++i) {
    const Json& e = s.events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["id"], "cmpl-" + res->get_header_value("X-Request-Id"));
    EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null());
    EXPECT_EQ(e.contains("prompt_token_ids"), i == 0);
    text += e["choices"][0]["text"].get<std::string>();
    for (int id : e["choices"][0]["token_ids"]) ids.push_back(id);
  }
  EXPECT_EQ(s.events[0]["prompt_token_ids"].size(), 11u);
  EXPECT_EQ(text, "hello ");
  const std::vector<int32_t> expected_ids = ByteIds("hello ");
  EXPECT_EQ(ids, std::vector<int>(expected_ids.begin(), expected_ids.end()));
  const Json& last = s.events[s.events.size() - 2];
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const Json& usage = s.events.back();
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 11);
  EXPECT_EQ(usage["usage"]["total_tokens"], 17);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST_F(RouterE2eTest, StreamingChatWithStopString) {
  auto res = cli_->Post(
      "/v1/chat/completions",
      Json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 50}, {"stream", true}, {"stop", "hi"}}
          .dump(),
      "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  SseStream s = ParseSse(res->body);
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(s.well_formed);
  ASSERT_GE(s.events.size(), 2u);
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (size_t i = 1; i + 1 < s.events.size(); ++i) {
    EXPECT_EQ(s.events[i]["object"], "chat.completion.chunk");
    content += s.events[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(content, "user\n");  // the echo is "user\nhi\n...": cut at the stop string
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s.events.back()["choices"][0]["delta"], Json::object());
  EXPECT_FALSE(s.events.back().contains("usage"));
}

struct HttpErrorCase {
  std::string path;
  std::string body;
  int status;
  std::string param;
  std::string code;
};

TEST_F(RouterE2eTest, BadRequestsGetOpenAiErrorsAndTheRouterKeepsServing) {
  const Json msgs = {{{"role", "user"}, {"content", "hi"}}};
  const std::vector<HttpErrorCase> cases = {
      {"/v1/completions", "{not json", 400, "", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"temperature", "x"}}.dump(), 400, "temperature", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"temperature", 2.5}}.dump(), 400, "temperature", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"max_tokens", -1}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"max_tokens", 1e15}}.dump(), 400, "max_tokens", ""},
      {"/v1/completions", Json{{"prompt", ""}}.dump(), 400, "prompt", ""},
      {"/v1/completions", Json{{"prompt", {999}}}.dump(), 400, "prompt", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"n", 2}}.dump(), 400, "n", ""},
      {"/v1/completions", Json{{"prompt", "hi"}, {"model", "other"}}.dump(), 404, "model", "model_not_found"},
      {"/v1/completions", Json{{"prompt", "hi"}, {"max_tokens", 5000}}.dump(), 400, "prompt",
       "context_length_exceeded"},
      {"/v1/chat/completions", Json{{"messages", Json::array()}}.dump(), 400, "messages", ""},
      {"/v1/chat/completions", Json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}.dump(), 400, "messages", ""},
      {"/v1/chat/completions", Json{{"messages", msgs}, {"top_p", 0}}.dump(), 400, "top_p", ""},
      {"/v1/chat/completions", Json{{"messages", msgs}, {"max_tokens", 4095}}.dump(), 400, "messages",
       "context_length_exceeded"},
  };
  for (const HttpErrorCase& c : cases) {
    auto res = cli_->Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << c.body;
    EXPECT_EQ(res->status, c.status) << c.body << " -> " << res->body;
    EXPECT_THAT(res->get_header_value("Content-Type"), StartsWith("application/json"));
    Json j = Json::parse(res->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << res->body;
    const Json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_EQ(e["type"], "invalid_request_error") << res->body;
    EXPECT_EQ(e["param"], c.param.empty() ? Json(nullptr) : Json(c.param)) << res->body;
    EXPECT_EQ(e["code"], c.code.empty() ? Json(nullptr) : Json(c.code)) << res->body;
  }
  // Both counts named.
  auto res = cli_->Post("/v1/completions", Json{{"prompt", "hi"}, {"max_tokens", 5000}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("4096"));
  EXPECT_THAT(res->body, HasSubstr("2 in the prompt, 5000 for the completion"));
  // Unknown routes answer in the same format.
  res = cli_->Get("/v1/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_TRUE(Json::parse(res->body, nullptr, false).contains("error"));
  // Still serving.
  Json j = PostOk("/v1/completions", {{"prompt", "ok"}, {"max_tokens", 2}});
  EXPECT_EQ(j["choices"][0]["text"], "ok");
}

TEST_F(RouterE2eTest, ModelsEndpoint) {
  auto res = cli_->Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  Json j = Json::parse(res->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "test-model");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 4096);
}

}  // namespace
}  // namespace moeshard::router::testing
