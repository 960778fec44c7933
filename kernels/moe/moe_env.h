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

// A switch on by default: off when the variable's value starts with 0.
inline bool EnvOn(const char* name) {
  const char* v = std::getenv(name);
  return !(v && v[0] == '0');
}

// MOESHARD_MOE_DOWN_EARLY: the direct down kernels (moe_stream_direct.cu, moe_direct.cu,
// moe_gemv.cu) issue their first weights before their wait; a value starting with 0 makes them wait
// first. Read once, the same for all three.
inline bool MoeDownEarly() {
  static const bool on = EnvOn("MOESHARD_MOE_DOWN_EARLY");
  return on;
}

}  // namespace moeshard::gpu
