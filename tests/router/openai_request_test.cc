// OpenAI request parsing and validation: what is accepted, the typed result, and for
// every malformed body the status (HTTP code), error type, parameter and code.
#include "router/openai_request.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CompletionRequestTest, DefaultsAndTextPrompt) {
  auto r = ParseCompletionRequest(R"({"prompt": "hello"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->prompt_is_ids);
  EXPECT_EQ(r->prompt_text, "hello");
  const GenerationParams& p = r->params;
  EXPECT_EQ(p.model, "");
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_EQ(p.sampling.temperature, 1.0f);
  EXPECT_EQ(p.sampling.top_p, 1.0f);
  EXPECT_EQ(p.sampling.top_k, 0);  // off
  EXPECT_EQ(p.sampling.min_p, 0.0f);
  EXPECT_FALSE(p.sampling.has_seed);
  EXPECT_FALSE(p.stream);
  EXPECT_FALSE(p.logprobs);
  EXPECT_TRUE(p.skip_special_tokens);
  EXPECT_FALSE(r->allow_special_tokens);
}

TEST(CompletionRequestTest, AllowSpecialTokens) {
  auto on = ParseCompletionRequest(R"({"prompt": "a<|im_end|>", "allow_special_tokens": true})");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->allow_special_tokens);
  auto off = ParseCompletionRequest(R"({"prompt": "a", "allow_special_tokens": false})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->allow_special_tokens);
  auto bad = ParseCompletionRequest(R"({"prompt": "a", "allow_special_tokens": "yes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("allow_special_tokens"), std::string::npos) << bad.status();
}

TEST(CompletionRequestTest, AllParameters) {
  auto r = ParseCompletionRequest(R"({
      "model": "m", "prompt": [[1, 2, 3]], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "top_k": 40, "min_p": 0.05, "seed": -3, "stop": ["a", "bc"], "stop_token_ids": [9],
      "ignore_eos": true, "n": 1, "logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
      "return_token_ids": true, "user": "ignored", "frequency_penalty": 0, "echo": false, "best_of": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->prompt_is_ids);
  EXPECT_THAT(r->prompt_ids, ElementsAre(1, 2, 3));
  const GenerationParams& p = r->params;
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.05f);
  EXPECT_TRUE(p.sampling.has_seed);
  EXPECT_EQ(p.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_THAT(p.stop, ElementsAre("a", "bc"));
  EXPECT_THAT(p.stop_token_ids, ElementsAre(9));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_TRUE(p.logprobs);
  EXPECT_EQ(p.top_logprobs, 3);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.return_token_ids);
}

TEST(CompletionRequestTest, PromptForms) {
  auto ids = ParseCompletionRequest(R"({"prompt": [5, 6]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->prompt_ids, ElementsAre(5, 6));
  auto one = ParseCompletionRequest(R"({"prompt": ["only"]})");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->prompt_text, "only");
  auto single_string = ParseCompletionRequest(R"({"prompt": "x", "stop": "END"})");
  ASSERT_TRUE(single_string.ok());
  EXPECT_THAT(single_string->params.stop, ElementsAre("END"));
  auto whole_float = ParseCompletionRequest(R"({"prompt": "x", "max_tokens": 16.0})");
  ASSERT_TRUE(whole_float.ok()) << whole_float.status();
  EXPECT_EQ(whole_float->params.max_tokens, 16);
  auto nulls = ParseCompletionRequest(R"({"prompt": "x", "max_tokens": null, "temperature": null, "model": null})");
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_FALSE(nulls->params.max_tokens.has_value());
}

TEST(ChatRequestTest, MessagesAndChatOptions) {
  auto r = ParseChatRequest(R"({
      "messages": [{"role": "developer", "content": "be brief"},
                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                   {"role": "assistant", "content": null}],
      "max_tokens": 3, "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 2,
      "chat_template_kwargs": {"enable_thinking": false}, "add_generation_prompt": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "a\nb");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->params.max_tokens, 5);  // max_completion_tokens wins
  EXPECT_TRUE(r->params.logprobs);
  EXPECT_EQ(r->params.top_logprobs, 2);
  EXPECT_FALSE(r->chat_options.enable_thinking);
  EXPECT_TRUE(r->chat_options.add_generation_prompt);
}

