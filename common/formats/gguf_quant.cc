// See gguf_quant.h for the rules; the arithmetic follows ggml's float32 code step by
// step (same divisions, same search order) so the bytes match llama.cpp's own quantizer.
#include "common/formats/gguf_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"

namespace moeshard {
namespace {

// ggml's kvalues_mxfp4: the E2M1 values doubled, to be scaled by half the E8M0 scale.
constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Half of 2^(e-127), as ggml's GGML_E8M0_TO_FP32_HALF (subnormal for e < 2).
float E8M0Half(uint8_t e) {
  const uint32_t bits = e < 2 ? (0x00200000u << e) : (static_cast<uint32_t>(e) - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Index of the table value nearest to x (first one on ties), as ggml's best_index_mxfp4.
uint8_t NearestMxfp4(float x, float half_scale) {
  int best = 0;
  float best_err = std::fabs(kMxfp4Doubled[0] * half_scale - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(kMxfp4Doubled[i] * half_scale - x);
    if (err < best_err) {
      best = i;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

float BlockAmax(const float* x) {
  float amax = 0.f;
  for (int j = 0; j < kGgufBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

}  // namespace

uint8_t Mxfp4Exponent(float amax) {
  if (!(amax > 0.f)) return 0;
  // ggml converts floor(log2f(amax)) - 2 + 127 straight to uint8; clamped here so that
  // magnitudes outside e8m0's range cannot wrap around.
  const float e = std::floor(std::log2(amax)) - 2.f + 127.f;
  return static_cast<uint8_t>(std::clamp(e, 0.f, 254.f));
}

void QuantizeRowQ8_0(const float* x, int64_t n, std::string* out) {
  for (int64_t b = 0; b < n / kGgufBlock; ++b) {
    const float* xb = x + b * kGgufBlock;
    const float d = BlockAmax(xb) / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const uint16_t h = F32ToF16(d);
    out->append(reinterpret_cast<const char*>(&h), 2);
    for (int j = 0; j < kGgufBlock; ++j) {
      out->push_back(static_cast<char>(static_cast<int8_t>(std::round(xb[j] * id))));
    }
  }
}

void QuantizeRowMxfp4(const float* x, int64_t n, std::string* out) {
  for (int64_t b = 0; b < n / kGgufBlock; ++b) {
    const float* xb = x + b * kGgufBlock;
    const uint8_t e = Mxfp4Exponent(BlockAmax(xb));
    const float half_scale = E8M0Half(e);
    out->push_back(static_cast<char>(e));
    for (int j = 0; j < kGgufBlock / 2; ++j) {
      const uint8_t lo = NearestMxfp4(xb[j], half_scale);
      const uint8_t hi = NearestMxfp4(xb[j + kGgufBlock / 2], half_scale);
      out->push_back(static_cast<char>(lo | (hi << 4)));
    }
  }
}

}  // namespace moeshard
