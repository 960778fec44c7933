#include "router/log.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace moeshard::router {

void LogLine(absl::string_view request_id, absl::string_view message) {
  const std::string when = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  const std::string line = request_id.empty() ? absl::StrCat(when, " router ", message, "\n")
                                              : absl::StrCat(when, " router [", request_id, "] ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace moeshard::router