struct BadCase {
  const char* name;
  bool chat;
  std::string body;
  int http_status;
  std::string param;  // "" = null
  std::string code;   // "" = null
  std::string message_part;
};

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, GivesTheRightError) {
  const BadCase& c = GetParam();
  absl::Status st = c.chat ? ParseChatRequest(c.body).status() : ParseCompletionRequest(c.body).status();
  ASSERT_FALSE(st.ok()) << c.body;
  const HttpError e = ToHttpError(st);
  EXPECT_EQ(e.http_status, c.http_status) << st;
  EXPECT_EQ(e.body["error"]["type"], "invalid_request_error");
  if (c.param.empty()) {
    EXPECT_TRUE(e.body["error"]["param"].is_null()) << e.body.dump();
  } else {
    EXPECT_EQ(e.body["error"]["param"], c.param) << e.body.dump();
  }
  if (c.code.empty()) {
    EXPECT_TRUE(e.body["error"]["code"].is_null()) << e.body.dump();
  } else {
    EXPECT_EQ(e.body["error"]["code"], c.code);
  }
  EXPECT_THAT(std::string(st.message()), HasSubstr(c.message_part));
}

const char kMsg[] = R"("messages": [{"role": "user", "content": "hi"}])";

std::string Chat(const std::string& extra) {
  return std::string("{") + kMsg + (extra.empty() ? "" : ", " + extra) + "}";
}
std::string Completion(const std::string& extra) {
  return std::string(R"({"prompt": "hi")") + (extra.empty() ? "" : ", " + extra) + "}";
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, BadRequestTest,
    ::testing::Values(
        BadCase{"not_json", false, "{\"prompt\": ", 400, "", "", "not valid JSON"},
        BadCase{"not_object", false, "[1, 2]", 400, "", "", "JSON object"},
        BadCase{"chat_not_json", true, "nope", 400, "", "", "not valid JSON"},
        BadCase{"no_prompt", false, "{}", 400, "prompt", "", "required"},
        BadCase{"empty_prompt", false, R"({"prompt": ""})", 400, "prompt", "", "empty"},
        BadCase{"empty_prompt_list", false, R"({"prompt": []})", 400, "prompt", "", "empty"},
        BadCase{"empty_inner_list", false, R"({"prompt": [[]]})", 400, "prompt", "", "empty"},
        BadCase{"two_prompts", false, R"({"prompt": ["a", "b"]})", 400, "prompt", "", "one prompt"},
        BadCase{"prompt_number", false, R"({"prompt": 5})", 400, "prompt", "", "must be"},
        BadCase{"negative_id", false, R"({"prompt": [1, -2]})", 400, "prompt", "", "between"},
        BadCase{"mixed_prompt", false, R"({"prompt": [1, "a"]})", 400, "prompt", "", "one prompt"},
        BadCase{"temperature_high", false, Completion(R"("temperature": 2.5)"), 400, "temperature", "", "[0, 2]"},
        BadCase{"temperature_negative", false, Completion(R"("temperature": -0.1)"), 400, "temperature", "", "[0, 2]"},
        BadCase{"temperature_string", false, Completion(R"("temperature": "hot")"), 400, "temperature", "", "number"},
        BadCase{"top_p_zero", false, Completion(R"("top_p": 0)"), 400, "top_p", "", "(0, 1]"},
        BadCase{"top_p_high", true, Chat(R"("top_p": 1.5)"), 400, "top_p", "", "(0, 1]"},
        BadCase{"top_k_bad", false, Completion(R"("top_k": -2)"), 400, "top_k", "", "-1"},
        BadCase{"top_k_float", false, Completion(R"("top_k": 1.5)"), 400, "top_k", "", "integer"},
        BadCase{"min_p_high", false, Completion(R"("min_p": 1.5)"), 400, "min_p", "", "[0, 1]"},
        BadCase{"max_tokens_negative", false, Completion(R"("max_tokens": -1)"), 400, "max_tokens", "", "between"},
        BadCase{"max_tokens_zero", false, Completion(R"("max_tokens": 0)"), 400, "max_tokens", "", "between"},
        BadCase{"max_tokens_huge", false, Completion(R"("max_tokens": 1000000000000)"), 400, "max_tokens", "",
                "between"},
        BadCase{"max_tokens_huger", false, Completion(R"("max_tokens": 18446744073709551615)"), 400, "max_tokens", "",
                "between"},
        BadCase{"max_tokens_string", false, Completion(R"("max_tokens": "10")"), 400, "max_tokens", "", "integer"},
        BadCase{"max_tokens_bool", false, Completion(R"("max_tokens": true)"), 400, "max_tokens", "", "integer"},
        BadCase{"max_completion_tokens", true, Chat(R"("max_completion_tokens": -5)"), 400, "max_completion_tokens", "",
                "between"},
        BadCase{"seed_string", false, Completion(R"("seed": "1")"), 400, "seed", "", "integer"},
        BadCase{"n_two", false, Completion(R"("n": 2)"), 400, "n", "", "n=1"},
        BadCase{"n_two_chat", true, Chat(R"("n": 2)"), 400, "n", "", "n=1"},
        BadCase{"n_zero", true, Chat(R"("n": 0)"), 400, "n", "", "between"},
        BadCase{"stop_five", false, Completion(R"("stop": ["a", "b", "c", "d", "e"])"), 400, "stop", "", "at most 4"},
        BadCase{"stop_empty", false, Completion(R"("stop": "")"), 400, "stop", "", "empty"},
        BadCase{"stop_number", false, Completion(R"("stop": 5)"), 400, "stop", "", "string"},
        BadCase{"stop_list_number", false, Completion(R"("stop": ["a", 5])"), 400, "stop", "", "string"},
        BadCase{"stop_token_ids", false, Completion(R"("stop_token_ids": "x")"), 400, "stop_token_ids", "", "list"},
        BadCase{"ignore_eos", false, Completion(R"("ignore_eos": 1)"), 400, "ignore_eos", "", "boolean"},
        BadCase{"stream_string", false, Completion(R"("stream": "yes")"), 400, "stream", "", "boolean"},
        BadCase{"stream_options_no_stream", false, Completion(R"("stream_options": {"include_usage": true})"), 400,
                "stream_options", "", "stream"},
        BadCase{"logprobs_bool", false, Completion(R"("logprobs": true)"), 400, "logprobs", "", "integer"},
        BadCase{"logprobs_many", false, Completion(R"("logprobs": 21)"), 400, "logprobs", "", "between"},
        BadCase{"chat_logprobs_int", true, Chat(R"("logprobs": 2)"), 400, "logprobs", "", "boolean"},
        BadCase{"top_logprobs_alone", true, Chat(R"("top_logprobs": 2)"), 400, "top_logprobs", "", "logprobs"},
        BadCase{"top_logprobs_many", true, Chat(R"("logprobs": true, "top_logprobs": 30)"), 400, "top_logprobs", "",
                "between"},
        BadCase{"model_number", false, Completion(R"("model": 3)"), 400, "model", "", "string"},
        BadCase{"echo", false, Completion(R"("echo": true)"), 400, "echo", "", "not supported"},
        BadCase{"penalty", true, Chat(R"("presence_penalty": 0.5)"), 400, "presence_penalty", "", "not supported"},
        BadCase{"tools", true, Chat(R"("tools": [{"type": "function"}])"), 400, "tools", "", "not supported"},
        BadCase{"response_format", true, Chat(R"("response_format": {"type": "json_object"})"), 400, "response_format",
                "", "text"},
        BadCase{"no_messages", true, "{}", 400, "messages", "", "required"},
        BadCase{"empty_messages", true, R"({"messages": []})", 400, "messages", "", "empty"},
        BadCase{"messages_object", true, R"({"messages": {"role": "user"}})", 400, "messages", "", "list"},
        BadCase{"message_no_content", true, R"({"messages": [{"role": "user"}]})", 400, "messages", "", "content"},
        BadCase{"message_null_content", true,
                R"({"messages": [{"role": "system", "content": null}, {"role": "user", "content": "x"}]})", 400,
                "messages", "", "content"},
        BadCase{"message_no_role", true, R"({"messages": [{"content": "hi"}]})", 400, "messages", "", "role"},
        BadCase{"message_image", true, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
                "messages", "", "text content"},
        BadCase{"message_content_number", true, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages",
                "", "must be"},
        BadCase{"thinking_string", true, Chat(R"("chat_template_kwargs": {"enable_thinking": "no"})"), 400,
                "enable_thinking", "", "boolean"},
        BadCase{"kwargs_list", true, Chat(R"("chat_template_kwargs": [])"), 400, "chat_template_kwargs", "", "object"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(ModelNameTest, EmptyOrServedIsFineElse404) {
  EXPECT_TRUE(CheckModelName("", "served").ok());
  EXPECT_TRUE(CheckModelName("served", "served").ok());
  absl::Status st = CheckModelName("other", "served");
  const HttpError e = ToHttpError(st);
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.body["error"]["code"], "model_not_found");
  EXPECT_EQ(e.body["error"]["param"], "model");
  EXPECT_THAT(e.body["error"]["message"].get<std::string>(), HasSubstr("other"));
}

TEST(ApiErrorTest, StatusCodesMapToHttp) {
  EXPECT_EQ(ToHttpError(absl::UnauthenticatedError("x")).http_status, 401);
  EXPECT_EQ(ToHttpError(absl::UnauthenticatedError("x")).body["error"]["code"], "invalid_api_key");
  EXPECT_EQ(ToHttpError(absl::UnavailableError("x")).http_status, 503);
  EXPECT_EQ(ToHttpError(absl::InternalError("x")).http_status, 500);
  EXPECT_EQ(ToHttpError(absl::InternalError("x")).body["error"]["type"], "server_error");
  absl::Status st = WithParam(InvalidParam("a", "msg", "c1"), "b");  // the first parameter stays
  EXPECT_EQ(ErrorParam(st), "a");
  EXPECT_EQ(ErrorCode(st), "c1");
}

}  // namespace
}  // namespace moeshard::router
