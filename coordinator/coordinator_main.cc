// moeshard-coordinator: holds the plan, the scheduler and the KV block manager of one
// model replica, and drives its workers. Serves the Coordinator gRPC service and /metrics.
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <random>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "common/flags/args.h"
#include "common/comm/kv_store.h"
#include "common/metrics/metrics.h"
#include "common/security/internal_grpc.h"
#include "common/status.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/engine.h"
#include "common/model/kv_pools.h"
#include "common/model/model_loader.h"
#include "coordinator/grpc_worker_pool.h"

namespace {
std::unique_ptr<grpc::Server>* g_server = nullptr;
// Drain: no new streams from now on; running ones get up to kDrainSeconds to finish.
constexpr int kDrainSeconds = 30;
void OnSignal(int) {
  std::thread([] {
    if (g_server && *g_server) (*g_server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(kDrainSeconds));
  }).detach();
}

absl::StatusOr<moeshard::EngineOptions> Options(const moeshard::Args& a, const std::string& store_address) {
  using namespace moeshard;
  EngineOptions o;
  ASSIGN_OR_RETURN(std::string model, a.Required("model"));
  ASSIGN_OR_RETURN(std::string workers, a.Required("workers"));
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(model, /*load_tokenizer=*/false));
  o.config = m.config;
  const std::vector<std::string> addresses = absl::StrSplit(workers, ',', absl::SkipEmpty());
  ASSIGN_OR_RETURN(ParallelMode mode, ParseMode(a.Get("mode", "layer-split")));
  std::vector<double> weights;
  if (a.Has("layer-split")) {
    ASSIGN_OR_RETURN(weights, ParseLayerWeights(a.Get("layer-split")));
  }
  ASSIGN_OR_RETURN(o.plan, MakePlan(o.config, mode, static_cast<int>(addresses.size()), weights));
  ASSIGN_OR_RETURN(o.num_kv_blocks, a.GetInt("num-kv-blocks", 1024));
  ASSIGN_OR_RETURN(int64_t bs, a.GetInt("block-size", 16));
  o.block_size = static_cast<int32_t>(bs);
  ASSIGN_OR_RETURN(o.max_num_seqs, a.GetInt("max-num-seqs", 64));
  ASSIGN_OR_RETURN(o.max_tokens_per_step, a.GetInt("max-tokens-per-step", 512));
  ASSIGN_OR_RETURN(o.max_model_len, a.GetInt("max-model-len", std::min<int64_t>(o.config.max_position_embeddings, 4096)));
  // -1 (the default): derived from the limits above; 0: one pool for every layer.
  ASSIGN_OR_RETURN(o.num_sliding_kv_blocks, a.GetInt("num-sliding-kv-blocks", -1));
  if (o.num_sliding_kv_blocks < 0) {
    o.num_sliding_kv_blocks =
        DefaultSlidingKvBlocks(o.config, o.num_kv_blocks, o.block_size, o.max_num_seqs, o.max_tokens_per_step);
  }
  ASSIGN_OR_RETURN(o.comm_timeout_ms, a.GetInt("comm-timeout-ms", 60000));
  o.prefix_caching = !a.Flag("no-prefix-caching");
  // Lookahead decode steps (one worker with the whole model); MOESHARD_LOOKAHEAD=0 also turns
  // them off (for A/B runs through `moeshard up`).
  const char* lookahead_env = std::getenv("MOESHARD_LOOKAHEAD");
  o.lookahead = !a.Flag("no-lookahead") && !(lookahead_env && lookahead_env[0] == '0');
  ASSIGN_OR_RETURN(o.admission.max_queued_requests, a.GetInt("max-queued-requests", 4 * o.max_num_seqs));
  ASSIGN_OR_RETURN(o.admission.max_queued_tokens, a.GetInt("max-queued-tokens", 4 * o.num_kv_blocks * o.block_size));
  ASSIGN_OR_RETURN(int64_t queue_time_s, a.GetInt("max-queue-time-s", 30));
  o.admission.max_queue_time = std::chrono::seconds(queue_time_s);
  RETURN_IF_ERROR(o.admission.Validate());
  ASSIGN_OR_RETURN(int64_t floor_ms, a.GetInt("step-deadline-floor-ms", 2000));
  o.step_deadline.floor = std::chrono::milliseconds(floor_ms);
  if (floor_ms < 1) return absl::InvalidArgumentError("--step-deadline-floor-ms must be > 0");
  o.store_address = store_address;
  o.model_name = a.Get("served-model-name", model);
  if (o.num_kv_blocks < 1 || o.block_size < 1 || o.max_num_seqs < 1 || o.max_tokens_per_step < 1 || o.max_model_len < 1) {
    return absl::InvalidArgumentError("sizes must be positive");
  }
  return o;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace moeshard;
  auto a = Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                       {"model", "workers", "mode", "layer-split", "host", "port", "metrics-port", "num-kv-blocks", "block-size",
                        "num-sliding-kv-blocks", "max-num-seqs", "max-tokens-per-step", "max-model-len", "comm-timeout-ms", "served-model-name", "metric-prefix",
                        "max-queued-requests", "max-queued-tokens", "max-queue-time-s", "step-deadline-floor-ms",
                        "cluster-token-file", "internal-tls-cert", "internal-tls-key", "internal-tls-ca"},
                       {"no-prefix-caching", "no-lookahead", "help"});
  if (!a.ok() || a->Flag("help")) {
    std::fprintf(stderr,
                 "usage: moeshard-coordinator --model PATH --workers HOST:PORT[,HOST:PORT...] [--mode layer-split|tensor-parallel]\n"
                 "       [--layer-split 2,1,1] [--host 127.0.0.1] [--port 0] [--metrics-port 0] [--num-kv-blocks 1024]\n"
                 "       [--num-sliding-kv-blocks auto (models with sliding-window layers; 0: one pool)]\n"
                 "       [--block-size 16] [--max-num-seqs 64] [--max-tokens-per-step 512] [--max-model-len N]\n"
                 "       [--comm-timeout-ms 60000] [--no-prefix-caching] [--no-lookahead] [--metric-prefix moeshard_|moeshard:]\n"
                 "       [--max-queued-requests 4*max-num-seqs] [--max-queued-tokens 4*num-kv-blocks*block-size]\n"
                 "       [--max-queue-time-s 30] [--step-deadline-floor-ms 2000]\n       %s\n%s\n",
                 kInternalSecurityUsage, a.ok() ? "" : std::string(a.status().message()).c_str());
    return 2;
  }
  if (absl::Status st = SetMetricPrefix(a->Get("metric-prefix", kDefaultMetricPrefix)); !st.ok()) {
    std::fprintf(stderr, "moeshard-coordinator: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (absl::Status st = ConfigureInternalSecurityFromFlags(a->Get("cluster-token-file"), a->Get("internal-tls-cert"),
                                                         a->Get("internal-tls-key"), a->Get("internal-tls-ca"));
      !st.ok()) {
    std::fprintf(stderr, "moeshard-coordinator: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  std::string host = a->Get("host", "127.0.0.1");
  auto port = a->GetInt("port", 0), mport = a->GetInt("metrics-port", 0);
  if (!port.ok() || !mport.ok()) return 2;
  // Bind the gRPC port first: the workers reach the store through it.
  InMemoryKvStore store;
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(host + ":" + std::to_string(*port), InternalServerCredentials(), &bound);
  // The service needs the engine, which needs the bound address: register a late-bound service.
  std::unique_ptr<Engine> engine;
  std::unique_ptr<CoordinatorServiceImpl> service;
  // Build options with a placeholder store address, then fix it once the port is known.
  auto opts = Options(*a, "");
  if (!opts.ok()) {
    std::fprintf(stderr, "moeshard-coordinator: %s\n", std::string(opts.status().message()).c_str());
    return 1;
  }
  engine = std::make_unique<Engine>(*opts, std::make_unique<GrpcWorkerPool>(absl::StrSplit(a->Get("workers"), ',', absl::SkipEmpty())));
  service = std::make_unique<CoordinatorServiceImpl>(engine.get(), &store);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "moeshard-coordinator: cannot listen on %s:%ld\n", host.c_str(), static_cast<long>(*port));
    return 1;
  }
  g_server = &server;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  engine->SetStoreAddress(host + ":" + std::to_string(bound));
  MetricsServer metrics;
  auto mp = metrics.Start(host, static_cast<int>(*mport), engine->registry(), ClusterBearerAuthorized);
  if (!mp.ok()) {
    std::fprintf(stderr, "moeshard-coordinator: %s\n", std::string(mp.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr, "moeshard-coordinator: %s\n", opts->plan.Describe().c_str());
  std::printf("moeshard-coordinator: grpc %s:%d metrics http://%s:%d/metrics\n", host.c_str(), bound, host.c_str(), *mp);
  std::fflush(stdout);
  engine->Start();
  // Workers that refuse the handshake for good (wrong model, bad weights) end the process with
  // the reason, so that a supervisor reports it instead of retrying for ever.
  std::string fatal;
  std::thread watcher([&] {
    fatal = engine->WaitFatal();
    if (!fatal.empty()) server->Shutdown();
  });
  server->Wait();
  engine->Stop();
  watcher.join();
  metrics.Stop();
  if (!fatal.empty()) {
    std::fprintf(stderr, "moeshard-coordinator: giving up: %s\n", fatal.c_str());
    return 3;
  }
  return 0;
}
