#include "tests/itest/suite.h"

#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moeshard::itest {

absl::Status Skip(const std::string& why) { return absl::UnimplementedError(why); }

void Suite::Run(const std::string& name, const std::function<absl::Status()>& check) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = check();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A check of a second or more says how long it took (where an e2e stage's time goes).
  const std::string took = s >= 1 ? absl::StrCat(" (", static_cast<int64_t>(s * 10) / 10.0, " s)") : "";
  if (st.ok()) {
    ++passed_;
    std::printf("ok  %s%s\n", name.c_str(), took.c_str());
  } else if (st.code() == absl::StatusCode::kUnimplemented) {
    ++skipped_;
    std::printf("skip %s: %s\n", name.c_str(), std::string(st.message()).c_str());
  } else {
    ++failed_;
    std::printf("FAIL %s: %s%s\n", name.c_str(), std::string(st.message()).c_str(), took.c_str());
  }
  std::fflush(stdout);
}

Context::Context(ItestOptions o) : opts(std::move(o)), http(opts.url, opts.api_key), tolerance(opts.tolerance) {}

absl::StatusOr<std::vector<int32_t>> Context::Reference(const std::vector<int32_t>& prompt, int64_t n) const {
  if (reference == nullptr) return Skip("needs --model (the in-process reference)");
  return reference->Greedy(prompt, n);
}

absl::Status StillServes(const Context& ctx, bool stream, uint64_t seed, int64_t max_tokens) {
  GenRequest r;
  r.prompt_ids = MakePrompt(6, seed, ctx.prompt_vocab);
  r.max_tokens = max_tokens;
  ASSIGN_OR_RETURN(GenResult g, stream ? ctx.api->CompleteStream(r) : ctx.api->Complete(r));
  if (static_cast<int64_t>(g.token_ids.size()) != max_tokens)
    return absl::InternalError(absl::StrCat(g.token_ids.size(), " tokens, want ", max_tokens));
  return absl::OkStatus();
}

}  // namespace moeshard::itest
