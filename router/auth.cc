#include "router/auth.h"

#include "common/security/cluster_credential.h"

namespace moeshard::router {

bool ConstantTimeEquals(std::string_view a, std::string_view b) { return SecretEquals(a, b); }

bool BearerAuthorized(std::string_view authorization, std::string_view api_key) {
  return api_key.empty() || BearerEquals(authorization, api_key);
}

}  // namespace moeshard::router
