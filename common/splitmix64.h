// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014),
// the one copy of it for host and device code: the engine's seeds, the synthetic weights of
// make-model and the GPU fills, the KV block hashes, the integration suite's prompts.
//
//   state += 0x9E3779B97F4A7C15 (the golden-ratio gamma);  out = Mix(state)
//
// where Mix is the variant-13 finalizer (xor-shift 30, 27, 31 and two multiplies), a bijection
// of 64 bits. Everything here is constexpr, header-only and, under nvcc, __host__ __device__.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOESHARD_HOST_DEVICE __host__ __device__
#else
#define MOESHARD_HOST_DEVICE
#endif

namespace moeshard {

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// The finalizer alone: a bijective mix of the 64 bits of z.
MOESHARD_HOST_DEVICE constexpr uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The draw of a generator whose state is z: Mix(z + gamma). A stateless hash of z.
MOESHARD_HOST_DEVICE constexpr uint64_t SplitMix64(uint64_t z) { return SplitMix64Mix(z + 0x9E3779B97F4A7C15ull); }

// The generator as a value type: Next() advances the state by gamma and returns its mix.
// Not thread-safe (one per thread).
class SplitMix64Rng {
 public:
  MOESHARD_HOST_DEVICE constexpr explicit SplitMix64Rng(uint64_t state) : state_(state) {}
  MOESHARD_HOST_DEVICE constexpr uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return SplitMix64Mix(state_);
  }
  MOESHARD_HOST_DEVICE constexpr uint64_t state() const { return state_; }
  MOESHARD_HOST_DEVICE constexpr void set_state(uint64_t state) { state_ = state; }

 private:
  uint64_t state_;
};

// Reference values (Vigna's splitmix64.c seeded with 0: 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4).
static_assert(SplitMix64Rng(0).Next() == 0xE220A8397B1DCDAFull);
static_assert(SplitMix64(kSplitMix64Gamma) == 0x6E789E6AA1B965F4ull);

}  // namespace moeshard
