// CPU expansion of stored weight rows to float32: the reference that every GPU
// expansion (bf16, f16, Q8_0, MXFP4, NVFP4) must match bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_ref.h"

namespace moeshard {

// out[0..w.cols) = row `row` of the view, expanded to float32.
void DequantRow(const WeightRef& w, int64_t row, float* out);

// One Q8_0 block (34 bytes: f16 scale, 32 int8) / MXFP4 block (17 bytes: e8m0 scale,
// 16 bytes of nibbles: element j in the low nibble of byte j, element j+16 in the high one).
void DequantQ8_0Block(const uint8_t* block, float* out32);
void DequantMxfp4Block(const uint8_t* block, float* out32);

}  // namespace moeshard
