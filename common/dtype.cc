#include "common/dtype.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace moeshard {

const float kE2M1Values[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                               -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kBool: return "BOOL";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E5M2: return "F8_E5M2";
    case DType::kQ8_0: return "Q8_0";
    case DType::kMXFP4: return "MXFP4";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromSafetensors(std::string_view n) {
  if (n == "F32") return DType::kF32;
  if (n == "F16") return DType::kF16;
  if (n == "BF16") return DType::kBF16;
  if (n == "F64") return DType::kF64;
  if (n == "I8") return DType::kI8;
  if (n == "U8") return DType::kU8;
  if (n == "I16") return DType::kI16;
  if (n == "I32") return DType::kI32;
  if (n == "I64") return DType::kI64;
  if (n == "BOOL") return DType::kBool;
  if (n == "F8_E4M3") return DType::kF8E4M3;
  if (n == "F8_E5M2") return DType::kF8E5M2;
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", std::string(n), "'"));
}

int DTypeBlock(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kMXFP4: return 32;
    default: return 1;
  }
}

absl::StatusOr<uint64_t> DTypeBytes(DType t, uint64_t n) {
  uint64_t per = 0;
  switch (t) {
    case DType::kF64: case DType::kI64: per = 8; break;
    case DType::kF32: case DType::kI32: per = 4; break;
    case DType::kF16: case DType::kBF16: case DType::kI16: per = 2; break;
    case DType::kI8: case DType::kU8: case DType::kBool: case DType::kF8E4M3: case DType::kF8E5M2:
      per = 1; break;
    case DType::kQ8_0:
    case DType::kMXFP4: {
      if (n % 32 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(DTypeName(t), " needs a multiple of 32 elements per row, got ", n));
      }
      uint64_t blocks = n / 32;
      return blocks * (t == DType::kQ8_0 ? 34u : 17u);
    }
  }
  if (n > (UINT64_MAX / 8)) return absl::InvalidArgumentError("element count overflows");
  return n * per;
}

float F16ToF32Exact(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00);
  if (a >= 65520.f) return static_cast<uint16_t>(sign | 0x7c00);
  if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.f));
    return static_cast<uint16_t>(sign | m);
  }
  int e;
  float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  uint32_t mant = static_cast<uint32_t>(std::nearbyint((m * 2.f - 1.f) * 1024.f));
  int exp = e - 1 + 15;
  if (mant == 1024) { mant = 0; ++exp; }
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

float E4M3ToF32Exact(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  float r;
  if (exp == 15 && man == 7) return NAN;
  if (exp == 0) r = std::ldexp(static_cast<float>(man), -9);
  else r = std::ldexp(static_cast<float>(man | 8), static_cast<int>(exp) - 10);
  return sign ? -r : r;
}

uint8_t F32ToE4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  // Exhaustive nearest search over the 127 non-negative codes; ties go to the even code.
  uint8_t best = 0;
  float best_d = INFINITY;
  for (uint8_t c = 0; c < 0x7f; ++c) {
    float d = std::fabs(E4M3ToF32(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) { best_d = d; best = c; }
  }
  return sign | best;
}

const float* F16Table() {
  static float* t = [] {
    float* a = new float[65536];
    for (uint32_t i = 0; i < 65536; ++i) a[i] = F16ToF32Exact(static_cast<uint16_t>(i));
    return a;
  }();
  return t;
}

const float* E4M3Table() {
  static float* t = [] {
    float* a = new float[256];
    for (uint32_t i = 0; i < 256; ++i) a[i] = E4M3ToF32Exact(static_cast<uint8_t>(i));
    return a;
  }();
  return t;
}

float E5M2ToF32(uint8_t v) {
  uint16_t h = static_cast<uint16_t>(v) << 8;
  return F16ToF32(h);
}

float E8M0ToF32(uint8_t v) {
  if (v == 0xff) return NAN;
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

}  // namespace moeshard
