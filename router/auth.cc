#include "router/auth.h"

#include "common/security/cluster_credential.h"

namespace moeshard::router {

bool ConstantTimeEquals(std::string_view a, std::string_view b) { return SecretEquals(a, b); }

bool BearerAuthorized(std::string_view authorization, std::string_view api_key) {
  if (api_key.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return false;
  return ConstantTimeEquals(authorization.substr(kBearer.size()), api_key);
}

}  // namespace moeshard::router
