// Metrics (--metrics): `promtool check metrics` accepts every process's /metrics; the
// coordinators export vLLM's metric names under the moeshard_ prefix (or moeshard:, vLLM's
// style, when the cluster runs with --metric-prefix moeshard:); the counters moved by at
// least what the suite's own requests add (the cluster may serve others meanwhile); and, once
// the cluster is idle, three known requests move each counter by exactly what they are.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

absl::Status Promtool(const Scrape& s) {
  if (access(kPromtool, X_OK) != 0) return Skip("promtool is not installed (Debian's prometheus package)");
  char path[] = "/tmp/moeshard-itest-metrics-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("cannot create a temporary file");
  close(fd);
  std::ofstream(path) << s.text;
  std::string cmd = absl::StrCat(kPromtool, " check metrics < ", path, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (p != nullptr && fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int rc = p != nullptr ? pclose(p) : -1;
  unlink(path);
  if (rc == 0) return absl::OkStatus();
  // Exit 3 is lint only. A cluster started with --metric-prefix moeshard: exports vLLM's
  // style ("vllm:<name>", here "moeshard:<name>"), which promtool's linter reserves for
  // recording rules: for such a process (and only then) that one lint is accepted; with
  // the default prefix every problem fails.
  std::vector<std::string> problems;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    if (s.prefix != "moeshard:" || !absl::EndsWith(line, "metric names should not contain ':'"))
      problems.emplace_back(line);
  }
  if (WEXITSTATUS(rc) == 3 && problems.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("promtool (exit ", WEXITSTATUS(rc), "): ", absl::StrJoin(problems, "; ")));
}

absl::Status Names(const MetricsView& v) {
  const char* kGauges[] = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"};
  const char* kCounters[] = {"prompt_tokens_total",   "generation_tokens_total",    "request_success_total",
                             "num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total"};
  const char* kHistograms[] = {"time_to_first_token_seconds",  "inter_token_latency_seconds",
                               "e2e_request_latency_seconds",  "request_queue_time_seconds",
                               "request_prefill_time_seconds", "request_decode_time_seconds"};
  std::vector<std::string> missing;
  for (const Scrape& s : v.scrapes()) {
    if (!s.coordinator) continue;
    auto has = [&](const std::string& n) {
      for (const Sample& x : s.samples) {
        if (x.name == n) return true;
      }
      return false;
    };
    for (const char* n : kGauges) {
      if (!has(absl::StrCat(s.prefix, n))) missing.push_back(absl::StrCat(s.url, " ", s.prefix, n));
    }
    for (const char* n : kCounters) {
      if (!has(absl::StrCat(s.prefix, n))) missing.push_back(absl::StrCat(s.url, " ", s.prefix, n));
    }
    for (const char* n : kHistograms) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (!has(absl::StrCat(s.prefix, n, suffix))) missing.push_back(absl::StrCat(s.url, " ", s.prefix, n, suffix));
      }
    }
  }
  if (!missing.empty()) return absl::NotFoundError(absl::StrCat("missing: ", absl::StrJoin(missing, ", ")));
  return absl::OkStatus();
}

absl::Status CountersMoved(const Context& ctx, const MetricsView& now) {
  if (!ctx.metrics_at_start.has_value()) return absl::FailedPreconditionError("no metrics scrape from the start");
  const MetricsView& was = *ctx.metrics_at_start;
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& labels = {}) {
    return now.Coord(name, labels) - was.Coord(name, labels);
  };
  struct Want {
    std::string what;
    double got, want;
  };
  const double finished = ctx.tally.finished;
  const Want wants[] = {
      // At least the prompt tokens computed (vLLM counts cached ones too; either is accepted).
      {"prompt_tokens_total", delta("prompt_tokens_total"),
       static_cast<double>(ctx.tally.prompt_tokens - ctx.tally.cached_tokens)},
      {"generation_tokens_total", delta("generation_tokens_total"), static_cast<double>(ctx.tally.generation_tokens)},
      {"request_success_total (all reasons)", delta("request_success_total"), finished},
      {"request_success_total{finished_reason=\"abort\"}",
       delta("request_success_total", {{"finished_reason", "abort"}}), static_cast<double>(ctx.tally.abandoned)},
      {"time_to_first_token_seconds_count", delta("time_to_first_token_seconds_count"), finished},
      {"e2e_request_latency_seconds_count", delta("e2e_request_latency_seconds_count"), finished},
      {"prefix_cache_queries_total", delta("prefix_cache_queries_total"), 1},
  };
  std::vector<std::string> bad;
  for (const Want& w : wants) {
    if (w.got < w.want) bad.push_back(absl::StrCat(w.what, " rose by ", w.got, ", want >= ", w.want));
  }
  if (!bad.empty()) return absl::InternalError(absl::StrJoin(bad, "; "));
  return absl::OkStatus();
}

