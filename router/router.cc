#include "router/router.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "router/log.h"
#include "common/model/model_loader.h"

namespace moeshard::router {

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterConfig& config) {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> eos_ids;
  if (!config.model_path.empty()) {
    auto model = LoadModel(config.model_path, /*load_tokenizer=*/true);
    if (!model.ok()) return model.status();
    tokenizer = std::move(model->tokenizer);
    eos_ids = model->config.eos_token_ids;
    if (tokenizer == nullptr) LogLine("", absl::StrCat(config.model_path, " has no tokenizer: token-id prompts only"));
  }
  return Create(config, std::move(tokenizer), std::move(eos_ids));
}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(const RouterConfig& config, std::unique_ptr<Tokenizer> tokenizer,
                                                       std::vector<int32_t> eos_ids) {
  std::vector<PoolConfig> pools;
  if (!config.pools_path.empty()) {
    auto loaded = LoadPoolsConfig(config.pools_path);
    if (!loaded.ok()) return loaded.status();
    pools = *std::move(loaded);
  } else {
    pools.push_back(PoolConfig{.name = "default", .max_model_len = 0, .coordinators = {config.coordinator}});
  }
  if (tokenizer != nullptr && eos_ids.empty() && tokenizer->eos_id()) eos_ids.push_back(*tokenizer->eos_id());
  auto router = std::unique_ptr<Router>(new Router(config, std::move(tokenizer), std::move(pools)));
  router->services_.eos_ids = std::move(eos_ids);
  return router;
}

Router::Router(const RouterConfig& config, std::unique_ptr<Tokenizer> tokenizer, std::vector<PoolConfig> pools)
    : config_(config), tokenizer_(std::move(tokenizer)) {
  cluster_ = std::make_unique<Cluster>(std::move(pools), config_.poll_interval);
  metrics_.RegisterPools(cluster_->Snapshot());
  services_.served_model_name = config_.served_model_name;
  services_.tokenizer = tokenizer_.get();
  services_.cluster = cluster_.get();
  services_.metrics = &metrics_;
  services_.active = &active_;
  services_.shutting_down = &shutting_down_;
  services_.migration_timeout = config_.migration_timeout;
  services_.heal_wait = config_.heal_wait;
  services_.max_prompt_bytes = config_.max_prompt_bytes;
  ConnectionLimits limits;
  limits.num_threads = std::max(1, config_.http_threads);
  limits.max_connections = config_.max_connections > 0 ? config_.max_connections : 2 * config_.http_threads;
  limits.max_per_client = config_.max_connections_per_client;
  limits.request_read_timeout_s = config_.request_read_timeout_s;
  limits.tls_cert_file = config_.tls_cert;
  limits.tls_key_file = config_.tls_key;
  // A prompt's JSON may escape each byte as six (\u00XX); the body limit leaves that room.
  const size_t max_body = static_cast<size_t>(std::min<int64_t>(config_.max_prompt_bytes * 6 + (1 << 20), int64_t{1} << 31));
  HttpOptions http;
  http.host = config_.host;
  http.port = config_.http_port;
  http.api_key = config_.api_key;
  http.limits = limits;
  http.max_body_bytes = max_body;
  http_ = std::make_unique<HttpServer>(services_, http);
  grpc_ = std::make_unique<GrpcServer>(services_, config_.api_key);
}

Router::~Router() { Shutdown(); }

absl::Status Router::Start() {
  LogLine("", absl::StrCat("starting: ", DescribeConfig(config_)));
  auto grpc_port = grpc_->Start(config_.host, config_.grpc_port, config_.tls_cert, config_.tls_key);
  if (!grpc_port.ok()) return grpc_port.status();
  grpc_port_ = *grpc_port;
  auto http_port = http_->Start();
  if (!http_port.ok()) return http_port.status();
  http_port_ = *http_port;
  cluster_->SetReadinessCallback([this](bool ready) {
    LogLine("", ready ? "a pool is ready: serving" : "no pool is ready");
    if (!shutting_down_.load()) grpc_->SetServing(ready);
  });
  cluster_->Start();
  started_ = true;
  for (const PoolState& p : cluster_->Snapshot()) {
    std::string coords;
    for (const CoordinatorState& c : p.coordinators) absl::StrAppend(&coords, coords.empty() ? "" : ",", c.address);
    LogLine("", absl::StrCat("pool ", p.name, " max_model_len=",
                             p.max_model_len == 0 ? "(from coordinator)" : absl::StrCat(p.max_model_len),
                             " coordinators=", coords));
  }
  return absl::OkStatus();
}

void Router::Shutdown() {
  if (stopped_) return;
  stopped_ = true;
  if (!started_) return;
  shutting_down_ = true;
  grpc_->SetServing(false);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(config_.drain_timeout);
  if (active_.size() > 0) LogLine("", absl::StrCat("shutting down: draining ", active_.size(), " requests"));
  while (active_.size() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (active_.size() > 0) LogLine("", absl::StrCat("shutting down: cancelling ", active_.size(), " requests"));
  active_.CancelAll();
  grpc_->Stop(absl::Seconds(1));
  http_->Stop();
  cluster_->Stop();
  LogLine("", "stopped");
}

std::string Router::Banner() const {
  return absl::StrCat("moeshard-router: ", config_.tls_cert.empty() ? "http" : "https", "://", config_.host, ":", http_port_, " grpc ", config_.host, ":",
                      grpc_port_);
}

}  // namespace moeshard::router
