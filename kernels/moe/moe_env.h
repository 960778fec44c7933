// The MoE kernels' environment knobs (benchmarks and tests set them; production leaves them
// unset): an integer, or `def` when the variable is unset or empty. Callers read it once, into a
// function-local static.
#pragma once

#include <cstdlib>

namespace moeshard::gpu {

inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

}  // namespace moeshard::gpu
