// Logprobs: completions' logprobs=3 and chat's logprobs/top_logprobs present, consistent and
// most likely first, and every value (each chosen token's logprob and the top-3 at every
// position) equal to the in-process fp32 engine's log-softmax within the fp32 tolerance, so a
// wrong normalization (a temperature applied twice, logits instead of logprobs, a stale lse)
// fails here.
#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

constexpr int kTop = 3, kTokens = 5;

using Served = ServedLogprobs;

// One position's alternatives, in the order listed: a list of {token, logprob} or a {token: logprob} map.
absl::StatusOr<std::vector<double>> TopValues(const Json& top, const std::string& where) {
  std::vector<double> v;
  if (top.is_array()) {
    for (const Json& e : top) {
      if (!e.contains("logprob") || !e["logprob"].is_number())
        return absl::InternalError(absl::StrCat(where, ": entry without logprob"));
      v.push_back(e["logprob"]);
    }
  } else if (top.is_object()) {
    for (auto it = top.begin(); it != top.end(); ++it) v.push_back(it.value().get<double>());
  } else {
    return absl::InternalError(absl::StrCat(where, ": top_logprobs is neither a list nor a map"));
  }
  return v;
}

absl::Status CheckTop(const Json& top, double chosen, const std::string& where, std::vector<double>* out) {
  ASSIGN_OR_RETURN(std::vector<double> v, TopValues(top, where));
  if (v.size() != kTop)
    return absl::InternalError(absl::StrCat(where, ": ", v.size(), " alternatives, want ", kTop, ": ", top.dump()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] <= 1e-6)) return absl::InternalError(absl::StrCat(where, ": logprob ", v[i], " > 0"));
    if (top.is_array() && i > 0 && v[i] > v[i - 1] + 1e-6) {
      return absl::InternalError(
          absl::StrCat(where, ": alternatives not most likely first (as OpenAI and vLLM list them): ", top.dump()));
    }
  }
  std::sort(v.begin(), v.end(), std::greater<>());
  // Greedy: the chosen token is the most likely one.
  if (std::fabs(v[0] - chosen) > 1e-3) {
    return absl::InternalError(
        absl::StrCat(where, ": greedy token's logprob ", chosen, " but the best alternative has ", v[0]));
  }
  *out = std::move(v);
  return absl::OkStatus();
}

// The served values against the in-process engine's (token_match.h: SameLogprobs).
absl::Status LogprobsMatchReference(Context& ctx, const Served& s) {
  if (ctx.reference == nullptr) return Skip("needs --model (the in-process reference)");
  return SameLogprobs(ctx, s);
}

absl::Status CompletionLogprobs(Context& ctx, Served* s) {
  GenRequest r;
  r.prompt_ids = MakePrompt(6, 2, ctx.prompt_vocab);
  r.max_tokens = kTokens;
  r.extra = {{"logprobs", kTop}};
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
  const Json& lp = g.logprobs;
  if (!lp.is_object()) return absl::InternalError(absl::StrCat("choices[0].logprobs is not an object: ", lp.dump()));
  for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    if (!lp.contains(k) || !lp[k].is_array() || lp[k].size() != kTokens) {
      return absl::InternalError(absl::StrCat("logprobs.", k, " is not a list of 5: ", lp.dump().substr(0, 300)));
    }
  }
  s->prompt = r.prompt_ids;
  s->tokens = g.token_ids;
  for (size_t i = 0; i < kTokens; ++i) {
    if (!lp["token_logprobs"][i].is_number()) return absl::InternalError("a token_logprob is not a number");
    s->chosen.push_back(lp["token_logprobs"][i]);
    s->top.emplace_back();
    RETURN_IF_ERROR(CheckTop(lp["top_logprobs"][i], s->chosen.back(), absl::StrCat("position ", i), &s->top.back()));
  }
  return absl::OkStatus();
}

absl::Status ChatLogprobs(Context& ctx, Served* s) {
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  Json messages = Json::array({{{"role", "user"}, {"content", "Count to five."}}});
  ASSIGN_OR_RETURN(
      GenResult g,
      ctx.api->Chat(messages, kTokens,
                    {{"logprobs", true}, {"top_logprobs", kTop}, {"ignore_eos", true}, {"return_token_ids", true}},
                    false));
  const Json& c = g.response["choices"][0];
  if (!c.contains("logprobs") || !c["logprobs"].is_object() || !c["logprobs"].contains("content") ||
      !c["logprobs"]["content"].is_array()) {
    return absl::InternalError(absl::StrCat("choices[0].logprobs.content missing: ", c.dump().substr(0, 300)));
  }
  const Json& content = c["logprobs"]["content"];
  if (static_cast<int64_t>(content.size()) != g.completion_tokens) {
    return absl::InternalError(absl::StrCat(content.size(), " logprobs entries for ", g.completion_tokens, " tokens"));
  }
  s->prompt = g.prompt_token_ids;
  s->tokens = g.token_ids;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& e = content[i];
    if (!e.contains("token") || !e["token"].is_string() || !e.contains("logprob") || !e["logprob"].is_number() ||
        !e.contains("top_logprobs")) {
      return absl::InternalError(absl::StrCat("entry ", i, " lacks token / logprob / top_logprobs: ", e.dump()));
    }
    s->chosen.push_back(e["logprob"]);
    s->top.emplace_back();
    RETURN_IF_ERROR(CheckTop(e["top_logprobs"], s->chosen.back(), absl::StrCat("position ", i), &s->top.back()));
  }
  return absl::OkStatus();
}

}  // namespace

void RunLogprobChecks(Context& ctx, Suite& suite) {
  Served completion, chat;
  suite.Run("completions: logprobs=3 present and sorted", [&] { return CompletionLogprobs(ctx, &completion); });
  suite.Run("completions: logprobs and top-3 equal the in-process engine's", [&] {
    return completion.chosen.empty() ? Skip("the check above got no logprobs")
                                     : LogprobsMatchReference(ctx, completion);
  });
  suite.Run("chat: logprobs/top_logprobs present and sorted", [&] { return ChatLogprobs(ctx, &chat); });
  suite.Run("chat: logprobs and top_logprobs equal the in-process engine's", [&] {
    return chat.chosen.empty() ? Skip("the check above got no logprobs") : LogprobsMatchReference(ctx, chat);
  });
}

}  // namespace moeshard::itest
