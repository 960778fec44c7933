// exp(x) for x <= 0 for the sampler's passes over a vocabulary (worker/sampler.cc,
// worker/sampler_buckets.cc): inline and branch-free, so that those loops vectorize (their files
// compile with -fno-trapping-math: GCC keeps the clamp's compare a branch otherwise).
#pragma once

#include <cstdint>
#include <cstring>

namespace moeshard {

// exp(x) for x <= 0, within a few ulp of std::exp: x = k ln2 + r with |r| <= ln2 / 2, e^r by its
// Taylor series to r^13 (the remainder is below 1e-17 relative), times 2^k written into the
// exponent bits. Below -708 it returns about e^-708 (~3e-308) instead of a denormal or 0, which
// no sum of these terms (the largest is 1) can tell apart. Branch-free, so the loop over a
// vocabulary vectorizes (std::exp is a call per element).
inline double ExpNonPositive(double x) {
  x = x >= -708.0 ? x : -708.0;  // NaN too
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: t's low mantissa bits hold round(x log2 e)
  const double t = x * kLog2e + kShift;
  const double k = t - kShift;
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  int64_t tb, sb;
  std::memcpy(&tb, &t, 8);
  std::memcpy(&sb, &kShift, 8);
  const int64_t scale_bits = (tb - sb + 1023) << 52;  // 2^k, k in [-1022, 0]
  double scale;
  std::memcpy(&scale, &scale_bits, 8);
  return p * scale;
}

}  // namespace moeshard
