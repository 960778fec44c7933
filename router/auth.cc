#include "router/auth.h"

#include <algorithm>

namespace moeshard::router {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool BearerAuthorized(std::string_view authorization, std::string_view api_key) {
  if (api_key.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) return false;
  return ConstantTimeEquals(authorization.substr(kBearer.size()), api_key);
}

}  // namespace moeshard::router
