// moeshard-itest --url URL [...]: the integration suite, against any running cluster
// (local, GPU, Kubernetes). Prints one line per check and a last line `N passed, M
// failed, K skipped`; exits 1 on any failure. Assumes the cluster serves nobody else meanwhile
// (the disconnect and metrics checks read cluster-wide counters).
#include <signal.h>

#include <cstdio>
#include <map>

#include "absl/strings/str_split.h"
#include "common/flags/args.h"
#include "tests/itest/suite.h"

namespace moeshard::itest {
namespace {

const std::map<std::string, void (*)(Context&, Suite&)>& Groups() {
  static const std::map<std::string, void (*)(Context&, Suite&)> groups = {{"api", RunApiChecks},
                                                                           {"logprobs", RunLogprobChecks},
                                                                           {"generation", RunGenerationChecks},
                                                                           {"behaviour", RunBehaviourChecks},
                                                                           {"prefix", RunPrefixCacheChecks},
                                                                           {"grpc", RunGrpcChecks},
                                                                           {"errors", RunErrorChecks},
                                                                           {"disconnect", RunDisconnectChecks},
                                                                           {"metrics", RunMetricsChecks},
                                                                           {"pools", RunPoolChecks}};
  return groups;
}
// The order the groups run in: metrics last, to see everything the others sent. "pools" runs
// only with --pools (a cluster of length pools).
const char* const kOrder[] = {"api",    "logprobs",   "generation", "behaviour", "prefix",
                              "grpc",   "errors",     "pools",      "disconnect", "metrics"};

void Usage(const std::string& why) {
  std::fprintf(stderr,
               "usage: moeshard-itest --url http://HOST:PORT [--grpc HOST:PORT] [--metrics URL,URL,...]\n"
               "       [--model PATH] [--goldens FILE] [--api-key KEY] [--ready-timeout S]\n"
               "       [--only GROUP,...] [--skip GROUP,...] [--tolerance exact|bf16] [--pools NAME:LEN[:kvblocks=N],...]\n"
               "groups: api logprobs generation behaviour prefix grpc errors pools disconnect metrics\n"
               "  --pools: the cluster's length pools, shortest first, in the order of their coordinators in\n"
               "           --metrics (one coordinator each); adds the pools group; kvblocks=N: the pool's own\n"
               "           num_kv_blocks, checked on its coordinator\n%s\n",
               why.c_str());
}

int Main(const std::vector<std::string>& argv) {
  auto a = Args::Parse(argv, {"url", "grpc", "metrics", "model", "goldens", "api-key", "ready-timeout", "only", "skip",
                              "tolerance", "pools"},
                       {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("url")) {
    Usage(a.ok() ? "" : std::string(a.status().message()));
    return a.ok() && a->Flag("help") ? 0 : 2;
  }
  ItestOptions o;
  o.url = a->Get("url");
  o.grpc = a->Get("grpc");
  o.model_path = a->Get("model");
  o.goldens = a->Get("goldens");
  o.api_key = a->Get("api-key");
  for (auto u : absl::StrSplit(a->Get("metrics"), ',', absl::SkipWhitespace())) o.metrics.emplace_back(u);
  auto ready = a->GetDouble("ready-timeout", 60);
  if (!ready.ok()) {
    Usage(std::string(ready.status().message()));
    return 2;
  }
  o.ready_timeout_s = *ready;
  // bf16 workers: tokens and logprobs compared with tolerance (tests/itest/token_match.h).
  if (absl::Status st = itest::ParseTolerance(a->Get("tolerance"), &o.tolerance); !st.ok()) {
    Usage(std::string(st.message()));
    return 2;
  }
  if (a->Has("pools")) {
    auto pools = ParsePoolSpecs(a->Get("pools"));
    if (!pools.ok()) {
      Usage(std::string(pools.status().message()));
      return 2;
    }
    o.pools = *std::move(pools);
  }
  std::set<std::string> only, skip;
  for (auto g : absl::StrSplit(a->Get("only"), ',', absl::SkipWhitespace())) only.emplace(g);
  for (auto g : absl::StrSplit(a->Get("skip"), ',', absl::SkipWhitespace())) skip.emplace(g);
  for (const auto* set : {&only, &skip}) {
    for (const auto& g : *set) {
      if (!Groups().count(g)) {
        Usage("unknown group " + g);
        return 2;
      }
    }
  }
  signal(SIGPIPE, SIG_IGN);  // abandoned streams close sockets under the server's feet
  Context ctx(o);
  Suite suite;
  RunSetupChecks(ctx, suite);
  for (const char* g : kOrder) {
    if ((!only.empty() && !only.count(g)) || skip.count(g)) continue;
    if (std::string(g) == "pools" && o.pools.empty()) continue;
    Groups().at(g)(ctx, suite);
  }
  std::printf("%d passed, %d failed, %d skipped\n", suite.passed(), suite.failed(), suite.skipped());
  return suite.failed() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace moeshard::itest

int main(int argc, char** argv) { return moeshard::itest::Main(std::vector<std::string>(argv + 1, argv + argc)); }
