#include "kernels/cpu/dequant.h"

#include <cstring>

#include "common/dtype.h"

namespace moeshard {

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kF16: return "f16";
    case WeightFormat::kQ8_0: return "q8_0";
    case WeightFormat::kMXFP4: return "mxfp4";
    case WeightFormat::kNVFP4: return "nvfp4";
  }
  return "?";
}

void DequantQ8_0Block(const uint8_t* b, float* out) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  float d = F16ToF32(h);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(q[i]);
}

void DequantMxfp4Block(const uint8_t* b, float* out) {
  float d = E8M0ToF32(b[0]);
  for (int j = 0; j < 16; ++j) {
    out[j] = kE2M1Values[b[1 + j] & 0xf] * d;
    out[j + 16] = kE2M1Values[b[1 + j] >> 4] * d;
  }
}

namespace {

// Expands stored block-format columns [c0, c1) (block aligned) of one row.
template <int kBlockBytes, void (*kBlock)(const uint8_t*, float*)>
void DequantBlocks(const uint8_t* row, int64_t c0, int64_t c1, float* out) {
  for (int64_t c = c0; c < c1; c += 32) kBlock(row + (c / 32) * kBlockBytes, out + (c - c0));
}

}  // namespace

void DequantRow(const WeightRef& w, int64_t row, float* out) {
  const uint8_t* r = w.data + row * w.row_stride_bytes;
  const int64_t c0 = w.col_offset, n = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, r + c0 * 4, n * 4);
      return;
    case WeightFormat::kBF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(r) + c0;
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(p[i]);
      return;
    }
    case WeightFormat::kF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(r) + c0;
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(p[i]);
      return;
    }
    case WeightFormat::kNVFP4: {
      const uint8_t* s = w.scale + row * w.scale_row_stride;
      for (int64_t i = 0; i < n; ++i) {
        int64_t c = c0 + i;
        uint8_t byte = r[c / 2];
        uint8_t code = (c & 1) ? (byte >> 4) : (byte & 0xf);
        out[i] = kE2M1Values[code] * E4M3ToF32(s[c / 16]) * w.scale2;
      }
      return;
    }
    case WeightFormat::kQ8_0:
    case WeightFormat::kMXFP4: {
      int64_t b0 = (c0 / 32) * 32, b1 = ((c0 + n + 31) / 32) * 32;
      float tmp_stack[1024];
      float* tmp = (b1 - b0 <= 1024) ? tmp_stack : new float[b1 - b0];
      if (w.format == WeightFormat::kQ8_0) {
        DequantBlocks<34, DequantQ8_0Block>(r, b0, b1, tmp);
      } else {
        DequantBlocks<17, DequantMxfp4Block>(r, b0, b1, tmp);
      }
      std::memcpy(out, tmp + (c0 - b0), n * 4);
      if (tmp != tmp_stack) delete[] tmp;
      return;
    }
  }
}

}  // namespace moeshard
