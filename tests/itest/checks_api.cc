// OpenAI API formats: completions streamed and not (the same tokens both ways, SSE
// chunks that parse and end in [DONE]), text prompts and chat when the model has a
// tokenizer. Logprobs: checks_logprobs.cc.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

absl::Status SameOutput(const GenResult& a, const GenResult& b, const std::string& what) {
  if (a.token_ids != b.token_ids)
    return absl::InternalError(absl::StrCat(what, ": token ids differ: ", DescribeDiff(a.token_ids, b.token_ids)));
  if (a.text != b.text)
    return absl::InternalError(absl::StrCat(what, ": text differs: '", a.text, "' vs '", b.text, "'"));
  if (a.finish_reason != b.finish_reason) {
    return absl::InternalError(absl::StrCat(what, ": finish_reason ", a.finish_reason, " vs ", b.finish_reason));
  }
  return absl::OkStatus();
}

absl::Status CompletionFormat(Context& ctx, GenResult* out) {
  GenRequest r;
  r.prompt_ids = MakePrompt(8, 1, ctx.prompt_vocab);
  r.max_tokens = 8;
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
  if (g.finish_reason != "length")
    return absl::InternalError(absl::StrCat("finish_reason '", g.finish_reason, "' with ignore_eos"));
  if (g.token_ids.size() != 8) return absl::InternalError(absl::StrCat(g.token_ids.size(), " token_ids, want 8"));
  if (g.prompt_token_ids != r.prompt_ids) {
    return absl::InternalError(
        absl::StrCat("prompt_token_ids ", FormatIds(g.prompt_token_ids), " != the prompt ", FormatIds(r.prompt_ids)));
  }
  if (g.prompt_tokens != 8)
    return absl::InternalError(absl::StrCat("usage.prompt_tokens ", g.prompt_tokens, ", want 8"));
  for (int32_t id : g.token_ids) {
    if (id < 0 || (ctx.vocab > 0 && id >= ctx.vocab))
      return absl::InternalError(absl::StrCat("token id ", id, " outside the vocabulary"));
  }
  if (!g.response.contains("created") || !g.response["created"].is_number_integer()) {
    return absl::InternalError("response without an integer 'created'");
  }
  if (g.response.value("model", "") != ctx.model_name)
    return absl::InternalError("response 'model' is not the served model");
  *out = g;
  return absl::OkStatus();
}

absl::Status CompletionStream(Context& ctx, const GenResult& whole) {
  if (whole.token_ids.empty()) return Skip("the non-streamed completion failed");
  GenRequest r;
  r.prompt_ids = MakePrompt(8, 1, ctx.prompt_vocab);
  r.max_tokens = 8;
  ASSIGN_OR_RETURN(GenResult s, ctx.api->CompleteStream(r));
  if (s.num_chunks < 2) return absl::InternalError(absl::StrCat("only ", s.num_chunks, " chunks for 8 tokens"));
  if (s.completion_tokens < 0) return absl::InternalError("no usage chunk with stream_options.include_usage");
  return SameOutput(whole, s, "stream vs non-stream");
}

absl::Status TextPrompt(Context& ctx) {
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  GenRequest r;
  r.prompt_text = "The quick brown fox jumps over the lazy dog.";
  r.max_tokens = 10;
  ASSIGN_OR_RETURN(GenResult a, ctx.api->Complete(r));
  ASSIGN_OR_RETURN(GenResult b, ctx.api->CompleteStream(r));
  RETURN_IF_ERROR(SameOutput(a, b, "stream vs non-stream"));
  if (ctx.reference != nullptr) {
    ASSIGN_OR_RETURN(auto ids, ctx.reference->tokenizer()->Encode(r.prompt_text));
    if (ids != a.prompt_token_ids)
      return absl::InternalError(absl::StrCat("prompt_token_ids ", DescribeDiff(ids, a.prompt_token_ids)));
    ASSIGN_OR_RETURN(auto want, ctx.Reference(ids, 10));
    RETURN_IF_ERROR(SameGreedy(ctx, ids, want, a.token_ids, "vs in-process engine"));
  }
  return absl::OkStatus();
}

absl::Status Chat(Context& ctx) {
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  Json messages = Json::array(
      {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name three colours."}}});
  Json extra = {{"ignore_eos", true}, {"return_token_ids", true}};
  ASSIGN_OR_RETURN(GenResult a, ctx.api->Chat(messages, 12, extra, false));
  if (a.response.value("object", "") != "chat.completion") return absl::InternalError("object is not chat.completion");
  if (a.finish_reason != "length" || a.completion_tokens != 12) {
    return absl::InternalError(
        absl::StrCat("finish_reason ", a.finish_reason, ", ", a.completion_tokens, " tokens; want length, 12"));
  }
  ASSIGN_OR_RETURN(GenResult b, ctx.api->Chat(messages, 12, extra, true));
  if (b.num_chunks < 2) return absl::InternalError(absl::StrCat("the stream had ", b.num_chunks, " chunks"));
  if (a.text != b.text) return absl::InternalError(absl::StrCat("streamed content '", b.text, "' != '", a.text, "'"));
  if (ctx.reference != nullptr && !a.prompt_token_ids.empty() && !a.token_ids.empty()) {
    ASSIGN_OR_RETURN(auto want, ctx.Reference(a.prompt_token_ids, 12));
    RETURN_IF_ERROR(SameGreedy(ctx, a.prompt_token_ids, want, a.token_ids, "vs in-process engine"));
  }
  return absl::OkStatus();
}

}  // namespace

void RunApiChecks(Context& ctx, Suite& suite) {
  GenResult whole;
  suite.Run("completions: token-id prompt, OpenAI response format", [&] { return CompletionFormat(ctx, &whole); });
  suite.Run("completions: SSE stream equals the non-streamed response", [&] { return CompletionStream(ctx, whole); });
  suite.Run("completions: text prompt, streamed and not", [&] { return TextPrompt(ctx); });
  suite.Run("chat: completions streamed and not, same content", [&] { return Chat(ctx); });
}

}  // namespace moeshard::itest
