#include "common/security/cluster_credential.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace moeshard {
namespace {

absl::Status CheckToken(const std::string& token, const std::string& source) {
  if (token.size() < kMinClusterTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster credential from ", source, " is shorter than ", kMinClusterTokenChars, " characters"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the cluster credential from ", source, " must be printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> GenerateClusterToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string bytes(32, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    return absl::UnavailableError("cannot read /dev/urandom for the cluster credential");
  }
  return absl::BytesToHexString(bytes);
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(what, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(ss.str()));
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is empty"));
  return secret;
}

absl::StatusOr<std::string> LoadClusterToken(const std::string& file_flag) {
  if (const char* env = std::getenv(kClusterTokenEnv); env != nullptr && *env != '\0') {
    std::string token(absl::StripAsciiWhitespace(env));
    if (absl::Status st = CheckToken(token, absl::StrCat("$", kClusterTokenEnv)); !st.ok()) return st;
    return token;
  }
  std::string path = file_flag;
  std::string source = "--cluster-token-file";
  if (path.empty()) {
    if (const char* env = std::getenv(kClusterTokenFileEnv); env != nullptr) path = env;
    source = absl::StrCat("$", kClusterTokenFileEnv);
  }
  if (path.empty()) {
    return absl::NotFoundError(absl::StrCat("no cluster credential: set $", kClusterTokenEnv, " or $", kClusterTokenFileEnv,
                                            ", or pass --cluster-token-file (`moeshard up` makes one per cluster)"));
  }
  auto token = ReadSecretFile(path, source);
  if (!token.ok()) return token.status();
  if (absl::Status st = CheckToken(*token, path); !st.ok()) return st;
  return token;
}

bool SecretEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool BearerEquals(std::string_view authorization, std::string_view secret) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return false;
  return SecretEquals(authorization.substr(kBearer.size()), secret);
}

}  // namespace moeshard
