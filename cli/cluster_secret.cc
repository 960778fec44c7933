#include "cli/cluster_secret.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/security/cluster_credential.h"

namespace moeshard {

absl::Status ExportClusterToken(const Args& a) {
  std::string token;
  auto loaded = LoadClusterToken(a.Get("cluster-token-file"));
  if (loaded.ok()) {
    token = *loaded;
  } else if (absl::IsNotFound(loaded.status()) && !a.Has("cluster-token-file")) {
    auto made = GenerateClusterToken();
    if (!made.ok()) return made.status();
    token = *made;
  } else {
    return loaded.status();
  }
  if (setenv(kClusterTokenEnv, token.c_str(), 1) != 0) return absl::InternalError("cannot set the cluster credential");
  return absl::OkStatus();
}

absl::Status ExportApiKey(const Args& a) {
  if (a.Has("api-key") && a.Has("api-key-file")) return absl::InvalidArgumentError("give at most one of --api-key and --api-key-file");
  std::string key = a.Get("api-key");
  if (!key.empty()) {
    std::fprintf(stderr, "moeshard up: warning: --api-key is visible to every user in ps; use $MOESHARD_API_KEY or --api-key-file\n");
  }
  if (a.Has("api-key-file")) {
    auto k = ReadSecretFile(a.Get("api-key-file"), "--api-key-file");
    if (!k.ok()) return k.status();
    key = *k;
  }
  if (!key.empty() && setenv("MOESHARD_API_KEY", key.c_str(), 1) != 0) return absl::InternalError("cannot set the API key");
  return absl::OkStatus();
}

std::vector<std::string> InternalTlsArgs(const Args& a) {
  std::vector<std::string> args;
  for (const char* f : {"internal-tls-cert", "internal-tls-key", "internal-tls-ca"}) {
    if (a.Has(f)) args.insert(args.end(), {absl::StrCat("--", f), a.Get(f)});
  }
  return args;
}

}  // namespace moeshard