// Exact counters: waits until no request runs or waits (the cluster serves only this suite, as
// in tests/e2e), sends three requests of known sizes with fresh prompts (no prefix-cache hits),
// and requires each counter to move by exactly their totals.
absl::Status ExactCounters(Context& ctx) {
  absl::StatusOr<MetricsView> before = absl::UnknownError("not scraped");
  for (int i = 0; i < 100; ++i) {
    before = MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key);
    if (!before.ok()) return before.status();
    if (before->Coord("num_requests_running") + before->Coord("num_requests_waiting") == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  struct Req {
    int64_t prompt, max_tokens;
    bool stream;
  };
  const Req reqs[] = {{11, 5, false}, {13, 7, true}, {17, 3, false}};
  double prompt_tokens = 0, generation_tokens = 0;
  for (size_t i = 0; i < std::size(reqs); ++i) {
    GenRequest r;
    r.prompt_ids = MakePrompt(reqs[i].prompt, 9000 + i, ctx.prompt_vocab);
    r.max_tokens = reqs[i].max_tokens;
    ASSIGN_OR_RETURN(GenResult g, reqs[i].stream ? ctx.api->CompleteStream(r) : ctx.api->Complete(r));
    if (g.finish_reason != "length") return absl::InternalError(absl::StrCat("request ", i, ": ", g.finish_reason));
    prompt_tokens += reqs[i].prompt;
    generation_tokens += reqs[i].max_tokens;
  }
  ASSIGN_OR_RETURN(MetricsView after, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
  const double n = std::size(reqs);
  auto delta = [&](const std::string& name, const std::map<std::string, std::string>& labels = {}) {
    return after.Coord(name, labels) - before->Coord(name, labels);
  };
  const std::pair<std::string, double> wants[] = {
      {"prompt_tokens_total", prompt_tokens},
      {"generation_tokens_total", generation_tokens},
      {"request_success_total", n},
      {"time_to_first_token_seconds_count", n},
      {"e2e_request_latency_seconds_count", n},
      {"request_queue_time_seconds_count", n},
  };
  std::vector<std::string> bad;
  for (const auto& [name, want] : wants) {
    if (delta(name) != want) bad.push_back(absl::StrCat(name, " rose by ", delta(name), ", want exactly ", want));
  }
  const double length = delta("request_success_total", {{"finished_reason", "length"}});
  if (length != n) bad.push_back(absl::StrCat("request_success_total{finished_reason=\"length\"} rose by ", length));
  if (!bad.empty()) return absl::InternalError(absl::StrJoin(bad, "; "));
  return absl::OkStatus();
}

}  // namespace

void RunMetricsChecks(Context& ctx, Suite& suite) {
  if (ctx.opts.metrics.empty()) {
    suite.Run("metrics: promtool check metrics on every process", [] { return Skip("no --metrics"); });
    return;
  }
  auto now = MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key);
  if (!now.ok()) {
    suite.Run("metrics: scrape at the end", [&] { return now.status(); });
    return;
  }
  for (const Scrape& s : now->scrapes()) {
    suite.Run(absl::StrCat("metrics: promtool check metrics ", s.url), [&] { return Promtool(s); });
  }
  suite.Run("metrics: coordinators export vLLM's names (prefix moeshard_ or moeshard:)", [&] { return Names(*now); });
  suite.Run("metrics: counters rose by what this suite sent", [&] { return CountersMoved(ctx, *now); });
  suite.Run("metrics: on an idle cluster, three requests move each counter by exactly their sizes",
            [&] { return ExactCounters(ctx); });
  // The gauges settle once the coordinators have reaped the suite's last cancelled streams (a
  // client disconnect reaches the scheduler asynchronously): scraped again for up to 10 s; a
  // request that never leaves keeps them up and fails the check.
  suite.Run("metrics: nothing running or waiting at the end", [&]() -> absl::Status {
    double busy = now->Coord("num_requests_running") + now->Coord("num_requests_waiting");
    for (int i = 0; i < 20 && busy != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ASSIGN_OR_RETURN(MetricsView again, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
      busy = again.Coord("num_requests_running") + again.Coord("num_requests_waiting");
    }
    if (busy != 0) return absl::InternalError(absl::StrCat(busy, " requests running or waiting 10 s after the suite"));
    return absl::OkStatus();
  });
}

}  // namespace moeshard::itest
