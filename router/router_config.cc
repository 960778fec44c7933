#include "router/router_config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/metrics/metrics.h"
#include "common/security/cluster_credential.h"

namespace moeshard::router {
namespace {

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value, int lo, int hi) {
  int v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " needs an integer in [", lo, ", ", hi, "], got '", value, "'"));
  }
  return v;
}

}  // namespace

std::string RouterUsage() {
  return "usage: moeshard-router (--pools FILE | --coordinator HOST:PORT) [--model PATH] [--served-model-name NAME]\n"
         "                       [--host 127.0.0.1] [--port 0] [--grpc-port 0] [--api-key KEY | --api-key-file FILE]\n"
         "                       [--http-threads 128] [--poll-interval-ms 250] [--drain-timeout-s 10] [--metric-prefix moeshard_|moeshard:]\n"
         "                       [--tls-cert PEM --tls-key PEM] [--max-prompt-bytes 4194304] [--max-connections N]\n"
         "                       [--max-connections-per-client 96] [--request-read-timeout-s 10]\n"
         "                       [--cluster-token-file FILE] [--internal-tls-cert PEM --internal-tls-key PEM --internal-tls-ca PEM]\n"
         "The API key is best given by $MOESHARD_API_KEY or --api-key-file (a command line is visible in ps);\n"
         "the cluster credential by $MOESHARD_CLUSTER_TOKEN or --cluster-token-file (`moeshard up` makes one).\n";
}

absl::StatusOr<RouterConfig> ParseRouterFlags(const std::vector<std::string>& args) {
  static const char* const kFlags[] = {
      "host",        "port",    "grpc-port",    "model",        "served-model-name", "pools",
      "coordinator", "api-key", "api-key-file", "http-threads", "poll-interval-ms",  "drain-timeout-s", "metric-prefix",
      "cluster-token-file", "internal-tls-cert", "internal-tls-key", "internal-tls-ca", "tls-cert", "tls-key",
      "max-prompt-bytes", "max-connections", "max-connections-per-client", "request-read-timeout-s"};
  std::map<std::string, std::string> values;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (!absl::ConsumePrefix(&arg, "--"))
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    std::string name(arg), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    if (std::find(std::begin(kFlags), std::end(kFlags), name) == std::end(kFlags)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    values[name] = value;
  }
  auto get = [&](const char* name) { return values.count(name) ? values[name] : std::string(); };

  RouterConfig c;
  if (values.count("host")) c.host = get("host");
  if (values.count("port")) {
    auto v = ParseInt("port", get("port"), 0, 65535);
    if (!v.ok()) return v.status();
    c.http_port = *v;
  }
  if (values.count("grpc-port")) {
    auto v = ParseInt("grpc-port", get("grpc-port"), 0, 65535);
    if (!v.ok()) return v.status();
    c.grpc_port = *v;
  }
  if (values.count("http-threads")) {
    auto v = ParseInt("http-threads", get("http-threads"), 1, 100000);
    if (!v.ok()) return v.status();
    c.http_threads = *v;
  }
  if (values.count("poll-interval-ms")) {
    auto v = ParseInt("poll-interval-ms", get("poll-interval-ms"), 10, 60000);
    if (!v.ok()) return v.status();
    c.poll_interval = absl::Milliseconds(*v);
  }
  if (values.count("drain-timeout-s")) {
    auto v = ParseInt("drain-timeout-s", get("drain-timeout-s"), 0, 3600);
    if (!v.ok()) return v.status();
    c.drain_timeout = absl::Seconds(*v);
  }
  const std::pair<const char*, int*> kInts[] = {{"max-connections", &c.max_connections},
                                                {"max-connections-per-client", &c.max_connections_per_client},
                                                {"request-read-timeout-s", &c.request_read_timeout_s}};
  for (const auto& [flag, field] : kInts) {
    if (!values.count(flag)) continue;
    auto v = ParseInt(flag, get(flag), 1, 1000000);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  if (values.count("max-prompt-bytes")) {
    auto v = ParseInt("max-prompt-bytes", get("max-prompt-bytes"), 1, 1 << 30);
    if (!v.ok()) return v.status();
    c.max_prompt_bytes = *v;
  }
  if (c.max_connections == 0) c.max_connections = 2 * c.http_threads;
  c.cluster_token_file = get("cluster-token-file");
  c.internal_tls_cert = get("internal-tls-cert");
  c.internal_tls_key = get("internal-tls-key");
  c.internal_tls_ca = get("internal-tls-ca");
  c.tls_cert = get("tls-cert");
  c.tls_key = get("tls-key");
  if (c.tls_cert.empty() != c.tls_key.empty()) return absl::InvalidArgumentError("give both --tls-cert and --tls-key, or neither");
  if (values.count("metric-prefix")) {
    c.metric_prefix = get("metric-prefix");
    if (absl::Status st = ValidateMetricPrefix(c.metric_prefix); !st.ok()) return st;
  }
  c.model_path = get("model");
  c.served_model_name = get("served-model-name");
  if (c.served_model_name.empty()) c.served_model_name = c.model_path.empty() ? "moeshard" : c.model_path;
  c.pools_path = get("pools");
  c.coordinator = get("coordinator");
  if (c.pools_path.empty() == c.coordinator.empty()) {
    return absl::InvalidArgumentError("give exactly one of --pools FILE and --coordinator HOST:PORT");
  }
  if (values.count("api-key") && values.count("api-key-file")) {
    return absl::InvalidArgumentError("give at most one of --api-key and --api-key-file");
  }
  if (values.count("api-key")) {
    c.api_key = get("api-key");
    if (c.api_key.empty()) return absl::InvalidArgumentError("--api-key must not be empty");
  } else if (values.count("api-key-file")) {
    auto key = ReadSecretFile(get("api-key-file"), "--api-key-file");
    if (!key.ok()) return key.status();
    c.api_key = *key;
  } else if (const char* env = std::getenv("MOESHARD_API_KEY"); env != nullptr && *env != '\0') {
    c.api_key = env;
  }
  return c;
}

std::string DescribeConfig(const RouterConfig& c) {
  return absl::StrCat(
      "host=", c.host, " port=", c.http_port, " grpc_port=", c.grpc_port,
      " model=", c.model_path.empty() ? "(none: token ids only)" : c.model_path,
      " served_model_name=", c.served_model_name,
      c.pools_path.empty() ? absl::StrCat(" coordinator=", c.coordinator) : absl::StrCat(" pools=", c.pools_path),
      " api_key=", c.api_key.empty() ? "off" : "on", " http_threads=", c.http_threads,
      " poll_interval=", absl::FormatDuration(c.poll_interval),
      " drain_timeout=", absl::FormatDuration(c.drain_timeout), " metric_prefix=", c.metric_prefix);
}

}  // namespace moeshard::router
