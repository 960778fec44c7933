// Pools by length (`moeshard-itest --pools short:512,long:2048`, a cluster started with
// `moeshard up --pools FILE`, one coordinator per pool): each request lands in the smallest
// pool whose max_model_len holds prompt + max_tokens (router/pools.h; vLLM refuses a request
// whose prompt + max_tokens exceeds max_model_len, so the router counts both), and one that
// no pool holds is a 400 context_length_exceeded naming the largest pool's limit.
//
// Where a request went is read from two independent places, never from logs: the router's
// per-pool counter <prefix>router_requests_total{pool=NAME}, and the coordinators' own
// /metrics (request_success_total and prompt_tokens_total of the coordinator of that pool
// move by one request and its prompt, prefilled or found in its prefix cache; the other
// pool's do not move). --metrics lists the coordinators in the order of the pools (as
// `moeshard up` prints them), and --pools names them in that same order.
#include <functional>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "tests/itest/suite.h"

namespace moeshard::itest {
namespace {

// What each pool has counted so far: the router's dispatches and its coordinator's requests
// and prompt tokens.
struct PoolCounts {
  double dispatched = 0, succeeded = 0, prompt_tokens = 0;
};
struct Counts {
  std::vector<PoolCounts> pools;  // in the order of --pools
  double context_refusals = 0;    // router_rejected_total{pool="none", reason="context_length"}
};

// The coordinators' scrapes in the order of --metrics, one a pool.
absl::StatusOr<std::vector<const Scrape*>> PoolCoordinators(const Context& ctx, const MetricsView& v) {
  std::vector<const Scrape*> coords;
  for (const Scrape& s : v.scrapes()) {
    if (s.coordinator) coords.push_back(&s);
  }
  if (coords.size() != ctx.opts.pools.size()) {
    return absl::FailedPreconditionError(absl::StrCat("--metrics lists ", coords.size(), " coordinators for ",
                                                      ctx.opts.pools.size(), " pools (one coordinator per pool)"));
  }
  return coords;
}

absl::StatusOr<Counts> CountPools(const Context& ctx) {
  ASSIGN_OR_RETURN(MetricsView v, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
  const Scrape* router = nullptr;
  for (const Scrape& s : v.scrapes()) {
    if (!s.coordinator && router == nullptr && s.text.find("router_requests_total") != std::string::npos) router = &s;
  }
  if (router == nullptr) return absl::FailedPreconditionError("no router among the --metrics URLs");
  ASSIGN_OR_RETURN(std::vector<const Scrape*> coords, PoolCoordinators(ctx, v));
  Counts out;
  out.context_refusals = SumSamples(*router, "router_rejected_total", {{"pool", "none"}, {"reason", "context_length"}});
  out.pools.resize(coords.size());
  for (size_t i = 0; i < coords.size(); ++i) {
    out.pools[i].dispatched = SumSamples(*router, "router_requests_total", {{"pool", ctx.opts.pools[i].name}});
    out.pools[i].succeeded = SumSamples(*coords[i], "request_success_total");
    // Prefilled + found in the prefix cache: the whole prompt, wherever it came from.
    out.pools[i].prompt_tokens =
        SumSamples(*coords[i], "prompt_tokens_total") + SumSamples(*coords[i], "prefix_cache_hits_total");
  }
  return out;
}

// Sends prompt_len tokens with max_tokens and checks that exactly pool `want` counted it.
absl::Status LandsIn(Context& ctx, int64_t prompt_len, int64_t max_tokens, size_t want, uint64_t seed) {
  ASSIGN_OR_RETURN(auto before, CountPools(ctx));
  GenRequest r;
  r.prompt_ids = MakePrompt(prompt_len, seed, ctx.prompt_vocab);
  r.max_tokens = max_tokens;
  ASSIGN_OR_RETURN(GenResult g, ctx.api->Complete(r));
  if (static_cast<int64_t>(g.token_ids.size()) != max_tokens) {
    return absl::InternalError(absl::StrCat(g.token_ids.size(), " tokens generated, want ", max_tokens));
  }
  ASSIGN_OR_RETURN(auto after, CountPools(ctx));
  for (size_t i = 0; i < after.pools.size(); ++i) {
    const std::string& name = ctx.opts.pools[i].name;
    const double dispatched = after.pools[i].dispatched - before.pools[i].dispatched;
    const double succeeded = after.pools[i].succeeded - before.pools[i].succeeded;
    const double prompt = after.pools[i].prompt_tokens - before.pools[i].prompt_tokens;
    const bool here = i == want;
    if (dispatched != (here ? 1 : 0)) {
      return absl::InternalError(
          absl::StrCat("router_requests_total{pool=\"", name, "\"} moved by ", dispatched, ", want ", here ? 1 : 0));
    }
    if (succeeded != (here ? 1 : 0)) {
      return absl::InternalError(absl::StrCat("pool ", name, "'s coordinator: request_success_total moved by ",
                                              succeeded, ", want ", here ? 1 : 0));
    }
    // Every prompt token is either prefilled or a prefix-cache hit on this pool's coordinator.
    if (prompt != (here ? prompt_len : 0)) {
      return absl::InternalError(absl::StrCat("pool ", name,
                                              "'s coordinator: prompt tokens (prefilled + cached) moved by ", prompt,
                                              ", want ", here ? prompt_len : 0));
    }
  }
  return absl::OkStatus();
}

// A request no pool holds: 400 context_length_exceeded naming the largest limit and the
// request's own count; nothing dispatched anywhere, one context_length refusal at the router.
absl::Status RefusedEverywhere(Context& ctx, int64_t prompt_len, std::optional<int64_t> max_tokens) {
  const int64_t largest = ctx.opts.pools.back().max_model_len;
  ASSIGN_OR_RETURN(auto before, CountPools(ctx));
  Json body = {{"model", ctx.model_name}, {"prompt", MakePrompt(prompt_len, 77, ctx.prompt_vocab)}};
  if (max_tokens) body["max_tokens"] = *max_tokens;
  HttpResponse r = ctx.http.PostJson("/v1/completions", body);
  RETURN_IF_ERROR(CheckErrorBody(r, 400));
  Json e = Json::parse(r.body)["error"];
  if (e.value("code", Json()) != "context_length_exceeded") {
    return absl::InternalError(absl::StrCat("error.code is not context_length_exceeded: ", r.Describe()));
  }
  const std::string msg = e.value("message", std::string());
  const int64_t asked = prompt_len + max_tokens.value_or(0);
  for (int64_t n : {largest, max_tokens ? asked : prompt_len}) {
    if (msg.find(absl::StrCat(" ", n, " tokens")) == std::string::npos) {
      return absl::InternalError(absl::StrCat("the message does not name ", n, " tokens: ", msg));
    }
  }
  ASSIGN_OR_RETURN(auto after, CountPools(ctx));
  for (size_t i = 0; i < after.pools.size(); ++i) {
    if (after.pools[i].dispatched != before.pools[i].dispatched ||
        after.pools[i].succeeded != before.pools[i].succeeded) {
      return absl::InternalError(absl::StrCat("pool ", ctx.opts.pools[i].name, " counted the refused request"));
    }
  }
  if (after.context_refusals != before.context_refusals + 1) {
    return absl::InternalError(absl::StrCat("router_rejected_total{pool=\"none\",reason=\"context_length\"} moved by ",
                                            after.context_refusals - before.context_refusals, ", want 1"));
  }
  return absl::OkStatus();
}

// Each pool's coordinator holds the full-attention KV blocks its pool set (`up --pools`' per-pool
// num_kv_blocks): used + cached + free of kv_blocks{kind="full"} on its own /metrics.
absl::Status PoolsKeepTheirOwnKv(const Context& ctx) {
  ASSIGN_OR_RETURN(MetricsView v, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
  ASSIGN_OR_RETURN(std::vector<const Scrape*> coords, PoolCoordinators(ctx, v));
  for (size_t i = 0; i < coords.size(); ++i) {
    const PoolSpec& p = ctx.opts.pools[i];
    if (p.kv_blocks == 0) continue;
    const double total = SumSamples(*coords[i], "kv_blocks", {{"kind", "full"}});
    if (total != static_cast<double>(p.kv_blocks)) {
      return absl::InternalError(absl::StrCat("pool ", p.name, "'s coordinator holds ", total,
                                              " full KV blocks (kv_blocks{kind=\"full\"}), want its own ", p.kv_blocks));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PoolSpec>> ParsePoolSpecs(const std::string& text) {
  std::vector<PoolSpec> pools;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    PoolSpec p;
    const bool blocks_ok = parts.size() == 2 || (parts.size() == 3 && absl::StartsWith(parts[2], "kvblocks=") &&
                                                 absl::SimpleAtoi(parts[2].substr(9), &p.kv_blocks) && p.kv_blocks > 0);
    if (!blocks_ok || parts[0].empty() || !absl::SimpleAtoi(parts[1], &p.max_model_len) || p.max_model_len < 2) {
      return absl::InvalidArgumentError(absl::StrCat("--pools: '", item, "' is not NAME:MAX_MODEL_LEN[:kvblocks=N]"));
    }
    p.name = parts[0];
    if (!pools.empty() && p.max_model_len <= pools.back().max_model_len) {
      return absl::InvalidArgumentError("--pools: list the pools from the shortest up, each longer than the last");
    }
    pools.push_back(p);
  }
  if (pools.size() < 2) return absl::InvalidArgumentError("--pools: needs two pools or more");
  return pools;
}

void RunPoolChecks(Context& ctx, Suite& suite) {
  const auto& pools = ctx.opts.pools;
  const int64_t shortest = pools.front().max_model_len, longest = pools.back().max_model_len;
  const std::string s = pools.front().name, l = pools[1].name;
  auto need_metrics = [&](const std::function<absl::Status()>& f) {
    return ctx.opts.metrics.empty() ? absl::FailedPreconditionError("--pools needs --metrics") : f();
  };
  suite.Run(absl::StrCat("pools: a short request (40 + 4 tokens) goes to ", s),
            [&] { return need_metrics([&] { return LandsIn(ctx, 40, 4, 0, 101); }); });
  suite.Run(absl::StrCat("pools: a request past ", s, " (", shortest + 60, " + 4 tokens) goes to ", l),
            [&] { return need_metrics([&] { return LandsIn(ctx, shortest + 60, 4, 1, 102); }); });
  // The boundary: the router counts prompt + max_tokens, and a pool holds exactly its length.
  suite.Run(absl::StrCat("pools: prompt + max_tokens = ", shortest, " exactly fits ", s),
            [&] { return need_metrics([&] { return LandsIn(ctx, shortest - 12, 12, 0, 103); }); });
  suite.Run(absl::StrCat("pools: the same prompt + max_tokens = ", shortest + 1, " goes to ", l),
            [&] { return need_metrics([&] { return LandsIn(ctx, shortest - 12, 13, 1, 104); }); });
  suite.Run(absl::StrCat("pools: prompt + max_tokens = ", longest + 8, " -> 400 naming the ", longest, "-token limit"),
            [&] { return need_metrics([&] { return RefusedEverywhere(ctx, longest - 8, 16); }); });
  suite.Run(absl::StrCat("pools: a prompt of ", longest + 5, " tokens without max_tokens -> 400"),
            [&] { return need_metrics([&] { return RefusedEverywhere(ctx, longest + 5, std::nullopt); }); });
  bool sized = false;
  for (const PoolSpec& p : pools) sized |= p.kv_blocks > 0;
  if (sized) {
    suite.Run("pools: each pool's coordinator holds the KV blocks of its own settings",
              [&] { return need_metrics([&] { return PoolsKeepTheirOwnKv(ctx); }); });
  }
  suite.Run("pools: after the refusals both pools still serve", [&] {
    return need_metrics([&]() -> absl::Status {
      RETURN_IF_ERROR(LandsIn(ctx, 20, 3, 0, 105));
      return LandsIn(ctx, shortest + 1, 3, 1, 106);
    });
  });
}

}  // namespace moeshard::itest
