// What a user can ask of a generation, each against the in-process engine
// (reference_engine.h) run with the same options: seeded sampling with temperature, top-k,
// top-p and min-p (the draw depends only on seed and position, so the cluster must produce the
// in-process tokens exactly), seeded determinism, stop_token_ids, the model's EOS, stop strings,
// a multi-turn chat, prompts longer than the 512-token step budget, a completion that runs to
// the context limit, and a character split across tokens while streaming.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"
#include "common/tokenizer/chat_template.h"

namespace moeshard::itest {
namespace {

absl::Status NeedsReference(const Context& ctx) {
  return ctx.reference == nullptr ? Skip("needs --model (the in-process reference)") : absl::OkStatus();
}

struct Sampling {
  double temperature;
  int32_t top_k;  // 0: off
  double top_p, min_p;
};
constexpr Sampling kSamplings[] = {{0.8, 5, 1.0, 0.0}, {1.0, 0, 0.9, 0.0}, {0.7, 0, 1.0, 0.1}, {1.3, 20, 0.95, 0.02}};

GenerateOptions ReferenceOptions(const Sampling& s, uint64_t seed, int64_t n) {
  GenerateOptions o;
  o.sampling.temperature = static_cast<float>(s.temperature);
  o.sampling.top_k = s.top_k;
  o.sampling.top_p = static_cast<float>(s.top_p);
  o.sampling.min_p = static_cast<float>(s.min_p);
  o.sampling.seed = seed;
  o.sampling.has_seed = true;
  o.max_new_tokens = n;
  return o;
}

GenRequest SampledRequest(const Context& ctx, const Sampling& s, uint64_t seed, int prompt_idx) {
  GenRequest r;
  r.prompt_ids = MakePrompt(5 + 7 * prompt_idx, 300 + prompt_idx, ctx.prompt_vocab);
  r.max_tokens = 16;
  r.extra = {{"temperature", s.temperature},
             {"top_k", s.top_k == 0 ? -1 : s.top_k},
             {"top_p", s.top_p},
             {"min_p", s.min_p},
             {"seed", seed}};
  return r;
}

absl::Status SeededSamplingMatches(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  for (size_t i = 0; i < std::size(kSamplings); ++i) {
    for (int p = 0; p < 2; ++p) {
      const uint64_t seed = 1000 + 17 * i + p;
      GenRequest r = SampledRequest(ctx, kSamplings[i], seed, p);
      ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
      ASSIGN_OR_RETURN(GenerateResult want,
                       ctx.reference->Generate(r.prompt_ids, ReferenceOptions(kSamplings[i], seed, r.max_tokens)));
      RETURN_IF_ERROR(SameSampled(ctx, r.prompt_ids, want.tokens, g.token_ids,
                                  absl::StrCat("sampling set ", i, " (", r.extra.dump(), ")")));
    }
  }
  return absl::OkStatus();
}

// The same seed twice gives the same tokens; different seeds give different samples, and
// sampling is not greedy in disguise.
absl::Status SeededDeterminism(Context& ctx) {
  const Sampling& s = kSamplings[1];
  GenRequest greedy_req = SampledRequest(ctx, s, 0, 1);
  greedy_req.extra = Json::object();
  ASSIGN_OR_RETURN(GenResult greedy, ctx.api->Complete(greedy_req));
  int differs_from_greedy = 0;
  std::vector<std::vector<int32_t>> outputs;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GenRequest r = SampledRequest(ctx, s, seed, 1);
    ASSIGN_OR_RETURN(GenResult a, ctx.api->Complete(r));
    ASSIGN_OR_RETURN(GenResult b, ctx.api->CompleteStream(r));
    if (a.token_ids != b.token_ids)
      return absl::InternalError(absl::StrCat("seed ", seed, " twice: ", DescribeDiff(a.token_ids, b.token_ids)));
    differs_from_greedy += a.token_ids != greedy.token_ids;
    if (std::find(outputs.begin(), outputs.end(), a.token_ids) == outputs.end()) outputs.push_back(a.token_ids);
  }
  if (outputs.size() < 2) return absl::InternalError("6 seeds at temperature 1 all gave the same tokens");
  if (differs_from_greedy == 0) return absl::InternalError("every sampled output equals the greedy one");
  return absl::OkStatus();
}

// Served tokens against an in-process generation that stopped on `stop_id`: the cluster may list
// the stop token itself last (as vLLM does), the in-process engine does not. With the bf16
// tolerance the two may part before the stop (token_match.h); past that nothing is compared.
absl::Status SameStop(const Context& ctx, const std::vector<int32_t>& prompt, const GenResult& g,
                      const GenerateResult& want, int32_t stop_id, const std::string& what) {
  std::vector<int32_t> with_stop = want.tokens;
  with_stop.push_back(stop_id);
  if (g.token_ids != want.tokens && g.token_ids != with_stop) return SameGreedy(ctx, prompt, with_stop, g.token_ids, what);
  if (g.finish_reason != want.finish_reason) {
    return absl::InternalError(
        absl::StrCat(what, ": finish_reason '", g.finish_reason, "', in-process '", want.finish_reason, "'"));
  }
  return absl::OkStatus();
}

absl::Status StopTokenIds(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  for (int p = 0; p < 3; ++p) {
    GenRequest r;
    r.prompt_ids = MakePrompt(9 + p, 400 + p, ctx.prompt_vocab);
    r.max_tokens = 20;
    ASSIGN_OR_RETURN(auto greedy, ctx.Reference(r.prompt_ids, r.max_tokens));
    const int32_t stop_id = greedy[4 + 3 * p];
    r.extra = {{"stop_token_ids", Json::array({stop_id})}};
    ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
    GenerateOptions o;
    o.max_new_tokens = r.max_tokens;
    o.eos_ids = {stop_id};
    ASSIGN_OR_RETURN(GenerateResult want, ctx.reference->Generate(r.prompt_ids, o));
    if (want.finish_reason != "stop") return absl::InternalError("the in-process engine did not stop");
    RETURN_IF_ERROR(SameStop(ctx, r.prompt_ids, g, want, stop_id, absl::StrCat("stop_token_ids [", stop_id, "]")));
  }
  return absl::OkStatus();
}

// Without ignore_eos a generation ends at the model's EOS. Random weights rarely produce it, so
// the in-process engine first looks for prompts whose continuation reaches it (skipped when none
// does); the cluster must then end those where the in-process engine does, and run another on.
absl::Status EndsAtEos(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  const std::vector<int32_t>& eos = ctx.reference->config().eos_token_ids;
  if (eos.empty()) return Skip("the model names no EOS token");
  constexpr int kTries = 64;
  GenerateOptions o;
  o.max_new_tokens = 48;
  o.eos_ids = eos;
  std::vector<std::pair<std::vector<int32_t>, GenerateResult>> cases;
  bool have_length = false;
  for (int p = 0; p < kTries && cases.size() < 3; ++p) {
    std::vector<int32_t> prompt = MakePrompt(3 + p % 11, 500 + p, ctx.prompt_vocab);
    ASSIGN_OR_RETURN(GenerateResult want, ctx.reference->Generate(prompt, o));
    const bool stops = want.finish_reason == "stop";
    if (stops || !have_length) cases.emplace_back(std::move(prompt), std::move(want));
    have_length |= !stops;
  }
  if (cases.size() < 2) return Skip(absl::StrCat("no continuation of ", kTries, " prompts reaches EOS in-process"));
  for (const auto& [prompt, want] : cases) {
    GenRequest r;
    r.prompt_ids = prompt;
    r.max_tokens = o.max_new_tokens;
    r.ignore_eos = false;
    ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
    const int32_t last = g.token_ids.empty() ? -1 : g.token_ids.back();
    const bool served_eos = std::find(eos.begin(), eos.end(), last) != eos.end();
    RETURN_IF_ERROR(SameStop(ctx, prompt, g, want, served_eos ? last : eos[0], absl::StrCat("prompt ", FormatIds(prompt))));
  }
  return absl::OkStatus();
}

// A stop string taken from the middle of the greedy text: the served text ends right before it.
absl::Status StopStrings(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  GenRequest r;
  r.prompt_text = "Once upon a time";
  r.max_tokens = 24;
  ASSIGN_OR_RETURN(GenResult whole, ctx.api->Complete(r));
  std::string stop;
  for (size_t at = whole.text.size() / 3; at + 2 <= whole.text.size() && stop.empty(); ++at) {
    const std::string c = whole.text.substr(at, 2);
    const bool plain = std::all_of(c.begin(), c.end(), [](char ch) { return ch > ' ' && ch < 127; });
    if (plain) stop = c;
  }
  if (stop.empty()) return Skip(absl::StrCat("no two printable ASCII characters in '", whole.text, "'"));
  r.extra = {{"stop", Json::array({stop})}};
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
  const std::string want = whole.text.substr(0, whole.text.find(stop));
  if (g.text != want || g.finish_reason != "stop") {
    return absl::InternalError(
        absl::StrCat("stop '", stop, "': text '", g.text, "' (", g.finish_reason, "), want '", want, "' (stop)"));
  }
  GenerateOptions o;
  o.max_new_tokens = r.max_tokens;
  if (ctx.tolerance == Tolerance::kBf16) {
    // The served greedy text may part from the float32 engine's at a near tie (token_match.h);
    // then the stop string, taken from the served text, need not occur in the engine's.
    ASSIGN_OR_RETURN(GenerateResult plain, ctx.reference->Generate(whole.prompt_token_ids, o));
    if (plain.tokens != whole.token_ids)
      return SameGreedy(ctx, whole.prompt_token_ids, plain.tokens, whole.token_ids, "text the stop string came from");
  }
  o.stop = {stop};
  ASSIGN_OR_RETURN(GenerateResult ref, ctx.reference->Generate(whole.prompt_token_ids, o));
  if (ref.finish_reason != "stop") return absl::InternalError("the in-process engine did not stop on it");
  return absl::OkStatus();
}

absl::Status MultiTurnChat(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  const std::vector<ChatMessage> turns = {{"system", "You answer in one line."},
                                          {"user", "What is the capital of France?"},
                                          {"assistant", "Paris."},
                                          {"user", "And of Italy?"}};
  Json messages = Json::array();
  for (const ChatMessage& m : turns) messages.push_back({{"role", m.role}, {"content", m.content}});
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Chat(messages, 12, {{"ignore_eos", true}, {"return_token_ids", true}}, false));
  bool rendered = false;
  for (bool thinking : {true, false}) {
    ASSIGN_OR_RETURN(std::string text, RenderChatMl(turns, ChatOptions{true, thinking}));
    ASSIGN_OR_RETURN(auto ids, ctx.reference->tokenizer()->Encode(text));
    rendered |= ids == g.prompt_token_ids;
  }
  if (!rendered) {
    return absl::InternalError(
        absl::StrCat("prompt_token_ids ", FormatIds(g.prompt_token_ids), " are not the ChatML rendering of the turns"));
  }
  ASSIGN_OR_RETURN(auto want, ctx.Reference(g.prompt_token_ids, 12));
  return SameGreedy(ctx, g.prompt_token_ids, want, g.token_ids, "vs in-process");
  return absl::OkStatus();
}

