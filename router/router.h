// The router process as a library object: pools of coordinators, the HTTP (OpenAI) and
// gRPC front ends, metrics. router_main.cc is a thin shell over it; tests run it in
// process.
//
// Lifetime: Create() -> Start() -> Shutdown() (or the destructor). Shutdown stops taking
// new generations (503), lets running ones finish for up to drain_timeout, cancels the
// rest (which cancels their coordinator calls), then stops both servers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/cluster.h"
#include "router/generation.h"
#include "router/grpc_service.h"
#include "router/http_server.h"
#include "router/router_config.h"
#include "router/router_metrics.h"

namespace moeshard {
class Tokenizer;
}

namespace moeshard::router {

class Router {
 public:
  // Loads the tokenizer of config.model_path (if any) and the pools config.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterConfig& config);
  // With a given tokenizer (may be null) and EOS ids instead of loading --model.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterConfig& config,
                                                        std::unique_ptr<Tokenizer> tokenizer,
                                                        std::vector<int32_t> eos_ids);
  ~Router();

  absl::Status Start();
  void Shutdown();

  int http_port() const { return http_port_; }
  int grpc_port() const { return grpc_port_; }
  // "moeshard-router: http://HOST:PORT grpc HOST:GPORT"
  std::string Banner() const;

 private:
  Router(const RouterConfig& config, std::unique_ptr<Tokenizer> tokenizer, std::vector<PoolConfig> pools);

  const RouterConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  RouterMetrics metrics_;
  ActiveGenerations active_;
  std::atomic<bool> shutting_down_{false};
  std::unique_ptr<Cluster> cluster_;
  RouterServices services_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<GrpcServer> grpc_;
  int http_port_ = 0;
  int grpc_port_ = 0;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace moeshard::router
