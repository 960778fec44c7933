// Prefix caching: R = P + S2 is sent with a fresh 64-token prefix P (nothing cached),
// then A = P + S1 and B = P + S2 share P. A and B must report at least 48 cached prompt
// tokens (usage and, with --metrics, prefix_cache_hits_total); B's output must
// equal R's (computed without the cache) and, with --model, all three equal the
// in-process engine's.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

constexpr int64_t kPrefix = 64, kSuffix = 16, kMinCached = 48, kOut = 12;

struct PrefixRun {
  bool ran = false;
  GenResult r, a, b, b_stream;
  std::vector<int32_t> prompt_r, prompt_a;
  double hits_delta = -1, queries_delta = -1;
};

std::vector<int32_t> Concat(const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
  std::vector<int32_t> v = x;
  v.insert(v.end(), y.begin(), y.end());
  return v;
}

absl::Status Send(Context& ctx, PrefixRun* run) {
  // A fresh prefix on every run: a long-lived cluster may hold earlier runs' blocks.
  const uint64_t nonce = std::chrono::system_clock::now().time_since_epoch().count();
  const auto prefix = MakePrompt(kPrefix, nonce, ctx.prompt_vocab);
  run->prompt_r = Concat(prefix, MakePrompt(kSuffix, nonce + 1, ctx.prompt_vocab));
  run->prompt_a = Concat(prefix, MakePrompt(kSuffix, nonce + 2, ctx.prompt_vocab));
  GenRequest r;
  r.max_tokens = kOut;
  r.prompt_ids = run->prompt_r;
  ASSIGN_OR_RETURN(run->r, ctx.api->Complete(r));
  std::optional<MetricsView> before;
  if (!ctx.opts.metrics.empty()) {
    ASSIGN_OR_RETURN(before, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
  }
  GenRequest a = r;
  a.prompt_ids = run->prompt_a;
  ASSIGN_OR_RETURN(run->a, ctx.api->Complete(a));
  ASSIGN_OR_RETURN(run->b, ctx.api->Complete(r));
  if (before.has_value()) {
    ASSIGN_OR_RETURN(MetricsView after, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
    run->hits_delta =
        after.Coord("prefix_cache_hits_total") - before->Coord("prefix_cache_hits_total");
    run->queries_delta =
        after.Coord("prefix_cache_queries_total") - before->Coord("prefix_cache_queries_total");
  }
  ASSIGN_OR_RETURN(run->b_stream, ctx.api->CompleteStream(r));
  run->ran = true;
  return absl::OkStatus();
}

absl::Status Reported(const PrefixRun& run) {
  if (run.r.cached_tokens < 0 || run.a.cached_tokens < 0) {
    return absl::InternalError("usage.prompt_tokens_details.cached_tokens is not reported");
  }
  // The reference must really have been computed without the cache.
  if (run.r.cached_tokens >= kMinCached) {
    return absl::InternalError(
        absl::StrCat("the first request with a fresh prefix reports ", run.r.cached_tokens, " cached tokens"));
  }
  using Named = std::pair<const char*, const GenResult*>;
  for (const auto& [name, g] : {Named{"second request (A)", &run.a}, Named{"third request (B)", &run.b}}) {
    if (g->cached_tokens < kMinCached || g->cached_tokens > g->prompt_tokens) {
      return absl::InternalError(absl::StrCat(name, " shares a ", kPrefix, "-token prefix but reports ",
                                              g->cached_tokens, " cached of ", g->prompt_tokens,
                                              " prompt tokens (want >= ", kMinCached, ")"));
    }
  }
  if (run.b_stream.cached_tokens < kMinCached) {
    return absl::InternalError(
        absl::StrCat("the streamed repeat reports ", run.b_stream.cached_tokens, " cached tokens in its usage chunk"));
  }
  return absl::OkStatus();
}

absl::Status SameOutputAfterPrefix(Context& ctx, const PrefixRun& run) {
  RETURN_IF_ERROR(SameGreedy(ctx, run.prompt_r, run.r.token_ids, run.b.token_ids, "cached vs uncached"));
  RETURN_IF_ERROR(
      SameGreedy(ctx, run.prompt_r, run.r.token_ids, run.b_stream.token_ids, "cached (streamed) vs uncached"));
  if (ctx.reference == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto want_r, ctx.Reference(run.prompt_r, kOut));
  RETURN_IF_ERROR(SameGreedy(ctx, run.prompt_r, want_r, run.r.token_ids, "uncached vs in-process"));
  ASSIGN_OR_RETURN(auto want_a, ctx.Reference(run.prompt_a, kOut));
  return SameGreedy(ctx, run.prompt_a, want_a, run.a.token_ids, "cached (other suffix) vs in-process");
}

absl::Status Metrics(Context& ctx, const PrefixRun& run) {
  if (ctx.opts.metrics.empty()) return Skip("needs --metrics");
  if (run.hits_delta < 2 * kMinCached) {
    return absl::InternalError(absl::StrCat("prefix_cache_hits_total rose by ", run.hits_delta,
                                            " over two requests with ", run.a.cached_tokens, " and ",
                                            run.b.cached_tokens, " cached tokens"));
  }
  if (run.queries_delta < run.hits_delta) {
    return absl::InternalError(absl::StrCat("prefix_cache_queries_total rose by ", run.queries_delta,
                                            ", less than the hits (", run.hits_delta, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

void RunPrefixCacheChecks(Context& ctx, Suite& suite) {
  PrefixRun run;
  absl::Status sent = Send(ctx, &run);
  auto need = [&](const std::function<absl::Status()>& f) { return sent.ok() ? f() : sent; };
  suite.Run("prefix cache: a shared 64-token prefix is reported cached (usage)",
            [&] { return need([&] { return Reported(run); }); });
  suite.Run("prefix cache: the cached request's output equals the uncached one",
            [&] { return need([&] { return SameOutputAfterPrefix(ctx, run); }); });
  suite.Run("prefix cache: prefix_cache_hits_total rose", [&] { return need([&] { return Metrics(ctx, run); }); });
}

}  // namespace moeshard::itest
