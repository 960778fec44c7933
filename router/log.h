// Log lines on stderr, one per event, each naming the request it belongs to:
//   2025-01-31T12:00:00.123Z router [req-id] message
// Thread-safe (one fwrite per line).
#pragma once

#include "absl/strings/string_view.h"

namespace moeshard::router {

void LogLine(absl::string_view request_id, absl::string_view message);

}  // namespace moeshard::router
