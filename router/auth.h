// API-key checks shared by the HTTP and gRPC front ends.
#pragma once

#include <string_view>

namespace moeshard::router {

// Equal strings, in time that depends only on their lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// True when no key is set, or `authorization` (the HTTP header or gRPC metadata value)
// is "Bearer <key>".
bool BearerAuthorized(std::string_view authorization, std::string_view api_key);

}  // namespace moeshard::router
