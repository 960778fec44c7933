// moeshard-worker: one process per GPU or CPU slot. Serves the Worker gRPC service and
// /metrics; waits for the coordinator's handshake to learn its share of the model.
#include <csignal>
#include <cstdio>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "common/flags/args.h"
#include "worker/runner_flags.h"
#include "common/metrics/metrics.h"
#include "common/security/internal_grpc.h"
#include "worker/service/worker_service.h"

namespace {
std::unique_ptr<grpc::Server>* g_server = nullptr;
void OnSignal(int) {
  // Shutdown from another thread: gRPC's Shutdown is not async-signal-safe.
  std::thread([] { if (g_server && *g_server) (*g_server)->Shutdown(); }).detach();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace moeshard;
  auto a = Args::Parse(std::vector<std::string>(argv + 1, argv + argc), {"model", "host", "port", "metrics-port", "device", "gpu", "dtype", "kv-dtype", "expert-layout", "max-batch-tokens", "tp-comm", "metric-prefix",
                                                                            "cluster-token-file", "internal-tls-cert", "internal-tls-key", "internal-tls-ca"}, {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("model")) {
    std::fprintf(stderr, "usage: moeshard-worker --model PATH [--host 127.0.0.1] [--port 0] [--metrics-port 0]\n"
                 "       [--device cpu|cuda] [--gpu N] [--dtype bfloat16|float32] [--kv-dtype auto|float32|bfloat16|fp8]\n"
                 "       [--expert-layout auto|stream|stored]\n"
                 "       [--max-batch-tokens N] [--tp-comm auto|nccl|host] [--metric-prefix moeshard_|moeshard:]\n       %s\n%s\n",
                 kInternalSecurityUsage, a.ok() ? "" : std::string(a.status().message()).c_str());
    return 2;
  }
  if (absl::Status st = SetMetricPrefix(a->Get("metric-prefix", kDefaultMetricPrefix)); !st.ok()) {
    std::fprintf(stderr, "moeshard-worker: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (absl::Status st = ConfigureInternalSecurityFromFlags(a->Get("cluster-token-file"), a->Get("internal-tls-cert"),
                                                         a->Get("internal-tls-key"), a->Get("internal-tls-ca"));
      !st.ok()) {
    std::fprintf(stderr, "moeshard-worker: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto port = a->GetInt("port", 0);
  auto mport = a->GetInt("metrics-port", 0);
  if (!port.ok() || !mport.ok()) {
    std::fprintf(stderr, "moeshard-worker: bad port\n");
    return 2;
  }
  std::string host = a->Get("host", "127.0.0.1");
  auto registry = std::make_shared<prometheus::Registry>();
  MetricsServer metrics;
  auto mp = metrics.Start(host, static_cast<int>(*mport), registry, ClusterBearerAuthorized);
  if (!mp.ok()) {
    std::fprintf(stderr, "moeshard-worker: %s\n", std::string(mp.status().message()).c_str());
    return 1;
  }
  auto runner = ParseRunnerFlags(*a);
  if (!runner.ok()) {
    std::fprintf(stderr, "moeshard-worker: %s\n", std::string(runner.status().message()).c_str());
    return 2;
  }
  const std::string tp_comm = a->Get("tp-comm", "auto");
  if (tp_comm != "auto" && tp_comm != "nccl" && tp_comm != "host") {
    std::fprintf(stderr, "moeshard-worker: --tp-comm must be auto, nccl or host\n");
    return 2;
  }
  WorkerServiceImpl service({a->Get("model"), host, *runner, tp_comm}, registry);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(host + ":" + std::to_string(*port), InternalServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound == 0) {
    std::fprintf(stderr, "moeshard-worker: cannot listen on %s:%ld\n", host.c_str(), static_cast<long>(*port));
    return 1;
  }
  g_server = &server;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::printf("moeshard-worker: grpc %s:%d metrics http://%s:%d/metrics\n", host.c_str(), bound, host.c_str(), *mp);
  std::fflush(stdout);
  server->Wait();
  metrics.Stop();
  return 0;
}
