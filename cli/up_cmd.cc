// `moeshard up`: starts a whole cluster on this machine — workers, a coordinator per
// replica, and the router — on free loopback ports, prints the URL, supervises the processes
// (cli/supervisor.h: a dead or hung one is restarted on its ports; one that dies before the
// cluster was ready fails `up` with the reason), and stops everything on Ctrl-C or SIGTERM.
// The same binaries run one per container in deploy/.
//
// Pools (--pools FILE, cli/up_pools.h): {"pools": [{"name": "32k", "max_model_len": 32768,
//   "replicas": 1, "workers": 2, "mode": "tensor-parallel", "layer_split": "2,1",
//   "kv_dtype": "fp8", ...}]}, each pool's own worker and coordinator settings replacing the
// command line's for it; without it one pool "default" of one replica with
// --workers/--mode/--layer-split.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/flags/args.h"
#include "cli/cluster_secret.h"
#include "cli/commands.h"
#include "cli/process.h"
#include "cli/supervisor.h"
#include "cli/up_pools.h"
#include "common/mapped_file.h"
#include "common/metrics/metrics.h"
#include "common/status.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace moeshard {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

absl::StatusOr<std::vector<UpPool>> ReadPools(const Args& a) {
  if (!a.Has("pools")) {
    UpPool p;
    ASSIGN_OR_RETURN(p.workers, a.GetInt("workers", 1));
    ASSIGN_OR_RETURN(p.max_model_len, a.GetInt("max-model-len", 0));
    p.mode = a.Get("mode", "layer-split");
    p.layer_split = a.Get("layer-split");
    return std::vector<UpPool>{p};
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(a.Get("pools")));
  return ParseUpPools(text);
}

// The command line's value of a flag `up` passes on.
FlagValue CommandLine(const Args& a, const char* flag) {
  return a.Has(flag) ? FlagValue{true, a.Get(flag)} : FlagValue{};
}