// Prompts longer than one scheduler step's token budget (512) are prefilled in chunks.
absl::Status LongPrompts(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  for (int64_t len : {513, 700, 1300}) {
    const int64_t n = std::min<int64_t>(len, ctx.max_model_len - 10);
    GenRequest r;
    r.prompt_ids = MakePrompt(n, 600 + len, ctx.prompt_vocab);
    r.max_tokens = 8;
    ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
    ASSIGN_OR_RETURN(auto want, ctx.Reference(r.prompt_ids, r.max_tokens));
    RETURN_IF_ERROR(SameGreedy(ctx, r.prompt_ids, want, g.token_ids, absl::StrCat("prompt of ", n)));
  }
  return absl::OkStatus();
}

// Without max_tokens a completion runs to the context limit and stops with "length".
absl::Status ContextLimit(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  if (ctx.max_model_len <= 16 || ctx.max_model_len > ReferenceEngine::kMaxPositions) {
    return Skip(absl::StrCat("max_model_len ", ctx.max_model_len, " is beyond the in-process reference's ",
                             ReferenceEngine::kMaxPositions, " positions (start the cluster with --max-model-len)"));
  }
  constexpr int64_t kRoom = 6;
  GenRequest r;
  r.prompt_ids = MakePrompt(ctx.max_model_len - kRoom, 700, ctx.prompt_vocab);
  r.extra = {{"max_tokens", nullptr}};
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
  if (g.finish_reason != "length" || static_cast<int64_t>(g.token_ids.size()) != kRoom) {
    return absl::InternalError(absl::StrCat(g.token_ids.size(), " tokens (", g.finish_reason, ") after a prompt of ",
                                            r.prompt_ids.size(), "; want ", kRoom, " (length)"));
  }
  ASSIGN_OR_RETURN(auto want, ctx.Reference(r.prompt_ids, kRoom));
  RETURN_IF_ERROR(SameGreedy(ctx, r.prompt_ids, want, g.token_ids, "vs in-process"));
  r.extra = {{"max_tokens", kRoom + 1}};
  HttpResponse over = ctx.http.PostJson("/v1/completions", ctx.api->CompletionBody(r, false));
  if (over.status != 400) return absl::InternalError(absl::StrCat("one token past the limit: ", over.Describe()));
  return CheckErrorBody(over, 400);
}

bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Whether a well-formed multi-byte UTF-8 character of the tokens' bytes spans two tokens.
bool SplitsACharacter(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string bytes;
  std::vector<size_t> token_of;  // the token each byte came from
  for (size_t i = 0; i < ids.size(); ++i) {
    auto b = tok.TokenBytes(ids[i]);
    if (!b.ok()) return false;
    bytes += *b;
    token_of.resize(bytes.size(), i);
  }
  for (size_t at = 0; at < bytes.size(); ++at) {
    const auto lead = static_cast<unsigned char>(bytes[at]);
    const size_t n = (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
    if (n > 0 && at + n <= bytes.size() && ValidUtf8(bytes.substr(at, n)) && token_of[at] != token_of[at + n - 1]) {
      return true;
    }
  }
  return false;
}

// A streamed completion whose output has a character split over tokens: seeded sampling at a high temperature spreads
// the output over the vocabulary, and the in-process engine finds a seed whose tokens split one (the cluster samples
// the same tokens: SeededSamplingMatches). Every chunk's text must be whole UTF-8, and the chunks
// add up to the non-streamed text, which is the tokens' decoding as a whole (so no chunk boundary
// put a replacement character where the whole text has a character).
absl::Status SplitCharacterStreams(Context& ctx) {
  RETURN_IF_ERROR(NeedsReference(ctx));
  if (!ctx.has_tokenizer) return Skip("the model has no tokenizer");
  const Tokenizer& tok = *ctx.reference->tokenizer();
  constexpr int kTries = 64;
  constexpr Sampling kHot = {1.8, 0, 1.0, 0.0};
  GenRequest r;
  bool found = false;
  for (uint64_t seed = 1; seed <= kTries && !found; ++seed) {
    r = SampledRequest(ctx, kHot, seed, 0);
    r.max_tokens = 24;
    ASSIGN_OR_RETURN(GenerateResult out, ctx.reference->Generate(r.prompt_ids, ReferenceOptions(kHot, seed, 24)));
    found = SplitsACharacter(tok, out.tokens);
  }
  if (!found) return Skip(absl::StrCat("no sampled output of ", kTries, " seeds splits a character"));
  ASSIGN_OR_RETURN(GenResult whole, ctx.api->Complete(r));
  ASSIGN_OR_RETURN(GenResult s, ctx.api->CompleteStream(r));
  for (size_t i = 0; i < s.deltas.size(); ++i) {
    if (!ValidUtf8(s.deltas[i]))
      return absl::InternalError(absl::StrCat("chunk ", i, " is not whole UTF-8: '", s.deltas[i], "'"));
  }
  if (s.text != whole.text || s.token_ids != whole.token_ids)
    return absl::InternalError(absl::StrCat("streamed '", s.text, "' vs '", whole.text, "'"));
  std::vector<int32_t> plain;  // skip_special_tokens, the API's default
  for (int32_t id : whole.token_ids) {
    if (!tok.IsSpecial(id)) plain.push_back(id);
  }
  ASSIGN_OR_RETURN(std::string decoded, tok.Decode(plain));
  if (decoded != whole.text)
    return absl::InternalError(absl::StrCat("text '", whole.text, "', decoded '", decoded, "'"));
  return absl::OkStatus();
}

}  // namespace

void RunBehaviourChecks(Context& ctx, Suite& suite) {
  suite.Run("sampling: seeded temperature/top-k/top-p/min-p equal the in-process engine",
            [&] { return SeededSamplingMatches(ctx); });
  suite.Run("sampling: a seed repeats, seeds differ, sampling is not greedy", [&] { return SeededDeterminism(ctx); });
  suite.Run("stop_token_ids: stops where the in-process engine does", [&] { return StopTokenIds(ctx); });
  suite.Run("eos: without ignore_eos, ends at the model's EOS as in-process", [&] { return EndsAtEos(ctx); });
  suite.Run("stop: a stop string ends the text right before it", [&] { return StopStrings(ctx); });
  suite.Run("chat: a multi-turn conversation equals the in-process engine", [&] { return MultiTurnChat(ctx); });
  suite.Run("prefill: prompts of 513, 700 and 1300 tokens equal the in-process engine",
            [&] { return LongPrompts(ctx); });
  suite.Run("context: a completion without max_tokens runs to the limit; one more is refused",
            [&] { return ContextLimit(ctx); });
  suite.Run("stream: a character split across tokens arrives whole", [&] { return SplitCharacterStreams(ctx); });
}

}  // namespace moeshard::itest
