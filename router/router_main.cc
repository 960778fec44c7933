// moeshard-router: the OpenAI-compatible HTTP and gRPC front end of a moeshard cluster.
// Prints one line "moeshard-router: http://HOST:PORT grpc HOST:GPORT" once both ports
// listen, and shuts down cleanly on SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/security/internal_grpc.h"
#include "router/router.h"

int main(int argc, char** argv) {
  // Block the shutdown signals in every thread (threads inherit the mask); the main
  // thread takes them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(moeshard::router::RouterUsage().c_str(), stdout);
    return 0;
  }
  auto config = moeshard::router::ParseRouterFlags(args);
  if (!config.ok()) {
    std::fprintf(stderr, "moeshard-router: %s\n%s", std::string(config.status().message()).c_str(),
                 moeshard::router::RouterUsage().c_str());
    return 2;
  }
  if (absl::Status st = moeshard::SetMetricPrefix(config->metric_prefix); !st.ok()) {
    std::fprintf(stderr, "moeshard-router: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (absl::Status st = moeshard::ConfigureInternalSecurityFromFlags(config->cluster_token_file, config->internal_tls_cert,
                                                                    config->internal_tls_key, config->internal_tls_ca);
      !st.ok()) {
    std::fprintf(stderr, "moeshard-router: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  auto router = moeshard::router::Router::Create(*config);
  if (!router.ok()) {
    std::fprintf(stderr, "moeshard-router: %s\n", std::string(router.status().message()).c_str());
    return 1;
  }
  if (absl::Status st = (*router)->Start(); !st.ok()) {
    std::fprintf(stderr, "moeshard-router: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("%s\n", (*router)->Banner().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "moeshard-router: signal %d, shutting down\n", sig);
  (*router)->Shutdown();
  return 0;
}
