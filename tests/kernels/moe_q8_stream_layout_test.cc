// The Q8_0 streaming layout (kernels/moe/moe_q8_stream_layout.h) on the CPU, without a GPU: a
// matrix repacked by Q8StreamRepackGroup (what the device repack runs per thread), then read the
// way the streaming kernel's Q8 stage reads it (moe_stream.cuh ComputeStageQ8: each lane's 16
// code bytes, 8 scale bytes and 16 activation bytes at the layout's offsets, its a0..a3 / b0 b1
// registers filled as the kernel fills them) and multiplied by the m16n8k16 fragment rules of
// the PTX ISA (lane (g, c): a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1], a2 = A[g][2c+8, 2c+9],
// a3 = A[g+8][2c+8, 2c+9]; b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]; the lane's results D[g][2c,
// 2c+1], D[g+8][2c, 2c+1]). The products must be the CPU dequant's W · x for 8 tokens, within
// fp32 rounding: any disagreement between what the repack writes and what a lane reads, or
// between A's and B's k, moves them by far more.
#include "kernels/moe/moe_q8_stream_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"

namespace moeshard {
namespace {

using namespace gpu;  // NOLINT: the layout's functions

struct Lane16 {
  uint32_t x, y, z, w;  // as the kernel's uint4
};

Lane16 Load16(const uint8_t* p) {
  Lane16 v;
  std::memcpy(&v, p, 16);
  return v;
}

// The two values of a register: int8 codes in bytes (lo, hi) = (0, 1) or (2, 3) of a word, as
// I8x4ToBf16 gives them (exactly), or two bf16 activations.
struct Pair {
  float lo, hi;
};
Pair Codes(uint32_t word, int half) {
  return {static_cast<float>(static_cast<int8_t>(word >> (16 * half))),
          static_cast<float>(static_cast<int8_t>(word >> (16 * half + 8)))};
}
Pair Acts(uint32_t word) {
  return {Bf16ToF32(static_cast<uint16_t>(word)), Bf16ToF32(static_cast<uint16_t>(word >> 16))};
}

// out[r][n] (16 rows of slice s, 8 tokens) = Σ over the matrix's columns, chunk by chunk, block by
// block, as the kernel's warp computes them. x[n] is token n's bf16 row of `cols` values.
void EmulateSlice(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int64_t cols, int64_t s,
                  const std::vector<std::vector<uint16_t>>& x, float out[16][8]) {
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) out[r][n] = 0.f;
  const int64_t chunks = cols / kQ8StreamCols;
  for (int64_t kc = 0; kc < chunks; ++kc) {
    const uint8_t* sb = codes.data() + (s * chunks + kc) * kQ8StreamSliceBytes;
    const uint8_t* sc = scales.data() + (s * chunks + kc) * kQ8StreamSliceScaleBytes;
    // The stage's activations: token n's 256 columns at row n of kQ8StreamBRow bytes.
    std::vector<uint8_t> brows(8 * kQ8StreamBRow, 0xEE);
    for (int n = 0; n < 8; ++n) std::memcpy(brows.data() + n * kQ8StreamBRow, x[n].data() + kc * 256, 512);
    for (int q = 0; q < 4; ++q) {
      for (int i = 0; i < 2; ++i) {
        const int b = 2 * q + i;
        float a[32][2][4][2], bb[32][2][2][2];  // [lane][step][register][lo, hi]
        float d[32][2];                         // [lane][row g, g + 8] of block b
        for (int lane = 0; lane < 32; ++lane) {
          const Lane16 v = Load16(sb + Q8StreamLaneCodes(b, lane));
          const uint32_t fill[2][4][2] = {{{v.x, 0}, {v.z, 0}, {v.x, 1}, {v.z, 1}},   // step 0: a0 a1 a2 a3
                                          {{v.y, 0}, {v.w, 0}, {v.y, 1}, {v.w, 1}}};  // step 1
          for (int t = 0; t < 2; ++t)
            for (int reg = 0; reg < 4; ++reg) {
              const Pair p = Codes(fill[t][reg][0], static_cast<int>(fill[t][reg][1]));
              a[lane][t][reg][0] = p.lo, a[lane][t][reg][1] = p.hi;
            }
          const Lane16 xb = Load16(brows.data() + (lane / 4) * kQ8StreamBRow + Q8StreamLaneB(b, lane));
          const uint32_t bf[2][2] = {{xb.x, xb.y}, {xb.z, xb.w}};
          for (int t = 0; t < 2; ++t)
            for (int reg = 0; reg < 2; ++reg) {
              const Pair p = Acts(bf[t][reg]);
              bb[lane][t][reg][0] = p.lo, bb[lane][t][reg][1] = p.hi;
            }
          uint16_t h[4];
          std::memcpy(h, sc + Q8StreamLaneScales(q, lane), 8);  // blocks 2q, 2q + 1 × rows g, g + 8
          d[lane][0] = F16ToF32Exact(h[2 * i]), d[lane][1] = F16ToF32Exact(h[2 * i + 1]);
        }
        // The two k16 steps by the fragment rules, into a fresh accumulator (MmaBf16Zero, MmaBf16).
        double D[16][8] = {};
        for (int t = 0; t < 2; ++t) {
          float A[16][16], B[16][8];
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, c = lane % 4;
            for (int j = 0; j < 2; ++j) {
              A[g][2 * c + j] = a[lane][t][0][j];
              A[g + 8][2 * c + j] = a[lane][t][1][j];
              A[g][2 * c + 8 + j] = a[lane][t][2][j];
              A[g + 8][2 * c + 8 + j] = a[lane][t][3][j];
              B[2 * c + j][g] = bb[lane][t][0][j];
              B[2 * c + 8 + j][g] = bb[lane][t][1][j];
            }
          }
          for (int r = 0; r < 16; ++r)
            for (int n = 0; n < 8; ++n)
              for (int k = 0; k < 16; ++k) D[r][n] += double(A[r][k]) * B[k][n];
        }
        // Each lane adds its four results times its rows' block scales (the kernel's fmaf).
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, c = lane % 4;
          for (int j = 0; j < 2; ++j) {
            out[g][2 * c + j] += static_cast<float>(D[g][2 * c + j]) * d[lane][0];
            out[g + 8][2 * c + j] += static_cast<float>(D[g + 8][2 * c + j]) * d[lane][1];
          }
        }
      }
    }
  }
}

