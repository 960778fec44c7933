// The Q8_0 streaming layout (MoeRepackQ8; read by the kernels of moe_stream.cuh with kQ8): where
// each int8 code and fp16 block scale of a repacked matrix sits. The repack (moe_q8_stream.cu)
// writes through these functions and the kernels read through them, and
// tests/kernels/moe_stream_layout_test.cc checks on the CPU that a product computed with them
// and the m16n8k16 fragment rules of the PTX ISA is W · x.
//
// A matrix [rows, cols] (rows % 16 == 0, cols % 256 == 0) is cut into 16-row slices and 256-column
// chunks; chunk (s, kc) is kQ8StreamSliceBytes of codes at ((s · cols/256) + kc) ·
// kQ8StreamSliceBytes and kQ8StreamSliceScaleBytes of scales at the same index times that.
// Inside a chunk, for each 32-column block b (0..7), lane (g, c) = (lane / 4, lane % 4) of a warp
// finds at byte (32b + lane) · 16 the 8 codes of columns 32b + 8c .. 32b + 8c + 7 of row g, then
// those of row g + 8. mma k16 step t (0, 1) of block b gives lane c the columns 32b + 8c + 4t ..
// + 3 (k = 2c, 2c+1 and 2c+8, 2c+9), so a step never leaves its block: its product can be scaled
// by the block's scale in fp32. The activations of a token are copied as they are (column k at
// byte 2k of a row of kQ8StreamBRow bytes); lane c reads its 8 columns of block b with one 16-byte
// load at 64b + 16c. Scales: the fp16 d of (row r, block b) at byte ((r % 8) · 16 + 2b + r / 8) · 2,
// so that lane (g, ·) finds blocks 2q and 2q + 1 of rows g and g + 8 in one 8-byte load at
// g · 32 + 8q.
#pragma once

#include <cstdint>

#include "kernels/moe/moe_params.h"

namespace moeshard::gpu {

constexpr int kQ8StreamCols = 256;                                       // columns per chunk
constexpr int kQ8StreamSliceBytes = 16 * kQ8StreamCols;                  // 16 rows of int8 codes
constexpr int kQ8StreamSliceScaleBytes = 16 * (kQ8StreamCols / 32) * 2;  // fp16 per row and block
// A token's activations in shared memory: 512 bytes and 64 of padding, so that the 8 lanes of a
// 16-byte load phase ((g, c) and (g + 1, c), at row · 576 + 16c) fall in distinct banks.
constexpr int kQ8StreamBRow = 2 * kQ8StreamCols + 64;

// Byte of the code of (row r, column k) of a 16 × 256 chunk (r < 16, k < 256).
MOESHARD_MOE_HD constexpr int Q8StreamCodeByte(int r, int k) {
  const int b = k / 32, c = (k % 32) / 8, g = r % 8;
  return (b * 32 + g * 4 + c) * 16 + (r / 8) * 8 + k % 8;
}

// Byte of the fp16 scale of (row r, 32-column block b) of a chunk (r < 16, b < 8).
MOESHARD_MOE_HD constexpr int Q8StreamScaleByte(int r, int b) { return ((r % 8) * 16 + 2 * b + r / 8) * 2; }

// What lane `lane` loads for block b: 16 code bytes at Q8StreamLaneCodes (row g's 8 codes, then row
// g + 8's), the activations of its 8 columns at Q8StreamLaneB within a token's row, and the scales
// of blocks 2q, 2q + 1 (rows g, g + 8 each) as 8 bytes at Q8StreamLaneScales.
MOESHARD_MOE_HD constexpr int Q8StreamLaneCodes(int b, int lane) { return (b * 32 + lane) * 16; }
MOESHARD_MOE_HD constexpr int Q8StreamLaneB(int b, int lane) { return 64 * b + 16 * (lane % 4); }
MOESHARD_MOE_HD constexpr int Q8StreamLaneScales(int q, int lane) { return (lane / 4) * 32 + 8 * q; }

// The repack of one stored group of 4 codes of `src` (Q8_0: 34-byte blocks, the fp16 d, then the
// codes of columns 32j .. 32j + 31): group `g4` (0 .. 1023, row-major: row g4 / 64 of the slice,
// columns 4 · (g4 % 64) ..) of chunk `chunk` (numbered slice by slice, cols / 256 a slice), and for
// g4 < 128 also one scale (row g4 / 8, block g4 % 8). The device repack runs it once per group.
MOESHARD_MOE_HD void Q8StreamRepackGroup(const WeightRef& src, int64_t chunk, int g4, uint8_t* dst_data,
                                         uint8_t* dst_scale) {
  const int64_t chunks = src.cols / kQ8StreamCols, s = chunk / chunks, kc = chunk % chunks;
  const int r = g4 / (kQ8StreamCols / 4), k = (g4 % (kQ8StreamCols / 4)) * 4;
  const int64_t col = src.col_offset + kc * kQ8StreamCols + k;
  const uint8_t* b = src.data + (16 * s + r) * src.row_stride_bytes + col / 32 * 34 + 2 + col % 32;
  uint8_t* out = dst_data + chunk * kQ8StreamSliceBytes + Q8StreamCodeByte(r, k);
  for (int i = 0; i < 4; ++i) out[i] = b[i];  // k % 4 == 0: the 4 columns stay in one block and lane
  if (g4 < 16 * 8) {
    const int sr = g4 / 8, blk = g4 % 8;
    const uint8_t* d = src.data + (16 * s + sr) * src.row_stride_bytes + (src.col_offset / 32 + kc * 8 + blk) * 34;
    uint8_t* sd = dst_scale + chunk * kQ8StreamSliceScaleBytes + Q8StreamScaleByte(sr, blk);
    sd[0] = d[0];
    sd[1] = d[1];
  }
}

static_assert(Q8StreamCodeByte(15, 255) == kQ8StreamSliceBytes - 1, "the codes fill the slice");
static_assert(Q8StreamScaleByte(15, 7) == kQ8StreamSliceScaleBytes - 2, "the scales fill theirs");
static_assert(Q8StreamLaneCodes(3, 5) == Q8StreamCodeByte(1, 3 * 32 + 8), "lane (1, 1)'s row g");
static_assert(Q8StreamLaneScales(1, 9) == Q8StreamScaleByte(2, 2), "lane (2, ·)'s block 2, row g");

}  // namespace moeshard::gpu
