// The sampling parameters of one request, as every layer sees them: the router fills them
// from the API, the coordinator's scheduler carries them per sequence, the worker's sampler
// draws with them. The one definition (proto/proto_convert.h maps it to the wire).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace moeshard {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int32_t top_k = 0;        // 0 = off
  float top_p = 1.f;        // 1 = off
  float min_p = 0.f;        // 0 = off
  uint64_t seed = 0;
  bool has_seed = false;

  // InvalidArgument naming the parameter outside its range: temperature in [0, 100],
  // top_k >= 0, top_p in (0, 1], min_p in [0, 1].
  absl::Status Validate() const;
};

}  // namespace moeshard