// A Q8_0 matrix [rows, stored_cols] with random codes and scales, viewed as columns
// [col_offset, col_offset + cols).
struct Q8Matrix {
  std::vector<uint8_t> bytes;
  WeightRef view;
};

Q8Matrix MakeQ8(int64_t rows, int64_t stored_cols, int64_t col_offset, int64_t cols, std::mt19937& rng) {
  Q8Matrix m;
  const int64_t stride = stored_cols / 32 * 34;
  m.bytes.resize(rows * stride);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t blk = 0; blk < stored_cols / 32; ++blk) {
      uint8_t* p = m.bytes.data() + r * stride + blk * 34;
      const uint16_t d = F32ToF16(scale(rng));
      std::memcpy(p, &d, 2);
      for (int i = 0; i < 32; ++i) p[2 + i] = static_cast<uint8_t>(rng());
    }
  }
  m.view.format = WeightFormat::kQ8_0;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.col_offset = col_offset;
  m.view.data = m.bytes.data();
  m.view.row_stride_bytes = stride;
  return m;
}

TEST(MoeQ8StreamLayoutTest, KernelReadsOfTheRepackComputeTheProduct) {
  std::mt19937 rng(21);
  // 48 rows (3 slices) × 512 columns (2 chunks) viewed at column 64 of 608 stored ones.
  const int64_t rows = 48, cols = 512, col_offset = 64, stored = 608;
  const Q8Matrix m = MakeQ8(rows, stored, col_offset, cols, rng);
  std::vector<uint8_t> codes(rows * cols, 0), scales(rows * cols / 16, 0);
  const int64_t nchunks = rows / 16 * (cols / kQ8StreamCols);
  for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
    for (int g4 = 0; g4 < kQ8StreamSliceBytes / 4; ++g4) {
      Q8StreamRepackGroup(m.view, chunk, g4, codes.data(), scales.data());
    }
  }
  // Every byte written exactly once: the repack is a permutation of codes and scales.
  std::vector<uint8_t> sorted_codes = codes, want_codes;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t col = col_offset + c;
      want_codes.push_back(m.bytes[r * m.view.row_stride_bytes + col / 32 * 34 + 2 + col % 32]);
    }
  std::sort(sorted_codes.begin(), sorted_codes.end());
  std::sort(want_codes.begin(), want_codes.end());
  EXPECT_EQ(sorted_codes, want_codes);

  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::vector<uint16_t>> x(8, std::vector<uint16_t>(cols));
  for (auto& row : x)
    for (auto& v : row) v = F32ToBf16(normal(rng));
  std::vector<float> w(cols);
  int checked = 0;
  for (int64_t s = 0; s < rows / 16; ++s) {
    float got[16][8];
    EmulateSlice(codes, scales, cols, s, x, got);
    for (int r = 0; r < 16; ++r) {
      DequantRow(m.view, 16 * s + r, w.data());
      for (int n = 0; n < 8; ++n) {
        double want = 0, mag = 0;
        for (int64_t c = 0; c < cols; ++c) {
          want += double(w[c]) * Bf16ToF32(x[n][c]);
          mag += std::fabs(double(w[c]) * Bf16ToF32(x[n][c]));
        }
        ASSERT_NEAR(got[r][n], want, 1e-5 * mag) << "slice " << s << " row " << r << " token " << n;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, rows * 8);
}

// The offsets agree with each other: lane (g, c)'s 16 bytes of block b are row g's then row g + 8's
// codes of columns 32b + 8c .., and its scales of blocks 2q, 2q + 1 are rows g, g + 8 of each.
TEST(MoeQ8StreamLayoutTest, LaneOffsetsNameTheLayoutsBytes) {
  for (int b = 0; b < 8; ++b) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, c = lane % 4;
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(Q8StreamLaneCodes(b, lane) + i, Q8StreamCodeByte(g, 32 * b + 8 * c + i));
        EXPECT_EQ(Q8StreamLaneCodes(b, lane) + 8 + i, Q8StreamCodeByte(g + 8, 32 * b + 8 * c + i));
      }
      EXPECT_EQ(Q8StreamLaneB(b, lane), 2 * (32 * b + 8 * c));
    }
  }
  for (int q = 0; q < 4; ++q) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4;
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 0, Q8StreamScaleByte(g, 2 * q));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 2, Q8StreamScaleByte(g + 8, 2 * q));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 4, Q8StreamScaleByte(g, 2 * q + 1));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 6, Q8StreamScaleByte(g + 8, 2 * q + 1));
    }
  }
}

}  // namespace
}  // namespace moeshard
