// Weight quantizers (CPU): NVFP4 as NVIDIA's modelopt lays it out (and as
// ../shared/reference/muse_spark.py's nvfp4_quant computes it): one fp32 scale per matrix
// (amax / (6 * 448)), one e4m3 scale per 16 elements of a row, E2M1 codes rounded to
// nearest, packed two per byte (even column in the low nibble).
#pragma once

#include <cstdint>
#include <vector>

namespace moeshard {

struct Nvfp4Matrix {
  std::vector<uint8_t> packed;  // [rows, cols/2]
  std::vector<uint8_t> scale;   // e4m3 [rows, cols/16]
  float scale2 = 1.f;
};

// cols must be a multiple of 16.
Nvfp4Matrix QuantizeNvfp4(const float* w, int64_t rows, int64_t cols);

}  // namespace moeshard
