// The router's configuration: parsed from the command line once, validated, immutable.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace moeshard::router {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int http_port = 0;              // 0 = a free port
  int grpc_port = 0;              // 0 = a free port
  std::string model_path;         // tokenizer, chat template and default model name
  std::string served_model_name;  // default: model_path, else "moeshard"
  std::string pools_path;         // --pools FILE, or
  std::string coordinator;        // --coordinator host:port (pool "default")
  std::string api_key;            // --api-key, --api-key-file or MOESHARD_API_KEY; "" = open
  int http_threads = 128;         // connections served at once; each stream holds one
  absl::Duration poll_interval = absl::Milliseconds(250);
  absl::Duration drain_timeout = absl::Seconds(10);
  absl::Duration migration_timeout = absl::Seconds(60);  // generation.h: RouterServices
  absl::Duration heal_wait = absl::Seconds(10);
  std::string metric_prefix = "moeshard_";  // --metric-prefix: moeshard_ or moeshard: (see common/metrics)
};

// `args` without the program name. Errors: unknown flags, missing values, bad numbers,
// neither or both of --pools and --coordinator, an unreadable or empty key file.
absl::StatusOr<RouterConfig> ParseRouterFlags(const std::vector<std::string>& args);
std::string RouterUsage();

// The effective configuration in one line, without the key (for the start-up log).
std::string DescribeConfig(const RouterConfig& config);

}  // namespace moeshard::router
