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
  // Security (docs/architecture.md, "Security model"). The cluster credential comes from
  // $MOESHARD_CLUSTER_TOKEN or --cluster-token-file; mutual TLS to the coordinators by files.
  std::string cluster_token_file, internal_tls_cert, internal_tls_key, internal_tls_ca;
  std::string tls_cert, tls_key;          // TLS on the public HTTP and gRPC ports: both or none
  int64_t max_prompt_bytes = 4 << 20;     // request bodies and prompt text, checked before tokenizing
  int max_connections = 0;                // HTTP connections at once; 0 = 2 x http_threads
  int max_connections_per_client = 96;    // HTTP connections at once from one address (a benchmark at 64 fits)
  int request_read_timeout_s = 10;        // a request's header and body must arrive within this
};

// `args` without the program name. Errors: unknown flags, missing values, bad numbers,
// neither or both of --pools and --coordinator, an unreadable or empty key file.
absl::StatusOr<RouterConfig> ParseRouterFlags(const std::vector<std::string>& args);
std::string RouterUsage();

// The effective configuration in one line, without the key (for the start-up log).
std::string DescribeConfig(const RouterConfig& config);

}  // namespace moeshard::router
