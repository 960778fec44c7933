// A view of one weight matrix W [rows, cols] in its stored format, without copying it.
// Rows are `row_stride_bytes` apart; `col_offset` selects a column window of a wider
// stored row (tensor-parallel slices of a row-parallel projection).
#pragma once

#include <cstdint>

namespace moeshard {

enum class WeightFormat : uint8_t { kF32, kBF16, kF16, kQ8_0, kMXFP4, kNVFP4 };

const char* WeightFormatName(WeightFormat f);

// Bytes of one stored row of `cols` elements (block formats: cols a multiple of 32; NVFP4's
// scales live in a separate tensor).
inline int64_t WeightRowBytes(WeightFormat f, int64_t cols) {
  switch (f) {
    case WeightFormat::kF32: return cols * 4;
    case WeightFormat::kBF16:
    case WeightFormat::kF16: return cols * 2;
    case WeightFormat::kQ8_0: return cols / 32 * 34;
    case WeightFormat::kMXFP4: return cols / 32 * 17;
    case WeightFormat::kNVFP4: return cols / 2;
  }
  return 0;
}

struct WeightRef {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0, cols = 0;           // the logical view
  const uint8_t* data = nullptr;        // row 0 of the view (column 0 of the stored row)
  int64_t row_stride_bytes = 0;
  int64_t col_offset = 0;               // first stored column of the view
  // NVFP4 only: e4m3 block scales [rows, stored_cols/16] and the per-matrix fp32 scale.
  const uint8_t* scale = nullptr;
  int64_t scale_row_stride = 0;
  float scale2 = 1.0f;

  bool valid() const { return data != nullptr && rows > 0 && cols > 0; }
  // Rows [begin, begin + n) of this view.
  WeightRef RowSlice(int64_t begin, int64_t n) const {
    WeightRef r = *this;
    r.data = data + begin * row_stride_bytes;
    if (scale) r.scale = scale + begin * scale_row_stride;
    r.rows = n;
    return r;
  }
  // Columns [begin, begin + n) of this view.
  WeightRef ColSlice(int64_t begin, int64_t n) const {
    WeightRef r = *this;
    r.col_offset += begin;
    r.cols = n;
    return r;
  }
};

}  // namespace moeshard