absl::Status Up(const Args& a) {
  ASSIGN_OR_RETURN(std::string model, a.Required("model"));
  ASSIGN_OR_RETURN(auto pools, ReadPools(a));
  ASSIGN_OR_RETURN(int64_t port, a.GetInt("port", 0));
  // --host is the router's public address; workers and coordinators listen on --internal-host.
  const std::string host = a.Get("host", "127.0.0.1"), internal_host = a.Get("internal-host", "127.0.0.1"), dir = SelfDir();
  RETURN_IF_ERROR(ExportClusterToken(a));
  const std::vector<std::string> internal_tls = InternalTlsArgs(a);
  ASSIGN_OR_RETURN(int64_t num_gpus, a.GetInt("gpus", 1));
  // Checked here so that a typo stops before any process starts.
  if (a.Has("metric-prefix")) RETURN_IF_ERROR(SetMetricPrefix(a.Get("metric-prefix")));
  if (num_gpus < 1) return absl::InvalidArgumentError("--gpus must be >= 1");
  // Each pool's step budget, checked before any process starts.
  std::vector<FlagValue> step_tokens;
  for (const UpPool& p : pools) {
    ASSIGN_OR_RETURN(FlagValue st,
                     StepTokensFlag(p.name, a.Get("device") == "cuda",
                                    PoolFlag(p.coordinator_flags, "max-tokens-per-step", CommandLine(a, "max-tokens-per-step")),
                                    PoolFlag(p.worker_flags, "max-batch-tokens", CommandLine(a, "max-batch-tokens"))));
    step_tokens.push_back(st);
  }
  int64_t next_gpu = 0;
  Supervisor procs({});
  std::vector<std::string> coord_metrics, worker_metrics, internal_grpc;
  nlohmann::json router_pools = nlohmann::json::array();
  for (size_t pi = 0; pi < pools.size(); ++pi) {
    const UpPool& p = pools[pi];
    nlohmann::json coords = nlohmann::json::array();
    for (int64_t r = 0; r < p.replicas; ++r) {
      std::string workers;
      for (int64_t w = 0; w < p.workers; ++w) {
        std::vector<std::string> wargs = {dir + "/moeshard-worker", "--model", model, "--host", internal_host};
        wargs.insert(wargs.end(), internal_tls.begin(), internal_tls.end());
        for (const char* f : {"device", "dtype", "kv-dtype", "expert-layout", "max-batch-tokens", "metric-prefix"}) {
          const FlagValue v = PoolFlag(p.worker_flags, f, CommandLine(a, f));
          if (v.has) wargs.insert(wargs.end(), {absl::StrCat("--", f), v.value});
        }
        // Workers take the GPUs in turn; several share one when there are more workers than GPUs.
        if (a.Get("device") == "cuda") wargs.insert(wargs.end(), {"--gpu", std::to_string(next_gpu++ % num_gpus)});
        ASSIGN_OR_RETURN(std::string line, procs.Start(Role::kWorker, wargs, 300));
        ASSIGN_OR_RETURN(std::string addr, FieldAfter(line, "grpc"));
        absl::StrAppend(&workers, workers.empty() ? "" : ",", addr);
        internal_grpc.push_back(absl::StrCat("worker=", addr));
        worker_metrics.push_back(FieldAfter(line, "metrics").value_or(""));
      }
      std::vector<std::string> cargs = {dir + "/moeshard-coordinator", "--model", model, "--workers", workers, "--mode", p.mode,
                                        "--host", internal_host};
      cargs.insert(cargs.end(), internal_tls.begin(), internal_tls.end());
      if (!p.layer_split.empty()) cargs.insert(cargs.end(), {"--layer-split", p.layer_split});
      if (p.max_model_len > 0) cargs.insert(cargs.end(), {"--max-model-len", std::to_string(p.max_model_len)});
      if (step_tokens[pi].has) cargs.insert(cargs.end(), {"--max-tokens-per-step", step_tokens[pi].value});
      for (const char* f : {"num-kv-blocks", "num-sliding-kv-blocks", "max-num-seqs", "comm-timeout-ms", "metric-prefix",
                            "max-queued-requests", "max-queued-tokens", "max-queue-time-s", "step-deadline-floor-ms"}) {
        const FlagValue v = PoolFlag(p.coordinator_flags, f, CommandLine(a, f));
        if (v.has) cargs.insert(cargs.end(), {absl::StrCat("--", f), v.value});
      }
      ASSIGN_OR_RETURN(std::string line, procs.Start(Role::kCoordinator, cargs, 120));
      ASSIGN_OR_RETURN(std::string addr, FieldAfter(line, "grpc"));
      coords.push_back(addr);
      internal_grpc.push_back(absl::StrCat("coordinator=", addr));
      coord_metrics.push_back(FieldAfter(line, "metrics").value_or(""));
    }
    router_pools.push_back({{"name", p.name}, {"max_model_len", p.max_model_len}, {"coordinators", coords}});
  }
  char tmpl[] = "/tmp/moeshard-pools-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return absl::InternalError("cannot write the router's pools file");
  close(fd);
  std::ofstream(tmpl) << nlohmann::json({{"pools", router_pools}}).dump(2);
  std::vector<std::string> rargs = {dir + "/moeshard-router", "--model", model, "--pools", tmpl, "--host", host,
                                    "--port", std::to_string(port)};
  rargs.insert(rargs.end(), internal_tls.begin(), internal_tls.end());
  // The API key travels in $MOESHARD_API_KEY, to the router only, not on a command line.
  RETURN_IF_ERROR(ExportApiKey(a));
  for (const char* f : {"grpc-port", "served-model-name", "metric-prefix", "tls-cert", "tls-key", "max-prompt-bytes",
                        "max-connections-per-client"}) {
    if (a.Has(f)) rargs.insert(rargs.end(), {absl::StrCat("--", f), a.Get(f)});
  }
  ASSIGN_OR_RETURN(std::string router_line, procs.Start(Role::kRouter, rargs, 120));
  ASSIGN_OR_RETURN(std::string url, FieldAfter(router_line, "moeshard-router:"));
  std::string grpc_addr = FieldAfter(router_line, "grpc").value_or("");
  std::printf("moeshard up: %s grpc %s\n", url.c_str(), grpc_addr.c_str());
  std::string metrics_line = url + "/metrics";
  for (const auto& m : coord_metrics) absl::StrAppend(&metrics_line, " ", m);
  for (const auto& m : worker_metrics) absl::StrAppend(&metrics_line, " ", m);
  std::printf("moeshard up: metrics %s\n", metrics_line.c_str());
  // The internal services (they need the cluster credential).
  std::printf("moeshard up: internal %s\n", absl::StrJoin(internal_grpc, " ").c_str());
  std::fflush(stdout);
  // Wait for readiness (a real step has succeeded), then supervise until a signal.
  httplib::Client cli(url);
  cli.set_connection_timeout(1);
  cli.enable_server_certificate_verification(false);  // our own router, by its bound address
  bool ready = false;
  auto t0 = std::chrono::steady_clock::now();
  absl::Status result = absl::OkStatus();
  while (!g_stop) {
    result = procs.Tick();
    if (!result.ok()) break;
    if (!ready) {
      auto r = cli.Get("/ready");
      if (r && r->status == 200) {
        ready = true;
        procs.MarkReady();
        std::fprintf(stderr, "moeshard up: ready after %.1f s\n",
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        std::printf("moeshard up: ready\n");
        std::fflush(stdout);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "moeshard up: stopping %zu processes\n", procs.size());
  procs.StopAll();
  unlink(tmpl);
  return result;
}

}  // namespace

int UpCommand(const std::vector<std::string>& argv) {
  auto a = Args::Parse(argv, {"model", "workers", "mode", "layer-split", "pools", "port", "grpc-port", "host", "api-key",
                              "api-key-file", "served-model-name", "max-model-len", "num-kv-blocks", "num-sliding-kv-blocks", "max-num-seqs",
                              "max-tokens-per-step", "comm-timeout-ms", "device", "gpus", "dtype", "kv-dtype", "expert-layout",
                              "max-batch-tokens", "metric-prefix", "max-queued-requests", "max-queued-tokens",
                              "max-queue-time-s", "step-deadline-floor-ms", "internal-host", "cluster-token-file",
                              "internal-tls-cert", "internal-tls-key", "internal-tls-ca", "tls-cert", "tls-key",
                              "max-prompt-bytes", "max-connections-per-client"},
                       {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("model")) {
    std::fprintf(stderr,
                 "usage: moeshard up --model PATH [--workers N] [--mode layer-split|tensor-parallel] [--layer-split 2,1]\n"
                 "       [--pools FILE] [--port P] [--grpc-port P] [--host 127.0.0.1] [--internal-host 127.0.0.1]\n"
                 "       [--api-key-file FILE] [--tls-cert PEM --tls-key PEM] [--max-prompt-bytes N] [--max-connections-per-client N]\n"
                 "       [--max-model-len N]\n"
                 "       [--cluster-token-file FILE] [--internal-tls-cert PEM --internal-tls-key PEM --internal-tls-ca PEM]\n"
                 "       [--device cpu|cuda] [--gpus N] [--dtype bfloat16|float32] [--kv-dtype auto|float32|bfloat16|fp8]\n"
                 "       [--expert-layout auto|stream|stored]\n"
                 "       [--metric-prefix moeshard_|moeshard:] [--max-queued-requests N] [--max-queued-tokens N]\n"
                 "       [--max-queue-time-s S] [--step-deadline-floor-ms MS]\n"
                 "       [--max-tokens-per-step N] [--max-batch-tokens N] [--num-kv-blocks N] [--max-num-seqs N]\n"
                 "  --max-tokens-per-step: a coordinator's step budget (chunked prefill); default 512 on CPUs and\n"
                 "  4096 with --device cuda, never above the GPU workers' --max-batch-tokens (default 8192)\n"
                 "  --pools FILE: {\"pools\": [{\"name\": \"long\", \"max_model_len\": 131072, \"workers\": 2, ...}]}; a pool\n"
                 "  may set replicas, workers, mode, layer_split, kv_dtype, expert_layout, dtype, max_batch_tokens, num_kv_blocks,\n"
                 "  num_sliding_kv_blocks, max_num_seqs and max_tokens_per_step for itself\n%s\n",
                 a.ok() ? "" : std::string(a.status().message()).c_str());
    return (a.ok() && a->Flag("help")) ? 0 : 2;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  absl::Status st = Up(*a);
  if (!st.ok()) {
    std::fprintf(stderr, "moeshard up: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace moeshard
