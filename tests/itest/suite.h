// The integration suite's frame: options, the shared context every check reads, and the
// runner that prints one line per check (`ok  name`, `FAIL name: why`, `skip name: why`)
// and counts them. A check is a function returning OK, an error (a failure, with the
// reason) or Skip(why) when what it needs is absent (no --model, no tokenizer, ...).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/itest/client.h"
#include "tests/itest/metrics_scrape.h"
#include "tests/itest/reference_engine.h"
#include "tests/itest/token_match.h"

namespace moeshard::itest {

// One pool of a cluster started with `moeshard up --pools` (checks_pools.cc).
struct PoolSpec {
  std::string name;
  int64_t max_model_len = 0;
  int64_t kv_blocks = 0;  // the full-attention KV blocks its coordinator must hold (0: not checked)
};
// "short:512,long:2048:kvblocks=1000": the pools from the shortest up, in the order of their
// coordinators in --metrics, each NAME:MAX_MODEL_LEN[:kvblocks=N] (N: the pool's own
// num_kv_blocks, checked on its coordinator's kv_blocks gauge). Errors: a malformed item, fewer
// than two pools, lengths not increasing.
absl::StatusOr<std::vector<PoolSpec>> ParsePoolSpecs(const std::string& text);

struct ItestOptions {
  std::string url;                   // the router, http://host:port
  std::string grpc;                  // host:port of its gRPC API, or empty
  std::vector<std::string> metrics;  // /metrics URLs of every process, or empty
  std::string model_path;            // the same model, run in-process as the reference
  std::string goldens;               // goldens.safetensors
  std::string api_key;
  double ready_timeout_s = 60;
  Tolerance tolerance = Tolerance::kExact;  // how tokens and logprobs are compared (token_match.h)
  std::vector<PoolSpec> pools;              // --pools: the pool checks run (needs --metrics)
};

absl::Status Skip(const std::string& why);

class Suite {
 public:
  // Runs one check now and prints its line.
  void Run(const std::string& name, const std::function<absl::Status()>& check);
  int passed() const { return passed_; }
  int failed() const { return failed_; }
  int skipped() const { return skipped_; }

 private:
  int passed_ = 0, failed_ = 0, skipped_ = 0;
};

struct Context {
  explicit Context(ItestOptions o);
  ItestOptions opts;
  HttpClient http;
  Tally tally;
  std::string model_name;                       // as /v1/models lists it
  int64_t vocab = 0;                            // the model's vocabulary (0: unknown, no --model)
  int64_t prompt_vocab = 256;                   // prompt ids are drawn from [0, prompt_vocab)
  int64_t max_model_len = 0;                    // 0: unknown
  bool has_tokenizer = false;                   // text prompts and chat work
  std::unique_ptr<ReferenceEngine> reference;   // with --model
  std::optional<MetricsView> metrics_at_start;  // with --metrics
  std::unique_ptr<OpenAiApi> api;
  Tolerance tolerance = Tolerance::kExact;
  // bf16: the router ties tried (token_match.h): those within this bound, at most this many;
  // tests change them.
  double route_tie_bound = kBf16RouteTie;
  int route_ties_tried = kRouteTiesTried;

  // The greedy reference for a prompt: the in-process engine, or Skip without --model.
  absl::StatusOr<std::vector<int32_t>> Reference(const std::vector<int32_t>& prompt, int64_t n) const;
};

// After checks that disturb the cluster: a short greedy request (streamed or not; its prompt
// made from `seed`) still gets every token it asked for.
absl::Status StillServes(const Context& ctx, bool stream, uint64_t seed, int64_t max_tokens);

// Check groups, in the order the command runs them. Each adds its checks to the suite.
void RunSetupChecks(Context& ctx, Suite& suite);       // /health, /ready, /v1/models, --model
void RunApiChecks(Context& ctx, Suite& suite);         // formats, SSE, chat
void RunLogprobChecks(Context& ctx, Suite& suite);     // logprobs against the in-process engine
void RunGenerationChecks(Context& ctx, Suite& suite);  // goldens, reference, concurrency
void RunBehaviourChecks(Context& ctx, Suite& suite);   // sampling, stops, EOS, chat, long prompts, context
void RunPrefixCacheChecks(Context& ctx, Suite& suite);
void RunGrpcChecks(Context& ctx, Suite& suite);
void RunErrorChecks(Context& ctx, Suite& suite);  // bad requests, API key
void RunDisconnectChecks(Context& ctx, Suite& suite);
void RunMetricsChecks(Context& ctx, Suite& suite);  // promtool, counters
void RunPoolChecks(Context& ctx, Suite& suite);     // with --pools: dispatch by length

}  // namespace moeshard::itest
